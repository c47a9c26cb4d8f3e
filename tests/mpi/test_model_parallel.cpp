// Tensor and pipeline parallelism reproduce the single-process trajectory. Every layout trains the tiny model
// 8 steps (clipping on, accumulation 2) and is compared, step by step and in the final (gathered,
// HF-shaped) weights, with one process training alone on the same token windows: a run with dp
// data-parallel ranks and accumulation a reads exactly what one process reads with accumulation
// dp x a (docs/data.md, Data order). fp64 shows the layouts compute the same function (differences are
// summation order only, ~1e-15 per op); fp32 bounds are ~3x the worst measured. Also: sequence
// parallelism equals TP without it, activation checkpointing changes nothing, and the bytes each
// tensor-parallel collective moves per step equal Megatron's count.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "parallel/fault_injection.h"
#include "parallel/tensor/tp_layout.h"
#include "reference_runs.h"
#include "test_dirs.h"
#include "trajectory.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

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

train::TrainConfig config(const Layout& l, int64_t accumulation, const std::string& tag) {
  std::vector<std::string> overrides = {
      "steps=8", "data.val=", "threads=1", "comm.timeout_s=30", "gradient_clipping=0.5", "resume=false",
      "train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=" + std::to_string(accumulation),
      "optimizer.params.lr=3e-3", "ddp.bucket_cap_mb=0.1", "zero_optimization.stage=" + std::to_string(l.stage),
      "zero_optimization.stage3_param_persistence_threshold=0", "parallelism.tensor_parallel=" + std::to_string(l.tp),
      "parallelism.sequence_parallel=" + std::string(l.sp ? "true" : "false"),
      "activation_checkpointing.mode=" + l.recompute,
      "model.tie_word_embeddings=" + std::string(l.tied ? "true" : "false"),
      "model.num_hidden_layers=" + std::to_string(l.layers), "parallelism.pipeline_parallel=" + std::to_string(l.pp),
      "parallelism.pipeline_schedule=" + l.schedule,
      "parallelism.virtual_pipeline_parallel=" + std::to_string(l.vpp)};
  overrides.insert(overrides.end(), l.model.begin(), l.model.end());
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = l.precision == "fp64";
  // fp32 at lr 1e-3 (as tests/mpi/test_zero.cpp): Adam's first, sign-like steps on near-zero
  // gradients turn a rounding difference into a whole step at larger rates.
  if (l.precision == "fp32") c.optimizer.lr = 1e-3;
  c.out_dir = test_support::mpi_test_path("tp_" + tag);
  return c;
}

using test_support::Outcome;

// Parameters every tensor-parallel peer holds a copy of (norms; KV heads when tp exceeds them) must
// stay bit-identical across the peers: a peer that drifted would go unnoticed in the gathered model,
// which takes the copy of tp rank 0.
void expect_replicas_identical(model::Llama& model, int tp) {
  auto world = comm::mpi_world();
  auto group = world->split(world->rank() / tp, world->rank(), "tp_check");
  int checked = 0;
  for (const auto& p : model.parameters()) {
    const bool kv = p.name.find("k_proj") != std::string::npos || p.name.find("v_proj") != std::string::npos;
    // Norms, row-parallel biases and replicated KV heads (column-parallel biases are 1-D shards).
    const bool replicated = parallel::tp::param_split(p.name, model.config(), tp, false).replicas > 1;
    if (!replicated || p.tensor.numel() == 0) continue;  // 0 elements: another pipeline stage's
    const auto mine = p.tensor.detach().to(at::kCPU, at::kDouble).contiguous().reshape({-1});
    auto all = at::empty({tp * mine.numel()}, mine.options());
    group->all_gather(mine, all);
    // Norms: every peer holds the copy. A replicated KV head: the tp / KV peers whose query heads read it.
    const int copies = kv ? tp / static_cast<int>(model.config().num_key_value_heads) : tp;
    for (int r = 0; r < tp; ++r) {
      if (r / copies != group->rank() / copies) continue;
      EXPECT_TRUE(at::equal(all.narrow(0, r * mine.numel(), mine.numel()), mine)) << p.name << " on tp rank " << r;
    }
    ++checked;
  }
  int64_t held_norms = 0;  // every norm this rank's stage holds
  for (const auto& p : model.parameters())
    held_norms += p.name.find("norm.weight") != std::string::npos && p.tensor.numel() > 0;
  EXPECT_GT(held_norms, 0);
  EXPECT_GE(checked, held_norms);
}

Outcome train_on(const train::TrainConfig& cfg, comm::CommPtr comm) {
  train::Trainer trainer(cfg, comm, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  Outcome o;
  o.history = trainer.run().history;
  if (cfg.parallelism.tensor_parallel > 1 && cfg.zero.stage < 3)  // stage 3 holds no whole parameters
    expect_replicas_identical(trainer.model(), cfg.parallelism.tensor_parallel);
  comm->barrier();  // its rank 0 has written the files
  if (comm->rank() == 0) o.weights = io::load_safetensors(cfg.out_dir + "/model.safetensors");
  return o;
}

// The same training by one process, on world rank 0 (the one that compares), once per configuration
// (tests/mpi/reference_runs.h).
Outcome single_process(const Layout& l, int dp) {
  Layout one = l;
  one.tp = 1;
  one.sp = false;
  one.stage = 0;
  one.recompute = "none";
  one.pp = 1;
  one.vpp = 1;
  one.schedule = "1f1b";
  // The family's model.* options stay; how the layout splits the ranks (parallelism.*) does not.
  one.model.clear();
  for (const auto& o : l.model)
    if (o.rfind("parallelism.", 0) != 0) one.model.push_back(o);
  auto world = comm::mpi_world();
  auto self = world->split(world->rank(), 0, "self");
  const auto cfg = config(one, l.accumulation * dp, "single_" + l.name());
  const std::string inputs = one.name() + " " + test_support::joined(one.model) + " accumulation " +
                             std::to_string(l.accumulation * dp);
  return test_support::one_process_on_rank_0<Outcome>(inputs, cfg, [&] { return train_on(cfg, self); });
}

test_support::Deviation compare(const Outcome& got, const Outcome& ref) {
  return test_support::deviation_of(got, ref, [&](size_t i) {
    test_support::expect_same_routing(got, ref, i);  // MoE families: zero routing decisions flipped
    if (std::getenv("SHARDLM_TEST_VERBOSE"))
      std::printf("step %zu: loss %.3e grad norm %.3e\n", i + 1,
                  std::abs(got.history[i].loss - ref.history[i].loss) / ref.history[i].loss,
                  std::abs(got.history[i].grad_norm - ref.history[i].grad_norm) / ref.history[i].grad_norm);
  });
}

// Trains `l` on the whole world and compares it with the single-process run.
void expect_reproduces_single_process(const Layout& l) {
  auto world = comm::mpi_world();
  if (world->size() % (l.tp * l.pp) != 0) GTEST_SKIP() << "needs a multiple of " << l.tp * l.pp << " ranks";
  const int dp = world->size() / (l.tp * l.pp);
  const auto ref = single_process(l, dp);
  const auto got = train_on(config(l, l.accumulation, l.name()), world);
  if (world->rank() != 0) return;
  const auto d = compare(got, ref);
  // fp32 bounds: ~3x the worst measured over 2 and 4 ranks (loss 1.2e-7, grad norm 1.1e-5, final
  // weights 5e-6). fp64: the loss to 1e-12; grad norms to 1e-10 and weights to 5e-12, because tied
  // embeddings over pipeline stages sum their two copies' gradients in another order than one
  // process: step 1 agrees exactly, and Adam carries that rounding to 1.9e-12 (4 ranks) and 2.1e-11
  // (3D, 8 ranks) in the grad norm and 1.1e-12 in the weights by step 8.
  const double bound = l.precision == "fp64" ? 1e-12 : 1e-6;
  const double weight_bound = l.precision != "fp64" ? 2e-5 : l.fp64_weight_bound > 0 ? l.fp64_weight_bound : 5e-12;
  const double grad_norm_bound = l.precision != "fp64" ? 3e-5 : l.fp64_grad_norm_bound > 0 ? l.fp64_grad_norm_bound : 1e-10;
  EXPECT_LT(d.loss, bound) << l.name();
  EXPECT_LT(d.grad_norm, grad_norm_bound) << l.name();
  EXPECT_LT(d.weights, weight_bound) << l.name();
  if (l.exact_alone && dp == 1) {
    EXPECT_EQ(d.loss, 0.0) << l.name();
    EXPECT_LT(d.grad_norm, 1e-15) << l.name();
    EXPECT_EQ(d.weights, 0.0) << l.name();
  }
  for (size_t i = 0; i < ref.history.size() && i < got.history.size(); ++i)  // a layout's evaluations
    if (ref.history[i].val_loss) {
      ASSERT_TRUE(got.history[i].val_loss.has_value()) << l.name() << " step " << i + 1;
      EXPECT_NEAR(*got.history[i].val_loss, *ref.history[i].val_loss, bound * *ref.history[i].val_loss) << l.name();
    }
  EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 0.1) << "the reference run should learn";
  std::printf("[ model-parallel ] %-46s dp=%d: worst relative deviation from one process: loss %.2e, grad norm %.2e, "
              "final weights %.2e\n",
              l.name().c_str(), dp, d.loss, d.grad_norm, d.weights);
}

// fp16 training of `cfg` for 5 steps where only world rank `rank` writes an inf into its gradient
// shard (as data-parallel rank `dp_rank`) at step 3: every rank must skip that step and only that
// one, and still learn. Returns this rank's history.
std::vector<observe::StepMetrics> fp16_run_with_overflow_on(train::TrainConfig cfg, int rank, int dp_rank) {
  auto world = comm::mpi_world();
  cfg.fp16.enabled = true;
  cfg.fp16.hysteresis = 1;
  cfg.steps = 5;
  parallel::FaultInjection faults;
  if (world->rank() == rank) {
    faults.overflow_rank = dp_rank;
    faults.overflow_step = 2;
  }
  const parallel::FaultScope injected(faults);
  train::Trainer trainer(cfg, world, true);
  const auto h = trainer.run().history;
  for (size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(h[i].extra.at("skipped"), i == 2 ? 1 : 0) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(h[i].loss));
  }
  EXPECT_LT(h.back().loss, h.front().loss);
  return h;
}

}  // namespace

TEST(TensorParallel, Tp2ReproducesOneProcess) { expect_reproduces_single_process({2, 0}); }
TEST(TensorParallel, Tp2Fp32ReproducesOneProcess) { expect_reproduces_single_process({2, 0, false, "none", "fp32"}); }
TEST(TensorParallel, Tp2SequenceParallelReproducesOneProcess) { expect_reproduces_single_process({2, 0, true}); }
TEST(TensorParallel, Tp2WithZero1ReproducesOneProcess) { expect_reproduces_single_process({2, 1}); }
TEST(TensorParallel, Tp2WithZero3ReproducesOneProcess) { expect_reproduces_single_process({2, 3}); }
TEST(TensorParallel, Tp2WithZero2Fp32ReproducesOneProcess) {
  expect_reproduces_single_process({2, 2, false, "none", "fp32"});
}
TEST(TensorParallel, Tp2WithZero3AndFullRecomputeReproducesOneProcess) {
  expect_reproduces_single_process({2, 3, true, "full"});
}
TEST(TensorParallel, Tp2SelectiveRecomputeReproducesOneProcess) {
  expect_reproduces_single_process({2, 0, false, "selective"});
}
TEST(TensorParallel, Tp2TiedEmbeddingsReproducesOneProcess) {
  expect_reproduces_single_process({2, 1, false, "none", "fp64", /*tied=*/true});
}
// 4 ranks, 2 KV heads: each KV head is replicated on 2 ranks and its gradient summed over them.
TEST(TensorParallel, Tp4ReplicatedKvHeadsReproducesOneProcess) { expect_reproduces_single_process({4, 0}); }
TEST(TensorParallel, Tp4SequenceParallelWithZero2ReproducesOneProcess) {
  expect_reproduces_single_process({4, 2, true});
}
TEST(TensorParallel, Tp4TiedWithZero1ReproducesOneProcess) {
  expect_reproduces_single_process({4, 1, false, "none", "fp64", /*tied=*/true});
}

// The Llama family's options ride on every layout: biases on q/k/v/o and the MLP (the row-parallel
// o and down biases added once after the sum), head_dim != hidden / heads, a RoPE type, a Mistral
// or Qwen2 sliding window shorter than the sequence, and a vocabulary tp does not divide (padded).
const std::vector<std::string> kLlamaBiases = {
    "model.attention_bias=true", "model.mlp_bias=true", "model.head_dim=32", "model.vocab_size=4097",
    R"(model.rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})"};
const std::vector<std::string> kQwen2Windows = {"model.model_type=qwen2", "model.use_sliding_window=true",
                                                "model.sliding_window=6", "model.max_window_layers=1",
                                                "model.vocab_size=4099"};
const std::vector<std::string> kMistralWindow = {"model.model_type=mistral", "model.sliding_window=5",
                                                 "model.num_key_value_heads=2"};
Layout family(const std::string& name, const std::vector<std::string>& model, int tp, int stage, bool sp = false) {
  Layout l{tp, stage, sp};
  l.model = model;
  l.family = name + "_";
  return l;
}

TEST(TensorParallel, Tp2LlamaBiasesHeadDimRopeAndPaddedVocabReproduceOneProcess) {
  expect_reproduces_single_process(family("llama_bias", kLlamaBiases, 2, 0));
}
TEST(TensorParallel, Tp2SequenceParallelLlamaBiasesReproduceOneProcess) {
  expect_reproduces_single_process(family("llama_bias", kLlamaBiases, 2, 0, /*sp=*/true));
}
TEST(TensorParallel, Tp2Qwen2WindowsWithZero3ReproduceOneProcess) {
  expect_reproduces_single_process(family("qwen2", kQwen2Windows, 2, 3));
}
TEST(TensorParallel, Tp4SequenceParallelQwen2PaddedVocabWithZero1ReproduceOneProcess) {
  expect_reproduces_single_process(family("qwen2", kQwen2Windows, 4, 1, /*sp=*/true));
}
TEST(TensorParallel, Tp2Qwen2WindowsWithFullAndSelectiveRecomputeReproduceOneProcess) {
  for (const char* mode : {"full", "selective"}) {
    auto l = family("qwen2", kQwen2Windows, 2, 3, /*sp=*/true);
    l.recompute = mode;
    expect_reproduces_single_process(l);
  }
}
TEST(Families, DdpQwen2WindowsReproduceOneProcess) {
  expect_reproduces_single_process(family("qwen2", kQwen2Windows, 1, 0));
}
TEST(Families, Zero3LlamaBiasesReproduceOneProcess) {
  expect_reproduces_single_process(family("llama_bias", kLlamaBiases, 1, 3));
}
TEST(Families, Zero2MistralWindowReproducesOneProcess) {
  expect_reproduces_single_process(family("mistral", kMistralWindow, 1, 2));
}
// Mixture of experts (model/moe.h): the experts are parameters of their layer's unit, so ZeRO-3
// gathers, frees and reduce-scatters them like any other; with output_router_logits the
// load-balancing loss reaches every layer's router (its gradient joins the unit's backward, after
// the unit's gather). Qwen2-MoE's shared expert and a dense layer ride on DDP.
const std::vector<std::string> kMixtralAux = {"model.model_type=mixtral", "model.num_local_experts=4",
                                              "model.num_experts_per_tok=2", "model.intermediate_size=64",
                                              "model.output_router_logits=true", "model.router_aux_loss_coef=0.05"};
const std::vector<std::string> kQwen2Moe = {"model.model_type=qwen2_moe", "model.num_experts=4",
                                            "model.num_experts_per_tok=2", "model.moe_intermediate_size=32",
                                            "model.shared_expert_intermediate_size=48", "model.mlp_only_layers=[1]"};
// The MoE families run on 2 and 3 ranks (even and padded ZeRO shards); more data-parallel ranks are
// the expert-parallel suite's (tests/mpi/test_expert_parallel.cpp), within CI's time.
#define MOE_FAMILY_ON_TWO_OR_THREE_RANKS() \
  if (comm::mpi_world()->size() > 3) GTEST_SKIP() << "MoE families: 2 and 3 ranks (CI time)"
TEST(Families, Zero3MixtralWithAuxLossReproducesOneProcess) {
  MOE_FAMILY_ON_TWO_OR_THREE_RANKS();
  expect_reproduces_single_process(family("mixtral", kMixtralAux, 1, 3));
}
// Full recomputation replays each layer in backward, ZeRO-3 re-gathering it first; the router logits
// leave the checkpointed layers as a second output, so the aux loss's gradient reaches the replay.
TEST(Families, Zero3MixtralWithAuxLossAndFullRecomputeReproducesOneProcess) {
  if (comm::mpi_world()->size() != 2) GTEST_SKIP() << "2 ranks only (CI time): the recomputation is per rank";
  auto l = family("mixtral", kMixtralAux, 1, 3);
  l.recompute = "full";
  expect_reproduces_single_process(l);
}
TEST(Families, DdpQwen2MoeReproducesOneProcess) {
  MOE_FAMILY_ON_TWO_OR_THREE_RANKS();
  expect_reproduces_single_process(family("qwen2_moe", kQwen2Moe, 1, 0));
}
// Under tensor parallelism the sparse block is replicated over the tp group and runs outside the
// parallel regions (tp_layout.h): without sequence parallelism every tp rank routes every position
// (Mixtral's load-balancing loss included), with it each rank its own positions and the router's and
// experts' gradients are summed over the group like the norms'. Qwen3-MoE adds the per-head q/k
// norms, whose gradients each rank sees for its heads only (summed with or without sequence
// parallelism).
// They run on 2 ranks only (CI time): more data-parallel ranks beside them are the 8-rank grid's
// (tests/mpi/test_expert_parallel.cpp).
#define MOE_ON_TWO_RANKS_ONLY() \
  if (comm::mpi_world()->size() != 2) GTEST_SKIP() << "MoE under TP/PP: 2 ranks only (CI time)"
const std::vector<std::string> kQwen3Moe = {"model.model_type=qwen3_moe", "model.num_experts=4",
                                            "model.num_experts_per_tok=2", "model.moe_intermediate_size=32",
                                            "model.head_dim=32"};
TEST(TensorParallel, Tp2MixtralWithAuxLossReproducesOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  auto l = family("mixtral", kMixtralAux, 2, 0);
  expect_reproduces_single_process(l);
  l.precision = "fp32";  // and no routing decision flips (the per-expert counts of every step)
  l.accumulation = 4;     // (at fp32's lower rate the reference learns 0.1 in 8 steps of 4)
  expect_reproduces_single_process(l);
}
// Under sequence parallelism each rank routes its own positions: the load-balancing loss's counts
// and probability sums are summed over the tp group (identity backward) before the one loss forms.
TEST(TensorParallel, Tp2SequenceParallelMixtralWithAuxLossReproducesOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  expect_reproduces_single_process(family("mixtral", kMixtralAux, 2, 0, /*sp=*/true));
}
TEST(TensorParallel, Tp2SequenceParallelQwen2MoeWithZero3ReproducesOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  expect_reproduces_single_process(family("qwen2_moe", kQwen2Moe, 2, 3, /*sp=*/true));
}
TEST(TensorParallel, Tp2Qwen3MoeQkNormsWithZero1ReproduceOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  expect_reproduces_single_process(family("qwen3_moe", kQwen3Moe, 2, 1));
}
// Pipeline stages hold sparse layers as they hold dense ones: Qwen2-MoE's sparse layer on the first
// stage and its dense one on the second (GPipe), Qwen3-MoE over two stages of two layers (1F1B), and
// in fp32 over two chunks per stage (interleaved 1F1B), where every step routes as one process does.
TEST(Pipeline, MoeTwoStagesAllSchedulesReproduceOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  auto qwen2 = family("qwen2_moe", kQwen2Moe, 1, 0);
  qwen2.pp = 2;
  qwen2.schedule = "gpipe";
  expect_reproduces_single_process(qwen2);
  auto qwen3 = family("qwen3_moe", kQwen3Moe, 1, 0);
  qwen3.pp = 2;
  qwen3.layers = 4;
  expect_reproduces_single_process(qwen3);
  qwen3.schedule = "interleaved_1f1b";
  qwen3.vpp = 2;
  qwen3.precision = "fp32";
  qwen3.accumulation = 4;
  expect_reproduces_single_process(qwen3);
}
// Mixtral's load-balancing loss over two stages, with every schedule: the running sums travel with
// the activations and the loss's gradient on them with the activations' gradient (parallelize.cpp).
TEST(Pipeline, MoeAuxLossTwoStagesAllSchedulesReproducesOneProcess) {
  MOE_ON_TWO_RANKS_ONLY();
  auto mixtral = family("mixtral", kMixtralAux, 1, 0);
  mixtral.pp = 2;
  for (const char* schedule : {"gpipe", "1f1b", "zb_h1"}) {
    mixtral.schedule = schedule;
    expect_reproduces_single_process(mixtral);
  }
  mixtral.schedule = "interleaved_1f1b";  // the chain passes every chunk: stage 0, 1, 0, 1
  mixtral.vpp = 2;
  mixtral.layers = 4;
  // and evaluation (val_loss includes the aux loss) passes the sums forward as training does
  mixtral.model.insert(mixtral.model.end(), {"data.val=" + std::string(SHARDLM_SOURCE_DIR) + "/data/brown/val.bin",
                                             "data.eval_batches=2"});
  expect_reproduces_single_process(mixtral);
}
// What does not compose stops before training, naming the keys and the fix.
TEST(Families, MoeRefusesCapacityOverSequenceShards) {
  auto world = comm::mpi_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto capped = kQwen2Moe;
  capped.push_back("model.moe_capacity_factor=1.0");
  std::string msg = "(no error)";
  try {
    train::Trainer trainer(config(family("qwen2_moe", capped, 2, 0, true), 2, "moe_refused"), world, true);
    trainer.run();
  } catch (const std::exception& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("model.moe_capacity_factor = 1 with parallelism.sequence_parallel"), std::string::npos) << msg;
}
TEST(Pipeline, Qwen2WindowsTwoStagesReproduceOneProcess) {
  auto l = family("qwen2", kQwen2Windows, 1, 1);
  l.pp = 2;
  expect_reproduces_single_process(l);
}

// fp16: an overflow only one tensor-parallel rank sees (an inf written into its own gradient
// shard) makes every rank skip the same step: a TP peer that updated while the other skipped
// would leave the model's shards out of step.
TEST(TensorParallel, Fp16OverflowOnOneTpRankSkipsTheStepEverywhere) {
  // tp rank 1 of the first data-parallel position (dp rank 0) only.
  const auto h = fp16_run_with_overflow_on(config({2, 1, false, "none", "fp32"}, 2, "fp16_overflow"), 1, 0);
  EXPECT_EQ(h[2].extra.at("loss_scale"), h[1].extra.at("loss_scale") / 2);
}

// Pipeline parallelism: 4 decoder layers over p stages, 4 micro-batches per step (more than the
// stages, as a pipeline wants), both schedules; with data parallelism, tensor parallelism and tied
// embeddings (whose two copies, first and last stage, sum their gradients).
Layout pipeline(int pp, const std::string& schedule, int tp = 1, bool tied = false) {
  Layout l;
  l.pp = pp;
  l.schedule = schedule;
  l.tp = tp;
  l.tied = tied;
  l.layers = 4;
  l.accumulation = 4;
  return l;
}
Layout exact_alone(Layout l) {
  l.exact_alone = true;
  return l;
}
// Two stages alone on 2 ranks; on 4 ranks (two stages x dp 2) the WithZero* and tied cases below
// cover that grid, so these two are not run again there (CI time).
#define TWO_STAGES_ALONE() \
  if (comm::mpi_world()->size() != 2) GTEST_SKIP() << "two stages alone: 2 ranks (dp 2 is covered below)"
TEST(Pipeline, GPipeTwoStagesReproducesOneProcess) {
  TWO_STAGES_ALONE();
  expect_reproduces_single_process(exact_alone(pipeline(2, "gpipe")));
}
TEST(Pipeline, OneFOneBTwoStagesReproducesOneProcess) {
  TWO_STAGES_ALONE();
  expect_reproduces_single_process(exact_alone(pipeline(2, "1f1b")));
}
TEST(Pipeline, GPipeFourStagesReproducesOneProcess) {
  expect_reproduces_single_process(exact_alone(pipeline(4, "gpipe")));
}
TEST(Pipeline, OneFOneBFourStagesReproducesOneProcess) {
  expect_reproduces_single_process(exact_alone(pipeline(4, "1f1b")));
}
TEST(Pipeline, TiedEmbeddingsAcrossFirstAndLastStageReproduceOneProcess) {
  expect_reproduces_single_process(pipeline(2, "1f1b", 1, /*tied=*/true));
}
TEST(Pipeline, WithTensorParallelismReproducesOneProcess) {
  expect_reproduces_single_process(pipeline(2, "1f1b", 2, /*tied=*/true));
}
// Hybrid sharding under tensor and pipeline parallelism: on 4 ranks tp 2 (or pp 2) x dp 2 in shard
// groups of 1, so every shard's gradient is all-reduced between the two replicas.
Layout hybrid(Layout l) {
  l.model.insert(l.model.end(), {"parallelism.hybrid_shard=true", "parallelism.shard_group_size=1"});
  l.family += "hybrid1_";
  return l;
}
TEST(TensorParallel, Tp2WithHybridZero3ReproducesOneProcess) { expect_reproduces_single_process(hybrid({2, 3})); }
TEST(Pipeline, WithHybridZero1AndTiedEmbeddingsReproducesOneProcess) {
  auto l = pipeline(2, "1f1b", 1, /*tied=*/true);
  l.stage = 1;
  expect_reproduces_single_process(hybrid(l));
}
TEST(Pipeline, FewerMicroBatchesThanStagesStillReproducesOneProcess) {
  auto l = exact_alone(pipeline(2, "1f1b"));
  l.accumulation = 1;
  expect_reproduces_single_process(l);
}
TEST(Pipeline, FourStagesTwoMicroBatchesBothSchedulesReproduceOneProcess) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    auto l = exact_alone(pipeline(4, schedule));
    l.accumulation = 2;
    expect_reproduces_single_process(l);
  }
}
// Pipeline x ZeRO over each stage's data-parallel group (DeepSpeed refuses ZeRO-2/3 with a pipeline).
// Stages 2 and 3 reduce-scatter each unit's gradients in every micro-batch's backward, as without a
// pipeline; the tied embedding's two copies are summed shard by shard (the embedding unit has the
// same layout on the first and last stage).
TEST(Pipeline, WithZero1TiedReproducesOneProcess) {
  auto l = pipeline(2, "1f1b", 1, /*tied=*/true);
  l.stage = 1;
  expect_reproduces_single_process(l);
}
TEST(Pipeline, WithZero2ReproducesOneProcess) {
  auto l = pipeline(2, "gpipe");
  l.stage = 2;
  expect_reproduces_single_process(l);
}
TEST(Pipeline, WithZero3TiedReproducesOneProcess) {
  auto l = pipeline(2, "1f1b", 1, /*tied=*/true);
  l.stage = 3;
  expect_reproduces_single_process(l);
}
// Stage 3 under a pipeline: the largest set each stage's engine gathers is the planner's replay for
// that stage (plan.json), with its micro-batches' forwards in flight.
// - No prefetch: both schedules run stage 0's second forward while the first micro-batch's last
//   layer stays gathered for its backward, so the embedding and a layer are gathered at once (one
//   micro-batch at a time would never gather more than the embedding).
// - Layers of 405632 elements (intermediate 2048) and a window of one layer: under 1F1B the last
//   stage (one micro-batch in flight) gathers at most a layer and the next. Its copy of the tied
//   embedding (262144) would fit the window, but the window stops at the stage's end: were it to
//   walk past it, the embedding would stay gathered into the next forward (+262144). Under GPipe the
//   next forwards run while the first's head, the embedding it reads and the layer kept below it
//   stay gathered for its backward: two layers, the final norm and the embedding.
// - ZB-H1 (its B releases each unit once B has passed below it, zero_engine.cpp): the replay, run
//   with its micro-batches alive, is an upper bound. Stage 0 gathers exactly the plan; the last
//   stage, whose B releases the final norm kept for a later micro-batch that the replay keeps
//   gathered, measured 256 bytes (the norm) below it with and without a window. Without the release
//   after B, stage 0 gathered 1,603,072 bytes against 1,233,408 planned.
TEST(Pipeline, Stage3GatheredPeakIsThePlannedReplay) {
  auto world = comm::mpi_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs a multiple of 2 ranks";
  const int stage = world->rank() / (world->size() / 2);  // pp is the outermost axis
  const int64_t embedding = 4096 * 64;
  auto layer = [](int64_t f) { return 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * f + 2 * 64; };
  for (const char* schedule : {"gpipe", "1f1b", "zb_h1"}) {
    for (const auto& [prefetch, intermediate] : {std::pair{0.0, 176}, {double(layer(2048)), 2048}, {1e6, 176}}) {
      auto l = pipeline(2, schedule, 1, /*tied=*/true);
      l.stage = 3;
      l.precision = "fp32";
      auto cfg = config(l, l.accumulation, "gathered_" + l.name() + "_" + std::to_string(int64_t(prefetch)));
      cfg.steps = 1;
      cfg.zero.stage3_prefetch_bucket_size = prefetch;
      cfg.model.intermediate_size = intermediate;
      SCOPED_TRACE(std::string(schedule) + " prefetch " + std::to_string(prefetch) + " stage " + std::to_string(stage));
      train::Trainer trainer(cfg, world, true);
      trainer.run();
      world->barrier();  // rank 0 has written plan.json
      nlohmann::json plan;
      std::ifstream(cfg.out_dir + "/plan.json") >> plan;
      const auto& mine = plan["pipeline_stages"][stage];
      ASSERT_EQ(mine["stage"].get<int>(), stage);
      const int64_t planned = mine["memory"][0]["gathered_peak"].get<int64_t>();
      const bool zero_bubble = std::string(schedule) == "zb_h1";
      if (zero_bubble && stage > 0) EXPECT_LE(trainer.memory().gathered_peak, planned);
      else EXPECT_EQ(planned, trainer.memory().gathered_peak);
      if (prefetch == 0 && stage == 0) {
        EXPECT_EQ(planned, 4 * (embedding + layer(176)));
      }
      if (intermediate == 2048 && stage == 1 && !zero_bubble) {
        EXPECT_EQ(planned, 4 * (2 * layer(2048) + (std::string(schedule) == "gpipe" ? 64 + embedding : 0)));
      }
      world->barrier();  // every rank has read plan.json before the next run rewrites it
    }
  }
}

// fp16 under a pipeline: an overflow that only one rank of stage 0 sees (in its shard of the first
// decoder layer) skips the step on every stage (checked on every rank).
TEST(Pipeline, Fp16OverflowOnOneStageSkipsTheStepEverywhere) {
  auto l = pipeline(2, "1f1b");
  l.stage = 1;
  l.precision = "fp32";
  // Stage 0's last data-parallel rank only (its world rank is its dp rank: pp is the outermost axis).
  const int rank = comm::mpi_world()->size() / 2 - 1;
  fp16_run_with_overflow_on(config(l, 4, "pp_fp16_overflow"), rank, rank);
}
// Interleaved 1F1B (v model chunks per rank, activations wrapping from the last rank to the first)
// and ZB-H1 (backward split into the input's gradient and the parameters') reproduce one process,
// alone and with data parallelism and ZeRO 1-3 (ZB-H1: 1-2; it refuses stage 3). Interleaved needs
// layers divisible by p·v: 4 layers at p = 2, 8 at p = 4.
// They run at 2 and 4 ranks (pp 2 x dp 2, pp 4); the 8-rank suite filters to the 3D grid alone.
Layout interleaved(int pp, int vpp = 2, bool tied = false) {
  auto l = pipeline(pp, "interleaved_1f1b", 1, tied);
  l.vpp = vpp;
  l.layers = pp * vpp;
  return l;
}
TEST(PipelineSchedules, InterleavedTwoStagesReproducesOneProcess) {
  TWO_STAGES_ALONE();  // InterleavedWithZero covers two stages x dp 2
  expect_reproduces_single_process(interleaved(2));
}
TEST(PipelineSchedules, InterleavedTwoStagesTiedFp32ReproducesOneProcess) {
  auto l = interleaved(2, 2, /*tied=*/true);
  l.precision = "fp32";
  expect_reproduces_single_process(l);
}
TEST(PipelineSchedules, InterleavedFourStagesReproducesOneProcess) {
  expect_reproduces_single_process(interleaved(4));
}
TEST(PipelineSchedules, InterleavedThreeChunksReproducesOneProcess) {
  auto l = interleaved(2, 3, /*tied=*/true);
  l.accumulation = 2;  // m = p: every forward first (Megatron's all-warm-up case)
  expect_reproduces_single_process(l);
}
TEST(PipelineSchedules, InterleavedWithZeroReproducesOneProcess) {
  for (int stage : {1, 2, 3}) {
    auto l = interleaved(2, 2, /*tied=*/true);
    l.stage = stage;
    expect_reproduces_single_process(l);
  }
}
TEST(PipelineSchedules, ZeroBubbleTwoStagesReproducesOneProcess) {
  expect_reproduces_single_process(pipeline(2, "zb_h1", 1, /*tied=*/true));
  auto l = pipeline(2, "zb_h1");
  l.precision = "fp32";
  expect_reproduces_single_process(l);
}
TEST(PipelineSchedules, ZeroBubbleFourStagesReproducesOneProcess) {
  expect_reproduces_single_process(pipeline(4, "zb_h1"));
}
TEST(PipelineSchedules, ZeroBubbleWithZeroReproducesOneProcess) {
  for (int stage : {1, 2, 3}) {
    auto l = pipeline(2, "zb_h1", 1, /*tied=*/true);
    l.stage = stage;
    expect_reproduces_single_process(l);
  }
}
// ZB-H1's B and W are 1F1B's backward products split per linear layer (dX in B, dW in W, the
// other parameters' gradients computed in B and accumulated in W), each parameter's gradient summed
// over the micro-batches in the same order and its hooks fired once per micro-batch: the whole
// trajectory is bit-identical to 1F1B's, in fp32 too, with DDP (small buckets, so several
// all-reduces start during the last W) and with ZeRO-1, ZeRO-2 and ZeRO-3 (a reduce-scatter per unit
// in every W; ZeRO-3 releases each unit after its B, zero_engine.cpp) at P = 2, and at P = 4 (interleaved splits the layers differently, so only its first
// step's loss is, see above for its bounds).
// Trains `zb` (a zb_h1 layout, fp32) and the same layout under 1f1b: every step's loss and grad norm
// and every final weight equal bit for bit.
void expect_zero_bubble_bit_identical(Layout zb, const std::string& where) {
  auto world = comm::mpi_world();
  auto one = zb;
  one.schedule = "1f1b";
  const auto a = train_on(config(zb, zb.accumulation, zb.name() + "_bits"), world);
  const auto b = train_on(config(one, one.accumulation, one.name() + "_bits"), world);
  if (world->rank() != 0) return;
  ASSERT_EQ(a.history.size(), b.history.size());
  for (size_t i = 0; i < a.history.size(); ++i) {
    EXPECT_EQ(a.history[i].loss, b.history[i].loss) << "step " << i + 1 << where;
    EXPECT_EQ(a.history[i].grad_norm, b.history[i].grad_norm) << "step " << i + 1 << where;
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t k = 0; k < a.weights.size(); ++k)
    EXPECT_TRUE(at::equal(a.weights[k].second, b.weights[k].second)) << a.weights[k].first << where;
}
TEST(PipelineSchedules, ZeroBubbleIsBitIdenticalToOneFOneB) {
  for (int pp : {2, 4})
    for (int stage : {0, 1, 2, 3}) {
      if (comm::mpi_world()->size() % pp != 0 || (pp == 4 && stage > 0)) continue;
      auto zb = pipeline(pp, "zb_h1", 1, /*tied=*/pp == 2);
      zb.precision = "fp32";
      zb.stage = stage;
      expect_zero_bubble_bit_identical(zb, " pp " + std::to_string(pp) + " zero " + std::to_string(stage));
    }
}
// With activation checkpointing the recomputation runs in B, its linears deferring their weight
// products into the same queue: bit-identical to 1F1B with the same full recomputation (selective
// recomputes only the attention core, which has no linear layer).
TEST(PipelineSchedules, ZeroBubbleWithRecomputeIsBitIdenticalToOneFOneB) {
  if (comm::mpi_world()->size() % 2 != 0) GTEST_SKIP() << "needs a multiple of 2 ranks";
  auto zb = pipeline(2, "zb_h1");
  zb.precision = "fp32";
  zb.recompute = "full";
  expect_zero_bubble_bit_identical(zb, " full recompute");
}
TEST(PipelineSchedules, RefusesWhatTheyCannotRun) {
  auto world = comm::mpi_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs a multiple of 2 ranks";
  auto error = [&](const Layout& l) {
    try {
      auto cfg = config(l, l.accumulation, "refused_" + l.name());
      train::Trainer trainer(cfg, world, true);
      trainer.run();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto odd = interleaved(2);
  odd.accumulation = 3;
  EXPECT_NE(error(odd).find("gradient_accumulation_steps = 3) to be a multiple of parallelism.pipeline_parallel = 2"),
            std::string::npos);
}
// 3D: dp 2 x tp 2 x pp 2 on 8 ranks (ctest runs this suite under mpirun -n 8 as well).
TEST(Pipeline, ThreeDimensionalGridReproducesOneProcess) {
  if (comm::mpi_world()->size() != 8) GTEST_SKIP() << "the 3D grid needs 8 ranks";
  auto l = pipeline(2, "1f1b", 2, /*tied=*/true);
  l.sp = true;
  // The tied embeddings' rounding that Adam carries (above) depends on the CPU's kernels: 2.1e-11 in
  // the grad norm on the machine the defaults were set on, but on an AMD Zen 4 (2026-12-03, main of
  // the day before included) 1.02e-10 / weights 5.2e-12 natively and 1.38e-10 / 7.0e-12 with
  // ATEN_CPU_CAPABILITY=avx2; the loss still agrees to 2.2e-14. These bounds are ~3.5x those.
  l.fp64_grad_norm_bound = 5e-10;
  l.fp64_weight_bound = 2.5e-11;
  expect_reproduces_single_process(l);
}

// Sequence parallelism computes what TP without it computes (fp64: to rounding order).
TEST(TensorParallel, SequenceParallelEqualsTensorParallel) {
  auto world = comm::mpi_world();
  const auto plain = train_on(config({2, 0}, 2, "sp_off"), world);
  const auto sp = train_on(config({2, 0, true}, 2, "sp_on"), world);
  if (world->rank() != 0) return;
  const auto d = compare(sp, plain);
  EXPECT_LT(d.loss, 1e-13);
  EXPECT_LT(d.grad_norm, 1e-12);
  EXPECT_LT(d.weights, 1e-12);
}

// Recomputing the layers (with their collectives) in backward gives the same fp32 numbers bit for
// bit: the same kernels on the same inputs in the same order.
TEST(TensorParallel, ActivationCheckpointingIsBitIdenticalUnderTp) {
  auto world = comm::mpi_world();
  const auto none = train_on(config({2, 0, false, "none", "fp32"}, 2, "ac_none"), world);
  for (const std::string mode : {"full", "selective"}) {
    const auto ac = train_on(config({2, 0, false, mode, "fp32"}, 2, "ac_" + mode), world);
    for (size_t i = 0; i < none.history.size(); ++i) {
      EXPECT_EQ(ac.history[i].loss, none.history[i].loss) << mode << " step " << i + 1;
      EXPECT_EQ(ac.history[i].grad_norm, none.history[i].grad_norm) << mode << " step " << i + 1;
    }
  }
}

// Bytes per step on the tensor-parallel group (what this rank contributes, the input size of each
// collective), against Megatron's count for L layers, micro-batch b, sequence s, hidden h, element
// size e, accumulation a:
//   without SP: per layer 2 all-reduces of b s h in forward (after o and down) and 2 in backward
//     (before q/k/v and gate/up), plus the embedding's (forward) and the head input's (backward):
//     all_reduce = a [(4L + 2) b s h e + 3 b s 4] + 8, the last terms the vocab-parallel loss's
//     max, sum and target logit (fp32 per position) and the gradient norm's one double.
//   with SP: each of those all-reduces becomes an all-gather (input b s h / t) plus a
//     reduce-scatter (input b s h): the same volume on the wire ((t-1)/t of b s h e each way).
//     The norm weights' gradients (2L + 1 of h elements) are summed over tp in backward.
TEST(TensorParallel, CommunicationBytesMatchMegatronsCount) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "counted for tp=2 on 2 ranks";
  for (bool sp : {false, true}) {
    auto cfg = config({2, 0, sp, "none", "fp32"}, 2, sp ? "bytes_sp" : "bytes");
    cfg.steps = 2;
    const auto h = train_on(cfg, world).history;
    const double L = cfg.model.num_hidden_layers, b = cfg.micro_batch, s = cfg.data.seq_len,
                 hidden = cfg.model.hidden_size, e = 4, a = cfg.grad_accum, t = 2;
    for (const auto& m : h) {
      auto bytes = [&](const std::string& op) {
        auto it = m.extra.find("comm_tp_" + op + "_bytes");
        return it == m.extra.end() ? 0.0 : it->second;
      };
      if (!sp) {
        EXPECT_EQ(bytes("all_reduce"), a * ((4 * L + 2) * b * s * hidden * e + 3 * b * s * 4) + 8);
        EXPECT_EQ(bytes("all_gather"), 0);
        EXPECT_EQ(bytes("reduce_scatter"), 0);
      } else {
        EXPECT_EQ(bytes("all_gather"), a * (4 * L + 2) * b * s * hidden * e / t);
        EXPECT_EQ(bytes("reduce_scatter"), a * (4 * L + 2) * b * s * hidden * e);
        EXPECT_EQ(bytes("all_reduce"), a * (3 * b * s * 4 + (2 * L + 1) * hidden * e) + 8);
      }
      if (world->rank() == 0)
        std::printf("[ tp       ] step %lld%s: tp all_reduce %.0f B, all_gather %.0f B, reduce_scatter %.0f B\n",
                    static_cast<long long>(m.step), sp ? " (sequence parallel)" : "", bytes("all_reduce"),
                    bytes("all_gather"), bytes("reduce_scatter"));
    }
  }
}

// Impossible layouts are refused with the arithmetic, before anything is allocated.
TEST(TensorParallel, RefusesLayoutsTheSplitCannotMake) {
  auto world = comm::mpi_world();
  auto error_of = [&](const std::vector<std::string>& overrides) {
    try {
      auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
      c.validate_for(world->size());
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(error_of({"parallelism.tensor_parallel=3"}).find("does not divide the attention heads"), std::string::npos);
  EXPECT_NE(error_of({"parallelism.tensor_parallel=2", "data.seq_len=33", "parallelism.sequence_parallel=true"})
                .find("seq_len 33 / 2 = 16.5"),
            std::string::npos);
  EXPECT_NE(error_of({"parallelism.sequence_parallel=true"}).find("needs parallelism.tensor_parallel > 1"),
            std::string::npos);
  EXPECT_NE(error_of({"parallelism.pipeline_parallel=3"}).find("exceeds the model's 2 decoder layers"),
            std::string::npos);
  EXPECT_NE(error_of({"parallelism.pipeline_parallel=2", "parallelism.pipeline_split=[2,1]"})
                .find("must hold 2 layer counts (one per pipeline stage), each >= 1, summing to the model's 2 layers; "
                      "it has 2 summing to 3"),
            std::string::npos);
  EXPECT_NE(error_of({"parallelism.pipeline_schedule=interleaved"}).find("must be \"gpipe\", \"1f1b\", \"interleaved_1f1b\" or \"zb_h1\""),
            std::string::npos);
  // A valid split (8 heads, 8 KV heads) on a job of 2 or 4 ranks that 8 does not divide.
  const auto too_many = error_of({"parallelism.tensor_parallel=8", "model.num_key_value_heads=8",
                                  "model.num_attention_heads=8"});
  EXPECT_NE(too_many.find("tensor_parallel x pipeline_parallel = 8 x 1 = 8 does not divide; launch a multiple of 8"),
            std::string::npos)
      << too_many;
}
