// `shardlm prepare`'s pipeline: stream documents, encode them on every core, stage the ids, then
// split and write. The rules are in prepare.h; scripts/make_corpus.sh reproduces the default
// ones byte for byte (tested), so they are a contract, not a detail. Memory stays bounded by one
// batch of text plus 8 bytes per document whatever the corpus size: ids go to a staging file in
// out_dir (the split point is only known once every document has been counted). Training a
// tokenizer first (--train-tokenizer) is the exception: spm_train reads every training document.
#include "data/prep/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>

#include "data/loader/token_file.h"
#include "data/prep/prepare_stream.h"
#include "data/tokenizer/tokenizer.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

// Ids of one document: encode, then eos unless the tokenizer's own post-processing ended with it.
void encode_document(const Tokenizer& tok, const std::string& doc, std::vector<uint32_t>* out) {
  const std::vector<int> ids = tok.encode(doc);
  for (int id : ids) out->push_back(static_cast<uint32_t>(id));
  if (ids.empty() || ids.back() != tok.eos_id()) out->push_back(static_cast<uint32_t>(tok.eos_id()));
}

// Ids [begin, end) of the staging file (raw uint32 ids) into `writer(shard)`, shard_tokens per
// writer (0: all into one).
void copy_ids(Staging& staging, int64_t begin, int64_t end, int64_t shard_tokens,
              const std::function<LlmcTokenWriter&(size_t)>& writer) {
  staging.seek(begin * 4);
  std::vector<uint32_t> buf(1 << 20);
  for (int64_t at = begin; at < end;) {
    const int64_t shard = shard_tokens > 0 ? (at - begin) / shard_tokens : 0;
    const int64_t shard_end = shard_tokens > 0 ? std::min(end, begin + (shard + 1) * shard_tokens) : end;
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf.size()), shard_end - at));
    staging.read(buf.data(), n * sizeof(uint32_t));
    writer(static_cast<size_t>(shard)).append(buf.data(), n);
    at += static_cast<int64_t>(n);
  }
}

// Ids [begin, end) of the staging file into DIR/<split>.bin or its shards, finished but not yet
// renamed into place (the caller commits every split's writers once all are written).
std::vector<std::unique_ptr<LlmcTokenWriter>> write_split(Staging& staging, int64_t begin, int64_t end, const std::string& out_dir,
                                     const std::string& split, int64_t shard_tokens, int bits) {
  std::vector<std::unique_ptr<LlmcTokenWriter>> writers;
  copy_ids(staging, begin, end, shard_tokens, [&](size_t shard) -> LlmcTokenWriter& {
    while (writers.size() <= shard) {
      if (!writers.empty()) writers.back()->finish();  // one open file at a time, whatever the shards
      writers.push_back(std::make_unique<LlmcTokenWriter>(token_file_path(out_dir, split, shard_tokens > 0, writers.size()), bits));
    }
    return *writers[shard];
  });
  for (auto& w : writers) w->finish();
  return writers;
}

}  // namespace

bool is_prepare_output(const std::string& name) {
  static const std::regex pattern(R"((train|val)(_[0-9]{6})?\.bin(\.mask)?)");
  return std::regex_match(name, pattern);
}

std::vector<std::string> remove_stale_outputs(const std::string& out_dir, const std::set<std::string>& written) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string path = entry.path().string();
    if (entry.is_regular_file() && is_prepare_output(entry.path().filename().string()) && !written.count(path)) {
      std::filesystem::remove(entry.path(), ec);
      removed.push_back(path);
    }
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::vector<std::string> read_documents(const std::vector<std::string>& paths, const DocumentOptions& options) {
  DocumentReader reader(expand_inputs(paths), options);
  std::vector<std::string> docs;
  std::string doc;
  while (reader.next(&doc)) docs.push_back(std::move(doc));
  return docs;
}

PrepareResult prepare_corpus(const PrepareOptions& options) {
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    fail("--val-fraction ", options.val_fraction, " must be in [0, 1): e.g. 0.05 holds out the last 5% of the ",
         "documents, 0 none");
  }
  if (options.out_dir.empty()) fail("no output folder; pass --out-dir DIR");
  if (options.shard_tokens < 0 || options.shard_tokens > kLlmcMaxTokens) {
    fail("--shard-tokens ", options.shard_tokens, " must be in [0, ", kLlmcMaxTokens, "] (0: one file per split)");
  }
  if (options.threads < 0) fail("--threads ", options.threads, " must be >= 0 (0: every core)");
  const std::vector<std::string> files = expand_inputs(options.inputs);
  const auto n_val_of = [&](int64_t n) {
    const int64_t n_val = options.val_fraction == 0.0
                              ? 0
                              : std::max<int64_t>(1, std::llround(options.val_fraction * static_cast<double>(n)));
    if (n_val >= n) {
      fail("the inputs hold ", n, " documents; --val-fraction ", options.val_fraction,
           " leaves none for training; add text or lower --val-fraction (0 holds nothing out)");
    }
    return n_val;
  };

  if (options.train_vocab_size > 0) {
    // Trained on the training documents only, so validation text stays unseen.
    std::vector<std::string> docs = read_documents(files, options.documents);
    docs.resize(docs.size() - static_cast<size_t>(n_val_of(static_cast<int64_t>(docs.size()))));
    train_tokenizer(docs, options.tokenizer, options.train_vocab_size);
  }
  const EncoderPool pool(
      options.tokenizer, options.threads,
      [](const Tokenizer& tok) {
        if (tok.eos_id() < 0 && tok.is_hf_json()) fail(tok.no_eos_error());
        if (tok.eos_id() < 0) {
          fail("tokenizer ", tok.path(), " has no eos token, which separates documents; ",
               "retrain it with eos_id set (e.g. `shardlm prepare --train-tokenizer`)");
        }
      },
      options.eos_token);
  const Tokenizer& tok = pool.tokenizer();
  const auto threads = static_cast<size_t>(pool.threads());

  const OutputFolder folder(options.out_dir);
  Staging staging(options.out_dir);
  std::vector<int64_t> doc_ends;  // staging offset after each document

  DocumentReader reader(files, options.documents);
  std::vector<std::string> batch;
  std::vector<std::vector<uint32_t>> ids(threads);
  std::vector<std::vector<int64_t>> ends(threads);
  bool more = true;
  while (more) {
    batch.clear();
    size_t bytes = 0;
    std::string doc;
    while (bytes < kBatchBytesPerThread * threads && (more = reader.next(&doc))) {
      bytes += doc.size();
      batch.push_back(std::move(doc));
    }
    if (batch.empty()) break;
    std::vector<size_t> sizes(batch.size());
    for (size_t d = 0; d < batch.size(); ++d) sizes[d] = batch[d].size();
    pool.run(sizes, [&](size_t t, size_t begin, size_t end, const Tokenizer& part_tok) {
      ids[t].clear();
      ends[t].clear();
      for (size_t d = begin; d < end; ++d) {
        encode_document(part_tok, batch[d], &ids[t]);
        ends[t].push_back(static_cast<int64_t>(ids[t].size()));
      }
    });
    for (size_t t = 0; t < threads; ++t) {
      const int64_t base = staging.bytes() / 4;
      for (int64_t end : ends[t]) doc_ends.push_back(base + end);
      staging.append(ids[t].data(), ids[t].size() * sizeof(uint32_t));
    }
    if (options.progress) options.progress(static_cast<int64_t>(doc_ends.size()), staging.bytes() / 4, reader.bytes_read());
  }

  PrepareResult r;
  r.documents = static_cast<int64_t>(doc_ends.size());
  if (r.documents == 0) fail("the inputs hold no document; check the --input files");  // DocumentReader names the file
  r.skipped_lines = reader.skipped();
  r.skipped_files = reader.skipped_files();
  r.val_documents = n_val_of(r.documents);
  r.train_documents = r.documents - r.val_documents;
  const int64_t split = doc_ends[static_cast<size_t>(r.train_documents - 1)];
  r.train_tokens = split;
  r.val_tokens = staging.bytes() / 4 - split;
  r.vocab_size = tok.vocab_size();
  r.eos = tok.eos_description();
  r.token_bits = llmc_bits_for_vocab(r.vocab_size);

  for (const auto& [name, tokens] : {std::make_pair("train", r.train_tokens), std::make_pair("val", r.val_tokens)}) {
    if (tokens > kLlmcMaxTokens && options.shard_tokens == 0) {
      fail("the ", name, " split holds ", tokens, " tokens, more than one llm.c file holds (", kLlmcMaxTokens,
           "); write shards with --shard-tokens (e.g. 100000000)");
    }
  }
  // Every file is written and closed before any is renamed into place.
  auto train_writers = write_split(staging, 0, split, options.out_dir, "train", options.shard_tokens, r.token_bits);
  decltype(train_writers) val_writers;
  if (r.val_documents > 0) {
    val_writers = write_split(staging, split, staging.bytes() / 4, options.out_dir, "val", options.shard_tokens, r.token_bits);
  }
  for (auto* writers : {&train_writers, &val_writers}) {
    for (auto& w : *writers) {
      w->commit();
      (writers == &train_writers ? r.train_files : r.val_files).push_back(w->path());
    }
  }
  const auto pattern = [&](const std::vector<std::string>& written, const std::string& split_name) {
    if (written.empty()) return std::string();
    if (options.shard_tokens == 0) return written[0];
    return (std::filesystem::path(options.out_dir) / (split_name + "_*.bin")).string();
  };
  r.train_path = pattern(r.train_files, "train");
  r.val_path = pattern(r.val_files, "val");

  // Token files (and loss masks) of an earlier prepare that this one did not write.
  std::set<std::string> written(r.train_files.begin(), r.train_files.end());
  written.insert(r.val_files.begin(), r.val_files.end());
  r.removed = remove_stale_outputs(options.out_dir, written);
  return r;
}

}  // namespace shardlm::data
