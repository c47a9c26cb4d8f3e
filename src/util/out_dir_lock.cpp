// See out_dir_lock.h.
#include "util/out_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace shardlm {
namespace {

std::string lock_path(const std::string& out_dir) { return (std::filesystem::path(out_dir) / ".lock").string(); }

// Takes the lock on `path` (opened as fd) or fails naming the holder recorded in the file.
void lock_or_fail(int fd, const std::string& out_dir) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  const int err = errno;
  if (err != EWOULDBLOCK) fail("cannot lock ", lock_path(out_dir), ": ", std::strerror(err));
  std::stringstream holder;
  holder << std::ifstream(lock_path(out_dir)).rdbuf();
  std::string who = holder.str();
  while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
  ::close(fd);
  fail("out_dir '", out_dir, "' is in use by another job (", who.empty() ? "holder unknown" : who,
       "); two jobs writing one out_dir would mix their metrics and checkpoints. Wait for it to finish, stop it, "
       "or pass another --out_dir");
}

}  // namespace

OutDirLock::OutDirLock(const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("cannot create out_dir '", out_dir, "': ", ec.message());
  const std::string path = lock_path(out_dir);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  lock_or_fail(fd_, out_dir);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const std::string who = "pid " + std::to_string(getpid()) + " on " + host + "\n";
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size()))
    fail("cannot write ", path, ": ", std::strerror(errno));
}

OutDirLock::~OutDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void OutDirLock::check_free(const std::string& out_dir) {
  const std::string path = lock_path(out_dir);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no lock file: nobody holds it
  lock_or_fail(fd, out_dir);
  ::close(fd);
}

bool OutDirLock::held(const std::string& out_dir) {
  const int fd = ::open(lock_path(out_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool free = flock(fd, LOCK_SH | LOCK_NB) == 0;  // shared: never blocks another prober
  ::close(fd);                                          // (closing releases it)
  return !free;
}

}  // namespace shardlm
