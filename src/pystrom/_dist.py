"""The name pystrom is installed under, the install hints that error messages give, and the one way an
optional package that is missing is reported (:func:`require`, :class:`~pystrom.MissingDependencyError`).

The import name is ``pystrom``; the distribution on the package index is ``pystrom-gpu`` (``pystrom``
there is an unrelated project). Every message that tells a user what to install comes from here, and
``tests/test_install_name.py`` checks that this name is pyproject.toml's and that the README, the docs
and the messages use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["DISTRIBUTION", "OPTIONAL", "install_hint", "missing", "require"]

DISTRIBUTION = "pystrom-gpu"


def install_hint(*extras: str) -> str:
    """``pip install 'pystrom-gpu[demo]'``; several extras are alternatives: ``... '[cuda13]' or '...[cuda12]'``."""
    return "pip install " + " or ".join(f"'{DISTRIBUTION}[{extra}]'" for extra in extras)


# Every optional module pystrom imports: its name for people (the package index's), and the extras
# that bring it (alternatives, in the order a user should try them). tests/test_missing_extras.py
# checks each name against pyproject.toml's extras.
OPTIONAL: dict[str, tuple[str, tuple[str, ...]]] = {
    "dask": ("dask", ("dask",)),
    "distributed": ("distributed", ("dask",)),
    "dask.dataframe": ("dask's DataFrame support (pandas)", ("dask,pandas",)),
    "dask_cuda": ("dask-cuda", ("dask-cuda",)),
    "pandas": ("pandas", ("pandas",)),
    "psycopg": ("psycopg", ("postgres",)),
    "numba": ("numba", ("udf",)),
    "numba.cuda": ("numba-cuda", ("udf",)),
    "cupy": ("CuPy", ("cuda13", "cuda12")),
    "kvikio": ("KvikIO", ("cuda13", "cuda12")),
    "nvidia.nvcomp": ("nvCOMP", ("nvcomp-cu13", "nvcomp-cu12")),
}


def missing(
    module: str,
    feature: str,
    cause: BaseException | None = None,
    error: type = MissingDependencyError,
    advice: str = "",
) -> MissingDependencyError:
    """The error for ``feature`` lacking optional ``module`` (a key of OPTIONAL): what is missing, why
    when the package is there but does not import (a missing shared library, say), the pip line, and
    ``advice`` (another way out) after it."""
    package, extras = OPTIONAL[module]
    not_found = cause is None or _not_found(module, cause)
    state = "which is not installed" if not_found else f"which is installed but does not import ({cause})"
    hint = install_hint(*extras) + (f"; {advice}" if advice else "")
    return error(f"{feature} needs {package}, {state}: {hint}", module, extras)


def _not_found(module: str, cause: BaseException) -> bool:
    """Whether ``cause`` (or what caused it: dask.dataframe re-raises pandas' absence as a plain
    ImportError) says that ``module``, a package above it or another optional package is absent."""
    seen = 0
    while cause is not None and seen < 8:
        if isinstance(cause, ModuleNotFoundError):
            name = cause.name or ""
            if not name or module == name or module.startswith(name + ".") or name.split(".")[0] in OPTIONAL:
                return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def require(module: str, feature: str, error: type = MissingDependencyError) -> ModuleType:
    """``import module`` for ``feature``, or :func:`missing`'s error (``error``: a subclass of
    MissingDependencyError that a call site also needs to be another pystrom error)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, feature, exc, error) from exc
