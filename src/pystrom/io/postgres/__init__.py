"""PostgreSQL -> Table. The path runs one way, each stage a module that imports only the stages after it:

1. :mod:`.read` - ``read_postgres`` / ``postgres_to_arrow``: arguments, then the stages below in order.
   :mod:`.scan` - ``scan_postgres``: the same stages once per range of the result, one range read
   ahead of the caller, each range filtered by a device ``where`` and yielded as one Table.
2. :mod:`.statement` - the SELECT, composed with ``psycopg.sql`` from ``query=`` or ``table=``.
3. :mod:`.types` - the result's columns (``LIMIT 0``) mapped to pystrom types, or refused with a cast.
4. :mod:`.session` - connections, one exported snapshot, the read split into ctid or key ranges.
5. :mod:`.stream` - every COPY ... TO STDOUT (FORMAT BINARY) drained by the native pump (:mod:`.pump`,
   the one module that touches libpq) into staging buffers, copied to the GPU as they fill.
6. :mod:`.assemble` - the Table allocated once at its final size (the pump counted rows, NULLs and
   string bytes), then :mod:`.decode` writes every chunk into its rows: the CUDA kernels
   (:mod:`.decode_device`) or the C++ decoder, with :mod:`.chunks` saying where each chunk goes.

Table -> PostgreSQL runs one way too, sharing only the bottom stages (:mod:`.session`'s connections,
:mod:`.pump`'s libpq access):

1. :mod:`.write` - ``write_postgres``: arguments, the target, the staging table, the final transaction.
2. :mod:`.ddl` - the Table's columns mapped to PostgreSQL types; CREATE, COPY and INSERT composed.
3. :mod:`.encode` - the sizes pass, the chunks and the C++ encoder; :mod:`.encode_device` its CUDA twin.
4. :mod:`.pump` - ``CopyInStream``: ``COPY ... FROM STDIN (FORMAT BINARY)`` sent by the native sender.
"""

from .read import postgres_to_arrow, read_postgres
from .scan import PostgresScan, PostgresScanStats, scan_postgres
from .write import write_postgres

__all__ = ["read_postgres", "postgres_to_arrow", "scan_postgres", "PostgresScan", "PostgresScanStats", "write_postgres"]
