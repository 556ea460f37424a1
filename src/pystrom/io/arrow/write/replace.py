"""Put a finished temporary file at its destination without ext4's flush of a replaced file.

``write_arrow`` writes under a temporary name and only then puts the file in place, so a reader never
sees a half-written file. ``rename(tmp, dest)`` over an existing ``dest`` does that, but ext4 (with
its default ``auto_da_alloc``) then writes the new file's delayed-allocation pages out before the
rename returns: a 640 MB write over an existing file took 1.43 s instead of 0.57 s (median of 4 on the
2-core test machine; writing a new file: 0.25 s). The flush buys crash safety, which ``write_arrow``
never promised (it does not fsync: after a power loss the file may hold zeros, as with ``write_feather``).

So, in order: where ``dest`` is an existing regular file, ``renameat2(RENAME_EXCHANGE)`` swaps the two
names atomically (ext4 does not flush on an exchange) and the old file, now under the temporary name,
is unlinked; readers that opened the old file keep reading it whole. Anywhere else (no such file, a
symlink, a kernel or file system without RENAME_EXCHANGE, a libc without ``renameat2``) ``os.replace``,
which flushes only where it replaces. Either way a reader opening ``dest`` sees the old file or the
new one, complete, never neither and never a mix.

The old file's name goes at once, the file itself a moment later: the last close of a file frees its
page cache pages and its blocks (with a discard on mounts with ``discard``), which for a 640 MB file took
30 ms (never written back) to 240 ms (written back, discard mount) on the 2-core test machine, all of it
in ``write_arrow`` when it unlinked the file. So a descriptor of the old file is taken (``O_PATH``: no
read permission needed) before its name is unlinked, and closed by a thread of its own; :func:`settle`
waits for those closes (the benchmark, before timing anything else). A forked child closes the
descriptors it inherited of files not yet closed, so it never keeps one alive.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import errno
import functools
import os
import stat
import threading

__all__ = ["replace_file", "settle"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV, errno.EPERM}


@functools.cache
def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):  # not glibc >= 2.28 (musl, macOS, Windows)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: str, b: str) -> int:
    """0 when the names were swapped, else the errno."""
    fn = _renameat2()
    if fn is None:
        return errno.ENOSYS
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return 0
    return ctypes.get_errno()


def replace_file(tmp: str, dest: str) -> None:
    """Move the finished file ``tmp`` to ``dest`` (see the module docstring); OSError as ``os.replace``."""
    try:
        regular = stat.S_ISREG(os.lstat(dest).st_mode)
    except OSError:
        regular = False
    if regular:
        err = _exchange(tmp, dest)
        if err == 0:
            if not stat.S_ISREG(os.lstat(tmp).st_mode):
                # dest became something else (a directory) after the check: put it back, fail as os.replace would
                _exchange(tmp, dest)
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), dest)
            _unlink_and_release(tmp)  # the old file: readers that hold it open keep it
            return
        if err not in _UNSUPPORTED and err != errno.ENOENT:
            raise OSError(err, os.strerror(err), dest)
    os.replace(tmp, dest)


# Descriptors of unlinked old files not closed yet, and the lock that orders their closes with a fork.
_pending: set[int] = set()
_pending_lock = threading.Lock()


@functools.cache
def _closer() -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(1, thread_name_prefix="pystrom-release")


def _unlink_and_release(path: str) -> None:
    """Unlink ``path`` (a regular file, ours to remove); its pages and blocks are freed on the closer thread."""
    try:
        fd = os.open(path, getattr(os, "O_PATH", os.O_RDONLY) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        os.unlink(path)  # freed here, as before
        return
    try:
        os.unlink(path)
    except BaseException:
        os.close(fd)
        raise
    with _pending_lock:
        _pending.add(fd)
    _closer().submit(_close, fd)


def _close(fd: int) -> None:
    with _pending_lock:  # a fork waits for it: a child never closes a number reused by then
        _pending.discard(fd)
        os.close(fd)


def settle() -> None:
    """Wait until every old file replaced so far is closed (its pages and blocks freed)."""
    _closer().submit(lambda: None).result()  # the closer runs its tasks in order


def _after_fork_in_child() -> None:
    for fd in _pending:  # inherited: closed here, or the child would keep those files alive
        try:
            os.close(fd)
        except OSError:
            pass
    _pending.clear()
    _closer.cache_clear()  # the parent's thread is not the child's
    _pending_lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_pending_lock.acquire, after_in_parent=_pending_lock.release,
                        after_in_child=_after_fork_in_child)  # fmt: skip
