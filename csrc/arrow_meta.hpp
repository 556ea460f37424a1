// The record batch messages of an Arrow IPC file, parsed for the fields io/arrow/read/batches.py reads: one
// call for every batch rather than a Python flatbuffer walk (and pyarrow's verifier) per batch.
// Pure C++; binding in module.cpp, the Python twin (which defines what is accepted) in io/arrow/read/batches.py.
//
// Every read is bounds-checked against the message's flatbuffer, and the tables read are verified at
// least as strictly as flatbuffers' Verifier does for pyarrow's ipc.read_message (alignment of every
// scalar, offset and vector; vtables whole; offsets non-zero and forward; vectors inside the buffer,
// struct vectors 8-byte aligned; tables' inline size inside; RecordBatch.variadicBufferCounts, the
// BodyCompression table and Message.custom_metadata's KeyValue tables and NUL-terminated strings too),
// so a batch marked ok here is one the Python parser (verifier included) accepts with the same values.
// Anything else is marked with a reason and left to the Python parser, which declines or raises.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pystrom {

// Per-batch status (0: ok). The numbers are part of the binding: batches.py treats every non-zero the same.
enum ArrowMeta : int32_t {
  kMetaOk = 0,
  kMetaBlock = 1,        // the Block lies outside [8, footer_start), or a negative length
  kMetaPrefix = 2,       // no continuation marker, or a flatbuffer length that does not fill the Block
  kMetaVerify = 3,       // a flatbuffer offset, vtable, scalar or vector out of bounds or misaligned
  kMetaHeader = 4,       // not a V5 RecordBatch message
  kMetaBodyLength = 5,   // the message's body length differs from the Block's
  kMetaCounts = 6,       // FieldNodes or Buffers absent or not as many as the schema implies
  kMetaCompression = 7,  // a codec id or method Arrow does not define (Python raises FileFormatError)
  kMetaCustom = 8,       // custom metadata not verified here, or more than 65,536 pairs (Python reads it)
};

// Batches i < count, Block i = (offsets[i], meta_lengths[i], body_lengths[i]) of a file whose footer starts
// at footer_start; the message of Block i (its meta_lengths[i] bytes) at src[msg_at[i]] (src the whole file
// and msg_at the offsets, or the messages alone, read one after the other: a Block whose message is not
// inside src[0, size) is refused). Out: rows[i], bodies[i] = (file offset, length), nodes[i] (num_fields
// x (length, null count)), buffers[i] (num_buffers x (body offset, length)), codecs[i] (-1: uncompressed,
// 0: LZ4_FRAME, 1: ZSTD), status[i], and the message's custom metadata: custom[i] = (first pair, pairs) of
// the (key at, key length, value at, value length) quadruples appended to *pairs (positions in src; pairs
// lacking a key or a value skipped, as the Python parser does). The other outputs of a batch whose status
// is not ok are unspecified; it has no pairs.
void arrow_batch_meta(const uint8_t* src, std::size_t size, int64_t footer_start, const int64_t* offsets,
                      const int64_t* meta_lengths, const int64_t* body_lengths, const int64_t* msg_at,
                      std::size_t count, std::size_t num_fields, std::size_t num_buffers, int64_t* rows,
                      int64_t* bodies, int64_t* nodes, int64_t* buffers, int64_t* codecs, int32_t* status,
                      int64_t* custom, std::vector<int64_t>* pairs);

// How arrow_flat_layouts checks a field of a flat schema (the numbers are part of the binding): fixed-width
// values (a validity bitmap and values of `width` bytes each), bit-packed booleans, or int32 offsets and bytes.
enum FlatLayout : int32_t { kFlatFixed = 0, kFlatBool = 1, kFlatVarbinary = 2 };

// The checks and layouts read/batches.py makes of an uncompressed file whose fields are all flat, over every
// batch at once (arrow_batch_meta's outputs, the file's size): every body inside the file, every buffer
// inside its body and 8-byte aligned, every FieldNode of the batch's row count with NULLs in [0, rows], a
// bitmap long enough wherever there are NULLs, every values buffer as long as its row count needs (a
// varbinary field with rows also a data buffer). layouts[j], widths[j], first_buffer[j]: field j's
// FlatLayout, value width and first buffer. Returns 0 when all hold (else the first failed check, the
// caller declines the file; an int64 overflow fails too) and then fills out[s][8][count] for the fields
// selected[s]: per batch the rows, the NULLs, and (file offset, size) of the validity (-1, 0 where no
// NULLs), the values and the data (varbinary; else -1, 0); an empty buffer's offset is 0, as pyarrow's path.
int32_t arrow_flat_layouts(std::size_t count, const int64_t* rows, const int64_t* bodies, const int64_t* nodes,
                           const int64_t* buffers, std::size_t num_fields, std::size_t num_buffers,
                           int64_t file_size, const int32_t* layouts, const int64_t* widths,
                           const int64_t* first_buffer, std::size_t num_selected, const int64_t* selected,
                           int64_t* out);

}  // namespace pystrom
