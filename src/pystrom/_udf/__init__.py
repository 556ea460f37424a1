"""User functions compiled with numba: ``@pystrom.udf`` row functions, ``@pystrom.kernel`` and ``pystrom.reduce``.

The PL/CUDA idea as Python: the user's scalar function runs over the rows of a Table on its device.

- :mod:`._row` — ``@pystrom.udf``: the registry of named UDFs (callable in ``where`` strings), the
  applied call (``f("x", "y")``, a value of ``Table.with_columns``), typing from the columns, one
  generated loop per (function, argument types, NULL mode, device) compiled once and counted in
  :data:`COMPILATIONS`; the CPU loop is numba ``njit``, the GPU loop one generated CUDA kernel with
  the function as a device function (:mod:`._cuda`).
- :mod:`._kernel` — ``@pystrom.kernel``: a numba CUDA kernel whose parameters are bound to columns
  and new output columns by name; its CPU twin is the kernel body compiled with ``njit`` as a
  function of the row index (``cuda.grid(1)`` rewritten to it).
- :mod:`._reduce` — ``pystrom.reduce``: a user reduction per batch, combined across batches of a
  stream and across Dask partitions.
- :mod:`._where` — UDF calls inside ``where`` strings (``Table.filter``, ``scan_arrow``): computed
  into temporary columns, then the ordinary predicate.
- :mod:`._cuda` — compiling and launching the generated kernels with numba-cuda on CuPy's stream.

numba is an optional dependency (``pip install pystrom-gpu[udf]``); :func:`numba_modules` raises a
pystrom error naming the extra when it is missing.
"""

from __future__ import annotations

from ._common import COMPILATIONS, numba_modules
from ._kernel import Kernel, kernel
from ._reduce import reduce
from ._row import UDF, UDFCall, registered, udf

__all__ = ["udf", "UDF", "UDFCall", "kernel", "Kernel", "reduce", "registered", "COMPILATIONS", "numba_modules"]
