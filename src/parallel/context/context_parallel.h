// Context parallelism (issue 43): every sequence split over the c ranks of the context-parallel
// group (ParallelDims::cp_comm) in the load-balanced chunks of chunks.h, attention over the whole
// sequence through one of three exchanges of keys and values (Megatron's --cp-comm-type):
//   p2p        the ring (ring_attention.h): K/V blocks travel rank to rank by send/recv,
//              overlapped with the current block's attention, merged by log-sum-exp;
//   all_gather every rank gathers all K/V once per layer (backward: reduce-scatter of dK/dV);
//   all_to_all DeepSpeed-Ulysses: sequence split -> head split, attention over the whole sequence
//              for h/c heads, and back (KV heads repeated when c does not divide them).
// The model reaches it only through model::ContextAttention; the trainer hands each rank its
// chunks of every batch (split_batch), and the gradients are averaged over dp x cp. Under tensor
// parallelism each rank exchanges its heads' K/V with the cp ranks holding the same heads; pipeline
// stages pass each rank's chunks on.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "data/loader/data_loader.h"
#include "model/context_attention.h"
#include "model/llama_config.h"

namespace shardlm::parallel::context {

enum class Mode { P2p, AllGather, AllToAll };
// "p2p" | "all_gather" | "all_to_all".
Mode parse_mode(const std::string& name);

// Refuses what context parallelism over c ranks cannot run, naming the key and the fix: a
// sequence length that does not split into 2c chunks; all_to_all with attention heads that c does
// not divide (the heads of one tensor-parallel rank, tp of them). A mixture-of-experts model's
// load-balancing sums and capacity count over the whole sequence (model/context_attention.h).
void check_context_parallel(const model::LlamaConfig& cfg, int c, Mode mode, int64_t seq_len, int tp = 1);

// The attention backend the model calls (Llama::set_context_attention) on the group `cp`.
std::shared_ptr<model::ContextAttention> make_context_attention(comm::CommPtr cp, Mode mode);

// This rank's part of a batch: inputs, targets and (packed rows) positions and segments, split as
// chunks.h does; the fine-tuning divisor's rank count (Batch::world) counts every rank that now
// averages the gradient (data-parallel x c).
data::DataLoader::Batch split_batch(const data::DataLoader::Batch& b, int c, int rank);

}  // namespace shardlm::parallel::context
