// safetensors read/write: the weight format of Hugging Face checkpoints, so shardlm can load HF
// Llama weights and write files that PyTorch/transformers load back. Format:
// https://github.com/huggingface/safetensors (8-byte LE header length, JSON header, raw data).
// Everything that goes wrong with a file is a shardlm::Error naming the file, the tensor and the fix.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::io {

// A vector, not a map, so the order of the file (and of the writer) is kept.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One header entry. begin/end are byte offsets relative to the start of the data area.
struct TensorInfo {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// Reads the whole file. Tensors come back CPU, contiguous, in their stored dtype, in file (data
// offset) order. Supported dtypes: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL.
NamedTensors load_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);

// Header only, fully validated against the file size, in file order; reads no tensor data.
std::vector<TensorInfo> read_safetensors_header(const std::string& path,
                                                std::map<std::string, std::string>* metadata = nullptr);

// Writes atomically (path + ".tmp", fsync, rename), tensors in the given order. Tensors may be on
// any device and non-contiguous; they are copied to CPU one at a time while writing.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Throws one Error listing every missing, unexpected and mis-shaped tensor of `loaded` compared
// with `expected` (name -> shape); `path` names the file in the message.
void check_tensor_names_and_shapes(const std::string& path, const NamedTensors& loaded,
                                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected);

// The safetensors dtype string for a scalar type, and back; both throw Error when unsupported.
std::string safetensors_dtype_name(at::ScalarType type);
at::ScalarType safetensors_scalar_type(const std::string& dtype);

}  // namespace shardlm::io
