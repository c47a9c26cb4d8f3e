// What the model-parallel suites share (test_tensor_parallel.cpp, test_pipeline_parallel.cpp,
// test_family_layouts.cpp): a layout of the tiny model, the config it trains with, and the one check
// they all make, that the layout reproduces one process training alone on the same token windows (a
// run with dp data-parallel ranks and accumulation a reads what one process reads with accumulation
// dp x a; docs/data.md, Data order), step by step and in the final gathered weights. fp64 shows the
// layouts compute the same function (differences are summation order only, ~1e-15 per op); fp32
// bounds are ~3x the worst measured. Also the model options of the families the suites run.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "trajectory.h"
#include "train/config.h"

namespace shardlm::model_parallel {

struct Layout {
  int tp = 1;
  int stage = 0;
  bool sp = false;
  std::string recompute = "none";
  std::string precision = "fp64";
  bool tied = false;
  int pp = 1;
  std::string schedule = "1f1b";
  int vpp = 1;  // parallelism.virtual_pipeline_parallel (interleaved_1f1b)
  int64_t layers = 2;
  int64_t accumulation = 2;
  std::vector<std::string> model = {};  // more model.* overrides (a family's options)
  std::string family = "";         // names them in the layout's name
  // fp64 bounds of the grad norm and the final weights (0: the defaults below); see the 3D grid.
  double fp64_grad_norm_bound = 0, fp64_weight_bound = 0;
  // Bit-identical to one process when it runs alone (dp 1): a pipeline of GPipe or 1F1B runs one
  // process's operations in one process's order, so loss and final weights deviate by 0; the grad
  // norm sums the stages' squares in another order (measured 1.8e-16 to 3.1e-16 at P = 2 and 4), so < 1e-15.
  bool exact_alone = false;
  std::string name() const {
    return family + "tp" + std::to_string(tp) + (sp ? "_sp" : "") + (pp > 1 ? "_pp" + std::to_string(pp) + "_" + schedule : "") +
           (vpp > 1 ? "_v" + std::to_string(vpp) : "") +
           "_zero" + std::to_string(stage) + "_" + recompute + "_" + precision + (tied ? "_tied" : "") + "_L" +
           std::to_string(layers) + "_m" + std::to_string(accumulation);
  }
};

// The tiny model trained 8 steps (clipping on) in layout `l` with `accumulation` micro-batches per
// step, writing under a scratch folder named by `tag`.
train::TrainConfig config(const Layout& l, int64_t accumulation, const std::string& tag);

// Trains `cfg` on `comm` (checking that tensor-parallel replicas stay bit-identical); rank 0 also
// reads back the final weights.
test_support::Outcome train_on(const train::TrainConfig& cfg, comm::CommPtr comm);

// Worst relative deviations of `got` from `ref` (routing decisions of MoE families must not flip).
test_support::Deviation compare(const test_support::Outcome& got, const test_support::Outcome& ref);

// Trains `l` on the whole world and compares it with the single-process run (skips when the world
// is not a multiple of tp x pp).
void expect_reproduces_single_process(const Layout& l);

// fp16 training of `cfg` for 5 steps where only world rank `rank` writes an inf into its gradient
// shard (as data-parallel rank `dp_rank`) at step 3: every rank must skip that step and only that
// one, and still learn. Returns this rank's history.
std::vector<observe::StepMetrics> fp16_run_with_overflow_on(train::TrainConfig cfg, int rank, int dp_rank);

// The Llama family's options ride on every layout: biases on q/k/v/o and the MLP (the row-parallel
// o and down biases added once after the sum), head_dim != hidden / heads, a RoPE type, a Mistral
// or Qwen2 sliding window shorter than the sequence, and a vocabulary tp does not divide (padded).
inline const std::vector<std::string> kLlamaBiases = {
    "model.attention_bias=true", "model.mlp_bias=true", "model.head_dim=32", "model.vocab_size=4097",
    R"(model.rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})"};
inline const std::vector<std::string> kQwen2Windows = {"model.model_type=qwen2", "model.use_sliding_window=true",
                                                       "model.sliding_window=6", "model.max_window_layers=1",
                                                       "model.vocab_size=4099"};
inline const std::vector<std::string> kMistralWindow = {"model.model_type=mistral", "model.sliding_window=5",
                                                        "model.num_key_value_heads=2"};
// Mixture of experts (model/moe.h): Mixtral with its load-balancing loss, Qwen2-MoE with its shared
// expert and a dense layer, Qwen3-MoE with per-head q/k norms.
inline const std::vector<std::string> kMixtralAux = {"model.model_type=mixtral", "model.num_local_experts=4",
                                                     "model.num_experts_per_tok=2", "model.intermediate_size=64",
                                                     "model.output_router_logits=true",
                                                     "model.router_aux_loss_coef=0.05"};
inline const std::vector<std::string> kQwen2Moe = {"model.model_type=qwen2_moe", "model.num_experts=4",
                                                   "model.num_experts_per_tok=2", "model.moe_intermediate_size=32",
                                                   "model.shared_expert_intermediate_size=48",
                                                   "model.mlp_only_layers=[1]"};
inline const std::vector<std::string> kQwen3Moe = {"model.model_type=qwen3_moe", "model.num_experts=4",
                                                   "model.num_experts_per_tok=2", "model.moe_intermediate_size=32",
                                                   "model.head_dim=32"};

// A family's layout: `model` options on tensor parallelism `tp` and ZeRO stage `stage`.
inline Layout family(const std::string& name, const std::vector<std::string>& model, int tp, int stage,
                     bool sp = false) {
  Layout l{tp, stage, sp};
  l.model = model;
  l.family = name + "_";
  return l;
}

// Pipeline parallelism: 4 decoder layers over p stages, 4 micro-batches per step (more than the
// stages, as a pipeline wants), both schedules; with data parallelism, tensor parallelism and tied
// embeddings (whose two copies, first and last stage, sum their gradients).
inline Layout pipeline(int pp, const std::string& schedule, int tp = 1, bool tied = false) {
  Layout l;
  l.pp = pp;
  l.schedule = schedule;
  l.tp = tp;
  l.tied = tied;
  l.layers = 4;
  l.accumulation = 4;
  return l;
}

// Hybrid sharding: shard groups of 1, so every shard's gradient is all-reduced between the replicas.
inline Layout hybrid(Layout l) {
  l.model.insert(l.model.end(), {"parallelism.hybrid_shard=true", "parallelism.shard_group_size=1"});
  l.family += "hybrid1_";
  return l;
}

}  // namespace shardlm::model_parallel

// MoE under tensor or pipeline parallelism runs on 2 ranks only (CI time): more data-parallel ranks
// beside them are the 8-rank grid's (tests/mpi/test_expert_parallel.cpp).
#define MOE_ON_TWO_RANKS_ONLY() \
  if (shardlm::comm::mpi_world()->size() != 2) GTEST_SKIP() << "MoE under TP/PP: 2 ranks only (CI time)"
