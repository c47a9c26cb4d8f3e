// `shardlm prepare --sft`: the row layout (padded, packed), the loss-mask sidecar, streaming and
// shards, and the errors for bad input. The loader over these rows is tested in test_sft_loader.cpp.
// Expected rows are built here from the tokenizer's own encode of each field (sft.h's rule), not
// from the code under test.
#include <gtest/gtest.h>

#include "sft_test_helpers.h"

TEST(SftPrepare, PaddedRowsHoldBosPromptCompletionEosThenEosPadding) {
  TempDir dir;
  write_text(dir.file("in.jsonl"), jsonl(kPadded));
  const Tokenizer tok(kModel);
  ASSERT_GE(tok.bos_id(), 0);
  ASSERT_GE(tok.eos_id(), 0);
  ASSERT_NE(tok.bos_id(), tok.eos_id());
  std::vector<Expected> samples;
  size_t longest = 0;
  for (const Pair& p : kPadded) {
    samples.push_back(expected_sample(tok, p));
    longest = std::max(longest, samples.back().ids.size());
  }
  const int64_t seq_len = static_cast<int64_t>(longest) + 2;  // every row has some padding
  const int64_t row = seq_len + 1;

  const SftResult r = prepare_sft(options(dir, seq_len, /*pack=*/false));
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;
  int64_t counted = 0, sample_tokens = 0;
  for (const Expected& e : samples) {
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    bits.insert(bits.end(), e.bits.begin(), e.bits.end());
    pad_row(&ids, &bits, row, static_cast<uint32_t>(tok.eos_id()));
    counted += e.counted;
    sample_tokens += static_cast<int64_t>(e.ids.size());
  }
  EXPECT_EQ(r.samples, 3);
  EXPECT_EQ(r.train_rows, 3);
  EXPECT_EQ(r.val_rows, 0);
  EXPECT_EQ(r.train_loss_tokens, counted);
  EXPECT_EQ(r.train_tokens, sample_tokens);
  EXPECT_EQ(r.truncated, 0);

  const std::string train = dir.file("out/train.bin");
  EXPECT_EQ(read_tokens(train, TokenFormat::LlmcBin).to_vector(), ids);
  const std::vector<unsigned char> got = mask_bits(train, static_cast<int64_t>(ids.size()), row, false);
  EXPECT_EQ(got, bits);
  // Spelled out for the first row: BOS and prompt never count, padding never counts or starts.
  const size_t prompt = tok.encode(kPadded[0].prompt, false).size();
  ASSERT_GE(got.size(), static_cast<size_t>(row));
  EXPECT_EQ(got[0], kDocumentStart);
  for (size_t j = 1; j <= prompt; ++j) EXPECT_EQ(got[j], 0) << "prompt token " << j;
  for (size_t j = prompt + 1; j < samples[0].ids.size(); ++j) EXPECT_EQ(got[j], kCountsInLoss) << "token " << j;
  for (size_t j = samples[0].ids.size(); j < static_cast<size_t>(row); ++j) EXPECT_EQ(got[j], 0) << "padding " << j;
  int64_t mask_count = 0, starts = 0;
  for (unsigned char b : got) {
    mask_count += b & kCountsInLoss;
    starts += (b & kDocumentStart) ? 1 : 0;
  }
  EXPECT_EQ(mask_count, counted);
  EXPECT_EQ(starts, 3);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/val.bin")));

  // The loader: one sample per row, so no positions/segments; targets that don't count are -100.
  const DataLoader dl(load(train), 3, seq_len, 0, 1);
  ASSERT_NE(dl.masks(), nullptr);
  EXPECT_FALSE(dl.masks()->packed);
  const DataLoader::Batch b = dl.batch(0);
  EXPECT_FALSE(b.positions.defined());
  EXPECT_FALSE(b.segments.defined());
  EXPECT_EQ(b.counted_all_ranks, counted);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < seq_len; ++j) {
      const size_t t = static_cast<size_t>(i * row + j);
      EXPECT_EQ(b.inputs[i][j].item<int64_t>(), static_cast<int64_t>(ids[t]));
      const int64_t want = (bits[t + 1] & kCountsInLoss) ? static_cast<int64_t>(ids[t + 1]) : kIgnoreIndex;
      EXPECT_EQ(b.targets[i][j].item<int64_t>(), want) << "row " << i << " position " << j;
    }
  }
}

TEST(SftPrepare, PackedRowsHoldWholeSamplesInInputOrder) {
  TempDir dir;
  const Tokenizer tok(kModel);
  const std::vector<Pair> pairs = {
      {"Who spoke?", "The jury did, at the end of the term."},            // s1
      {"Where?", "In the superior court of the county."},                // s2
      {"What did it find?", "That many of the laws are outmoded and should be revised."},  // s3
      {"What was asked?", "That the legislators act to have these laws studied soon."},    // s4
      {"When?", "Friday."},                                               // s5
  };
  std::vector<Expected> s;
  for (const Pair& p : pairs) s.push_back(expected_sample(tok, p));
  const auto L = [&](size_t i) { return static_cast<int64_t>(s[i].ids.size()); };
  // Row = L1 + L2 exactly; s3 and s4 do not fit together, s5 fits after s3 (so a first-fit packer
  // would put it there) and after s4 (where next fit, keeping input order, must put it).
  const int64_t row = L(0) + L(1);
  const int64_t seq_len = row - 1;
  ASSERT_LE(L(2), row);
  ASSERT_LE(L(3), row);
  ASSERT_GT(L(2) + L(3), row) << "calibrate the texts: " << L(0) << " " << L(1) << " " << L(2) << " " << L(3);
  ASSERT_LE(L(2) + L(4), row);
  ASSERT_LT(L(3) + L(4), row);

  write_text(dir.file("in.jsonl"), jsonl(pairs));
  const SftResult r = prepare_sft(options(dir, seq_len, /*pack=*/true));
  EXPECT_EQ(r.samples, 5);
  EXPECT_EQ(r.train_rows, 3);

  const uint32_t eos = static_cast<uint32_t>(tok.eos_id());
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;
  for (const std::vector<size_t>& in_row : {std::vector<size_t>{0, 1}, {2}, {3, 4}}) {
    for (size_t i : in_row) {
      ids.insert(ids.end(), s[i].ids.begin(), s[i].ids.end());
      bits.insert(bits.end(), s[i].bits.begin(), s[i].bits.end());
    }
    pad_row(&ids, &bits, row, eos);
  }
  const std::string train = dir.file("out/train.bin");
  ASSERT_EQ(read_tokens(train, TokenFormat::LlmcBin).to_vector(), ids);
  EXPECT_EQ(mask_bits(train, static_cast<int64_t>(ids.size()), row, true), bits);

  const DataLoader dl(load(train), 3, seq_len, 0, 1);
  const DataLoader::Batch b = dl.batch(0);
  ASSERT_TRUE(b.positions.defined());
  ASSERT_TRUE(b.segments.defined());
  ASSERT_EQ(b.positions.sizes(), (at::IntArrayRef{3, seq_len}));
  const auto at = [](const at::Tensor& t, int64_t i, int64_t j) { return t[i][j].item<int64_t>(); };
  // Row 0: s1 at [0, L1), s2 at [L1, row - 1): positions restart, the segment changes.
  for (int64_t j = 0; j < seq_len; ++j) {
    const bool second = j >= L(0);
    EXPECT_EQ(at(b.positions, 0, j), second ? j - L(0) : j) << "row 0 position " << j;
    EXPECT_EQ(at(b.segments, 0, j), second ? 1 : 0) << "row 0 position " << j;
  }
  EXPECT_NE(at(b.segments, 0, 0), at(b.segments, 0, L(0)));
  // Row 1: s3 alone; padding continues its positions and segment.
  for (int64_t j = 0; j < seq_len; ++j) {
    EXPECT_EQ(at(b.positions, 1, j), j);
    EXPECT_EQ(at(b.segments, 1, j), 0);
  }
  // Row 2: s4 then s5 then padding (in s5's segment).
  for (int64_t j = 0; j < seq_len; ++j) {
    const bool second = j >= L(3);
    EXPECT_EQ(at(b.positions, 2, j), second ? j - L(3) : j) << "row 2 position " << j;
    EXPECT_EQ(at(b.segments, 2, j), second ? 1 : 0) << "row 2 position " << j;
  }
  // Targets: the mask's, -100 elsewhere; spelled out at s1's end: its EOS is the target of the
  // position before it, and the next sample's BOS is no target.
  int64_t counted = 0;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < seq_len; ++j) {
      const size_t t = static_cast<size_t>(i * row + j);
      EXPECT_EQ(at(b.inputs, i, j), static_cast<int64_t>(ids[t]));
      const int64_t want = (bits[t + 1] & kCountsInLoss) ? static_cast<int64_t>(ids[t + 1]) : kIgnoreIndex;
      EXPECT_EQ(at(b.targets, i, j), want) << "row " << i << " position " << j;
      counted += want != kIgnoreIndex;
    }
  }
  EXPECT_EQ(at(b.targets, 0, L(0) - 2), static_cast<int64_t>(eos));
  EXPECT_EQ(at(b.targets, 0, L(0) - 1), kIgnoreIndex);  // predicts s2's BOS
  EXPECT_EQ(at(b.targets, 0, L(0)), kIgnoreIndex);      // predicts s2's first prompt token
  int64_t all = 0;
  for (const Expected& e : s) all += e.counted;
  EXPECT_EQ(counted, all);
  EXPECT_EQ(b.counted_all_ranks, all);
  EXPECT_EQ(r.train_loss_tokens, all);
}

TEST(SftPrepareErrors, BadLinesAreNamedAndNothingIsWritten) {
  TempDir dir;
  const std::string good = "{\"prompt\": \"Name the city.\", \"completion\": \"Atlanta\"}\n";
  const struct {
    std::string line, what;
  } cases[] = {
      {"{\"completion\": \"Atlanta\"}", "line 2: has no field \"prompt\""},
      {"{\"prompt\": \"Name the city.\"}", "line 2: has no field \"completion\""},
      {"{\"prompt\": \"Name the city.\", \"completion\": \"\"}", "line 2: field \"completion\" is empty"},
      {"{\"prompt\": \"Name the city.\", \"completion\": \"  \"}", "line 2: field \"completion\" is empty"},
      {"{\"prompt\": \"\", \"completion\": \"Atlanta\"}", "line 2: field \"prompt\" is empty"},
  };
  std::filesystem::create_directories(dir.file("out"));
  for (const auto& c : cases) {
    write_text(dir.file("in.jsonl"), good + c.line + "\n" + good);
    const std::string msg = error_message([&] { prepare_sft(options(dir, 64, false)); });
    EXPECT_TRUE(Contains(msg, dir.file("in.jsonl") + " " + c.what)) << c.line;
    EXPECT_EQ(entries(dir.file("out")), 0) << c.line;
  }
  // Skipped and counted with skip_bad_lines.
  write_text(dir.file("in.jsonl"), good + cases[0].line + "\n" + good);
  SftOptions o = options(dir, 64, false);
  o.skip_bad_lines = true;
  const SftResult r = prepare_sft(o);
  EXPECT_EQ(r.samples, 2);
  EXPECT_EQ(r.skipped_lines, 1);
}

TEST(SftPrepareErrors, SampleLongerThanARowIsRefusedOrTruncated) {
  TempDir dir;
  const Tokenizer tok(kModel);
  const std::vector<Pair> pairs = {{"Name the city.", "Atlanta"},
                                   {"Question: what did the jury say?", "It said the election was conducted well."}};
  const Expected first = expected_sample(tok, pairs[0]), second = expected_sample(tok, pairs[1]);
  const size_t prompt2 = 1 + tok.encode(pairs[1].prompt, false).size();  // BOS + prompt
  // A row that holds sample 1 and sample 2's prompt plus 2 completion tokens, not all of sample 2.
  const int64_t row = static_cast<int64_t>(prompt2) + 2;
  ASSERT_LE(static_cast<int64_t>(first.ids.size()), row);
  ASSERT_GT(static_cast<int64_t>(second.ids.size()), row);
  write_text(dir.file("in.jsonl"), jsonl(pairs));
  std::filesystem::create_directories(dir.file("out"));
  SftOptions o = options(dir, row - 1, false);
  const std::string msg = error_message([&] { prepare_sft(o); });
  EXPECT_TRUE(Contains(msg, dir.file("in.jsonl") + " line 2: the sample has " + std::to_string(second.ids.size()) +
                                " tokens, more than a row"));
  EXPECT_TRUE(Contains(msg, "--truncate"));
  EXPECT_EQ(entries(dir.file("out")), 0);

  o.truncate = true;
  const SftResult r = prepare_sft(o);
  EXPECT_EQ(r.truncated, 1);
  EXPECT_EQ(r.train_rows, 2);
  std::vector<uint32_t> ids = first.ids;
  std::vector<unsigned char> bits = first.bits;
  pad_row(&ids, &bits, row, static_cast<uint32_t>(tok.eos_id()));
  ids.insert(ids.end(), second.ids.begin(), second.ids.begin() + row);  // cut: its EOS is lost
  bits.insert(bits.end(), second.bits.begin(), second.bits.begin() + row);
  const std::string train = dir.file("out/train.bin");
  EXPECT_EQ(read_tokens(train, TokenFormat::LlmcBin).to_vector(), ids);
  EXPECT_EQ(mask_bits(train, static_cast<int64_t>(ids.size()), row, false), bits);
  EXPECT_EQ(r.train_loss_tokens, first.counted + 2);

  // A prompt that fills the whole row leaves nothing to learn from, even with truncate.
  TempDir dir2;
  write_text(dir2.file("in.jsonl"), jsonl({pairs[1]}));
  SftOptions o2 = options(dir2, static_cast<int64_t>(prompt2) - 1, false);  // row = BOS + prompt
  o2.truncate = true;
  const std::string msg2 = error_message([&] { prepare_sft(o2); });
  EXPECT_TRUE(Contains(msg2, dir2.file("in.jsonl") + " line 1: the prompt alone fills a row"));
  EXPECT_FALSE(std::filesystem::exists(dir2.file("out")));
}

namespace {

// Rows of `samples` by sft.h's rule (padded, or packed next fit), written out here.
void expected_rows(const std::vector<Expected>& samples, size_t begin, size_t end, int64_t row, bool pack,
                   uint32_t eos, std::vector<uint32_t>* ids, std::vector<unsigned char>* bits) {
  int64_t used = 0;  // tokens in the open row (0: none open)
  for (size_t i = begin; i < end; ++i) {
    const auto n = static_cast<int64_t>(samples[i].ids.size());
    if (used > 0 && (!pack || used + n > row)) {
      pad_row(ids, bits, row, eos);
      used = 0;
    }
    ids->insert(ids->end(), samples[i].ids.begin(), samples[i].ids.end());
    bits->insert(bits->end(), samples[i].bits.begin(), samples[i].bits.end());
    used += n;
  }
  pad_row(ids, bits, row, eos);
}

// Pairs whose JSON lines add up to at least `bytes`, of varied lengths.
std::vector<Pair> many_pairs(size_t bytes) {
  const std::vector<std::string> words = {"the jury", "said", "Friday", "an investigation", "of Atlanta's",
                                          "recent primary election", "produced", "no evidence", "that any",
                                          "irregularities", "took place", "in the city"};
  std::vector<Pair> pairs;
  size_t total = 0;
  for (size_t i = 0; total < bytes; ++i) {
    Pair p{"Item " + std::to_string(i) + ":", ""};
    for (size_t k = 0; k < 2 + i % 3; ++k) p.prompt += " " + words[(i * 7 + k) % words.size()];
    for (size_t k = 0; k < 1 + (i * 5) % 9; ++k) p.completion += (k ? " " : "") + words[(i + k * 3) % words.size()];
    total += jsonl({p}).size();
    pairs.push_back(std::move(p));
  }
  return pairs;
}

}  // namespace

// More text than one encoding batch of one thread, so samples stream through several batches and
// the staging file; the rows are sft.h's whatever the thread count, split by sample count.
TEST(SftPrepare, StreamsPastOneBatchAndDoesNotDependOnTheThreadCount) {
  TempDir dir;
  const std::vector<Pair> pairs = many_pairs(kBatchBytesPerThread + kBatchBytesPerThread / 4);
  write_text(dir.file("in.jsonl"), jsonl(pairs));
  ASSERT_GT(std::filesystem::file_size(dir.file("in.jsonl")), kBatchBytesPerThread);
  const Tokenizer tok(kModel);
  std::vector<Expected> samples;
  for (const Pair& p : pairs) samples.push_back(expected_sample(tok, p));
  const int64_t seq_len = 63, row = seq_len + 1;
  const auto n = static_cast<int64_t>(samples.size());
  const int64_t n_val = std::llround(0.1 * static_cast<double>(n));
  const uint32_t eos = static_cast<uint32_t>(tok.eos_id());
  for (const bool pack : {false, true}) {
    std::vector<std::vector<unsigned char>> first;  // the 1-thread output's files
    for (const int threads : {1, 2, 3}) {
      if (!pack && threads == 3) continue;
      SftOptions o = options(dir, seq_len, pack);
      o.val_fraction = 0.1;
      o.threads = threads;
      o.out_dir = dir.file("out" + std::to_string(pack) + std::to_string(threads));
      const SftResult r = prepare_sft(o);
      ASSERT_EQ(r.samples, n);
      ASSERT_EQ(r.val_samples, n_val);
      const std::string train = o.out_dir + "/train.bin", val = o.out_dir + "/val.bin";
      std::vector<std::vector<unsigned char>> files;
      for (const std::string& f : {train, sidecar_path(train), val, sidecar_path(val)}) files.push_back(read_bytes(f));
      if (threads == 1) {
        for (const bool is_val : {false, true}) {
          std::vector<uint32_t> ids;
          std::vector<unsigned char> bits;
          expected_rows(samples, is_val ? static_cast<size_t>(n - n_val) : 0, is_val ? samples.size() : static_cast<size_t>(n - n_val),
                        row, pack, eos, &ids, &bits);
          const std::string& path = is_val ? val : train;
          EXPECT_EQ(read_tokens(path, TokenFormat::LlmcBin).to_vector(), ids) << "pack " << pack << " val " << is_val;
          EXPECT_EQ(mask_bits(path, static_cast<int64_t>(ids.size()), row, pack), bits) << "pack " << pack;
          EXPECT_EQ(is_val ? r.val_rows : r.train_rows, static_cast<int64_t>(ids.size()) / row);
        }
        first = files;
      } else {
        EXPECT_TRUE(files == first) << "pack " << pack << ": " << threads << " threads wrote other bytes than 1";
      }
    }
  }
}

// --shard-tokens: shards of whole rows (the count rounded down), each token file with its mask,
// which the loader reads through a pattern as the rows of one file.
TEST(SftPrepare, ShardsHoldWholeRowsEachWithItsMaskAndReadAsOneFile) {
  TempDir dir;
  std::vector<Pair> pairs;
  for (int i = 0; i < 12; ++i) pairs.push_back({"Item " + std::to_string(i) + ":", std::string(i % 2 ? "yes" : "the jury said so")});
  write_text(dir.file("in.jsonl"), jsonl(pairs));
  const int64_t seq_len = 24, R = seq_len + 1;
  SftOptions o = options(dir, seq_len, false);
  o.val_fraction = 0.25;
  o.out_dir = dir.file("one");
  const SftResult one = prepare_sft(o);
  ASSERT_EQ(one.train_rows, 9);
  ASSERT_EQ(one.val_rows, 3);

  o.out_dir = dir.file("shards");
  prepare_sft(o);  // an unsharded prepare first: its files are stale once the shards are written
  o.shard_tokens = 2 * R + R / 2;  // 2.5 rows: shards of 2
  const SftResult r = prepare_sft(o);
  EXPECT_EQ(r.rows_per_shard, 2);
  EXPECT_EQ(r.train_rows, 9);
  EXPECT_EQ(r.train_path, dir.file("shards/train_*.bin"));
  EXPECT_EQ(r.val_path, dir.file("shards/val_*.bin"));
  EXPECT_EQ(r.removed, (std::vector<std::string>{dir.file("shards/train.bin"), dir.file("shards/train.bin.mask"),
                                                 dir.file("shards/val.bin"), dir.file("shards/val.bin.mask")}));
  ASSERT_EQ(r.train_files.size(), 5u);
  ASSERT_EQ(r.val_files.size(), 2u);
  for (const bool val : {false, true}) {
    const std::string whole = dir.file(val ? "one/val.bin" : "one/train.bin");
    const auto& files = val ? r.val_files : r.train_files;
    std::vector<uint32_t> ids;
    std::vector<unsigned char> bits;
    for (size_t k = 0; k < files.size(); ++k) {
      EXPECT_EQ(files[k], dir.file((val ? "shards/val_00000" : "shards/train_00000") + std::to_string(k) + ".bin"));
      const std::vector<uint32_t> shard = read_tokens(files[k], TokenFormat::LlmcBin).to_vector();
      EXPECT_EQ(static_cast<int64_t>(shard.size()), (k + 1 < files.size() ? 2 : 1) * R) << files[k];
      const std::vector<unsigned char> m = mask_bits(files[k], static_cast<int64_t>(shard.size()), R, false);
      ids.insert(ids.end(), shard.begin(), shard.end());
      bits.insert(bits.end(), m.begin(), m.end());
    }
    EXPECT_EQ(ids, read_tokens(whole, TokenFormat::LlmcBin).to_vector());
    EXPECT_EQ(bits, mask_bits(whole, static_cast<int64_t>(ids.size()), R, false));
  }
  // The loader reads the same rows, targets and counts from the shards as from the one file.
  for (const bool shuffle : {false, true}) {
    const DataLoader::Order order{shuffle, 7};
    const DataLoader a(load(dir.file("one/train.bin")), 2, seq_len, 0, 1, order);
    const DataLoader b(load(r.train_path), 2, seq_len, 0, 1, order);
    for (int64_t m = 0; m < 2 * a.micro_steps_per_pass(); ++m) {
      const DataLoader::Batch x = a.batch(m), y = b.batch(m);
      EXPECT_TRUE(x.inputs.equal(y.inputs)) << m;
      EXPECT_TRUE(x.targets.equal(y.targets)) << m;
      EXPECT_EQ(x.counted_all_ranks, y.counted_all_ranks) << m;
    }
  }

  o.shard_tokens = R - 1;
  const std::string msg = error_message([&] { prepare_sft(o); });
  EXPECT_TRUE(Contains(msg, "--shard-tokens " + std::to_string(R - 1) + " holds no whole row of --seq-len 24 + 1 = 25"));
}

// The sidecars are memory-mapped, and checked as before: each damage is named with both files.
