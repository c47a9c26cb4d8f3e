// Mapping whole files read-only (mapped_file.h).
#include "data/loader/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace shardlm::data {

MappedFile::~MappedFile() {
  if (bytes) munmap(const_cast<unsigned char*>(bytes), static_cast<size_t>(size));
}

std::shared_ptr<const MappedFile> map_whole_file(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", what, " ", path, ": ", std::strerror(errno), "; check its permissions");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read the size of ", what, " ", path, ": ", std::strerror(err), "; check the disk and rerun");
  }
  auto m = std::make_shared<MappedFile>();
  m->size = static_cast<int64_t>(st.st_size);
  if (m->size > 0) {
    void* addr = ::mmap(nullptr, static_cast<size_t>(m->size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (addr == MAP_FAILED) {
      fail("cannot map ", what, " ", path, " (", m->size, " bytes): ", std::strerror(err),
           "; it must be a regular file, and the process needs that much address space (ulimit -v)");
    }
    m->bytes = static_cast<const unsigned char*>(addr);
  } else {
    ::close(fd);
  }
  return m;
}

}  // namespace shardlm::data
