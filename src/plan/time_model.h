// Seconds per optimizer step for a planned layout on a measured machine (machine_profile.h), by the
// phases the trainer times (metrics.jsonl's time_forward_s, time_backward_s, time_grad_sync_s,
// time_optimizer_s), so the report can set predicted beside measured and say where they part.
//
// One rank of the busiest pipeline stage (the most decoder layers; the head's stage on ties):
// - compute: every matrix product of the layers it runs (q, k, v, o, gate, up, down; the head) at
//   the shapes tensor parallelism leaves (m = b*s tokens), forward once and backward twice (dX and dW),
//   each at the measured rate of its shape; attention through the fused kernel at its measured
//   forward and backward rates (causal: (s+1)/2 keys per query; eager: two products of s x s and the
//   softmax's bytes); elementwise work (norms, rotary, SiLU, residual adds, casts, the loss's
//   softmax) as bytes at the stream rate, ELEMENTWISE_* passes over each tensor (time_model.cpp);
//   recomputation adds forward work in backward (full: every layer; selective: the attention core);
// - pipeline: the busiest stage's m micro-batches plus its bubble, what the schedule's action lists
//   leave it idle when run with each stage's times ((m + p - 1) micro-batch times for balanced stages
//   under GPipe and 1F1B; less for 1F1B on unbalanced ones);
// - optimizer: the rank's fp32 elements at the measured AdamW rate, plus the gradient norm's read and
//   the cast of the updated masters to the compute dtype at the stream rate;
// - communication: each collective of the plan's comm_bytes at the measured per-call time of its
//   message size (per call: the step's bytes over its calls: one per unit, per micro-step where the
//   stage reduces or gathers in backward); the part a profile's `overlap` lets hide under the compute
//   it runs beside (gradient reductions under backward, stage 3's prefetched gathers under forward
//   and backward) is not counted; tensor-parallel and pipeline transfers are on the critical path;
// - NVMe offload (the disk at the profile's measured util::FileStore bandwidth: a step's reads and
//   rewrites at the measured read-ahead + rewrite rate, else read and write seconds added: one disk),
//   as the engine runs it (time_model.cpp add_offload):
//   optimizer states: the step reads every state chunk and writes it back, reads ahead and writes
//   behind while the optimizer steps the chunk before: the longer of the disk's and the optimizer's
//   time, plus the first chunk's read; parameters (stage 3): each micro-step's forward and backward
//   read every offloaded shard inside the prefetch window (what the pass's compute does not cover is
//   exposed, and the first unit's read), and the step pages the shards in (fp32: read; 16-bit: the
//   masters are cast into fresh ones) and writes them back, overlapped with the optimizer as above;
// - CPU optimizer offload on a GPU (ZeRO-Offload): the gradients down and the parameters up over the
//   profile's host link beside the host's AdamW, chunk by chunk (time_model.cpp add_host_optimizer).
#pragma once
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "plan/machine_profile.h"
#include "plan/planner.h"

namespace shardlm::plan {

struct StepTimePrediction {
  double forward_s = 0, backward_s = 0;  // all micro-batches, recomputation in backward_s
  double recompute_s = 0;                // the part of backward_s that recomputes forward work
  double bubble_s = 0;                   // pipeline: the busiest stage waiting for the others
  double optimizer_s = 0;  // with NVMe offload: the step's overlapped state / parameter I/O too
  double offload_io_s = 0;       // the disk's seconds per step (every offload transfer)
  double offload_exposed_s = 0;  // what offload adds to the step (in forward_s, backward_s and optimizer_s)
  std::map<std::string, double> comm_s;  // per operation, as plan comm_bytes names them
  double comm_s_total = 0, comm_exposed_s = 0;
  double step_s = 0;
  double tokens_per_s = 0;  // the whole job's (every data-parallel rank's tokens)
  double model_flops = 0;   // per rank per step: 6 N tokens-style FLOPs of the products and attention, no recompute
  double mfu = 0;           // model_flops / (step_s x the profile's peak GEMM rate of the dtype)
};

// The linear layers of decoder layer `layer` on one tensor-parallel rank for `tokens` tokens: y = x W^T
// with x [tokens, in], W [out, in], `count` of them (k and v; gate and up; each expert's). Forward
// multiplies (tokens, out, in) as at::mm's (m, n, k); backward (tokens, in, out) for dX and
// (out, in, tokens) for dW. `shardlm bench machine --model` measures exactly these shapes.
struct LinearShape {
  double tokens = 0, in = 0, out = 0;
  int64_t count = 1;
};
std::vector<LinearShape> layer_linears(const model::LlamaConfig& cfg, int64_t layer, double tokens, int tp);

// The prediction for ZeRO stage `stage` (one of plan.stages). Fails for a plan without a model
// (--params) or a model family the time model does not know, and for NVMe offload on a profile without
// a disk measurement (naming the field and `shardlm bench machine --disk DIR`).
StepTimePrediction predict_step_time(const Plan& plan, int stage, const MachineProfile& machine);
nlohmann::json to_json(const StepTimePrediction& t);
// Every planned ZeRO stage's prediction: as JSON ({"machine": description, "stages": [...]}) and as
// the table `shardlm plan --machine` prints.
nlohmann::json predicted_json(const Plan& plan, const MachineProfile& machine);
std::string format_predicted(const Plan& plan, const MachineProfile& machine);

}  // namespace shardlm::plan
