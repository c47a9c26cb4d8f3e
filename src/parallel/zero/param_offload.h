// Parameters on NVMe (zero_optimization.offload_param.device "nvme", ZeRO-Infinity's parameter
// offload, stage 3): the compute-dtype shard every unit all-gathers from exists only in a file under
// nvme_path between uses, so the parameters leave host memory as the optimizer states do with
// state_offload.h. The ZeRO engine reads a unit's file straight into its own slot of the gather
// buffer, ahead of the gather, inside the prefetch window (stage3_schedule.h), so the read of the
// next units overlaps this unit's compute; the gather then runs in place and nothing is kept. The
// optimizer step pages each shard in, in unit order with reads ahead, updates it and writes it back
// (with optimizer offload, inside the same streaming pass over the state chunks), never holding more
// than buffer_count shards at once. Files go through util::FileStore (O_DIRECT where the filesystem
// allows it), each rewritten in place (its blocks reused: no allocation while training).
#pragma once
#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "util/direct_file_store.h"

namespace shardlm::parallel {

struct ParamOffloadOptions {
  std::string dir;                                            // nvme_path
  std::string key = "zero_optimization.offload_param.nvme_path";  // named in errors
  int buffer_count = 5;  // shards paged in at once (reads ahead and writes in flight included), >= 2
  int rank = 0;          // names the files
  std::string name = "params";  // ditto: one engine's of a rank's (expert parallelism's second engine: its own)
  util::DirectIo direct = util::DirectIo::Auto;
};

class ParamOffload {
 public:
  // shards[u]: unit u's shard, a tensor owning its storage; undefined where the unit stays in memory.
  // Checks the directory (the store's constructor: the files' bytes as its reserve), writes every
  // shard to its file and frees its memory: the tensors (and views of them) stay valid, with no bytes.
  ParamOffload(std::vector<at::Tensor> shards, ParamOffloadOptions opts);
  ~ParamOffload();  // waits for I/O in flight and removes the files

  bool offloaded(size_t u) const { return u < units_.size() && units_[u].shard.defined(); }
  int64_t bytes() const { return bytes_; }  // shard bytes in files (this rank)
  util::IoPath io_path() const { return store_->path(); }
  std::string describe() const;  // for the log

  // Gives t's storage `bytes` of fresh 4096-aligned memory (zeroed, or only its tail up to the next
  // 4096 bytes): where O_DIRECT can move it without a copy. The engine's gather buffers use it too.
  // The blocks come from a cache of those freed before (the smallest that fits); this frees the cache.
  static void set_aligned_storage(const at::Tensor& t, size_t bytes, bool zeroed);
  static void release_cached_blocks();
  // A gather: starts reading unit u's file into dst (its shard's bytes; valid until the ticket is done).
  util::FileStore::Ticket read_into(size_t u, void* dst);

  // The step and checkpoints: unit u's shard gets memory again, holding its file's values (read) or
  // zeros; with read, the next offloaded units' reads start too while fewer than buffer_count shards
  // are in memory (a step visits the units in order).
  void page_in(size_t u, bool read);
  bool paged_in(size_t u) const { return offloaded(u) && units_[u].state == State::Resident; }
  // Frees unit u's memory, after writing it when `write` (asynchronously: finish() or a later call
  // that needs the buffer waits for it).
  void page_out(size_t u, bool write);
  // Pages out every unit still in memory (write: what they hold) and waits for every write.
  void finish(bool write);

  struct IoTotals {
    int64_t bytes_read = 0, bytes_written = 0;
  };
  const IoTotals& io_totals() const { return totals_; }

 private:
  enum class State { OnDisk, Reading, Resident, Writing };
  struct Unit {
    at::Tensor shard;
    std::string file;
    int64_t bytes = 0;
    State state = State::OnDisk;
    util::FileStore::Ticket ticket;  // the read or write in flight
  };
  void allocate(Unit& x, bool zeroed);
  void free_memory(Unit& x);
  void land(size_t u);             // the read or write of u in flight completed (a write: renamed, freed)
  void make_room(size_t budget);   // lands the oldest writes until fewer than budget shards are in memory
  size_t in_memory() const;
  ParamOffloadOptions opts_;
  std::vector<Unit> units_;
  int64_t bytes_ = 0;
  std::deque<size_t> writes_;  // units whose write is in flight, oldest first
  std::unique_ptr<util::FileStore> store_;
  IoTotals totals_;
};

}  // namespace shardlm::parallel
