// See direct_file_store.h. An operation is split into chunks of buffer_bytes; the pool's threads
// take chunks in submission order, each with one staging buffer (waiting for a free one: that is
// the bound), copy between the caller's memory and the buffer, and pwrite/pread the buffer at the
// chunk's offset. O_DIRECT needs 4096-aligned memory, offsets and lengths: buffers are aligned,
// chunk offsets are multiples of buffer_bytes, and a file's last chunk is written padded to 4096
// with zeros, the file then cut to its size (ftruncate) by the chunk that completes the operation.
#include "util/direct_file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "util/error.h"
#include "util/units.h"

namespace shardlm::util {

namespace {

using Clock = std::chrono::steady_clock;

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

std::string human(int64_t b) { return format_bytes(static_cast<double>(b)); }

std::string errno_text(int e) { return std::strerror(e); }

// O_DIRECT first (unless off); EINVAL from open means the filesystem refuses it: open buffered.
int open_file(const std::string& path, int flags, DirectIo direct, IoPath* took, int* direct_errno) {
  *direct_errno = 0;
  if (direct == DirectIo::Auto) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      *took = IoPath::Direct;
      return fd;
    }
    if (errno != EINVAL) return -1;
    *direct_errno = errno;
  }
  *took = IoPath::Buffered;
  return ::open(path.c_str(), flags | O_CLOEXEC, 0644);
}

}  // namespace

const char* io_path_name(IoPath p) { return p == IoPath::Direct ? "O_DIRECT" : "buffered + fadvise(DONTNEED)"; }

int64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

// ---- operations and the pool ----------------------------------------------------------------------

struct FileStore::Op {
  bool write = true;
  std::string name, path, dir, key;
  int fd = -1;
  IoPath took = IoPath::Direct;
  char* user = nullptr;  // the caller's memory (const for writes)
  int64_t bytes = 0, chunk = 0, chunks = 0;
  Clock::time_point submitted = Clock::now();
  std::atomic<int64_t> left{0};  // chunks not yet finished
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::string error;  // the first chunk's error
  double seconds = 0;

  void set_error(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = e;
  }
};

struct FileStore::Pool {
  struct Task {
    std::shared_ptr<Op> op;
    int64_t index;
  };
  std::mutex mu;
  std::condition_variable work_cv, buffer_cv;
  std::deque<Task> tasks;
  std::vector<void*> free_buffers, all_buffers;
  std::vector<std::thread> threads;
  bool stopping = false;
  int64_t buffer_bytes = 0;
  Stats stats;
  std::atomic<int64_t> zero_copy_bytes{0};

  ~Pool() {
    for (void* b : all_buffers) std::free(b);
  }
  void* take_buffer() {
    std::unique_lock<std::mutex> lock(mu);
    buffer_cv.wait(lock, [this] { return !free_buffers.empty(); });
    void* b = free_buffers.back();
    free_buffers.pop_back();
    return b;
  }
  void give_buffer(void* b) {
    {
      std::lock_guard<std::mutex> lock(mu);
      free_buffers.push_back(b);
    }
    buffer_cv.notify_one();
  }
  void run() {
    for (;;) {
      Task t;
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [this] { return stopping || !tasks.empty(); });
        if (tasks.empty()) return;  // stopping, and nothing left
        t = std::move(tasks.front());
        tasks.pop_front();
      }
      if (zero_copy(*t.op, t.index)) {
        do_chunk(*t.op, t.index, t.op->user + t.index * t.op->chunk);
      } else {
        void* buf = take_buffer();
        do_chunk(*t.op, t.index, static_cast<char*>(buf));
        give_buffer(buf);
      }
      if (t.op->left.fetch_sub(1) == 1) finish(*t.op);
    }
  }

  // O_DIRECT straight from (into) the caller's memory, with no staging buffer and no copy: where
  // the chunk starts on a 4096-byte boundary of it and is whole blocks long.
  static bool zero_copy(const Op& op, int64_t index) {
    const int64_t off = index * op.chunk;
    const int64_t n = std::min(op.chunk, op.bytes - off);
    return op.took == IoPath::Direct && reinterpret_cast<uintptr_t>(op.user + off) % kDirectIoAlignment == 0 &&
           n % kDirectIoAlignment == 0;
  }

  // buf: a staging buffer, or the caller's memory at the chunk (zero_copy).
  void do_chunk(Op& op, int64_t index, char* buf) {
    {
      std::lock_guard<std::mutex> lock(op.mu);
      if (!op.error.empty()) return;  // an earlier chunk failed: the operation has failed
    }
    const int64_t off = index * op.chunk;
    const int64_t n = std::min(op.chunk, op.bytes - off);
    const bool direct = op.took == IoPath::Direct;
    const int64_t len = direct ? round_up(n, kDirectIoAlignment) : n;  // O_DIRECT: whole blocks
    if (op.write) {
      if (buf != op.user + off) {
        std::memcpy(buf, op.user + off, n);
        if (len > n) std::memset(buf + n, 0, len - n);
      } else {
        zero_copy_bytes += n;
      }
      for (int64_t done = 0; done < len;) {
        const ssize_t w = ::pwrite(op.fd, buf + done, len - done, off + done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0 || (direct && w % kDirectIoAlignment != 0)) {
          const int e = w < 0 ? errno : ENOSPC;  // a short write that cannot go on: the device is full
          op.set_error(write_error(op, e, off + done));
          return;
        }
        done += w;
      }
      if (!direct) {  // write this chunk back now, then drop its pages from the cache
        ::sync_file_range(op.fd, off, n, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        ::posix_fadvise(op.fd, off, n, POSIX_FADV_DONTNEED);
      }
    } else {
      for (int64_t done = 0; done < n;) {
        const ssize_t r = ::pread(op.fd, buf + done, len - done, off + done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          op.set_error("file store: reading '" + op.path + "' failed at byte " + std::to_string(off + done) + ": " +
                       (r < 0 ? errno_text(errno) : std::string("the file ended early")));
          return;
        }
        done += r;
        if (direct && done < n && done % kDirectIoAlignment != 0) {
          op.set_error("file store: short O_DIRECT read of '" + op.path + "' at byte " + std::to_string(off + done));
          return;
        }
      }
      if (buf != op.user + off) std::memcpy(op.user + off, buf, n);
      else zero_copy_bytes += n;
      if (!direct) ::posix_fadvise(op.fd, off, n, POSIX_FADV_DONTNEED);
    }
  }

  static std::string write_error(const Op& op, int e, int64_t at) {
    const int64_t free = free_bytes(op.dir);
    if (e == ENOSPC || e == EDQUOT)
      return "file store: no space left writing '" + op.path + "' (" + human(op.bytes) + "; failed at byte " +
             std::to_string(at) + ", " + (free >= 0 ? human(free) : std::string("unknown")) + " free on its device" +
             (e == EDQUOT ? ", disk quota reached" : "") + "): free space in " + op.dir + " or point " + op.key +
             " at a larger disk";
    return "file store: writing '" + op.path + "' failed at byte " + std::to_string(at) + ": " + errno_text(e);
  }

  void finish(Op& op) {
    // The file was opened without O_TRUNC (written in place): cut what lies past the new end (an
    // older, longer file; O_DIRECT's last block rounded up to 4096).
    struct stat st {};
    if (op.write && op.error.empty() && (::fstat(op.fd, &st) != 0 || st.st_size != op.bytes) &&
        ::ftruncate(op.fd, op.bytes) != 0)
      op.set_error("file store: cutting '" + op.path + "' to " + std::to_string(op.bytes) + " bytes failed: " +
                   errno_text(errno));
    // Buffered: readahead may have brought in pages beyond the chunk a thread dropped (and pages
    // under I/O are not dropped); once the operation is complete, none of the file needs the cache.
    if (op.took == IoPath::Buffered) {
      if (op.write) ::fdatasync(op.fd);
      ::posix_fadvise(op.fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    ::close(op.fd);
    op.fd = -1;
    if (op.write && !op.error.empty()) ::unlink(op.path.c_str());  // no later read takes a partial file for data
    {
      std::lock_guard<std::mutex> lock(mu);
      (op.write ? stats.bytes_written : stats.bytes_read) += op.error.empty() ? op.bytes : 0;
      (op.took == IoPath::Direct ? stats.files_direct : stats.files_buffered)++;
    }
    {
      std::lock_guard<std::mutex> lock(op.mu);
      op.seconds = std::chrono::duration<double>(Clock::now() - op.submitted).count();
      op.finished = true;
    }
    op.cv.notify_all();
  }
};

// ---- Ticket ---------------------------------------------------------------------------------------

void FileStore::Ticket::wait() {
  if (!op_) return;
  std::unique_lock<std::mutex> lock(op_->mu);
  op_->cv.wait(lock, [this] { return op_->finished; });
  if (!op_->error.empty()) fail(op_->error);
}
bool FileStore::Ticket::done() const {
  if (!op_) return true;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->finished;
}
IoPath FileStore::Ticket::path() const { return op_ ? op_->took : IoPath::Direct; }
int64_t FileStore::Ticket::bytes() const { return op_ ? op_->bytes : 0; }
double FileStore::Ticket::seconds() const {
  if (!op_) return 0;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->seconds;
}

// ---- FileStore ------------------------------------------------------------------------------------

FileStore::FileStore(FileStoreOptions opts) : opts_(std::move(opts)) {
  const std::string& dir = opts_.dir;
  const std::string& key = opts_.key;
  if (opts_.buffer_bytes <= 0 || opts_.buffer_bytes % kDirectIoAlignment != 0)
    fail("file store: buffer size ", opts_.buffer_bytes, " must be a positive multiple of ", kDirectIoAlignment,
         " bytes (O_DIRECT transfers whole blocks)");
  if (opts_.buffer_count < 1) fail("file store: buffer_count must be at least 1, got ", opts_.buffer_count);
  if (opts_.threads < 1) fail("file store: threads must be at least 1, got ", opts_.threads);
  if (dir.empty()) fail(key, " is empty: set it to a directory on a local disk (NVMe) for the offloaded files");
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    fail(key, " = '", dir, "' does not exist (", errno_text(errno), "): create it (mkdir -p ", dir,
         ") or point ", key, " at an existing directory");
  if (!S_ISDIR(st.st_mode)) fail(key, " = '", dir, "' is not a directory: point ", key, " at a directory");
  // Writable, and whether it takes O_DIRECT: one block written to a probe file.
  const std::string probe = dir + "/.shardlm_store_probe." + std::to_string(::getpid());
  IoPath took = IoPath::Direct;
  int direct_errno = 0;
  const int fd = open_file(probe, O_WRONLY | O_CREAT | O_TRUNC, opts_.direct, &took, &direct_errno);
  if (fd < 0)
    fail(key, " = '", dir, "' is not writable (creating a file there failed: ", errno_text(errno), "): fix its ",
         "permissions or point ", key, " at a writable directory");
  void* block = nullptr;
  if (::posix_memalign(&block, kDirectIoAlignment, kDirectIoAlignment) != 0) fail("file store: out of memory");
  std::memset(block, 0, kDirectIoAlignment);
  const ssize_t w = ::pwrite(fd, block, kDirectIoAlignment, 0);
  const int write_errno = errno;
  std::free(block);
  ::close(fd);
  ::unlink(probe.c_str());
  if (w != kDirectIoAlignment)
    fail(key, " = '", dir, "': writing a test block failed (", w < 0 ? errno_text(write_errno) : "short write",
         "): ", write_errno == ENOSPC ? "the disk is full; free space there or choose another disk" : "check the disk");
  path_ = took;
  path_detail_ = io_path_name(took);
  if (took == IoPath::Buffered)
    path_detail_ += opts_.direct == DirectIo::Off ? " (O_DIRECT off)"
                                                   : " (O_DIRECT refused by the filesystem: " + errno_text(direct_errno) + ")";
  const int64_t free = free_bytes(dir);
  if (opts_.reserve_bytes > 0 && free >= 0 && free < opts_.reserve_bytes)
    fail(key, " = '", dir, "' has ", human(free), " free but the offloaded files need ", human(opts_.reserve_bytes),
         ": free space there or point ", key, " at a larger disk");

  pool_ = std::make_unique<Pool>();
  pool_->buffer_bytes = opts_.buffer_bytes;
  for (int i = 0; i < opts_.buffer_count; ++i) {
    void* b = nullptr;
    if (::posix_memalign(&b, kDirectIoAlignment, opts_.buffer_bytes) != 0)
      fail("file store: cannot allocate ", opts_.buffer_count, " buffers of ", human(opts_.buffer_bytes));
    std::memset(b, 0, opts_.buffer_bytes);  // touch now: no page faults inside the I/O
    pool_->all_buffers.push_back(b);
    pool_->free_buffers.push_back(b);
  }
  for (int i = 0; i < opts_.threads; ++i) pool_->threads.emplace_back([p = pool_.get()] { p->run(); });
}

FileStore::~FileStore() {
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->stopping = true;  // the threads finish what is queued, then leave
  }
  pool_->work_cv.notify_all();
  for (auto& t : pool_->threads) t.join();
}

std::string FileStore::file_path(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail("file store: '", name, "' is not a plain file name (no '/')");
  return opts_.dir + "/" + name;
}

FileStore::Ticket FileStore::submit(std::shared_ptr<Op> op) {
  op->chunk = opts_.buffer_bytes;
  op->chunks = (op->bytes + op->chunk - 1) / op->chunk;
  op->left = op->chunks;
  if (op->chunks == 0) {  // an empty file: nothing to move
    pool_->finish(*op);
    return Ticket(op);
  }
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    for (int64_t i = 0; i < op->chunks; ++i) pool_->tasks.push_back({op, i});
  }
  pool_->work_cv.notify_all();
  return Ticket(op);
}

FileStore::Ticket FileStore::write_async(const std::string& name, const void* src, int64_t bytes) {
  if (bytes < 0) fail("file store: cannot write ", bytes, " bytes");
  auto op = std::make_shared<Op>();
  op->write = true;
  op->name = name;
  op->path = file_path(name);
  op->dir = opts_.dir;
  op->key = opts_.key;
  op->user = const_cast<char*>(static_cast<const char*>(src));
  op->bytes = bytes;
  int direct_errno = 0;
  // No O_TRUNC: an existing file is written over in place, so its blocks stay allocated. Replacing it
  // (a new file, or truncation) frees them and allocates new ones on every write, which on ext4 mounted
  // with `discard` (common on cloud disks) made each offload write several times slower than the disk
  // (0.22 against 3.2 GB/s for 768 KiB files here), and could meet a full disk at run time.
  op->fd = open_file(op->path, O_WRONLY | O_CREAT, opts_.direct, &op->took, &direct_errno);
  if (op->fd < 0)
    fail("file store: cannot create '", op->path, "': ", errno_text(errno), "; check ", opts_.key, " = '", opts_.dir,
         "'");
  return submit(op);
}

FileStore::Ticket FileStore::read_async(const std::string& name, void* dst, int64_t bytes) {
  if (bytes < 0) fail("file store: cannot read ", bytes, " bytes");
  auto op = std::make_shared<Op>();
  op->write = false;
  op->name = name;
  op->path = file_path(name);
  op->dir = opts_.dir;
  op->key = opts_.key;
  op->user = static_cast<char*>(dst);
  op->bytes = bytes;
  int direct_errno = 0;
  op->fd = open_file(op->path, O_RDONLY, opts_.direct, &op->took, &direct_errno);
  if (op->fd < 0)
    fail("file store: cannot open '", op->path, "' to read: ", errno_text(errno), " (was it removed while training? ",
         "it holds this run's state; check ", opts_.key, " = '", opts_.dir, "' and restart from the last checkpoint)");
  struct stat st {};
  if (::fstat(op->fd, &st) != 0 || st.st_size < bytes) {
    const int64_t has = st.st_size;
    ::close(op->fd);
    fail("file store: '", op->path, "' holds ", has, " bytes, fewer than the ", bytes, " asked for");
  }
  return submit(op);
}

bool FileStore::exists(const std::string& name) const { return file_bytes(name) >= 0; }

int64_t FileStore::file_bytes(const std::string& name) const {
  struct stat st {};
  if (::stat(file_path(name).c_str(), &st) != 0) return -1;
  return st.st_size;
}

void FileStore::remove(const std::string& name) {
  const std::string p = file_path(name);
  if (::unlink(p.c_str()) != 0 && errno != ENOENT) fail("file store: cannot remove '", p, "': ", errno_text(errno));
}

FileStore::Stats FileStore::stats() const {
  std::lock_guard<std::mutex> lock(pool_->mu);
  Stats s = pool_->stats;
  s.bytes_zero_copy = pool_->zero_copy_bytes.load();
  return s;
}

}  // namespace shardlm::util
