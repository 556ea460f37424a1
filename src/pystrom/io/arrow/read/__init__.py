"""Stage 3: record batches read into one Table allocation, in this order:

1. :mod:`.batches` walks the record batch messages in one pass and lays out every buffer of the
   requested columns (:mod:`.layouts`); bodies that are compressed are laid out by
   :mod:`.compressed_layouts` (each buffer's frame, codec and claimed length);
2. :mod:`.direct` allocates the Table once and reads each column's byte ranges straight into place,
   uncompressed ones through :class:`..file.ranges.RangeReader`, compressed ones through
   :class:`.compressed_reads.InflatingReader`, which decompresses a bounded slice at a time;
3. string and list offsets are checked (:mod:`.offsets`, on the device) before their data is touched;
   legacy interval types are widened (:mod:`.intervals`);
4. columns that cannot be read that way (dictionaries, large strings, big-endian bodies, streams) go
   through pyarrow on the host, validated first (:mod:`.host`).
"""
