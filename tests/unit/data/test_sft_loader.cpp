// The DataLoader over `shardlm prepare --sft` rows: the loss-mask sidecar read as -100 targets, its
// world-independent count of counted targets, and the errors for mismatched or damaged masks.
// Split from test_sft.cpp (issue 40: one job per file); same test binary, same test names.
#include <gtest/gtest.h>

#include "sft_test_helpers.h"

TEST(SftLoaderErrors, MaskThatDoesNotMatchItsTokenFileIsRefused) {
  TempDir dir;
  write_text(dir.file("in.jsonl"), jsonl(kPadded));
  const int64_t seq_len = 40;
  prepare_sft(options(dir, seq_len, false));
  const std::string train = dir.file("out/train.bin"), mask = sidecar_path(train);
  const std::vector<unsigned char> tokens0 = read_bytes(train), mask0 = read_bytes(mask);
  ASSERT_NO_THROW(DataLoader(load(train), 1, seq_len, 0, 1));

  // One token rewritten (same count, other CRC): the mask belongs to other tokens.
  std::vector<unsigned char> t = tokens0;
  ASSERT_GT(t.size(), static_cast<size_t>(kLlmcHeaderBytes + 6));
  t[static_cast<size_t>(kLlmcHeaderBytes) + 4] ^= 1;  // token 2's low byte
  write_bytes(train, t);
  std::string msg = error_message([&] { DataLoader(load(train), 1, seq_len, 0, 1); });
  EXPECT_TRUE(Contains(msg, "loss-mask file " + mask + " does not belong to token file " + train));
  EXPECT_TRUE(Contains(msg, "CRC-32C"));
  write_bytes(train, tokens0);

  // The mask cut short by one byte.
  write_bytes(mask, std::vector<unsigned char>(mask0.begin(), mask0.end() - 1));
  msg = error_message([&] { DataLoader(load(train), 1, seq_len, 0, 1); });
  EXPECT_TRUE(Contains(msg, "loss-mask file " + mask));
  EXPECT_TRUE(Contains(msg, "truncated or corrupt"));

  // The mask of another token file (the same samples in rows of another length).
  TempDir other;
  write_text(other.file("in.jsonl"), jsonl(kPadded));
  prepare_sft(options(other, seq_len + 1, false));
  write_bytes(mask, read_bytes(sidecar_path(other.file("out/train.bin"))));
  msg = error_message([&] { DataLoader(load(train), 1, seq_len, 0, 1); });
  EXPECT_TRUE(Contains(msg, "does not belong to token file " + train));

  // Restored, it loads again (so the refusals above are about the damage).
  write_bytes(mask, mask0);
  EXPECT_NO_THROW(DataLoader(load(train), 1, seq_len, 0, 1));
}

TEST(SftLoader, CountedTargetsOfAMicroStepAreWorldIndependent) {
  TempDir dir;
  // 12 samples whose completions differ in length, so every row counts a different number.
  const std::vector<std::string> words = {"Atlanta", "the jury", "it said so", "a number of topics",
                                          "the city purchasing department", "Fulton county",
                                          "the grand jury commented on it", "yes", "the police",
                                          "a long and hard fought election", "no", "Georgia's laws"};
  std::vector<Pair> pairs;
  for (size_t i = 0; i < words.size(); ++i) pairs.push_back({"Item " + std::to_string(i) + ":", words[i]});
  write_text(dir.file("in.jsonl"), jsonl(pairs));
  const int64_t seq_len = 24, R = seq_len + 1, B = 1;
  prepare_sft(options(dir, seq_len, false));
  const std::string train = dir.file("out/train.bin");
  const auto tokens = load(train);
  const std::vector<unsigned char> bits = mask_bits(train, tokens->size(), R, false);
  const int64_t rows = tokens->size() / R;
  ASSERT_EQ(rows, 12);
  std::vector<int64_t> row_count(static_cast<size_t>(rows), 0);  // counted targets per row, from the file
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 1; j < R; ++j) row_count[static_cast<size_t>(r)] += bits[static_cast<size_t>(r * R + j)] & 1;

  for (const bool shuffle : {false, true}) {
    const DataLoader::Order order{shuffle, 1234};
    const DataLoader one(tokens, B, seq_len, 0, 1, order);
    for (int world : {1, 2, 3, 4}) {
      std::vector<DataLoader> ranks;
      for (int rank = 0; rank < world; ++rank) ranks.emplace_back(tokens, B, seq_len, rank, world, order);
      for (int64_t m = 0; m < ranks[0].micro_steps_per_pass(); ++m) {
        int64_t direct = 0, from_targets = 0, same_samples_one_rank = 0;
        for (int rank = 0; rank < world; ++rank) {
          const int64_t window = ranks[static_cast<size_t>(rank)].window_start(m) / (B * R);
          if (!shuffle) {
            EXPECT_EQ(window, m * world + rank);
          }
          direct += row_count[static_cast<size_t>(window)];
          const DataLoader::Batch b = ranks[static_cast<size_t>(rank)].batch(m);
          from_targets += b.targets.ne(kIgnoreIndex).sum().item<int64_t>();
          // Global sample k = m * world + rank is one rank's micro-step k.
          same_samples_one_rank += one.counted_targets(m * world + rank, 0);
        }
        ASSERT_GT(direct, 0);
        for (int rank = 0; rank < world; ++rank) {
          const DataLoader::Batch b = ranks[static_cast<size_t>(rank)].batch(m);
          EXPECT_EQ(b.counted_all_ranks, direct) << "shuffle " << shuffle << " world " << world << " rank " << rank
                                                 << " m " << m;
          EXPECT_EQ(b.world, world);
        }
        EXPECT_EQ(from_targets, direct) << "world " << world << " m " << m;
        EXPECT_EQ(same_samples_one_rank, direct) << "world " << world << " m " << m;
      }
    }
  }
}

TEST(SftLoaderErrors, MappedMasksAreCheckedAndNamed) {
  TempDir dir;
  write_text(dir.file("in.jsonl"), jsonl(kPadded));
  const int64_t seq_len = 40, R = seq_len + 1;
  SftOptions o = options(dir, seq_len, false);
  o.shard_tokens = R;  // a shard per row
  const SftResult r = prepare_sft(o);
  ASSERT_EQ(r.train_files.size(), 3u);
  const std::string pattern = r.train_path, shard1 = r.train_files[1], mask1 = sidecar_path(shard1);
  const std::vector<unsigned char> mask0 = read_bytes(mask1);
  ASSERT_NO_THROW(DataLoader(load(pattern), 1, seq_len, 0, 1));
  const auto refused = [&](const std::vector<unsigned char>& bytes) {
    write_bytes(mask1, bytes);
    return error_message([&] { DataLoader(load(pattern), 1, seq_len, 0, 1); });
  };
  std::vector<unsigned char> m = mask0;
  m[0] ^= 1;  // the magic
  EXPECT_TRUE(Contains(refused(m), "loss-mask file " + mask1 + " is not a shardlm loss mask"));
  EXPECT_TRUE(Contains(refused({}), "loss-mask file " + mask1 + " is not a shardlm loss mask"));
  m = mask0;
  m.push_back(0);  // one byte too many
  EXPECT_TRUE(Contains(refused(m), "loss-mask file " + mask1 + " should hold 32 + 41 bytes (one per token of " + shard1 +
                                       ") but holds 74; it is truncated or corrupt"));
  m = mask0;
  m[static_cast<size_t>(kLossMaskHeaderBytes)] = kCountsInLoss;  // the row's first token begins no sample
  EXPECT_TRUE(Contains(refused(m), "loss-mask file " + mask1 + " is corrupt at token 0"));
  m = mask0;
  m[static_cast<size_t>(kLossMaskHeaderBytes) + 5] = 7;
  EXPECT_TRUE(Contains(refused(m), "loss-mask file " + mask1 + " is corrupt at token 5 (byte 7"));
  std::filesystem::remove(mask1);
  const std::string missing = error_message([&] { DataLoader(load(pattern), 1, seq_len, 0, 1); });
  EXPECT_TRUE(Contains(missing, "but " + shard1 + " of the same data has none"));
  write_bytes(mask1, mask0);
  EXPECT_NO_THROW(DataLoader(load(pattern), 1, seq_len, 0, 1));
}
