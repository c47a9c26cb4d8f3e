// `shardlm prepare --sft`: the rules are in sft.h. Samples are read and encoded first, then cut
// into rows per split, then every file is written to a temporary and only then renamed, so bad
// input (which the reading stage finds) leaves out_dir as it was.
#include "data/sft.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <set>

#include "data/loss_mask.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

struct Sample {
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;  // loss_mask.h's per-token bits
};

struct Rows {
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;
  int64_t rows = 0, loss_tokens = 0, tokens = 0;
};

// Samples [begin, end) into rows of `row` tokens, padded with `pad`.
Rows cut_rows(const std::vector<Sample>& samples, size_t begin, size_t end, int64_t row, bool pack, uint32_t pad) {
  Rows r;
  int64_t used = row;  // tokens in the current row (row: none open)
  auto close_row = [&] {
    if (used == row) return;
    for (; used < row; ++used) {
      r.ids.push_back(pad);
      r.bits.push_back(0);
    }
  };
  for (size_t i = begin; i < end; ++i) {
    const auto n = static_cast<int64_t>(samples[i].ids.size());
    if (!pack || used + n > row) {
      close_row();
      used = 0;
      ++r.rows;
    }
    r.ids.insert(r.ids.end(), samples[i].ids.begin(), samples[i].ids.end());
    r.bits.insert(r.bits.end(), samples[i].bits.begin(), samples[i].bits.end());
    for (unsigned char b : samples[i].bits) r.loss_tokens += b & kCountsInLoss;
    r.tokens += n;
    used += n;
  }
  close_row();
  return r;
}

}  // namespace

SftResult prepare_sft(const SftOptions& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    fail("--val-fraction ", o.val_fraction, " must be in [0, 1): e.g. 0.05 holds out the last 5% of the samples, 0 none");
  }
  if (o.out_dir.empty()) fail("no output folder; pass --out-dir DIR");
  if (o.seq_len < 1) {
    fail("--sft needs --seq-len N (the training run's data.seq_len): samples are cut into rows of N + 1 tokens");
  }
  if (o.prompt_field.empty() || o.completion_field.empty() || o.prompt_field == o.completion_field) {
    fail("--prompt-field \"", o.prompt_field, "\" and --completion-field \"", o.completion_field,
         "\" must be two different, non-empty JSON field names");
  }
  const int64_t row = o.seq_len + 1;
  const Tokenizer tok(o.tokenizer);
  if (tok.eos_id() < 0) {
    fail("tokenizer ", tok.path(), " has no eos token, which ends every fine-tuning sample; use one that has");
  }
  const auto eos = static_cast<uint32_t>(tok.eos_id());
  const bool bos = o.add_bos && tok.bos_id() >= 0;

  DocumentOptions dopt;
  dopt.fields = {o.prompt_field, o.completion_field};
  dopt.skip_bad_lines = o.skip_bad_lines;
  DocumentReader reader(expand_inputs(o.inputs), dopt);
  std::vector<Sample> samples;
  std::vector<std::string> record;
  SftResult r;
  while (reader.next_record(&record)) {
    Sample s;
    if (bos) {
      s.ids.push_back(static_cast<uint32_t>(tok.bos_id()));
      s.bits.push_back(0);
    }
    for (int part = 0; part < 2; ++part) {
      for (int id : tok.encode(record[static_cast<size_t>(part)], /*add_special_tokens=*/false)) {
        s.ids.push_back(static_cast<uint32_t>(id));
        s.bits.push_back(part == 1 ? kCountsInLoss : 0);
      }
    }
    s.ids.push_back(eos);
    s.bits.push_back(kCountsInLoss);
    s.bits[0] |= kDocumentStart;
    s.bits[0] &= static_cast<unsigned char>(~kCountsInLoss);  // a sample's first token is no target of it
    const auto n = static_cast<int64_t>(s.ids.size());
    if (n > row) {
      if (!o.truncate) {
        fail(reader.where(), ": the sample has ", n, " tokens, more than a row of --seq-len ", o.seq_len, " + 1 = ", row,
             " holds; raise --seq-len, or pass --truncate to cut samples to the row (their end is lost)");
      }
      s.ids.resize(static_cast<size_t>(row));
      s.bits.resize(static_cast<size_t>(row));
      ++r.truncated;
      bool any = false;
      for (unsigned char b : s.bits) any = any || (b & kCountsInLoss);
      if (!any) {
        fail(reader.where(), ": the prompt alone fills a row of ", row, " tokens, so after --truncate no ",
             "completion token is left to learn from; raise --seq-len or shorten the prompt");
      }
    }
    samples.push_back(std::move(s));
  }
  r.samples = static_cast<int64_t>(samples.size());
  r.skipped_lines = reader.skipped();
  if (r.samples == 0) fail("the inputs hold no sample; check the --input files");
  r.val_samples = o.val_fraction == 0.0 ? 0 : std::max<int64_t>(1, std::llround(o.val_fraction * static_cast<double>(r.samples)));
  if (r.val_samples >= r.samples) {
    fail("the inputs hold ", r.samples, " samples; --val-fraction ", o.val_fraction,
         " leaves none for training; add samples or lower --val-fraction (0 holds nothing out)");
  }
  r.train_samples = r.samples - r.val_samples;
  r.vocab_size = tok.vocab_size();
  r.token_bits = llmc_bits_for_vocab(r.vocab_size);

  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) fail("cannot create output folder ", o.out_dir, ": ", ec.message(), "; check the path");
  // Every file is written (token file, then its mask, which hashes it) before any is renamed.
  std::vector<std::unique_ptr<LlmcTokenWriter>> token_writers;
  std::vector<std::unique_ptr<LossMaskWriter>> mask_writers;
  const auto train_end = static_cast<size_t>(r.train_samples);
  for (const bool val : {false, true}) {
    if (val && r.val_samples == 0) break;
    const Rows rows = val ? cut_rows(samples, train_end, samples.size(), row, o.pack, eos)
                          : cut_rows(samples, 0, train_end, row, o.pack, eos);
    (val ? r.val_rows : r.train_rows) = rows.rows;
    (val ? r.val_loss_tokens : r.train_loss_tokens) = rows.loss_tokens;
    (val ? r.val_tokens : r.train_tokens) = rows.tokens;
    const std::string path = (std::filesystem::path(o.out_dir) / (val ? "val.bin" : "train.bin")).string();
    token_writers.push_back(std::make_unique<LlmcTokenWriter>(path, r.token_bits));
    token_writers.back()->append(rows.ids.data(), rows.ids.size());
    token_writers.back()->finish();
    mask_writers.push_back(std::make_unique<LossMaskWriter>(
        sidecar_path(path), crc32c_file(token_writers.back()->temporary_path()), rows.bits, row, o.pack));
  }
  std::set<std::string> written;
  for (size_t i = 0; i < token_writers.size(); ++i) {
    token_writers[i]->commit();
    mask_writers[i]->commit();
    for (const std::string& p : {token_writers[i]->path(), mask_writers[i]->path()}) {
      written.insert(p);
      r.written.push_back(p);
    }
  }
  r.removed = remove_stale_outputs(o.out_dir, written);
  return r;
}

}  // namespace shardlm::data
