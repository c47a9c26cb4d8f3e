// A file store for NVMe offload (ZeRO-Infinity's optimizer states on disk): whole files of raw bytes
// written and read asynchronously, through O_DIRECT so that streaming gigabytes through the disk
// does not fill the page cache (and push out the memory training needs), on a small thread pool
// with a bounded number of 4096-aligned staging buffers. It knows nothing of models or tensors.
//
// - O_DIRECT is tried for every file; where the filesystem refuses it (EINVAL: some tmpfs, FUSE,
//   overlay or network filesystems) that file is written or read buffered, and the pages it used
//   are written back and dropped after each chunk (sync_file_range, posix_fadvise(DONTNEED)).
//   path() says which the directory takes; each Ticket says which its file took.
// - Data passes through buffer_count buffers of buffer_bytes each (posix_memalign 4096): the
//   caller's memory needs no alignment and the store never holds more than that. Where it is
//   aligned (4096) the O_DIRECT path moves whole-block chunks straight from or into it, no copy.
// - I/O runs on `threads` threads (the tested path; io_uring is not used: container seccomp
//   profiles often block it, and the thread pool reaches the disk's bandwidth here).
// - Errors are checked before training (a missing, unwritable or full directory: the constructor,
//   with statvfs against reserve_bytes) and at run time (ENOSPC, EDQUOT and other I/O errors:
//   Ticket::wait() throws shardlm::Error naming the file, the directory, the free space and the fix).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace shardlm::util {

constexpr int64_t kDirectIoAlignment = 4096;

// Bytes an unprivileged writer may still use on dir's filesystem (statvfs f_bavail x f_frsize).
int64_t free_bytes(const std::string& dir);

enum class DirectIo {
  Auto,  // O_DIRECT where the filesystem allows it, buffered (+ dropping the pages) elsewhere
  Off,   // always buffered (+ dropping the pages): for comparison and tests
};

enum class IoPath { Direct, Buffered };
const char* io_path_name(IoPath p);  // "O_DIRECT" | "buffered + fadvise(DONTNEED)"

struct FileStoreOptions {
  std::string dir;
  std::string key = "dir";        // the setting that chose dir, named in errors
  int64_t buffer_bytes = 4 << 20; // each staging buffer (a multiple of 4096)
  int buffer_count = 4;           // staging buffers: at most buffer_count x buffer_bytes in flight
  int threads = 2;                // I/O threads
  DirectIo direct = DirectIo::Auto;
  int64_t reserve_bytes = 0;      // the constructor fails unless dir has this much free
};

class FileStore {
 public:
  // Checks dir (exists, is a directory, writable: a probe file is created and removed; free space
  // against reserve_bytes) and whether it takes O_DIRECT, then starts the threads.
  explicit FileStore(FileStoreOptions opts);
  ~FileStore();  // waits for every operation still in flight
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // The directory's path, found by the probe: Direct, or Buffered when its filesystem refuses
  // O_DIRECT (or direct = Off); path_detail() adds why ("O_DIRECT refused: Invalid argument").
  IoPath path() const { return path_; }
  const std::string& path_detail() const { return path_detail_; }
  const FileStoreOptions& options() const { return opts_; }

  struct Op;
  // One write or read in flight. wait() returns once it completed and throws its error, if any.
  class Ticket {
   public:
    Ticket() = default;
    void wait();
    bool done() const;
    IoPath path() const;  // the path this file took
    int64_t bytes() const;
    double seconds() const;  // submission to completion (once done)

   private:
    friend class FileStore;
    explicit Ticket(std::shared_ptr<Op> op) : op_(std::move(op)) {}
    std::shared_ptr<Op> op_;
  };

  // Makes file `name` in dir hold the `bytes` bytes at src, writing over an existing file in place
  // (its blocks are reused: no allocation, so a full disk cannot stop a rewrite of the same size on
  // a filesystem that overwrites in place — ext4, xfs, tmpfs; copy-on-write ones allocate anew) and
  // cutting it to `bytes`. src must stay valid and unchanged until the ticket completes. Failing to
  // open the file throws here; I/O errors come from wait(), and a write that failed removes its file
  // (its contents are no longer the old ones either).
  Ticket write_async(const std::string& name, const void* src, int64_t bytes);
  // Reads the first `bytes` bytes of file `name` into dst (valid until the ticket completes); the
  // file must hold at least that many (checked here).
  Ticket read_async(const std::string& name, void* dst, int64_t bytes);
  void write(const std::string& name, const void* src, int64_t bytes) { write_async(name, src, bytes).wait(); }
  void read(const std::string& name, void* dst, int64_t bytes) { read_async(name, dst, bytes).wait(); }

  bool exists(const std::string& name) const;
  int64_t file_bytes(const std::string& name) const;  // -1 when absent
  void remove(const std::string& name);
  std::string file_path(const std::string& name) const;

  struct Stats {
    int64_t bytes_written = 0, bytes_read = 0;
    int64_t files_direct = 0, files_buffered = 0;  // operations by the path they took
    int64_t bytes_zero_copy = 0;  // moved straight from or into the caller's (aligned) memory
  };
  Stats stats() const;

 private:
  struct Pool;
  Ticket submit(std::shared_ptr<Op> op);
  FileStoreOptions opts_;
  IoPath path_ = IoPath::Direct;
  std::string path_detail_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace shardlm::util
