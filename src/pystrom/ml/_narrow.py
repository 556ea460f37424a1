"""The fused CUDA pass of a narrow fit (at most :data:`._pass.MAX_KERNEL_FEATURES` features), driven from
the host: :class:`KernelPass` sets a launch up once, and within an in-memory fit queues the next pass
before the solver asks for it.

Speculation. An in-memory fit is some twenty passes of ~0.3 ms each (40M x 4 float32 on an H100), and
between two of them the host used to read the result, unpack it, factor the Hessian and launch again:
~60 us a pass in which the GPU idled (the seed fit: 8.3 ms against a floor of 4.8). Nearly every pass
the solver asks for is a full Newton step from the pass before it (its line search takes the whole
step), so once the solver has told the source its step rule (:meth:`KernelPass.plan`: the free
parameters and the penalty), a one-thread kernel after each pass computes that step
(``logit_step_k<K>`` in kernels/logistic.cu) and writes the next weights to device memory, and the
pass is followed in the stream at once by a *speculative* one that reads them. The host hands the
solver the device's step with the pass's sums (:attr:`._pass.PassTotals.newton_step`); the solver,
whose rule it is, forms the same weights w + step, and when it asks for exactly those (bit for bit)
the speculative pass is its answer, already running or done. Any other request (a halved step, a
certificate) is launched behind it, and the speculative pass's work is lost; the solver stops
speculation before its last iteration (``plan(..., ahead=False)``), so a fit that runs to
``max_iter`` wastes nothing. (Cancelling a queued pass needed a flag its loop polled, which cost
every pass 6%.) A step that fails on the device (not positive definite, not finite) writes a flag
that makes the speculative pass return at once, and the solver computes the step itself, its
fallbacks and warnings in one place (``_irls.py``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "MAX_KERNEL_FEATURES",
    "STEP_TAIL",
    "KernelPass",
    "PartsPass",
    "kernel_pass",
    "layout_size",
    "pass_weights",
    "speculation_hit",
    "step_rule",
    "uses_kernel",
    "vector_loads",
]

MAX_KERNEL_FEATURES = 8  # the fused kernel keeps P(P+1)/2 + P + 6 float64 sums per thread in registers

_THREADS = 128  # LOGIT_THREADS in logistic.cu
_STRIDE = 9  # STEP_STRIDE in logistic.cu: the step's and the next weights' slots
STEP_TAIL = 2 * _STRIDE + 1  # after a pass's sums: the step, the next weights, the flag (1: a step)
_PART_FIELDS = 8  # PART_FIELDS in logistic.cu: an array's descriptor for logit_parts
_SPEC_SPILL_ALLOWANCE = 16  # bytes a speculative parts kind may spill where its plain kind spills none


def logit_kernel(function: str, k: int, ordinal: int, tname: str, unweighted: bool = False) -> Any:
    """``function`` of kernels/logistic.cu, from a build of only the kernels a fit over ``tname`` ("f32" or
    "f64") rows of ``k`` features asks for: one array's (``LOGIT_ONE_ARRAY_ONLY``: the pass, the speculative
    pass, the step), or a dask worker's partitions' (``LOGIT_MANY_ARRAYS_ONLY``: ``logit_parts*``,
    ``logit_gather_step``). A first fit compiles those 3, not all 80 (~40 s on a cold cache) nor its
    width's 10 (4.3 s on an H200). ``unweighted``: the ``LOGIT_UNWEIGHTED`` build, for passes with neither
    sample nor class weights (:func:`unweighted_pass`)."""
    from ..kernels import kernel

    kinds = "MANY_ARRAYS" if function.startswith(("logit_parts", "logit_gather_step")) else "ONE_ARRAY"
    defines = (f"LOGIT_K={k}", f"LOGIT_{tname.upper()}_ONLY", f"LOGIT_{kinds}_ONLY")
    return kernel("logistic", function, ordinal, defines + (("LOGIT_UNWEIGHTED",) if unweighted else ()))


def unweighted_pass(has_sample_weights: bool, cw: tuple[float, float]) -> bool:
    """Whether a pass may run the ``LOGIT_UNWEIGHTED`` build: no sample weights and both class weights 1,
    so every row's weight is 1 and that build's sums are the weighted build's bit for bit."""
    return not has_sample_weights and float(cw[0]) == 1.0 and float(cw[1]) == 1.0


def layout_size(k: int) -> int:
    """Values in a pass's flat result for k features (the layout: ``_pass.py``'s docstring)."""
    p = k + 1
    return p * (p + 1) // 2 + p + 6


def pass_weights(w: np.ndarray | None) -> list[np.float64]:
    """A pass kernel's nine weight arguments: ``w`` padded with zeros (None: all zeros, for a speculative
    pass, which reads its weights from device memory)."""
    padded = np.zeros(9)
    if w is not None:
        padded[: len(w)] = w
    return list(padded)


def step_rule(active: np.ndarray, n_free_features: int, l2: float) -> tuple[tuple, int]:
    """The solver's step rule as the step kernels take it: (free parameters, features among them, L2
    penalty), and the free parameters as a bit mask."""
    rule = (tuple(int(j) for j in active), int(n_free_features), float(l2))
    return rule, sum(1 << j for j in rule[0])


def speculation_hit(before: np.ndarray, k: int, spec_cw: tuple[float, float], cw: tuple[float, float],
                    w: np.ndarray) -> bool:  # fmt: skip
    """Whether the pass queued speculatively after a pass whose step tail is ``before`` (the step, the
    next weights, the flag) is the pass at ``w`` with class weights ``cw``."""
    nxt = before[_STRIDE : _STRIDE + k + 1]
    return spec_cw == cw and before[2 * _STRIDE] == 1.0 and np.array_equal(nxt, w)


class _Build(NamedTuple):
    """One build of a pass's kernels (:func:`logit_kernel`), and how :class:`KernelPass` or
    :class:`PartsPass` launches it."""

    fn: Any  # the pass
    spec_fn: Any  # the speculative pass
    step_fn: Any  # the Newton step after either (PartsPass: the dask chain's gather step, dask/_chain.py)
    spec_ok: bool  # a pass may be followed by a speculative one (the rule differs by class)
    blocks: int  # the grid: one wave of resident blocks


class _Builds:
    """What :class:`KernelPass` and :class:`PartsPass` share: their kernels, one build per
    :func:`unweighted_pass` choice, compiled when a pass first needs it. A subclass sets ``k``, ``tname``,
    ``ordinal``, ``rows`` (its grid's), ``has_sw`` and ``_builds``, names its three kernels and says when a
    pass may be followed by a speculative one."""

    _KERNELS: tuple[str, str, str]  # the pass, the speculative pass, the step after either ({t}: f32/f64)

    def build(self, cw: tuple[float, float]) -> _Build:
        """The kernels a pass with class weights ``cw`` runs (one module, compiled on first use)."""
        unweighted = unweighted_pass(bool(self.has_sw), cw)
        found = self._builds.get(unweighted)
        if found is None:
            k, tname, ordinal = self.k, self.tname, self.ordinal
            fn, spec_fn, step_fn = (logit_kernel(name.format(t=tname, k=k), k, ordinal, tname, unweighted)
                                    for name in self._KERNELS)  # fmt: skip
            found = _Build(fn, spec_fn, step_fn, self._spec_ok(fn, spec_fn), _blocks(fn, k, self.rows, ordinal))
            self._builds[unweighted] = found
        return found

    @staticmethod
    def _spec_ok(fn: Any, spec_fn: Any) -> bool:
        raise NotImplementedError


class KernelPass(_Builds):
    """The fused CUDA pass over one array, set up once and run every pass (module docstring).

    A pass is one launch (the weights go as scalar arguments, or for a speculative pass as the device
    weights the pass before it wrote; the last block reduces over the others) and, for a host result,
    a wait on its event: the kernel writes the result straight into pinned host memory mapped into the
    device's address space (two slots: a pass and the speculative one after it).
    """

    def __init__(self, X: Any, y: Any, sw: Any | None, ordinal: int, to_host: bool = False):
        import cupy

        n, k = X.shape
        self.k = k
        self.m = m = layout_size(k)
        self.tname = "f32" if X.dtype == np.float32 else "f64"
        self.ordinal, self.rows = ordinal, n
        self._builds: dict[bool, _Build] = {}  # by unweighted_pass: each built when a pass first needs it
        self.partials = cupy.empty((_partial_rows(n, ordinal), m), dtype=np.float64)
        self.done = cupy.zeros(1, dtype=np.uint32)  # blocks finished; the last one resets it
        self.wnext = cupy.zeros((2, _STRIDE + 1), dtype=np.float64)  # per slot: next weights, flag
        self.sums = cupy.zeros((2, m), dtype=np.float64)  # per slot: the pass's sums, for its step
        self.slots: list[tuple[np.ndarray | None, int]] = []
        self.out: Any = None
        if to_host:
            for _ in range(2):
                host, ptr = _mapped(m + STEP_TAIL, np.float64)
                if host is None:
                    self.slots = []
                    break
                self.slots.append((host, ptr))
        self.mapped = bool(self.slots)
        if not self.mapped:
            self.out = cupy.empty(m + STEP_TAIL, dtype=np.float64)
            self.slots = [(None, self.out.data.ptr)] * 2
        has_sw = sw is not None
        rs, cs, vec = _reading(X)
        self.vec = np.int32(vec)
        self.data_args = (X, np.int64(n), np.int64(rs), np.int64(cs), y, sw if has_sw else self.partials)
        self.has_sw = np.int32(has_sw)
        self.rule: tuple | None = None  # the solver's step rule (plan)
        self.ahead = False  # queue the pass at each step (plan)
        self._mask = 0
        self.launches = 0  # launch ids: 1, 2, ... (slot = id % 2)
        self.pending: tuple | None = None  # the speculative launch: (id, class weights)
        self.speculated = self.hits = 0  # speculative passes queued, and those the solver used

    def plan(self, active: np.ndarray, n_free_features: int, l2: float, ahead: bool = True) -> None:
        """The solver's step rule: the free parameters (indices, intercept = k), how many of them are
        features (they come first) and the L2 penalty. From now on every pass computes the step, and
        with ``ahead`` queues the pass at it (only with a host result in mapped memory: the host reads
        the step there without a copy)."""
        if not self.mapped:
            return
        self.rule, self._mask = step_rule(active, n_free_features, l2)
        self.ahead = bool(ahead)

    _KERNELS = ("logit_pass_{t}_k{k}", "logit_spec_{t}_k{k}", "logit_step_k{k}")

    @staticmethod
    def _spec_ok(fn: Any, spec_fn: Any) -> bool:
        # the speculative kind holds the weights in registers: where that spills the sums (the compiler
        # moved some to local memory) it is slower than the host's round trip it saves
        return _local_bytes(spec_fn) == 0

    def launch(self, cw: tuple[float, float], w: np.ndarray | None) -> int:
        """Queue a pass on the current stream (``w`` None: a speculative one), and under a step rule its
        step; its launch id."""
        self.launches += 1
        lid = self.launches
        slot = lid % 2
        weights = pass_weights(w)
        wsrc = self.wnext[(lid - 1) % 2].data.ptr if w is None else 0
        sums = self.sums[slot].data.ptr if self.rule else 0
        build = self.build(cw)
        fn = build.fn if w is not None else build.spec_fn
        fn((build.blocks,), (_THREADS,), (*self.data_args, self.has_sw, self.vec, np.float64(cw[0]), np.float64(cw[1]),
           *weights, np.uint64(wsrc), np.uint64(sums), self.partials, self.done,
           np.uint64(self.slots[slot][1])))  # fmt: skip
        if self.rule:
            _, nfree, l2 = self.rule
            build.step_fn((1,), (1,), (np.uint64(sums), *weights, np.uint64(wsrc), np.uint32(self._mask),
                         np.int32(nfree), np.float64(l2), np.uint64(self.slots[slot][1] + 8 * self.m),
                         self.wnext[slot]))  # fmt: skip
        return lid

    def __call__(
        self, cw: tuple[float, float], w: np.ndarray, hessian: str = "float64", next_hessian: str | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One pass at ``w``, waited for: the flat float64 sums on the host, and the Newton step under the
        planned rule (None: no rule, or the step failed on the device). Its Hessian is always float64
        (``hessian`` and ``next_hessian``: as ``WidePass``'s, ignored)."""
        import cupy

        lid = self._claim(cw, w)
        if lid is None:
            lid = self.launch(cw, w)
        event = cupy.cuda.Event(disable_timing=True)
        event.record()
        if self.rule is not None and self.ahead and self.build(cw).spec_ok:  # the pass most likely asked next
            self.pending = (self.launch(cw, None), cw)
            self.speculated += 1
        event.synchronize()
        host = self.slots[lid % 2][0]
        res = self.out.get() if host is None else host.copy()
        vec, tail = res[: self.m], res[self.m :]
        ok = self.rule is not None and tail[2 * _STRIDE] == 1.0
        return vec, (tail[: self.k + 1].copy() if ok else None)

    def _claim(self, cw: tuple[float, float], w: np.ndarray) -> int | None:
        """The pending speculative launch if it is the pass at ``w`` (else its work is lost)."""
        if self.pending is None:
            return None
        lid, spec_cw = self.pending
        self.pending = None
        before = self.slots[(lid - 1) % 2][0][self.m :]  # the pass it followed: done, its tail written
        if speculation_hit(before, self.k, spec_cw, cw, w):
            self.hits += 1
            return lid
        return None

    def close(self) -> None:
        """Wait for a speculative pass still queued (it writes into this object's buffers)."""
        if self.pending is not None:
            import cupy

            self.pending = None
            cupy.cuda.get_current_stream().synchronize()


class PartsPass(_Builds):
    """One fused pass over the rows of several arrays on one GPU (a dask worker's partitions): one
    launch of ``logit_parts_<t>_k<K>`` (kernels/logistic.cu) instead of one per array, the sums written
    straight into mapped host memory. ``parts``: (X, y, sw or None) each, every X of one dtype and width.
    The sums equal those of one pass over the arrays' rows stacked, to the order of the additions.
    :meth:`launch` queues a pass anywhere (dask/_chain.py: into the row its all-gather sends, or at the
    weights the step before it wrote)."""

    def __init__(self, parts: list[tuple[Any, Any, Any]], ordinal: int):
        import cupy

        dtypes = {X.dtype for X, _, _ in parts}
        widths = {X.shape[1] for X, _, _ in parts}
        if len(dtypes) != 1 or len(widths) != 1:
            raise ValueError(f"one fused pass needs arrays of one dtype and width; got {dtypes} and {widths}")
        (dtype,), (k,) = dtypes, widths
        self.k, self.m = k, layout_size(k)
        self.tname = "f32" if dtype == np.float32 else "f64"
        self.ordinal = ordinal
        # a fit's sample weights are a column or an array for every partition or for none, so every rank of a
        # dask fit picks the same build, and so decides alike whether to speculate (dask/_chain.py)
        self.has_sw = any(sw is not None for _, _, sw in parts)
        self.rows = max((X.shape[0] for X, _, _ in parts), default=0)
        self._builds: dict[bool, _Build] = {}  # by unweighted_pass, as KernelPass's
        fields = []
        for X, y, sw in parts:
            rs, cs, vec = _reading(X)
            sw_ptr = sw.data.ptr if sw is not None else 0
            fields.append([X.data.ptr, X.shape[0], rs, cs, y.data.ptr, sw_ptr, int(sw is not None), int(vec)])
        self._parts = parts  # the arrays the descriptors point into stay alive with this object
        self.table = cupy.asarray(np.array(fields, dtype=np.int64).reshape(-1, _PART_FIELDS))
        self.partials = cupy.empty((_partial_rows(self.rows, ordinal), self.m), dtype=np.float64)
        self.done = cupy.zeros(1, dtype=np.uint32)
        self.host, ptr = _mapped(self.m, np.float64)
        self.out = None if self.host is not None else cupy.empty(self.m, dtype=np.float64)
        self._out = ptr if self.host is not None else self.out.data.ptr
        self._head = (self.table, np.int32(len(parts)))

    # the step: the dask chain's, which sums the ranks' rows first (dask/_chain.py)
    _KERNELS = ("logit_parts_{t}_k{k}", "logit_parts_spec_{t}_k{k}", "logit_gather_step_k{k}")

    @staticmethod
    def _spec_ok(fn: Any, spec_fn: Any) -> bool:
        # as KernelPass's, but against the plain kind (the float64 kinds spill: k = 4 weighted 34 bytes
        # plain, 26 speculative, nvcc sm_90) or a few bytes (unweighted k = 4: 0 plain, 8 speculative;
        # without speculation its dask fit on one H200 took 15.8 ms a loop, the weighted build 14.7)
        return _local_bytes(spec_fn) <= max(_local_bytes(fn), _SPEC_SPILL_ALLOWANCE)

    def launch(self, cw: tuple[float, float], weights: list, wsrc: int = 0, out: int = 0, wout: int = 0) -> None:
        """Queue a pass on the current stream: at ``weights`` (:func:`pass_weights`), or where ``wsrc`` is
        given at the weights in device memory there (9 weights, then a flag: 0 makes the pass do nothing);
        the sums to ``out`` (default: this object's result) and the weights it used to ``wout`` (0: nowhere)."""
        build = self.build(cw)
        fn = build.spec_fn if wsrc else build.fn
        fn((build.blocks,), (_THREADS,), (*self._head, float(cw[0]), float(cw[1]), *weights, np.uint64(wsrc),
           np.uint64(wout), self.partials, self.done, np.uint64(out or self._out)))  # fmt: skip

    def __call__(self, cw: tuple[float, float], w: np.ndarray) -> np.ndarray:
        """The pass at ``w`` on the current stream, waited for: the flat float64 sums on the host."""
        import cupy

        self.launch(cw, pass_weights(w))
        if self.host is None:
            return self.out.get()
        cupy.cuda.get_current_stream().synchronize()
        return self.host.copy()


def _reading(X: Any) -> tuple[int, int, bool]:
    """How the pass kernels read ``X``: its row and column strides in elements, and whether by vector loads."""
    item = X.dtype.itemsize
    rs, cs = X.strides[0] // item, X.strides[1] // item
    return rs, cs, vector_loads(item, X.shape[1], rs, cs, X.data.ptr)


def _partial_rows(rows: int, ordinal: int) -> int:
    """Rows of a pass's partial sums: room for any build's grid (:func:`_blocks`; at most 16 blocks of 128
    threads are resident on an SM)."""
    from ..kernels import sm_count

    return max(1, min((rows + _THREADS - 1) // _THREADS, sm_count(ordinal) * 16))


def _blocks(fn: Any, k: int, rows: int, ordinal: int) -> int:
    """The pass kernel's grid: one block per 128 rows, at most one full wave of resident blocks (each
    block loops over rows, so no block waits for another to finish)."""
    from ..kernels import sm_count

    return max(1, min((rows + _THREADS - 1) // _THREADS, sm_count(ordinal) * _resident_blocks(fn, k)))


def vector_loads(itemsize: int, k: int, row_stride: int, col_stride: int, address: int) -> bool:
    """Whether the kernel may read each row with vector loads (``vec``; ``VecWidth`` in logistic.cu):
    rows of k contiguous values (C order, no padding) whose width is a multiple of 8 or 16 bytes, and
    a base address aligned to that width (a slice of an array may start anywhere)."""
    width = (
        16
        if (itemsize == 4 and k % 4 == 0) or (itemsize == 8 and k % 2 == 0)
        else 8
        if itemsize == 4 and k % 2 == 0
        else 0
    )
    return bool(width) and row_stride == k and (col_stride == 1 or k == 1) and address % width == 0


def _local_bytes(fn: Any) -> int:
    """Local memory a thread of the kernel uses (spilled registers), 0 where CuPy cannot tell."""
    try:
        return int(getattr(fn, "local_size_bytes", 0) or 0)
    except Exception:  # noqa: BLE001 - an attribute query of an older CuPy: assume none
        return 0


def _mapped(count: int, dtype: Any) -> tuple[np.ndarray | None, int]:
    """Pinned host memory for ``count`` values and its address for kernels (None where unmapped)."""
    import cupy
    import cupyx

    host = cupyx.empty_pinned(count, dtype=dtype)
    try:  # with unified addressing, pinned memory is mapped and has a device address (the same one)
        ptr = int(cupy.cuda.runtime.pointerGetAttributes(host.ctypes.data).devicePointer)
    except (AttributeError, cupy.cuda.runtime.CUDARuntimeError):
        ptr = 0
    return (host, ptr) if ptr else (None, 0)  # unmapped: the result is copied instead


def kernel_pass(X: Any, y: Any, sw: Any | None, cw: tuple[float, float], w: np.ndarray, ordinal: int) -> Any:
    """One fused CUDA pass over one batch: a fresh device vector of the sums, not synchronised."""
    kp = KernelPass(X, y, sw, ordinal)
    kp.launch(cw, w)
    return kp.out[: kp.m]


def uses_kernel(backend: Any, X: Any) -> bool:
    k = X.shape[1]
    return backend.kind == "cuda" and 1 <= k <= MAX_KERNEL_FEATURES and X.dtype in (np.float32, np.float64)


@functools.cache
def _resident(fn_ptr: int, fallback: int) -> int:
    try:
        from cupy.cuda import driver

        return max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(fn_ptr, _THREADS, 0)))
    except Exception:  # an older CuPy without the occupancy call: the kernel's launch bound
        return fallback


def _resident_blocks(fn: Any, k: int) -> int:
    """Blocks of the pass kernel that fit on one SM at once: the grid is one full wave (each block
    loops over rows), so no block waits for another to finish."""
    ptr = fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr  # CuPy's RawKernel wraps a Function
    return _resident(int(ptr), 4 if k <= 4 else 3 if k <= 6 else 2)
