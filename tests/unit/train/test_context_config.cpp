// Context parallelism's keys (parallelism.context_parallel, context_parallel_mode): what the run
// cannot split is refused with one message naming the key and the fix, and the batch arithmetic
// counts the context-parallel ranks of one sequence as one data-parallel rank.
#include <gtest/gtest.h>

#include <string>

#include "config_files.h"
#include "train/config.h"
#include "util/error.h"

using namespace shardlm;

namespace {
using train::testing::kBase;
using train::testing::has;

std::string validate_error(const std::vector<std::string>& overrides, int world) {
  try {
    train::load_train_config(train::testing::write_config(kBase), overrides).validate_for(world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ContextConfig, RefusesWhatCannotSplitNamingTheKey) {
  // 32 positions do not split into 2 x 3 chunks.
  auto e = validate_error({"parallelism.context_parallel=3", "data.seq_len=32"}, 3);
  EXPECT_TRUE(has(e, "parallelism.context_parallel = 3") && has(e, "data.seq_len = 32") && has(e, "multiple of 6")) << e;
  // The tiny model's 4 heads over 8 ranks of Ulysses.
  e = validate_error({"parallelism.context_parallel=8", "parallelism.context_parallel_mode=all_to_all"}, 8);
  EXPECT_TRUE(has(e, "context_parallel_mode = \"all_to_all\"") && has(e, "4 heads")) << e;
  e = validate_error({"parallelism.context_parallel=2"}, 3);
  EXPECT_TRUE(has(e, "parallelism.context_parallel = 2 does not divide the 3 ranks")) << e;
  // With tp 2 a rank holds 2 of the 4 heads, which 4 Ulysses ranks cannot split.
  e = validate_error({"parallelism.context_parallel=4", "parallelism.tensor_parallel=2",
                      "parallelism.context_parallel_mode=all_to_all"}, 8);
  EXPECT_TRUE(has(e, "the 2 heads of one tensor-parallel rank do not divide by 4")) << e;
  e = validate_error({"parallelism.context_parallel_mode=ring"}, 1);
  EXPECT_TRUE(has(e, "parallelism.context_parallel_mode")) << e;
  EXPECT_EQ(validate_error({"parallelism.context_parallel=4", "parallelism.context_parallel_mode=all_to_all"}, 4), "");
}

TEST(ContextConfig, ContextParallelRanksShareOneBatch) {
  // 8 ranks at cp 2: 4 data-parallel ranks, so train_batch_size = micro x accumulation x 4.
  auto c = train::load_train_config(train::testing::write_config(kBase),
                                    {"parallelism.context_parallel=2", "train_batch_size=32",
                                     "train_micro_batch_size_per_gpu=4"});
  c.micro_batch = 4, c.grad_accum = 0;
  c.resolve_for(8);
  EXPECT_EQ(c.grad_accum, 2);
}
