// The Llama family's options and the MoE families on data-parallel layouts (DDP, ZeRO-2, ZeRO-3 and
// recomputation) reproduce the single-process trajectory (model_parallel.h), and what does not
// compose with them is refused before training. Their tensor and pipeline layouts are in
// test_tensor_parallel.cpp and test_pipeline_parallel.cpp.
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
