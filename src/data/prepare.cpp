// `shardlm prepare`'s pipeline: read documents, optionally train the tokenizer, encode, split,
// write. Its output must match scripts/make_corpus.sh byte for byte (tested), so the document and
// split rules in prepare.h are a contract, not a detail.
#include "data/prepare.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/token_file.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

bool has_content(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\v\f") != std::string::npos;
}

}  // namespace

std::vector<std::string> read_documents(const std::vector<std::string>& paths) {
  if (paths.empty()) fail("no input text files; pass at least one --input FILE");
  std::vector<std::string> docs;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      fail("input text file ", path, " does not exist or is not a file; check the --input path");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open input text file ", path, "; check its permissions");
    const size_t before = docs.size();
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (has_content(line)) docs.push_back(std::move(line));
    }
    if (in.bad()) fail("error while reading input text file ", path, "; check the disk and rerun");
    if (docs.size() == before) {
      fail("input text file ", path, " has no non-empty lines; each non-empty line is a document, ",
           "so pass a plain UTF-8 text file (decompress .xz/.gz inputs first)");
    }
  }
  return docs;
}

std::vector<uint32_t> encode_documents(const Tokenizer& tokenizer,
                                       const std::vector<std::string>& documents, size_t begin,
                                       size_t end) {
  const int eos = tokenizer.eos_id();
  if (eos < 0) {
    fail("tokenizer ", tokenizer.path(), " has no eos piece, which separates documents; ",
         "retrain it with eos_id set (e.g. `shardlm prepare --train-tokenizer`)");
  }
  std::vector<uint32_t> tokens;
  for (size_t d = begin; d < end; ++d) {
    for (int id : tokenizer.encode(documents[d])) tokens.push_back(static_cast<uint32_t>(id));
    tokens.push_back(static_cast<uint32_t>(eos));
  }
  return tokens;
}

PrepareResult prepare_corpus(const PrepareOptions& options) {
  if (!(options.val_fraction > 0.0 && options.val_fraction < 1.0)) {
    fail("--val-fraction ", options.val_fraction, " must be between 0 and 1 (exclusive), ",
         "e.g. 0.05 to hold out the last 5% of the documents");
  }
  if (options.out_dir.empty()) fail("no output folder; pass --out-dir DIR");
  const std::vector<std::string> docs = read_documents(options.inputs);
  const auto n = static_cast<int64_t>(docs.size());
  int64_t n_val = std::llround(options.val_fraction * static_cast<double>(n));
  if (n_val < 1) n_val = 1;
  if (n_val >= n) {
    fail("the inputs hold ", n, " documents (non-empty lines); --val-fraction ",
         options.val_fraction, " leaves none for training; add text or lower --val-fraction");
  }
  const auto split = static_cast<size_t>(n - n_val);

  if (options.train_vocab_size > 0) {
    // Trained on the training documents only, so validation text stays unseen.
    const std::vector<std::string> train_docs(docs.begin(), docs.begin() + static_cast<std::ptrdiff_t>(split));
    train_tokenizer(train_docs, options.tokenizer, options.train_vocab_size);
  }
  const Tokenizer tokenizer(options.tokenizer);

  PrepareResult result;
  result.documents = n;
  result.val_documents = n_val;
  result.train_documents = n - n_val;
  result.vocab_size = tokenizer.vocab_size();
  result.token_bits = llmc_bits_for_vocab(result.vocab_size);
  const std::vector<uint32_t> train = encode_documents(tokenizer, docs, 0, split);
  const std::vector<uint32_t> val = encode_documents(tokenizer, docs, split, docs.size());
  result.train_tokens = static_cast<int64_t>(train.size());
  result.val_tokens = static_cast<int64_t>(val.size());

  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) fail("cannot create output folder ", options.out_dir, ": ", ec.message(), "; check the path");
  result.train_path = (std::filesystem::path(options.out_dir) / "train.bin").string();
  result.val_path = (std::filesystem::path(options.out_dir) / "val.bin").string();
  write_llmc_tokens(result.train_path, train, result.token_bits);
  write_llmc_tokens(result.val_path, val, result.token_bits);
  return result;
}

}  // namespace shardlm::data
