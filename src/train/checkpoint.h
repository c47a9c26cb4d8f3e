// Sharded checkpoints that survive crashes and load on another layout.
//   out_dir/checkpoints/step-000020/rank-00003.safetensors   one per rank that owns state: its
//        masters (fp32), Adam moments and (bf16/fp16) compute-dtype pieces under global HF names, each
//        piece tagged with its tensor-parallel index/size and element range (checkpoint_reader.h).
//        Ranks holding identical replicas (DDP, ZeRO-0 over dp) write once: dp rank 0.
//   out_dir/checkpoints/step-000020/checkpoint.json   written by rank 0 after every shard: step,
//        optimizer steps, data position, the trainer's state (loss scaler), config, layout, and each
//        shard file's size and CRC-32C.
//   out_dir/checkpoints/latest   the newest step directory's name (informational: a resume scans).
// A save writes step-N.tmp/, fsyncs files and directory, renames it into place, then prunes to the
// newest `keep`. A resume takes the newest checkpoint that verifies (sizes, checksums, finite values)
// and names every one it passes over; interrupted saves (*.tmp) are never read.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace shardlm::model {
class Llama;
}
namespace shardlm::parallel {
class Strategy;
struct ParallelDims;
}

namespace shardlm::train {

std::string checkpoints_root(const std::string& out_dir);
// Whether out_dir holds any checkpoint directory (complete or not): a resume must look at it.
bool has_checkpoint(const std::string& out_dir);

// Collective over the world. `state` is the trainer's own (loss scaler, data position, config,
// layout) and comes back from load_checkpoint. `fresh`: this run did not resume, so the
// checkpoints already in out_dir belong to another run and are removed.
void save_checkpoint(const std::string& out_dir, int64_t step, parallel::Strategy& strategy, const model::Llama& model,
                     const parallel::ParallelDims& dims, const nlohmann::json& state, int keep, bool fresh);

// The same save in two halves, so that training goes on while the shards are written (DCP's
// async_save): begin_checkpoint (collective) prepares step-N.tmp, copies this rank's pieces into
// host memory of their own and hands them to a writer thread, which writes, fsyncs and checksums the
// shard — no communication, so MPI's serialized threading holds; finish_checkpoint (collective)
// waits for the writer and commits as save_checkpoint does (checkpoint.json, the renames, pruning).
// Until then the save is a step-N.tmp directory, which no resume ever reads, so a crash meanwhile
// falls back to the previous checkpoint. A save not finished (an error) is abandoned: its writer is
// joined and step-N.tmp left for the next save to remove. Costs one host copy of the rank's state.
class PendingCheckpoint;
struct PendingCheckpointDeleter {
  void operator()(PendingCheckpoint* p) const;  // joins the writer; commits nothing
};
using PendingCheckpointPtr = std::unique_ptr<PendingCheckpoint, PendingCheckpointDeleter>;
// async false: the shard is written before it returns (no copy, no thread): save_checkpoint.
PendingCheckpointPtr begin_checkpoint(const std::string& out_dir, int64_t step, parallel::Strategy& strategy,
                                      const model::Llama& model, const parallel::ParallelDims& dims,
                                      const nlohmann::json& state, int keep, bool fresh, bool async = true);
// Returns the seconds this call waited for the writer.
double finish_checkpoint(PendingCheckpointPtr pending);

struct LoadedCheckpoint {
  std::string dir;
  int64_t step = 0;
  nlohmann::json meta;  // checkpoint.json
};
// Collective over the world: world rank 0 chooses the newest checkpoint that verifies (messages
// through `log` for every one skipped), every rank loads its state by global name and range.
// Fails when checkpoints exist but none is usable (nothing is overwritten).
std::optional<LoadedCheckpoint> load_checkpoint(const std::string& out_dir, parallel::Strategy& strategy,
                                                model::Llama& model, const parallel::ParallelDims& dims,
                                                const std::function<void(const std::string&)>& log);

// The newest checkpoint directory of out_dir that verifies (messages through `log` for every one
// skipped), "" when there is none; fails when checkpoints exist but none is usable.
std::string newest_usable_checkpoint(const std::string& out_dir, const std::function<void(const std::string&)>& log);

// Verifies one checkpoint directory: checkpoint.json, every shard's size and CRC-32C, every value
// finite. Returns the parsed checkpoint.json; fails naming the file and the problem.
nlohmann::json verify_checkpoint(const std::string& dir);

}  // namespace shardlm::train
