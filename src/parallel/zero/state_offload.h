// Optimizer states on NVMe (zero_optimization.offload_optimizer.device "nvme", ZeRO-Infinity's
// optimizer offload): this rank's master shards (where they are separate from the compute
// parameters: fp32 masters under 16-bit compute, or any master kept apart from a GPU's shard, bf16
// masters too) and Adam moments (any optimizer.state_precision, with 8-bit absmax values; with bf16
// masters and Kahan summation, the bf16 compensation) live in files under nvme_path between steps, and the ZeRO engine's step streams
// them through util::FileStore (O_DIRECT where the filesystem allows it): chunk k+1 is read while
// chunk k is stepped, chunk k is written back asynchronously, never more than buffer_count chunk
// buffers in memory. The update is the optimizer's own, in pieces (optim/adamw.h step_pieces), so a
// run with offload computes bit for bit what the same run without it computes.
//
// Chunks are fixed-size: the optimizer's segments, in order, are cut into pieces that fill chunks
// of chunk_elements elements (DeepSpeed's sub_group_size, the unit it swaps; 8-bit pieces on quantization-block boundaries of their parameter, others on
// multiples of 64 elements of their segment); one file per chunk.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "parallel/zero/host_optimizer.h"
#include "util/direct_file_store.h"

namespace shardlm::parallel {

struct StateOffloadOptions {
  std::string dir;                                              // nvme_path
  std::string key = "zero_optimization.offload_optimizer.nvme_path";  // named in errors
  int buffer_count = 4;                                         // chunk buffers in memory (>= 2)
  int64_t chunk_elements = int64_t{1} << 16;                    // state elements per chunk file
  int rank = 0;                                                 // names the files
  std::string name = "states";                                  // ditto: one engine's of a rank's
  util::DirectIo direct = util::DirectIo::Auto;
};

class StateOffload {
 public:
  // Takes every segment's states from `adam` (and, with separate_masters, its fp32 master: the
  // caller drops its own references to the master storage afterwards), writes them to the files
  // and leaves `adam` holding none. The store's constructor checks the directory first, with the
  // states' bytes as its reserve.
  StateOffload(optim::AdamW& adam, bool separate_masters, StateOffloadOptions opts);
  ~StateOffload();  // waits for I/O in flight and removes the files

  int64_t bytes() const { return bytes_; }  // state bytes on disk (this rank)
  int64_t buffer_bytes() const { return static_cast<int64_t>(buffers_.size()) * chunk_capacity_; }
  size_t chunks() const { return chunks_.size(); }
  // The chunks' pieces, in the order step() passes them (a GPU run copies their gradients down and
  // their parameters up chunk by chunk: host_optimizer.h ChunkTransfers).
  std::vector<std::vector<OffloadPiece>> chunk_pieces() const;
  // 8-bit blocks shared between ranks: step() reads every gradient in a pass of its own first.
  bool shares_blocks() const;
  util::IoPath io_path() const;
  std::string describe() const;  // for the log: bytes, directory, I/O path, chunks and buffers

  // One optimizer step over the files (the optimizer's begin_step included). on_piece runs after
  // each piece is updated, while its master is in memory (16-bit compute: cast it to the shard);
  // before_chunk, where given, runs before each chunk steps, with the segments of its pieces in order
  // (parameter offload pages their units in there).
  void step(double lr, const std::vector<double>* grad_multipliers,
            const std::function<void(const optim::AdamW::Piece&)>& on_piece,
            const std::function<void(const std::vector<size_t>& segments)>& before_chunk = {});

  // Checkpoints: page_in gives the optimizer memory of its own for every segment's states, read from
  // the files (master_for(i): where segment i's master goes, with separate masters); page_out writes
  // them back (write=true: they were changed, e.g. loaded from a checkpoint) and drops them again.
  void page_in(const std::function<at::Tensor(size_t segment)>& master_for);
  void page_out(bool write);
  bool paged_in() const { return paged_in_; }
  // After the caller dropped its own references to paged-out memory (the masters): return the freed
  // heap pages to the system (malloc_trim), so the offloaded bytes leave the resident set.
  static void return_freed_memory();

  struct IoTotals {
    int64_t bytes_read = 0, bytes_written = 0;
    double wait_seconds = 0;  // step time spent waiting for reads and writes
  };
  const IoTotals& io_totals() const { return totals_; }

 private:
  struct PieceLayout {
    size_t segment;
    int64_t begin, numel, blocks;
    int64_t master_off = -1, m_off = 0, v_off = 0, a1_off = -1, a2_off = -1, c_off = -1;  // c: Kahan's compensation
  };
  struct Chunk {
    std::vector<PieceLayout> pieces;
    int64_t bytes = 0;  // rounded up to 4096
    std::string file;
  };
  void plan_chunks(int64_t chunk_elements);
  bool shares(const PieceLayout& pl) const;  // the piece holds an 8-bit block shared between ranks
  std::vector<optim::AdamW::Piece> pieces_in(const Chunk& c, char* buf) const;
  void fill(const Chunk& c, char* buf) const;      // resident states -> buffer
  void spill(const Chunk& c, const char* buf);     // buffer -> resident states
  struct Pending {  // a chunk's write in flight, from one buffer
    util::FileStore::Ticket ticket;
    int64_t chunk = -1;
  };
  void start_write(Pending& w, size_t k, const char* buf);
  void land(Pending& w, double* wait_seconds);  // wait for it
  optim::AdamW& adam_;
  bool separate_masters_;
  StateOffloadOptions opts_;
  std::vector<at::ScalarType> master_dtype_, moment_dtype_;
  std::vector<Chunk> chunks_;
  int64_t bytes_ = 0, chunk_capacity_ = 0;
  std::vector<std::unique_ptr<char, void (*)(void*)>> buffers_;
  std::unique_ptr<util::FileStore> store_;
  bool paged_in_ = false;
  IoTotals totals_;
};

}  // namespace shardlm::parallel
