// `shardlm prepare --sft`: the rules are in sft.h. A stream in two passes, so memory stays bounded
// by one batch of text whatever the input size: batches of records are encoded on every core
// (prepare_stream.h) into samples staged on disk in input order; once all are counted (the split
// needs the count) the staged samples are cut into rows, split by split, and written to token
// files and masks that are renamed into place only once all are written, so bad input (which the
// first pass finds) leaves out_dir as it was.
#include "data/prep/sft.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>

#include "data/loader/loss_mask.h"
#include "data/loader/token_file.h"
#include "data/prep/chat_masks.h"
#include "data/prep/conversation.h"
#include "data/prep/prepare.h"
#include "data/prep/prepare_stream.h"
#include "data/tokenizer/jinja/jinja.h"
#include "data/tokenizer/tokenizer.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

// What became of one record: its tokens before any cut, and why it is refused (if it is).
enum class Refusal : unsigned char { None, TooLong, PromptFillsRow, BadLine };
struct SampleInfo {
  int64_t tokens = 0;  // as encoded, before --truncate cuts it
  Refusal refusal = Refusal::None;
  std::string error;             // BadLine: what is wrong with the line
  int turns = 0, left_out = 0;   // conversations: assistant turns, and those the prefix rule left out
};

// The samples of one part of a batch, one after the other (only those not refused).
struct EncodedPart {
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;  // loss_mask.h's per-token bits
  std::vector<SampleInfo> info;     // one per record of the part
  void clear() {
    ids.clear();
    bits.clear();
    info.clear();
  }
};

void finish_sample(size_t base, int64_t row, bool truncate, SampleInfo info, EncodedPart* out);

// sft.h's sample of one record appended to *out.
void encode_sample(const Tokenizer& tok, const std::vector<std::string>& record, bool bos, uint32_t eos,
                   int64_t row, bool truncate, EncodedPart* out) {
  const size_t base = out->ids.size();
  if (bos) {
    out->ids.push_back(static_cast<uint32_t>(tok.bos_id()));
    out->bits.push_back(0);
  }
  for (int part = 0; part < 2; ++part) {
    for (int id : tok.encode(record[static_cast<size_t>(part)], /*add_special_tokens=*/false)) {
      out->ids.push_back(static_cast<uint32_t>(id));
      out->bits.push_back(part == 1 ? kCountsInLoss : 0);
    }
  }
  out->ids.push_back(eos);
  out->bits.push_back(kCountsInLoss);
  finish_sample(base, row, truncate, SampleInfo{}, out);
}

// The sample of one conversation line (data/prep/chat_masks.h) appended to *out; a bad line is
// recorded as such (the caller names it, or skips it).
void encode_chat_sample(const Tokenizer& tok, const chat::ChatTemplates& templates, chat::ChatFormat format,
                        chat::TrainOn train_on, const std::string& line, int64_t row, bool truncate, EncodedPart* out) {
  SampleInfo info;
  chat::ChatSample sample;
  try {
    const chat::Conversation c = chat::parse_conversation(line, format);
    sample = chat::encode_conversation(templates, tok, c, train_on);
    info.turns = static_cast<int>(c.assistant_turns.size());
    info.left_out = sample.left_out;
    if (sample.counts.size() < 2 ||
        std::none_of(sample.counts.begin() + 1, sample.counts.end(), [](unsigned char b) { return b != 0; })) {
      throw chat::ConversationError("has no token that counts in the loss (its assistant turns render to nothing)");
    }
  } catch (const jinja::TemplateError& e) {
    info.refusal = Refusal::BadLine;
    info.error = std::string(e.raised_by_template ? "the chat template refuses it: " : "the chat template fails on it: ") +
                 e.what();
  } catch (const std::exception& e) {  // ConversationError, or tokens that do not spell the text
    info.refusal = Refusal::BadLine;
    info.error = e.what();
  }
  if (info.refusal == Refusal::BadLine) {
    out->info.push_back(std::move(info));
    return;
  }
  const size_t base = out->ids.size();
  for (size_t i = 0; i < sample.ids.size(); ++i) {
    out->ids.push_back(static_cast<uint32_t>(sample.ids[i]));
    out->bits.push_back(sample.counts[i] ? kCountsInLoss : 0);
  }
  finish_sample(base, row, truncate, std::move(info), out);
}

// Marks the sample that starts at ids[base] and applies sft.h's length rules to it.
void finish_sample(size_t base, int64_t row, bool truncate, SampleInfo info, EncodedPart* out) {
  out->bits[base] |= kDocumentStart;
  out->bits[base] &= static_cast<unsigned char>(~kCountsInLoss);  // a sample's first token is no target of it
  info.tokens = static_cast<int64_t>(out->ids.size() - base);
  if (info.tokens > row) {
    const size_t keep = truncate ? base + static_cast<size_t>(row) : base;
    out->ids.resize(keep);
    out->bits.resize(keep);
    if (!truncate) {
      info.refusal = Refusal::TooLong;
    } else if (std::none_of(out->bits.begin() + static_cast<std::ptrdiff_t>(base), out->bits.end(),
                            [](unsigned char b) { return (b & kCountsInLoss) != 0; })) {
      info.refusal = Refusal::PromptFillsRow;
      out->ids.resize(base);
      out->bits.resize(base);
    }
  }
  out->info.push_back(std::move(info));
}

// Rows of one split, cut from its samples as they come (sft.h: padded, or packed next fit) and
// written to DIR/<split>.bin, or to shards of rows_per_shard rows each, every token file with its
// mask. Files are finished as they fill; commit() renames them all.
class SplitWriter {
 public:
  SplitWriter(std::string out_dir, std::string split, int64_t row, bool pack, uint32_t pad, int bits,
              int64_t rows_per_shard)
      : out_dir_(std::move(out_dir)), split_(std::move(split)), row_(row), pack_(pack), pad_(pad), bits_(bits),
        rows_per_shard_(rows_per_shard) {
    ids_.reserve(static_cast<size_t>(row_));
    mask_.reserve(static_cast<size_t>(row_));
  }

  void add(const uint32_t* ids, const unsigned char* bits, int64_t n) {
    if (!pack_ || used() + n > row_) {
      close_row();
      ++rows;
    }
    ids_.insert(ids_.end(), ids, ids + n);
    mask_.insert(mask_.end(), bits, bits + n);
    for (int64_t i = 0; i < n; ++i) loss_tokens += bits[i] & kCountsInLoss;
    tokens += n;
  }

  // Closes the last row and finishes the last file.
  void finish() {
    close_row();
    finish_file();
  }

  // Renames every file into place; appends the paths to *written.
  void commit(std::vector<std::string>* token_files, std::vector<std::string>* written) {
    for (size_t i = 0; i < token_writers_.size(); ++i) {
      token_writers_[i]->commit();
      mask_writers_[i]->commit();
      token_files->push_back(token_writers_[i]->path());
      written->push_back(token_writers_[i]->path());
      written->push_back(mask_writers_[i]->path());
    }
  }

  int64_t rows = 0, loss_tokens = 0, tokens = 0;

 private:
  int64_t used() const { return ids_.empty() ? row_ : static_cast<int64_t>(ids_.size()); }  // row_: none open

  void close_row() {
    if (ids_.empty()) return;
    ids_.resize(static_cast<size_t>(row_), pad_);
    mask_.resize(static_cast<size_t>(row_), 0);
    if (token_writers_.empty() || (rows_per_shard_ > 0 && rows_in_file_ == rows_per_shard_)) {
      finish_file();
      const std::string path = token_file_path(out_dir_, split_, rows_per_shard_ > 0, token_writers_.size());
      token_writers_.push_back(std::make_unique<LlmcTokenWriter>(path, bits_));
      mask_writers_.push_back(std::make_unique<LossMaskWriter>(sidecar_path(path), row_, pack_));
      rows_in_file_ = 0;
    } else if (rows_per_shard_ == 0 && token_writers_.back()->count() + row_ > kLlmcMaxTokens) {
      fail("the ", split_, " split holds more than ", kLlmcMaxTokens, " tokens, more than one llm.c file holds; ",
           "write shards with --shard-tokens (e.g. 100000000)");
    }
    token_writers_.back()->append(ids_.data(), ids_.size());
    mask_writers_.back()->append(mask_.data(), mask_.size());
    ++rows_in_file_;
    ids_.clear();
    mask_.clear();
  }

  // The open token file finished, then its mask (which hashes it); one open pair at a time.
  void finish_file() {
    if (token_writers_.empty() || finished_ == token_writers_.size()) return;
    token_writers_.back()->finish();
    mask_writers_.back()->finish(crc32c_file(token_writers_.back()->temporary_path()));
    finished_ = token_writers_.size();
  }

  std::string out_dir_, split_;
  int64_t row_;
  bool pack_;
  uint32_t pad_;
  int bits_;
  int64_t rows_per_shard_, rows_in_file_ = 0;
  std::vector<uint32_t> ids_;  // the open row (empty: none)
  std::vector<unsigned char> mask_;
  std::vector<std::unique_ptr<LlmcTokenWriter>> token_writers_;
  std::vector<std::unique_ptr<LossMaskWriter>> mask_writers_;
  size_t finished_ = 0;
};

// Whether prepare_sft reads conversations (sft.h's `format`): auto looks at the first line.
bool reads_conversations(const SftOptions& o, const std::vector<std::string>& files) {
  if (o.format == "pairs") return false;
  if (o.format == "messages" || o.format == "sharegpt") return true;
  if (o.format != "auto") {
    fail("--format ", o.format, " is none of auto, pairs (prompt/completion), messages (OpenAI/TRL), sharegpt");
  }
  DocumentOptions peek;
  peek.raw_json_lines = true;
  DocumentReader reader(files, peek);
  std::vector<std::string> first;
  if (!is_jsonl(files.front()) || !reader.next_record(&first)) return false;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(first[0], nullptr, /*allow_exceptions=*/false);
  return chat::is_conversation(j);
}

// Pass 1 of prepare_sft: read, encode on every core (encode(tokenizer, record, part)), stage the
// samples in input order; a refused record stops it naming its line (a bad line unless skipped).
void stage_samples(const SftOptions& o, const EncoderPool& pool, DocumentReader& reader, Staging& staging, SftResult& r,
                   const std::function<void(const Tokenizer&, const std::vector<std::string>&, EncodedPart*)>& encode) {
  const int64_t row = o.seq_len + 1;
  const auto threads = static_cast<size_t>(pool.threads());
  std::vector<std::vector<std::string>> batch;
  std::vector<std::string> where;  // each record's "file F line L"
  std::vector<EncodedPart> parts(threads);
  std::exception_ptr read_error;
  bool more = true;
  while (more) {
    batch.clear();
    where.clear();
    std::vector<size_t> sizes;
    size_t bytes = 0;
    std::vector<std::string> record;
    try {
      while (bytes < kBatchBytesPerThread * threads && (more = reader.next_record(&record))) {
        size_t n = 0;
        for (const std::string& field : record) n += field.size();
        sizes.push_back(n);
        bytes += n;
        where.push_back(reader.where());
        batch.push_back(std::move(record));
      }
    } catch (...) {
      // A bad line after these records: theirs are the earlier errors, so they are encoded first.
      read_error = std::current_exception();
      more = false;
    }
    if (batch.empty()) break;
    pool.run(sizes, [&](size_t t, size_t begin, size_t end, const Tokenizer& part_tok) {
      parts[t].clear();
      for (size_t i = begin; i < end; ++i) encode(part_tok, batch[i], &parts[t]);
    });
    size_t i = 0;  // the record, over all parts
    for (const EncodedPart& p : parts) {
      size_t at = 0;  // its first token in p
      for (const SampleInfo& info : p.info) {
        if (info.refusal == Refusal::BadLine) {
          if (!o.skip_bad_lines) {
            fail("input ", where[i], ": ", info.error, "; fix the line, or pass --skip-bad-lines to skip such lines ",
                 "(they are counted)");
          }
          ++r.skipped_lines;
          ++i;
          continue;
        }
        if (info.refusal == Refusal::TooLong) {
          fail(where[i], ": the sample has ", info.tokens, " tokens, more than a row of --seq-len ", o.seq_len, " + 1 = ",
               row, " holds; raise --seq-len, or pass --truncate to cut samples to the row (their end is lost)");
        }
        if (info.refusal == Refusal::PromptFillsRow) {
          fail(where[i], ": the prompt alone fills a row of ", row, " tokens, so after --truncate no ",
               "completion token is left to learn from; raise --seq-len or shorten the prompt");
        }
        const auto n = static_cast<uint32_t>(std::min(info.tokens, row));
        r.truncated += info.tokens > row ? 1 : 0;
        r.assistant_turns += info.turns;
        r.turns_left_out += info.left_out;
        staging.append(&n, sizeof n);
        staging.append(p.ids.data() + at, n * sizeof(uint32_t));
        staging.append(p.bits.data() + at, n);
        at += n;
        ++r.samples;
        ++i;
      }
    }
  }
  if (read_error) std::rethrow_exception(read_error);
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
  if (o.shard_tokens < 0 || o.shard_tokens > kLlmcMaxTokens) {
    fail("--shard-tokens ", o.shard_tokens, " must be in [0, ", kLlmcMaxTokens, "] (0: one file per split)");
  }
  const int64_t rows_per_shard = o.shard_tokens / row;
  if (o.shard_tokens > 0 && rows_per_shard == 0) {
    fail("--shard-tokens ", o.shard_tokens, " holds no whole row of --seq-len ", o.seq_len, " + 1 = ", row,
         " tokens; shards of fine-tuning data hold whole rows, so pass at least ", row);
  }
  if (o.threads < 0) fail("--threads ", o.threads, " must be >= 0 (0: every core)");
  const std::vector<std::string> files = expand_inputs(o.inputs);
  const bool chat_mode = reads_conversations(o, files);
  if (chat_mode && (!o.add_bos || o.prompt_field != "prompt" || o.completion_field != "completion")) {
    fail("--no-bos, --prompt-field and --completion-field describe prompt/completion pairs; the inputs hold ",
         "conversations, whose BOS and turns the chat template writes");
  }
  if (!chat_mode && (!o.chat_template.empty() || o.train_on != "assistant" || !o.template_date.empty())) {
    fail("--chat-template, --train-on and --template-date describe conversations, but the inputs hold ",
         "prompt/completion pairs (the first line has no \"messages\" or \"conversations\"; or pass --format messages)");
  }
  if (!o.template_date.empty()) jinja::set_template_date(o.template_date);
  const EncoderPool pool(
      o.tokenizer, o.threads,
      [&](const Tokenizer& tok) {
        if (chat_mode && !tok.is_hf_json()) {
          fail("tokenizer ", tok.path(), " is a SentencePiece .model; conversations are rendered with the model's chat ",
               "template, so pass its Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json)");
        }
        if (tok.eos_id() < 0 && tok.is_hf_json()) fail(tok.no_eos_error());
        if (tok.eos_id() < 0) {
          fail("tokenizer ", tok.path(), " has no eos token, which ends every fine-tuning sample; use one that has");
        }
      },
      o.eos_token);
  const Tokenizer& tok = pool.tokenizer();
  const auto eos = static_cast<uint32_t>(tok.eos_id());
  const bool bos = o.add_bos && tok.bos_id() >= 0;

  DocumentOptions dopt;
  dopt.fields = {o.prompt_field, o.completion_field};
  dopt.raw_json_lines = chat_mode;
  dopt.skip_bad_lines = o.skip_bad_lines;
  DocumentReader reader(files, dopt);
  const OutputFolder folder(o.out_dir);
  Staging staging(o.out_dir);  // per sample: uint32 n, n uint32 ids, n mask bytes
  SftResult r;
  r.conversations = chat_mode;

  if (chat_mode) {
    const chat::ChatTemplates templates(o.tokenizer, o.chat_template);
    r.chat_template_name = templates.name(false);
    const chat::ChatFormat format = chat::parse_chat_format(o.format == "auto" ? "auto" : o.format);
    const chat::TrainOn train_on = chat::parse_train_on(o.train_on);
    stage_samples(o, pool, reader, staging, r, [&](const Tokenizer& t, const std::vector<std::string>& rec, EncodedPart* out) {
      encode_chat_sample(t, templates, format, train_on, rec[0], row, o.truncate, out);
    });
  } else {
    stage_samples(o, pool, reader, staging, r, [&](const Tokenizer& t, const std::vector<std::string>& rec, EncodedPart* out) {
      encode_sample(t, rec, bos, eos, row, o.truncate, out);
    });
  }
  r.skipped_lines += reader.skipped();
  if (r.samples == 0) fail("the inputs hold no sample; check the --input files");
  r.val_samples = o.val_fraction == 0.0 ? 0 : std::max<int64_t>(1, std::llround(o.val_fraction * static_cast<double>(r.samples)));
  if (r.val_samples >= r.samples) {
    fail("the inputs hold ", r.samples, " samples; --val-fraction ", o.val_fraction,
         " leaves none for training; add samples or lower --val-fraction (0 holds nothing out)");
  }
  r.train_samples = r.samples - r.val_samples;
  r.vocab_size = tok.vocab_size();
  r.eos = tok.eos_description();
  r.token_bits = llmc_bits_for_vocab(r.vocab_size);
  r.rows_per_shard = rows_per_shard;

  // Pass 2: the staged samples into rows, split by split; every file (token file, then its mask,
  // which hashes it) is written before any is renamed.
  staging.seek(0);
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;
  std::vector<std::unique_ptr<SplitWriter>> splits;
  for (const bool val : {false, true}) {
    if (val && r.val_samples == 0) break;
    splits.push_back(std::make_unique<SplitWriter>(o.out_dir, val ? "val" : "train", row, o.pack, eos, r.token_bits,
                                                   rows_per_shard));
    SplitWriter& w = *splits.back();
    for (int64_t k = 0, n_samples = val ? r.val_samples : r.train_samples; k < n_samples; ++k) {
      uint32_t n = 0;
      staging.read(&n, sizeof n);
      ids.resize(n);
      bits.resize(n);
      staging.read(ids.data(), n * sizeof(uint32_t));
      staging.read(bits.data(), n);
      w.add(ids.data(), bits.data(), n);
    }
    w.finish();
    (val ? r.val_rows : r.train_rows) = w.rows;
    (val ? r.val_loss_tokens : r.train_loss_tokens) = w.loss_tokens;
    (val ? r.val_tokens : r.train_tokens) = w.tokens;
  }
  for (size_t k = 0; k < splits.size(); ++k) splits[k]->commit(k == 0 ? &r.train_files : &r.val_files, &r.written);
  const auto pattern = [&](const std::vector<std::string>& files, const char* split) {
    if (files.empty()) return std::string();
    if (rows_per_shard == 0) return files[0];
    return (std::filesystem::path(o.out_dir) / (std::string(split) + "_*.bin")).string();
  };
  r.train_path = pattern(r.train_files, "train");
  r.val_path = pattern(r.val_files, "val");
  r.removed = remove_stale_outputs(o.out_dir, std::set<std::string>(r.written.begin(), r.written.end()));
  return r;
}

}  // namespace shardlm::data
