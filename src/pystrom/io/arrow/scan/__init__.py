"""Stage 4: ``read_arrow`` and ``scan_arrow``: which files, columns and record batches are read, and ``where``.

:mod:`.scan` skips batches whose statistics rule the predicate out, reads the rest a group at a time
(group k + 1 while the caller works on group k) and runs ``where`` on the device as one fused kernel;
on the CPU, :mod:`.sieve` reads the predicate's columns first and only the matching rows of the others.
"""

from .scan import ArrowScan, ScanStats, read_arrow, scan_arrow

__all__ = ["ArrowScan", "ScanStats", "read_arrow", "scan_arrow"]
