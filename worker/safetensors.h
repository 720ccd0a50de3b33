// The safetensors file format (https://github.com/huggingface/safetensors), fp32 only:
//   8 bytes   N, the header length, a little-endian u64
//   N bytes   a JSON object {"<name>": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
//             ..., "__metadata__": {"<key>": "<string value>", ...}}, padded with spaces
//   the rest  the data block: each tensor's little-endian bytes at [b, e) of the block
// Readers here treat a file as hostile: every number is checked before it is used.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kt::worker::safetensors {

// The reference implementation refuses headers above 100 MB; so do we.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte range [begin, end) in the data block
  uint64_t end = 0;
};

struct Header {
  std::vector<TensorInfo> tensors;  // sorted by begin: they tile the data block without gaps
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data block: 8 + N
};

// The first 8 + N bytes of a file holding `tensors` (their begin/end are ignored: the data block
// holds the tensors in the given order, back to back) and `metadata`. The JSON is padded with
// spaces so that the data block starts at a multiple of 8.
std::string encode_header(const std::vector<TensorInfo>& tensors,
                          const std::map<std::string, std::string>& metadata);

// N from the file's first 8 bytes, checked against the file size and kMaxHeaderBytes. Throws
// kt::Error("<file>: ...").
uint64_t decode_header_length(const unsigned char (&first8)[8], uint64_t file_bytes,
                              const std::string& file);

// Parses and validates the N header bytes of a file of `file_bytes` bytes: a JSON object; dtype
// F32; non-negative shapes; offsets in range, consistent with the shape, and tiling the whole data
// block (no overlap, no gap, nothing after the last tensor); metadata values strings. Throws
// kt::Error("<file>: ...") naming the first problem.
Header decode_header(std::string_view header_json, uint64_t file_bytes, const std::string& file);

}  // namespace kt::worker::safetensors
