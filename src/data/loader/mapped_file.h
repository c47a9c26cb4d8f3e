// A whole file mapped read-only into memory, shared by the readers that must not copy what they
// read (token files, data/loader/token_file.h; loss-mask sidecars, data/loader/loss_mask.h): pages come from the
// page cache on demand, ranks on one machine share one copy, and nothing is read whole up front.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace shardlm::data {

// A read-only private mapping of a whole file, unmapped with its last user.
struct MappedFile {
  const unsigned char* bytes = nullptr;  // null for an empty file: mmap refuses length 0
  int64_t size = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();
};

// Maps the existing regular file `path`; errors name it as `what` ("token file", "loss-mask file").
std::shared_ptr<const MappedFile> map_whole_file(const std::string& path, const std::string& what);

}  // namespace shardlm::data
