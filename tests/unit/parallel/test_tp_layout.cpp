// Megatron's tensor-parallel split as data (parallel/tensor/tp_layout.h): the pieces join back into
// the HF tensor, the query heads of a rank read the KV heads it holds, shapes match what the
// planner assumes, and impossible layouts are refused with the arithmetic.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/llama.h"
#include "parallel/tensor/tp_layout.h"

using namespace shardlm;

namespace {

model::LlamaConfig tiny() { return model::preset("tiny"); }

std::string error_of(const model::LlamaConfig& cfg, int t, bool sp, int64_t seq) {
  try {
    parallel::tp::check_tensor_parallel(cfg, t, sp, seq);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

TEST(TpLayout, PiecesJoinBackIntoTheHfTensor) {
  const auto cfg = tiny();
  model::Llama llama(cfg, 7);
  for (int t : {1, 2, 4}) {
    const auto shapes = parallel::tp::sharded_shape(model::describe(cfg), cfg, t);
    for (size_t i = 0; i < llama.parameters().size(); ++i) {
      const auto& p = llama.parameters()[i];
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < t; ++r) {
        pieces.push_back(parallel::tp::shard(p.tensor.detach(), p.name, cfg, t, r));
        EXPECT_EQ(pieces.back().sizes().vec(), shapes.params[i].second) << p.name << " t=" << t;
      }
      EXPECT_TRUE(at::equal(parallel::tp::unshard(pieces, p.name, cfg), p.tensor.detach())) << p.name << " t=" << t;
    }
  }
}

TEST(TpLayout, SplitsFollowMegatron) {
  const auto cfg = tiny();  // 4 heads, 2 KV heads, head_dim 16
  using parallel::tp::Split;
  auto split = [&](const std::string& n, int t, bool sp = false) { return parallel::tp::param_split(n, cfg, t, sp); };
  EXPECT_EQ(split("model.embed_tokens.weight", 2).split, Split::Rows);
  EXPECT_EQ(split("model.layers.0.self_attn.q_proj.weight", 2).split, Split::Rows);
  EXPECT_EQ(split("model.layers.0.mlp.up_proj.weight", 2).split, Split::Rows);
  EXPECT_EQ(split("model.layers.0.self_attn.o_proj.weight", 2).split, Split::Columns);
  EXPECT_EQ(split("model.layers.0.mlp.down_proj.weight", 2).split, Split::Columns);
  // Norms: replicated on every rank, gradients summed only when the sequence is split.
  EXPECT_EQ(split("model.norm.weight", 2).replicas, 2);
  EXPECT_FALSE(split("model.norm.weight", 2).sum_gradients);
  EXPECT_TRUE(split("model.norm.weight", 2, true).sum_gradients);
  // KV heads: split at t=2, replicated on 2 ranks each at t=4 (and then summed over them).
  EXPECT_EQ(split("model.layers.1.self_attn.k_proj.weight", 2).replicas, 1);
  EXPECT_EQ(split("model.layers.1.self_attn.k_proj.weight", 4).replicas, 2);
  EXPECT_TRUE(split("model.layers.1.self_attn.v_proj.weight", 4).sum_gradients);
  // A sparse layer (Qwen2-MoE names): router, experts and the shared expert (whose names end like
  // the dense MLP's) replicated like the norms; Qwen3's per-head q/k norms summed even without
  // sequence parallelism (each rank normalises only its heads).
  for (const char* n : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                        "model.layers.0.mlp.experts.down_proj", "model.layers.0.mlp.shared_expert.gate_proj.weight",
                        "model.layers.0.mlp.shared_expert.down_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight"}) {
    EXPECT_EQ(split(n, 2).split, Split::Replicated) << n;
    EXPECT_FALSE(split(n, 2).sum_gradients) << n;
    EXPECT_TRUE(split(n, 2, true).sum_gradients) << n;
  }
  EXPECT_TRUE(split("model.layers.0.self_attn.q_norm.weight", 2).sum_gradients);
  EXPECT_TRUE(split("model.layers.0.self_attn.k_norm.weight", 2).sum_gradients);
  EXPECT_EQ(split("model.layers.0.self_attn.k_norm.weight", 2).replicas, 2);
  // At t=4 ranks 0,1 hold KV head 0 (read by query heads 0,1) and ranks 2,3 KV head 1.
  const auto k = at::arange(2 * 16 * 64, at::kFloat).view({32, 64});
  EXPECT_TRUE(at::equal(parallel::tp::shard(k, "model.layers.0.self_attn.k_proj.weight", cfg, 4, 1), k.narrow(0, 0, 16)));
  EXPECT_TRUE(at::equal(parallel::tp::shard(k, "model.layers.0.self_attn.k_proj.weight", cfg, 4, 2), k.narrow(0, 16, 16)));
}

TEST(TpLayout, RefusesWhatTheSplitCannotMakeWithTheArithmetic) {
  auto cfg = tiny();
  EXPECT_EQ(error_of(cfg, 2, true, 32), "");
  EXPECT_NE(error_of(cfg, 3, false, 32).find("attention heads (num_attention_heads) (4 / 3 = 1.33333)"),
            std::string::npos)
      << error_of(cfg, 3, false, 32);
  cfg.vocab_size = 130;  // padded to 132 (tests below)
  EXPECT_EQ(error_of(cfg, 4, false, 32), "");
  cfg.vocab_size = 5;  // padded to 8: the last of 4 ranks would hold only padding
  EXPECT_NE(error_of(cfg, 4, false, 32).find("leaves the last rank no vocabulary row of 5"), std::string::npos)
      << error_of(cfg, 4, false, 32);
  cfg = tiny();
  cfg.num_attention_heads = 8;
  cfg.hidden_size = 128;
  cfg.num_key_value_heads = 4;  // 8 heads, 4 KV heads, t = 8: each KV head on 2 ranks is fine...
  EXPECT_EQ(error_of(cfg, 8, false, 32), "");
  cfg.num_key_value_heads = 8;
  cfg.num_attention_heads = 24;
  cfg.hidden_size = 384;  // ...but 8 KV heads and t = 12 is neither a split nor a replication
  cfg.intermediate_size = 1200;
  cfg.vocab_size = 1200;
  EXPECT_NE(error_of(cfg, 12, false, 36).find("8 % 12 = 8, 12 % 8 = 4"), std::string::npos)
      << error_of(cfg, 12, false, 36);
  EXPECT_NE(error_of(tiny(), 2, true, 33).find("seq_len 33 / 2 = 16.5"), std::string::npos);
  EXPECT_NE(error_of(tiny(), 1, true, 32).find("needs parallelism.tensor_parallel > 1"), std::string::npos);
}

TEST(TpLayout, AVocabularyTpDoesNotDivideIsPaddedAndThePaddingNeverLeavesTheShards) {
  auto cfg = tiny();
  cfg.vocab_size = 130;
  namespace tp = parallel::tp;
  EXPECT_EQ(tp::padded_vocab(cfg, 4), 132);
  EXPECT_EQ(tp::vocab_rows_per_rank(cfg, 4), 33);
  const auto shape = tp::sharded_shape(model::describe(cfg), cfg, 4);
  EXPECT_EQ(shape.params.front().second, (std::vector<int64_t>{33, cfg.hidden_size}));
  const auto full = at::randn({130, cfg.hidden_size}, at::kDouble);
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < 4; ++r) pieces.push_back(tp::shard(full, "model.embed_tokens.weight", cfg, 4, r));
  EXPECT_TRUE(at::equal(pieces[3].narrow(0, 31, 2), at::zeros({2, cfg.hidden_size}, at::kDouble)));
  EXPECT_TRUE(at::equal(pieces[1], full.narrow(0, 33, 33)));
  EXPECT_TRUE(at::equal(tp::unshard(pieces, "model.embed_tokens.weight", cfg), full));
  EXPECT_TRUE(at::equal(tp::unshard(pieces, "lm_head.weight", cfg), full));
}
