// Tensor parallelism (with sequence parallelism, ZeRO, recomputation, tied embeddings, the Llama
// family's options and MoE) reproduces the single-process trajectory (model_parallel.h says how it
// is compared). Also: sequence parallelism equals TP without it, activation checkpointing changes
// nothing, the bytes each tensor-parallel collective moves per step equal Megatron's count, and
// layouts the split cannot make are refused with the arithmetic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "model_parallel.h"
#include "train/trainer.h"

using namespace shardlm;
using namespace shardlm::model_parallel;

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
// Under tensor parallelism the sparse block is replicated over the tp group and runs outside the
// parallel regions (tp_layout.h): without sequence parallelism every tp rank routes every position
// (Mixtral's load-balancing loss included), with it each rank its own positions and the router's and
// experts' gradients are summed over the group like the norms'. Qwen3-MoE adds the per-head q/k
// norms, whose gradients each rank sees for its heads only (summed with or without sequence
// parallelism).
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

// fp16: an overflow only one tensor-parallel rank sees (an inf written into its own gradient
// shard) makes every rank skip the same step: a TP peer that updated while the other skipped
// would leave the model's shards out of step.
TEST(TensorParallel, Fp16OverflowOnOneTpRankSkipsTheStepEverywhere) {
  // tp rank 1 of the first data-parallel position (dp rank 0) only.
  const auto h = fp16_run_with_overflow_on(config({2, 1, false, "none", "fp32"}, 2, "fp16_overflow"), 1, 0);
  EXPECT_EQ(h[2].extra.at("loss_scale"), h[1].extra.at("loss_scale") / 2);
}

// Hybrid sharding under tensor parallelism: on 4 ranks tp 2 x dp 2 in shard groups of 1.
TEST(TensorParallel, Tp2WithHybridZero3ReproducesOneProcess) { expect_reproduces_single_process(hybrid({2, 3})); }

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
