// LoRA on every layout it is built for: DDP and ZeRO stages 1-3, tensor parallelism (with sequence
// parallelism and ZeRO-1), pipeline parallelism (every schedule, with full recomputation) and a
// checkpoint saved by pipeline stages resumed under tensor parallelism train the adapters as one process
// does, in float64: loss to 1e-12, grad norm and the exported adapter_model.safetensors (the slices
// gathered) to 1e-10. One process trains alone on the same token windows with accumulation dp x a
// (docs/data.md). The tiny model, 2 layers, 3-4 steps: seconds per layout. Also: ZeRO's units hold
// only the adapters.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "reference_runs.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/quant/quantized_base.h"
#include "parallel/zero/sharded_frozen_base.h"
#include "test_dirs.h"
#include "trajectory.h"
#include "train/lora_config.h"
#include "train/trainer.h"

using namespace shardlm;

namespace {

train::TrainConfig lora_config(int stage, int64_t accumulation, const std::string& tag) {
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
                                    {"steps=4", "data.val=", "threads=1", "comm.timeout_s=30", "resume=false",
                                     "train_micro_batch_size_per_gpu=2",
                                     "gradient_accumulation_steps=" + std::to_string(accumulation),
                                     "optimizer.params.lr=3e-3", "ddp.bucket_cap_mb=0.01",
                                     "zero_optimization.stage=" + std::to_string(stage), "model.num_hidden_layers=2",
                                     "lora.enabled=true", "lora.r=4", "lora.lora_alpha=8",
                                     "lora.target_modules=all-linear", "lora.init_lora_weights=false"});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = true;
  c.out_dir = test_support::mpi_test_path("lora_" + tag);
  return c;
}

test_support::Outcome train_lora(const train::TrainConfig& cfg, comm::CommPtr comm, int64_t* trainable = nullptr,
                               int64_t* frozen_bytes = nullptr) {
  train::Trainer trainer(cfg, comm, /*quiet=*/!std::getenv("SHARDLM_TEST_VERBOSE"));
  test_support::Outcome o;
  o.history = trainer.run().history;
  if (trainable) *trainable = trainer.model().num_parameters();
  if (frozen_bytes) *frozen_bytes = trainer.model().frozen_base()->bytes();
  comm->barrier();
  if (comm->rank() == 0) o.weights = io::load_safetensors(cfg.out_dir + "/adapter_model.safetensors");
  return o;
}

// The model-parallel suites' LoRA: every linear adapted, down_proj at its own rank (rank_pattern),
// the head and the embedding trained in full (modules_to_save; untied), 3 steps.
std::vector<std::string> model_parallel_lora(const std::vector<std::string>& layout) {
  std::vector<std::string> o = {"steps=3", "data.val=", "threads=1", "comm.timeout_s=60", "resume=false",
                                "train_micro_batch_size_per_gpu=2", "optimizer.params.lr=3e-3",
                                "model.num_hidden_layers=2", "lora.enabled=true", "lora.r=4", "lora.lora_alpha=8",
                                "lora.target_modules=all-linear", "lora.init_lora_weights=false",
                                "lora.rank_pattern={\"down_proj\": 2}",
                                "lora.modules_to_save=[\"lm_head\", \"embed_tokens\"]"};
  o.insert(o.end(), layout.begin(), layout.end());
  return o;
}

train::TrainConfig config_of(const std::vector<std::string>& overrides, const std::string& tag) {
  auto c = train::load_train_config(std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json", overrides);
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.float64_for_tests = true;
  c.out_dir = test_support::mpi_test_path("lora_" + tag);
  return c;
}

// One process with accumulation `accumulation` (world rank 0 alone; the other ranks get nothing).
test_support::Outcome one_process(std::vector<std::string> overrides, int64_t accumulation, const std::string& tag) {
  overrides.push_back("gradient_accumulation_steps=" + std::to_string(accumulation));
  const auto cfg = config_of(overrides, tag);
  auto world = comm::mpi_world();
  auto self = world->split(world->rank(), 0, "self");  // every rank takes part in the split
  return test_support::one_process_on_rank_0<test_support::Outcome>(
      "lora " + test_support::joined(overrides), cfg, [&] { return train_lora(cfg, self); });
}

// `layout` (its keys, on every rank, accumulation 2) against one process; prints and checks.
// frozen_bytes: the bytes of the frozen base this rank holds.
void expect_equals_one_process(const std::vector<std::string>& base, const std::vector<std::string>& layout,
                               const test_support::Outcome& ref, const std::string& tag,
                               int64_t* frozen_bytes = nullptr) {
  auto world = comm::mpi_world();
  auto overrides = base;
  overrides.insert(overrides.end(), layout.begin(), layout.end());
  overrides.push_back("gradient_accumulation_steps=2");
  const auto got = train_lora(config_of(overrides, tag), world, nullptr, frozen_bytes);
  if (world->rank() != 0) return;
  const auto d = test_support::deviation_of(got, ref);
  const auto name = test_support::joined(layout);
  EXPECT_LT(d.loss, 1e-12) << name;
  EXPECT_LT(d.grad_norm, 1e-10) << name;
  EXPECT_LT(d.weights, 1e-10) << name;
  EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 1e-4) << "the reference run should learn";
  std::printf("[ lora ] %s: worst relative deviation from one process: loss %.2e, grad norm %.2e, adapters %.2e\n",
              name.c_str(), d.loss, d.grad_norm, d.weights);
}

}  // namespace

// Tensor parallelism (with sequence parallelism and ZeRO-1: a column-parallel base's lora_B and a
// row-parallel base's lora_A split, the others whole, tp_layout.h) and pipeline parallelism (every
// schedule; full recomputation under gpipe) on 2 ranks. interleaved_1f1b needs 4 layers: its own
// reference, with tied (frozen) embeddings. (Left out of 3 and 4 ranks by tests/tests.cmake's filters:
// tp x dp and pp x dp are the strategies' own suites; these runs cost seconds each.)
TEST(Lora, TensorAndPipelineParallelEqualOneProcessInFp64) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "tp 2 and pp 2 alone: 2 ranks";
  const auto base = model_parallel_lora({});
  const auto ref = one_process(base, 2, "model_parallel_ref");
  expect_equals_one_process(base, {"parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true",
                                   "zero_optimization.stage=1"}, ref, "tp2_sp_zero1");
  int64_t stage_bytes = 0;
  expect_equals_one_process(base, {"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=gpipe",
                                   "activation_checkpointing.mode=full"}, ref, "pp2_gpipe_full", &stage_bytes);
  // Each stage keeps only its own layers' frozen base: the stages' bytes add up to the whole base.
  const auto cfg = config_of(base, "pp_whole");
  model::Llama whole(cfg.model, cfg.seed, at::kDouble);
  train::apply_lora(whole, cfg.lora, cfg.seed);
  auto sum = at::tensor({static_cast<double>(stage_bytes)}, at::kDouble);
  world->all_reduce(sum);
  EXPECT_LT(stage_bytes, whole.frozen_base()->bytes());
  EXPECT_EQ(sum.item<double>(), static_cast<double>(whole.frozen_base()->bytes()));
  expect_equals_one_process(base, {"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=zb_h1"}, ref,
                            "pp2_zb_h1");
  const auto tied = model_parallel_lora({"model.num_hidden_layers=4", "model.tie_word_embeddings=true",
                                         "lora.modules_to_save=[]"});
  const auto tied_ref = one_process(tied, 2, "tied_ref");
  expect_equals_one_process(tied, {"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=interleaved_1f1b",
                                   "parallelism.virtual_pipeline_parallel=2"}, tied_ref, "pp2_interleaved");
}

// Context parallelism (parallel/context/) splits each sequence over 2 ranks; the adapters are plain
// trained parameters beside attention, their gradients summed over the cp group like every other
// parameter's. Every exchange (the p2p ring, all-gather, all-to-all) and ZeRO-3 with its split frozen base, 2
// ranks, as one process in fp64 (the model-parallel reference: modules_to_save and rank_pattern too).
TEST(Lora, ContextParallelEqualsOneProcessInFp64) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "cp 2 alone: 2 ranks";
  const auto base = model_parallel_lora({});
  const auto ref = one_process(base, 2, "model_parallel_ref");
  for (const char* mode : {"p2p", "all_gather", "all_to_all"})
    expect_equals_one_process(base, {"parallelism.context_parallel=2", std::string("parallelism.context_parallel_mode=") + mode},
                              ref, std::string("cp2_") + mode);
  int64_t base_bytes = 0;
  expect_equals_one_process(base, {"parallelism.context_parallel=2", "zero_optimization.stage=3"}, ref, "cp2_zero3",
                            &base_bytes);
  const auto cfg = config_of(base, "cp_whole");
  model::Llama whole(cfg.model, cfg.seed, at::kDouble);
  train::apply_lora(whole, cfg.lora, cfg.seed);
  // ZeRO-3 shards over the cp group's ranks too (they hold the same parameters): half the base each.
  EXPECT_LT(std::abs(2.0 * static_cast<double>(base_bytes) - whole.frozen_base()->bytes()),
            0.01 * whole.frozen_base()->bytes());
}

// A checkpoint saved by pipeline stages (1f1b, each stage's adapters and their optimizer states)
// after 2 steps resumes under tensor parallelism (the adapters re-split, tp_layout.h) and finishes as
// one process's 3 steps: the reshard, and 1f1b and tp without sequence parallelism.
TEST(Lora, CheckpointFromPipelineResumesUnderTensorParallelism) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "pp 2 and tp 2 alone: 2 ranks";
  const auto base = model_parallel_lora({});
  const auto ref = one_process(base, 2, "model_parallel_ref");
  auto first = base;
  first.insert(first.end(), {"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=1f1b",
                             "gradient_accumulation_steps=2", "steps=2"});
  train_lora(config_of(first, "ckpt_pp2"), world);
  auto then = base;
  then.insert(then.end(), {"parallelism.tensor_parallel=2", "gradient_accumulation_steps=2", "resume=true"});
  const auto resumed = train_lora(config_of(then, "ckpt_pp2"), world);
  if (world->rank() != 0) return;
  ASSERT_EQ(resumed.history.size(), 1u);
  auto last = ref;
  last.history = {ref.history[2]};
  const auto d = test_support::deviation_of(resumed, last);
  EXPECT_LT(d.loss, 1e-12);
  EXPECT_LT(d.grad_norm, 1e-10);
  EXPECT_LT(d.weights, 1e-10);
  std::printf("[ lora ] checkpoint pp=2 (1f1b) -> tp=2: step 3 loss %.2e, grad norm %.2e, final adapters %.2e from one "
              "process\n", d.loss, d.grad_norm, d.weights);
}

TEST(Lora, DdpAndZeroStagesEqualOneProcessInFp64) {
  auto world = comm::mpi_world();
  const int dp = world->size();
  auto self = world->split(world->rank(), 0, "self");
  int64_t trainable = 0, whole_base = 0;
  const auto ref =
      train_lora(lora_config(0, 2 * dp, "single_r" + std::to_string(world->rank())), self, &trainable, &whole_base);
  // 2 layers x 7 linears, each r x in + out x r (hidden 128 ... of the tiny preset).
  EXPECT_GT(trainable, 0);
  for (int stage : {0, 1, 2, 3}) {
    int64_t held = 0, base_bytes = 0;
    const auto got = train_lora(lora_config(stage, 2, "stage" + std::to_string(stage)), world, &held, &base_bytes);
    EXPECT_EQ(held, trainable) << "stage " << stage << ": parameters() must be the adapters alone";
    // The frozen base: replicated at stages 0-2; at stage 3 each rank keeps 1/dp of every tensor, padded
    // to a multiple of dp elements (zero/sharded_frozen_base.h), and gathers it per use.
    if (stage < 3) EXPECT_EQ(base_bytes, whole_base) << "stage " << stage;
    else EXPECT_LT(std::abs(static_cast<double>(base_bytes) * dp - whole_base), 0.01 * whole_base) << base_bytes;
    if (stage == 3 && world->rank() == 0)
      std::printf("[ lora ] zero stage 3, dp=%d: frozen base %lld bytes per rank, one process %lld (%.4f)\n", dp,
                  static_cast<long long>(base_bytes), static_cast<long long>(whole_base),
                  static_cast<double>(base_bytes) / static_cast<double>(whole_base));
    if (world->rank() != 0) continue;
    const auto d = test_support::deviation_of(got, ref);
    EXPECT_LT(d.loss, 1e-12) << "stage " << stage;
    EXPECT_LT(d.grad_norm, 1e-10) << "stage " << stage;
    EXPECT_LT(d.weights, 1e-10) << "stage " << stage;
    EXPECT_GT(ref.history.front().loss - ref.history.back().loss, 1e-3) << "the reference run should learn";
    EXPECT_EQ(got.weights.size(), 28u);
    std::printf("[ lora ] zero stage %d, dp=%d: worst relative deviation from one process: loss %.2e, grad norm %.2e, "
                "adapters %.2e\n", stage, dp, d.loss, d.grad_norm, d.weights);
  }
}

namespace {

// memory.json's frozen_base of the run in `dir` (rank 0 writes it) equals plan.json's (the trainer's plan;
// an fp32 run: the planner prices no fp64), and the plan counts a gathered tensor.
void expect_frozen_base_as_planned(const std::string& dir) {
  nlohmann::json memory, plan;
  std::ifstream(dir + "/memory.json") >> memory;
  std::ifstream(dir + "/plan.json") >> plan;
  EXPECT_EQ(memory["frozen_base"], plan["stages"][0]["frozen_base"]) << dir;
  EXPECT_GT(plan["stages"][0]["gathered_peak"].get<int64_t>(), 0) << dir;
}

// A QLoRA run of the tiny model: NF4 with double quantization, fp32 compute, 3 steps.
train::TrainConfig qlora_zero3_config(int stage, int64_t accumulation, const std::string& tag) {
  auto c = train::load_train_config(
      std::string(SHARDLM_SOURCE_DIR) + "/configs/tiny.json",
      {"steps=3", "data.val=", "threads=1", "comm.timeout_s=30", "resume=false", "train_micro_batch_size_per_gpu=2",
       "gradient_accumulation_steps=" + std::to_string(accumulation), "optimizer.params.lr=3e-3",
       "zero_optimization.stage=" + std::to_string(stage), "model.num_hidden_layers=2", "lora.enabled=true",
       "lora.r=4", "lora.lora_alpha=8", "lora.target_modules=all-linear", "lora.init_lora_weights=false",
       "quantization.load_in_4bit=true", "quantization.bnb_4bit_quant_type=nf4",
       "quantization.bnb_4bit_use_double_quant=true"});
  c.data.train = std::string(SHARDLM_SOURCE_DIR) + "/data/brown/train.bin";
  c.out_dir = test_support::mpi_test_path("qlora_" + tag);
  return c;
}

}  // namespace

// QLoRA at ZeRO stage 3 (zero/sharded_frozen_base.h): each rank keeps its blocks of the 4-bit storage
// (codes, absmax, absmax2), about 1/dp of the replicated store's bytes, and the weight gathered and
// dequantized from the pieces is bit for bit the replicated store's. The run then equals ZeRO-2 (the
// same sums, its base replicated) bit for bit, and one process to fp32's summation order.
TEST(Lora, Zero3QloraShardsTheFourBitBaseAndEqualsOneProcess) {
  auto world = comm::mpi_world();
  const int dp = world->size();
  {
    const auto cfg = qlora_zero3_config(3, 2, "weights");
    model::Llama m(cfg.model, cfg.seed, at::kFloat);
    train::apply_lora(m, cfg.lora, cfg.seed);
    const auto replicated = model::quant::quantize_frozen_base(*m.frozen_base(), {model::quant::FourBitType::NF4, true, at::kFloat});
    const parallel::ShardedFrozenBase sharded(*replicated, world);
    for (size_t k = 0; k < replicated->size(); ++k)
      EXPECT_TRUE(at::equal(sharded.weight(k), replicated->weight(k))) << replicated->name(k);
    const double whole = static_cast<double>(replicated->bytes());
    EXPECT_LT(std::abs(static_cast<double>(sharded.bytes()) * dp - whole), 0.02 * whole) << sharded.bytes();
  }
  auto self = world->split(world->rank(), 0, "self");
  int64_t whole_base = 0, base_bytes = 0;
  const auto ref = train_lora(qlora_zero3_config(0, 2 * dp, "single_r" + std::to_string(world->rank())), self, nullptr,
                            &whole_base);
  const auto replicated = train_lora(qlora_zero3_config(2, 2, "zero2"), world);
  const auto got = train_lora(qlora_zero3_config(3, 2, "zero3"), world, nullptr, &base_bytes);
  EXPECT_LT(std::abs(static_cast<double>(base_bytes) * dp - whole_base), 0.02 * whole_base) << base_bytes;
  if (world->rank() != 0) return;
  expect_frozen_base_as_planned(qlora_zero3_config(3, 2, "zero3").out_dir);
  const auto same = test_support::deviation_of(got, replicated);
  EXPECT_EQ(same.loss, 0.0);
  EXPECT_EQ(same.weights, 0.0);
  const auto d = test_support::deviation_of(got, ref);
  EXPECT_LT(d.loss, 1e-6);
  EXPECT_LT(d.weights, 1e-6);
  std::printf("[ lora ] qlora nf4+dq zero stage 3, dp=%d: frozen base %lld bytes per rank, one process %lld (%.4f); "
              "deviation from zero stage 2: loss %.2e, adapters %.2e; from one process: loss %.2e, grad norm %.2e, "
              "adapters %.2e\n", dp, static_cast<long long>(base_bytes), static_cast<long long>(whole_base),
              static_cast<double>(base_bytes) / static_cast<double>(whole_base), same.loss, same.weights, d.loss,
              d.grad_norm, d.weights);
}

// ZeRO-3 over dp 2 beside tp 2 or pp 2 (4 ranks): the frozen base is split by tensor parallelism or
// held by its stage first, then over the ZeRO group; each rank holds about a quarter of it, all four
// add up to it (plus padding and TP's replicated norms), and the runs equal one process in float64.
// (Left out of 3 ranks by tests/tests.cmake's filter.)
TEST(Lora, Zero3BesideTensorOrPipelineParallelSplitsTheBase) {
  auto world = comm::mpi_world();
  if (world->size() != 4) GTEST_SKIP() << "tp 2 or pp 2 x dp 2: 4 ranks";
  const auto base = model_parallel_lora({"zero_optimization.stage=3"});
  const auto ref = one_process(base, 4, "zero3_model_parallel_ref");
  const auto cfg = config_of(base, "zero3_whole");
  model::Llama whole(cfg.model, cfg.seed, at::kDouble);
  train::apply_lora(whole, cfg.lora, cfg.seed);
  const double whole_bytes = static_cast<double>(whole.frozen_base()->bytes());
  for (const auto& layout : {std::vector<std::string>{"parallelism.tensor_parallel=2"},
                             std::vector<std::string>{"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=1f1b"}}) {
    int64_t held = 0;
    expect_equals_one_process(base, layout, ref, "zero3_" + test_support::joined(layout), &held);
    auto sum = at::tensor({static_cast<double>(held)}, at::kDouble);
    world->all_reduce(sum);
    EXPECT_LT(static_cast<double>(held), 0.3 * whole_bytes) << test_support::joined(layout);
    EXPECT_LT(std::abs(sum.item<double>() - whole_bytes), 0.02 * whole_bytes) << test_support::joined(layout);
    if (world->rank() == 0)
      std::printf("[ lora ] zero stage 3 with %s x dp 2: frozen base %lld bytes on rank 0, %.0f on all 4, one process "
                  "%.0f\n", test_support::joined(layout).c_str(), static_cast<long long>(held), sum.item<double>(),
                  whole_bytes);
  }
}

// The experts' adapters (lora.target_parameters, model/lora.h) on 2 ranks: a tiny Mixtral with q_proj and
// both expert weights adapted (B drawn nonzero: init_lora_weights false), 3 steps, as one process with the
// same micro-batches, in float64: DDP, ZeRO-1 and -3; pipeline stages; tensor parallelism with and without
// sequence parallelism (the sparse block and its adapters replicated, tp_layout.h: their gradients summed
// over the group when each rank routes its own positions).
TEST(Lora, ExpertAdaptersOnDataPipelineAndTensorParallelEqualOneProcessInFp64) {
  auto world = comm::mpi_world();
  if (world->size() != 2) GTEST_SKIP() << "dp 2 alone: 2 ranks";
  const std::vector<std::string> base = {
      "steps=3", "data.val=", "threads=1", "comm.timeout_s=60", "resume=false", "train_micro_batch_size_per_gpu=2",
      "optimizer.params.lr=3e-3", "model.num_hidden_layers=2", "model.model_type=mixtral",
      "model.num_local_experts=4", "model.num_experts_per_tok=2", "model.intermediate_size=64", "lora.enabled=true",
      "lora.r=4", "lora.lora_alpha=8", "lora.target_modules=[\"q_proj\"]", "lora.init_lora_weights=false",
      "lora.target_parameters=[\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"]",
      "lora.rank_pattern={\"down_proj\": 2}"};
  const auto ref = one_process(base, 4, "experts_ref");
  for (const char* stage : {"zero_optimization.stage=0", "zero_optimization.stage=1", "zero_optimization.stage=3"})
    expect_equals_one_process(base, {stage}, ref, std::string("experts_") + stage);
  // dp 1: pipeline stages (each its layers' expert adapters) and tensor parallelism, against one process at
  // accumulation 2.
  const auto ref_pp = one_process(base, 2, "experts_ref_pp");
  expect_equals_one_process(base, {"parallelism.pipeline_parallel=2", "parallelism.pipeline_schedule=1f1b"}, ref_pp,
                            "experts_pp2");
  expect_equals_one_process(base, {"parallelism.tensor_parallel=2"}, ref_pp, "experts_tp2");
  expect_equals_one_process(base, {"parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"}, ref_pp,
                            "experts_tp2_sp");
}
