// safetensors reader and writer (see safetensors.h). The reader validates the whole header against
// the file size before it allocates anything, so a corrupt or truncated file fails with a message
// instead of a crash or a silently wrong model; tensor bytes are read straight into the tensors'
// storage (one copy, no staging buffer), since checkpoints run to gigabytes.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "util/error.h"

// Tensor bytes go between file and memory unchanged, which is only right on a little-endian host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace shardlm::io {
namespace {

using ordered_json = nlohmann::ordered_json;

// A header larger than this is corruption, not a real checkpoint (HF's own limit is 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeEntry kDtypes[] = {
    {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16}, {"F64", at::kDouble},
    {"I64", at::kLong},  {"I32", at::kInt},   {"I16", at::kShort},     {"I8", at::kChar},
    {"U8", at::kByte},   {"BOOL", at::kBool},
};
// Valid safetensors dtypes that libtorch 1.13 has no tensor type for: named so the message can say
// "unsupported" rather than "unknown", which points at a different fix.
const std::set<std::string> kKnownButUnsupported = {"U16",     "U32",     "U64",     "F8_E4M3", "F8_E5M2",
                                                    "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",      "C64"};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const auto& d : kDtypes) s += std::string(s.empty() ? "" : ", ") + d.name;
  return s;
}

std::string where(const std::string& path) { return "safetensors file '" + path + "': "; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

// Closes on every exit path, including the Error ones.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Hands the descriptor over so the caller can check close()'s result (it reports write errors).
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

Fd open_for_read(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      fail(where(path), "file not found; check the path (relative paths start at the current directory)");
    fail(where(path), "cannot open: ", std::strerror(err), "; check the path and its permissions");
  }
  Fd file(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(where(path), "cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail(where(path), "is not a regular file (a directory?); give the path of the .safetensors file itself");
  *size = static_cast<uint64_t>(st.st_size);
  return Fd(file.release());
}

// pread until done: one call moves at most ~2 GB on Linux, and signals may cut it short.
void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path,
                const std::string& what) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(where(path), "read error in ", what, ": ", std::strerror(errno));
    }
    if (got == 0)
      fail(where(path), "file ended while reading ", what, " (was it truncated while being read?)");
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void write_all(int fd, const void* src, uint64_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t put = ::write(fd, p, chunk);
    if (put < 0) {
      if (errno == EINTR) continue;
      fail("writing safetensors file '", path, "': ", std::strerror(errno),
           "; check free disk space and permissions");
    }
    p += put;
    n -= static_cast<uint64_t>(put);
  }
}

// Reads a non-negative integer that fits in int64 (shapes and offsets); anything else is rejected.
bool as_count(const ordered_json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
  } else {
    return false;
  }
  return *out <= static_cast<uint64_t>(INT64_MAX);
}

struct Header {
  std::vector<TensorInfo> tensors;  // in file (data offset) order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // absolute file offset of the data area
};

TensorInfo parse_entry(const std::string& path, const std::string& name, const ordered_json& e) {
  auto bad = [&](const auto&... parts) { fail(where(path), "tensor '", name, "': ", parts...); };
  if (!e.is_object())
    bad("header entry is a JSON ", e.type_name(),
        ", expected an object with dtype, shape and data_offsets; the file is corrupt");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key))
      bad("header entry has no \"", key, "\"; the file is corrupt or was written by a broken exporter");

  TensorInfo info;
  info.name = name;
  const auto& dtype = e["dtype"];
  if (!dtype.is_string()) bad("\"dtype\" is a JSON ", dtype.type_name(), ", expected a string like \"F32\"");
  info.dtype = dtype.get<std::string>();
  const DtypeEntry* d = find_dtype(info.dtype);
  if (!d && kKnownButUnsupported.count(info.dtype))
    bad("dtype ", info.dtype,
        " is not supported (libtorch 1.13 has no such tensor type); supported: ", supported_list(),
        ". Convert the tensor in Python, e.g. to F32 or BF16, and save again");
  if (!d) bad("unknown dtype \"", info.dtype, "\"; supported: ", supported_list());

  const auto& shape = e["shape"];
  if (!shape.is_array()) bad("\"shape\" is a JSON ", shape.type_name(), ", expected an array of sizes");
  uint64_t numel = 1;
  for (const auto& v : shape) {
    uint64_t dim = 0;
    if (!as_count(v, &dim))
      bad("\"shape\" ", shape.dump(), " holds ", v.dump(), ", expected non-negative integers");
    info.shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel))
      bad("shape ", shape.dump(), " has more elements than fit in 64 bits");
  }

  const auto& offs = e["data_offsets"];
  if (!offs.is_array() || offs.size() != 2 || !as_count(offs[0], &info.begin) ||
      !as_count(offs[1], &info.end))
    bad("\"data_offsets\" is ", offs.dump(), ", expected [begin, end] with non-negative integers");
  if (info.end < info.begin)
    bad("data_offsets [", info.begin, ", ", info.end, "] end before they begin; the file is corrupt");

  const uint64_t elem = at::elementSize(d->type);
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, elem, &expected)) bad("shape ", shape.dump(), " is too large");
  const uint64_t found = info.end - info.begin;
  if (found != expected)
    bad("dtype ", info.dtype, " and shape ", shape_str(info.shape), " need ", expected, " bytes (", numel,
        " elements x ", elem, " bytes) but data_offsets [", info.begin, ", ", info.end, "] hold ", found,
        " bytes; the header is inconsistent, re-export the file");
  return info;
}

Header parse_header(int fd, uint64_t file_size, const std::string& path) {
  if (file_size < 8)
    fail(where(path), "file is only ", file_size,
         " bytes, shorter than the 8-byte header length; it is truncated or not a safetensors file");
  unsigned char len_bytes[8];
  read_exact(fd, len_bytes, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes)
    fail(where(path), "header length ", n, " bytes is implausible (limit ", kMaxHeaderBytes,
         "); the file is corrupt or not a safetensors file");
  if (n > file_size - 8)
    fail(where(path), "header length ", n, " bytes is larger than the rest of the file (", file_size - 8,
         " bytes); the file is truncated or not a safetensors file");

  std::string text(n, '\0');
  read_exact(fd, text.data(), n, 8, path, "the header");
  // The JSON parser keeps only one of two equal keys; a repeated tensor name means corruption.
  std::set<std::string> names;
  std::string repeated;
  auto note_repeats = [&](int depth, ordered_json::parse_event_t event, ordered_json& parsed) {
    if (depth == 1 && event == ordered_json::parse_event_t::key &&
        !names.insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text, note_repeats);
  } catch (const ordered_json::exception& e) {
    fail(where(path), "header is not valid JSON (", e.what(),
         "); the file is corrupt or not a safetensors file");
  }
  if (!j.is_object())
    fail(where(path), "header is a JSON ", j.type_name(),
         ", expected an object; the file is corrupt or not a safetensors file");

  if (!repeated.empty())
    fail(where(path), "tensor '", repeated, "' appears twice in the header; the file is corrupt");

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail(where(path), "\"__metadata__\" is a JSON ", value.type_name(),
             ", expected an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(where(path), "metadata entry '", mk, "' is ", mv.dump(),
               "; safetensors metadata values must be strings");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(path, key, value));
  }

  // By (begin, end): an empty tensor at offset X was written before the tensor that starts at X.
  // Stable, so empty tensors sharing an offset keep the header's (ordered_json) order.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* prev = nullptr;  // last non-empty tensor; empty ones overlap nothing
  for (const auto& t : h.tensors) {
    if (t.end > data_size)
      fail(where(path), "truncated: tensor '", t.name, "' needs bytes [", t.begin, ", ", t.end,
           ") but the data area has only ", data_size, " bytes; re-download or re-export the file");
    if (t.begin == t.end) continue;
    if (prev && t.begin < prev->end)
      fail(where(path), "tensors '", prev->name, "' (bytes [", prev->begin, ", ", prev->end, ")) and '",
           t.name, "' (bytes [", t.begin, ", ", t.end, ")) overlap; the file is corrupt");
    prev = &t;
  }
  return h;
}

void check_bool_bytes(const at::Tensor& t, const std::string& path, const std::string& name) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (p[i] > 1)
      fail(where(path), "tensor '", name, "' has dtype BOOL but byte ", i, " is ", int(p[i]),
           " (only 0 and 1 are valid); the file is corrupt");
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Deletes the temporary file unless the rename went through, so a failed save leaves no debris.
struct TmpFileGuard {
  std::string path;
  bool committed = false;
  ~TmpFileGuard() {
    if (!committed) ::unlink(path.c_str());
  }
};

}  // namespace

std::string safetensors_dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  fail("dtype ", c10::toString(type),
       " cannot be stored in safetensors by shardlm; supported: ", supported_list(),
       ". Convert the tensor first, e.g. tensor.to(at::kFloat)");
}

at::ScalarType safetensors_scalar_type(const std::string& dtype) {
  if (const DtypeEntry* d = find_dtype(dtype)) return d->type;
  fail("safetensors dtype \"", dtype, "\" is not supported; supported: ", supported_list());
}

std::vector<TensorInfo> read_safetensors_header(const std::string& path,
                                                std::map<std::string, std::string>* metadata) {
  uint64_t size = 0;
  Fd fd = open_for_read(path, &size);
  Header h = parse_header(fd.get(), size, path);
  if (metadata) *metadata = std::move(h.metadata);
  return std::move(h.tensors);
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  uint64_t size = 0;
  Fd fd = open_for_read(path, &size);
  Header h = parse_header(fd.get(), size, path);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint only; failure is harmless

  NamedTensors out;
  out.reserve(h.tensors.size());
  for (const auto& info : h.tensors) {
    const at::ScalarType type = find_dtype(info.dtype)->type;
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
    const uint64_t nbytes = info.end - info.begin;
    if (nbytes > 0) {
      read_exact(fd.get(), t.data_ptr(), nbytes, h.data_start + info.begin, path,
                 "tensor '" + info.name + "'");
      if (type == at::kBool) check_bool_bytes(t, path, info.name);
    }
    out.emplace_back(info.name, std::move(t));
  }
  if (metadata) *metadata = std::move(h.metadata);
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Validate and lay out everything before touching the disk, so a bad argument writes nothing.
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& [name, t] : tensors) {
    auto bad = [&](const auto&... parts) {
      fail("saving safetensors file '", path, "': tensor '", name, "': ", parts...);
    };
    if (name.empty()) bad("empty tensor name; every tensor needs a name");
    if (name == "__metadata__") bad("the name is reserved for the metadata block; rename the tensor");
    if (!names.insert(name).second) bad("name appears twice; tensor names must be unique");
    if (!t.defined()) bad("tensor is undefined (empty at::Tensor)");
    if (t.layout() != at::kStrided) bad("only dense tensors can be saved; call .to_dense() first");
    const DtypeEntry* d = nullptr;
    for (const auto& e : kDtypes)
      if (e.type == t.scalar_type()) d = &e;
    if (!d)
      bad("dtype ", c10::toString(t.scalar_type()), " is not supported; supported: ", supported_list(),
          ". Convert it first, e.g. .to(at::kFloat)");
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {
        {"dtype", d->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    sizes.push_back(nbytes);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::exception& e) {
    fail("saving safetensors file '", path, "': a tensor name or metadata string is not valid UTF-8 (",
         e.what(), ")");
  }
  // Padding to 8 keeps the data area 8-byte aligned for readers that mmap the file.
  text.append((8 - text.size() % 8) % 8, ' ');

  TmpFileGuard tmp{path + ".tmp"};
  int raw = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (raw < 0)
    fail("saving safetensors file '", path, "': cannot create '", tmp.path, "': ", std::strerror(errno),
         "; check that the directory exists and is writable");
  Fd fd(raw);
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  write_all(fd.get(), len_bytes, 8, tmp.path);
  write_all(fd.get(), text.data(), text.size(), tmp.path);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i] == 0) continue;
    // One tensor at a time, so a GPU model never needs a second full copy in host memory.
    at::Tensor cpu = tensors[i].second.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
    write_all(fd.get(), cpu.data_ptr(), sizes[i], tmp.path);
  }
  if (::fsync(fd.get()) != 0)
    fail("saving safetensors file '", path, "': fsync failed: ", std::strerror(errno),
         "; check free disk space");
  if (::close(fd.release()) != 0)
    fail("saving safetensors file '", path, "': close failed: ", std::strerror(errno),
         "; check free disk space");
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    fail("saving safetensors file '", path, "': cannot rename '", tmp.path,
         "' onto it: ", std::strerror(errno), "; is the path a directory, or on a read-only file system?");
  tmp.committed = true;
  // The rename is durable only once the directory entry is on disk; best effort, as some file
  // systems refuse fsync on directories.
  int dir = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void check_tensor_names_and_shapes(
    const std::string& path, const NamedTensors& loaded,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected) {
  std::map<std::string, const std::vector<int64_t>*> want;
  for (const auto& [name, shape] : expected) want.emplace(name, &shape);

  std::vector<std::string> missing, wrong_shape, unexpected;
  std::set<std::string> seen;
  for (const auto& [name, t] : loaded) {
    std::vector<int64_t> shape = t.defined() ? t.sizes().vec() : std::vector<int64_t>{};
    if (!seen.insert(name).second) {
      unexpected.push_back("duplicate: " + name);
      continue;
    }
    auto it = want.find(name);
    if (it == want.end())
      unexpected.push_back("unexpected: " + name + " " + shape_str(shape));
    else if (*it->second != shape)
      wrong_shape.push_back("wrong shape: " + name + ": model expects " + shape_str(*it->second) +
                            ", file has " + shape_str(shape));
  }
  for (const auto& [name, shape] : expected)
    if (!seen.count(name)) missing.push_back("missing: " + name + " " + shape_str(shape));
  if (missing.empty() && wrong_shape.empty() && unexpected.empty()) return;

  std::ostringstream msg;
  msg << where(path) << "tensors do not match the model: " << missing.size() << " missing, "
      << wrong_shape.size() << " with the wrong shape, " << unexpected.size() << " unexpected";
  constexpr size_t kMaxLines = 20;
  size_t shown = 0, total = missing.size() + wrong_shape.size() + unexpected.size();
  for (const auto* group : {&missing, &wrong_shape, &unexpected})
    for (const auto& line : *group)
      if (shown < kMaxLines) {
        msg << "\n  " << line;
        ++shown;
      }
  if (total > shown) msg << "\n  ... and " << (total - shown) << " more";
  msg << "\nCheck that the model config (layers, hidden size, vocab size, tied embeddings) matches "
         "the one the checkpoint was written for.";
  throw Error(msg.str());
}

}  // namespace shardlm::io
