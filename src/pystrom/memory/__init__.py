"""The memory layer under every Table (internal: nothing here is public API).

- :mod:`.backend`: devices (``cpu``, ``cuda:N``), the one allocation a table lives in, streams;
- :mod:`.transfer`: bulk host <-> GPU copies through pinned staging;
- :mod:`.hostmem`: host memory for CPU tables, private until first exported, then a memfd;
- :mod:`.shm`: memfd creation, sealing and naming for shared host memory;
- :mod:`.layout`: where each buffer of a table goes inside its allocation (64-byte aligned);
- :mod:`.bitmap`: validity bitmaps packed, unpacked and counted on either backend.

It imports nothing from the Table, I/O, IPC or ML layers above it (tests/test_layering.py).
"""
