"""Stage 2: the LZ4_FRAME and ZSTD codecs of compressed Arrow bodies, for reading and for writing.

A compressed read is planned in NumPy arrays (:mod:`.plan`: which frames, in which slices, each output
where) and a slice's frames are decompressed by one call (:mod:`.decompress`), which hands them to the
CPU codecs on a thread pool (:mod:`.host`: pystrom's LZ4 decoder, pyarrow's or the system's ZSTD, and
the structure check every ZSTD frame passes first) or to the GPU (:mod:`.device`: the LZ4 kernel, nvCOMP
on request). A GPU read of frames the GPU does not decode goes through :mod:`.staged`: read and decoded
on the host into pinned staging, copied up on the reader's stream. :mod:`.compress` compresses the
buffers of record batches for ``write_arrow``.

The codecs see frames and destinations, never files or columns: the read stage above maps them.
"""
