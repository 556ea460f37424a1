"""Stage 1 of reading an Arrow IPC file, and what writing shares with it: the file as bytes.

- :mod:`.format`: Arrow's flatbuffer messages (schema, record batch, footer) built and walked;
- :mod:`.stats`: PG-Strom's min/max statistics keys, written per batch and read back for skipping;
- :mod:`.ranges`: byte ranges read into backend memory (KvikIO on a GPU, ``pread`` on a thread pool on
  the CPU), every short read checked;
- :mod:`.metadata`: :class:`~.metadata.ArrowFile`, the opened file: its footer, schema and every
  requested column's buffers, checked against the file's size before anything is read.

Nothing here knows about compression or Tables: the stages above (codecs, read, scan, write) do.
"""
