"""Stage 5: ``write_arrow``: Tables, Arrow data and scans written as Arrow IPC files.

:mod:`.write` turns what the caller holds into record batches; :mod:`.writer` writes them 64-byte
aligned with their min/max statistics (the flatbuffers of :mod:`..file.format`, the buffers
:mod:`.columns` gives for each batch, compressed by :mod:`..codecs.compress` when asked) into a temporary
file that :mod:`.replace` swaps in atomically.
"""

from .write import write_arrow

__all__ = ["write_arrow"]
