// ZeRO-3's split of QLoRA's 4-bit storage (parallel/zero/sharded_frozen_base.h): each rank's piece is
// whole blocks of 64 (its codes start at a block's first byte, its absmax entries are those blocks'),
// the pieces concatenated in rank order rebuild the storage byte for byte (so the dequantized weight
// is the replicated one's), and the bytes a rank keeps are the planner's formula. Sizes: a partial
// last block, an odd count, more than 256 blocks (two absmax2 entries), fewer blocks than ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/quant/four_bit.h"
#include "parallel/zero/sharded_frozen_base.h"

using namespace shardlm;

TEST(ShardedFrozenBase, FourBitPiecesAreWholeBlocksAndJoinIntoTheStorage) {
  at::manual_seed(3);
  for (const int64_t n : {int64_t{64}, int64_t{129}, int64_t{4097}, int64_t{256 * 64 + 640}}) {
    const auto w = at::randn({n}, at::kFloat);
    for (const bool dq : {false, true}) {
      const auto q = model::quant::quantize_4bit(w, model::quant::FourBitType::NF4, dq);
      const auto bytes_of = [](const at::Tensor& t) { return t.contiguous().view({-1}).view(at::kByte); };
      for (const int shards : {1, 2, 3, 4}) {
        const auto split = parallel::four_bit_split(n, dq, shards);
        std::vector<at::Tensor> pieces;
        for (int r = 0; r < shards; ++r) {
          pieces.push_back(parallel::four_bit_piece(q, r, shards));
          ASSERT_EQ(pieces.back().numel(), split.piece_bytes()) << n << " " << dq << " " << shards;
          // Rank r's first code byte is block r*S's first, its first absmax entry block r*S's.
          const int64_t block = r * split.per_rank;
          if (block >= split.blocks) continue;  // only padding (fewer blocks than ranks)
          const int64_t code = block * parallel::FourBitSplit::kPackedPerBlock;
          EXPECT_EQ(pieces.back()[0].item<int64_t>(), q.packed[code].item<int64_t>()) << n << " r=" << r;
          const auto absmax = bytes_of(q.absmax).narrow(0, block * split.absmax_entry, split.absmax_entry);
          EXPECT_TRUE(at::equal(pieces.back().narrow(0, split.per_rank * parallel::FourBitSplit::kPackedPerBlock,
                                                     split.absmax_entry),
                                absmax))
              << n << " r=" << r;
        }
        const auto back = parallel::four_bit_from_pieces(at::cat(pieces), q, shards);
        EXPECT_TRUE(at::equal(back.packed, q.packed)) << n << " " << dq << " " << shards;
        EXPECT_TRUE(at::equal(back.absmax, q.absmax)) << n << " " << dq << " " << shards;
        if (dq) EXPECT_TRUE(at::equal(back.absmax2, q.absmax2)) << n << " " << shards;
        EXPECT_EQ(back.offset, q.offset);
        EXPECT_TRUE(at::equal(model::quant::dequantize_4bit(back, at::kFloat), model::quant::dequantize_4bit(q, at::kFloat)));
        // The bytes one rank keeps (the planner's): its piece and the offset; the whole store on one rank.
        EXPECT_EQ(parallel::sharded_four_bit_bytes(n, dq, shards),
                  shards == 1 ? q.bytes() : split.piece_bytes() + (dq ? 4 : 0));
        EXPECT_GE(shards * split.piece_bytes() + (dq ? 4 : 0), q.bytes());
      }
    }
  }
  EXPECT_EQ(parallel::sharded_tensor_bytes(10, 2, 3), 8);  // ceil(10 / 3) bf16 elements
  EXPECT_EQ(parallel::sharded_tensor_bytes(10, 4, 1), 40);
}
