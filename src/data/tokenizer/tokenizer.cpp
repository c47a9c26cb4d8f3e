// Tokenizer: the choice between a tokenizer.json (data/tokenizer/hf_tokenizer.h) and sentencepiece, with
// the special-id rules of a tokenizer.json; error translation around sentencepiece (reached through
// spm_isolated.h, see there for why it is never linked), whose messages would otherwise lack the
// file and the fix; and tokenizer training, delegated to the spm_train program for the same reason.
#include "data/tokenizer/tokenizer.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/tokenizer/hf_tokenizer.h"
#include "data/tokenizer/spm_isolated.h"
#include "util/error.h"

namespace shardlm::data {

struct Tokenizer::Impl {
  std::unique_ptr<spm::Processor> sp;
  std::unique_ptr<HfTokenizer> hf;
  int hf_bos = -1, hf_eos = -1;
  std::string eos_source = "the SentencePiece model's eos_id";
};

namespace {

// The eos rule of tokenizer.h for a tokenizer.json at `json_path`: the id, or -1; `source` says
// where it came from.
int find_hf_eos(const HfTokenizer& hf, const std::filesystem::path& json_path, std::string& source) {
  namespace fs = std::filesystem;
  const fs::path dir = json_path.parent_path();
  auto read_json = [](const fs::path& p, nlohmann::json* out) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return false;
    std::ifstream in(p);
    try {
      *out = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("cannot read ", p.string(), " (read for the tokenizer's eos token): ", e.what());
    }
    return out->is_object();
  };
  nlohmann::json j;
  if (read_json(dir / "tokenizer_config.json", &j) && j.contains("eos_token") && !j["eos_token"].is_null()) {
    const auto& e = j["eos_token"];
    std::string name;
    if (e.is_string()) name = e.get<std::string>();
    if (e.is_object() && e.contains("content") && e["content"].is_string()) name = e["content"].get<std::string>();
    if (name.empty() || hf.token_to_id(name) < 0)
      fail((dir / "tokenizer_config.json").string(), ": eos_token ", e.dump(), " is not a token of ", json_path.string(),
           "; fix the file, or pass the token that ends documents with --eos-token");
    source = "eos_token of tokenizer_config.json";
    return hf.token_to_id(name);
  }
  // generation_config.json and config.json: an id, or a list whose first id ends documents.
  for (const char* file : {"generation_config.json", "config.json"}) {
    if (!read_json(dir / file, &j) || !j.contains("eos_token_id") || j["eos_token_id"].is_null()) continue;
    const auto& e = j["eos_token_id"];
    const nlohmann::json& first = e.is_array() && !e.empty() ? e[0] : e;
    if (!first.is_number_integer() || first.get<int64_t>() < 0 || first.get<int64_t>() >= hf.vocab_size())
      fail((dir / file).string(), ": eos_token_id ", e.dump(), " is not an id of ", json_path.string(), " (",
           hf.vocab_size(), " ids); fix the file, or pass the token that ends documents with --eos-token");
    source = std::string("eos_token_id of ") + file + (e.is_array() ? " (the first of its list)" : "");
    return first.get<int>();
  }
  for (const char* name : kConventionalEosNames) {
    if (hf.is_special_added(name)) {
      source = std::string("the conventional name ") + name + ", a special added token (no tokenizer_config.json, "
               "generation_config.json or config.json beside the tokenizer names one)";
      return hf.token_to_id(name);
    }
  }
  return -1;
}

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path, const std::string& eos_token) : path_(model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool is_dir = fs::is_directory(model_path, ec);
  if (is_dir || fs::path(model_path).extension() == ".json") {
    const std::string file = is_dir ? (fs::path(model_path) / "tokenizer.json").string() : model_path;
    if (!fs::is_regular_file(file, ec)) {
      fail("tokenizer ", file, " does not exist; pass a Hugging Face tokenizer.json (or the folder ",
           "holding one) or a SentencePiece .model");
    }
    path_ = file;
    impl_ = std::make_unique<Impl>();
    impl_->hf = std::make_unique<HfTokenizer>(file);
    impl_->hf_bos = impl_->hf->template_bos_id();
    if (eos_token.empty()) {
      impl_->hf_eos = find_hf_eos(*impl_->hf, fs::path(file), impl_->eos_source);
    } else {
      impl_->hf_eos = impl_->hf->token_to_id(eos_token);
      if (impl_->hf_eos < 0) fail("--eos-token ", eos_token, " is not a token of ", file);
      impl_->eos_source = "--eos-token";
    }
    return;
  }
  if (!eos_token.empty())
    fail("--eos-token applies to a tokenizer.json; a SentencePiece .model (", model_path, ") has its own eos id");
  if (!std::filesystem::is_regular_file(model_path, ec)) {
    fail("tokenizer model ", model_path, " does not exist; pass the .model file written by ",
         "spm_train or `shardlm prepare --train-tokenizer VOCAB_SIZE` (the bundled one is ",
         "data/brown/tokenizer.model)");
  }
  impl_ = std::make_unique<Impl>();
  impl_->sp = std::make_unique<spm::Processor>();
  const std::string err = impl_->sp->load(model_path);
  if (!err.empty()) {
    fail("cannot load tokenizer model ", model_path, ": ", err,
         "; the file is not a SentencePiece .model (pass the .model, not the .vocab) or is corrupt");
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  if (impl_->hf) return impl_->hf->encode(text, add_special_tokens);
  std::vector<int> ids;
  const std::string err = impl_->sp->encode(text, &ids);
  if (!err.empty()) fail("tokenizer ", path_, " cannot encode text: ", err);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids, bool skip_special_tokens) const {
  const int n = vocab_size();
  for (int id : ids) {
    // sentencepiece aborts the process on an out-of-range id (tokenizers skips it silently), so
    // check first.
    if (id < 0 || id >= n) {
      fail("token id ", id, " is outside tokenizer ", path_, "'s vocabulary of ", n,
           "; the tokens were made with a different tokenizer");
    }
  }
  if (impl_->hf) return impl_->hf->decode(ids, skip_special_tokens);
  std::string text;
  const std::string err = impl_->sp->decode(ids, &text);
  if (!err.empty()) fail("tokenizer ", path_, " cannot decode ids: ", err);
  return text;
}

int Tokenizer::vocab_size() const { return impl_->hf ? impl_->hf->vocab_size() : impl_->sp->piece_size(); }
int Tokenizer::bos_id() const { return impl_->hf ? impl_->hf_bos : impl_->sp->bos_id(); }
int Tokenizer::eos_id() const { return impl_->hf ? impl_->hf_eos : impl_->sp->eos_id(); }
const std::string& Tokenizer::eos_source() const { return impl_->eos_source; }

std::string Tokenizer::eos_description() const {
  const int id = eos_id();
  if (id < 0) return "none";
  std::string text = decode({id}, false);
  if (impl_->hf) {  // the token's own text (a special token decodes to its content)
    std::string esc;
    for (char ch : text) esc += ch == '\n' ? std::string("\\n") : std::string(1, ch);
    text = esc;
  }
  return "id " + std::to_string(id) + " \"" + text + "\" (" + eos_source() + ")";
}

std::string Tokenizer::no_eos_error() const {
  std::string names;
  for (const char* n : kConventionalEosNames) names += (names.empty() ? "" : ", ") + std::string(n);
  return "tokenizer " + path_ + " has no eos token: no tokenizer_config.json (eos_token), generation_config.json or "
         "config.json (eos_token_id) beside it names one, and none of the conventional names " + names +
         " is a special added token of it. Pass the token that ends each document with --eos-token TOKEN";
}
bool Tokenizer::is_hf_json() const { return impl_->hf != nullptr; }
std::string Tokenizer::token_bytes(int id) const {
  if (!impl_->hf) {
    fail("tokenizer ", path_, " is a SentencePiece .model; conversations need the model's Hugging Face tokenizer ",
         "folder (tokenizer.json with tokenizer_config.json and its chat template)");
  }
  return impl_->hf->token_bytes(id);
}

namespace {

// Runs argv (argv[0] looked up on PATH) in folder `cwd`, waits, returns its exit status.
int run_program(const std::vector<std::string>& argv, const std::string& cwd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    fail("cannot run ", argv[0], ": ", std::strerror(rc),
         "; install Debian's `sentencepiece` package (spm_train), e.g. with scripts/setup.sh");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) fail("waiting for ", argv[0], " failed: ", std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_path,
                     int vocab_size) {
  namespace fs = std::filesystem;
  const fs::path model(model_path);
  if (model.extension() != ".model" || model.stem().empty()) {
    fail("tokenizer path ", model_path, " must end in .model when training a tokenizer ",
         "(sentencepiece writes PREFIX.model and PREFIX.vocab); e.g. --tokenizer out/tokenizer.model");
  }
  if (vocab_size < 260 || vocab_size > 65536) {
    fail("--train-tokenizer ", vocab_size, " is out of range: the vocabulary needs 256 byte pieces ",
         "plus unk/bos/eos, and token files store uint16 ids; use a size in [260, 65536]");
  }
  if (documents.empty()) fail("no documents to train tokenizer ", model_path, " on; check --input");
  const fs::path dir = model.parent_path().empty() ? fs::path(".") : model.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create folder ", dir.string(), " for ", model_path, ": ", ec.message());

  // spm_train runs in the model's folder with relative names because the model records its
  // arguments: STEM.train.txt + prefix STEM gives the same bytes wherever it runs, and the same
  // bytes as scripts/make_corpus.sh for the same documents.
  const std::string stem = model.stem().string();
  const std::string input = stem + ".train.txt";
  if (input.find(',') != std::string::npos) {
    fail("tokenizer name ", model.filename().string(), " contains a comma, which spm_train reads ",
         "as a list separator; choose another name");
  }
  {
    std::ofstream out(dir / input, std::ios::binary | std::ios::trunc);
    for (const std::string& d : documents) out << d << '\n';
    if (!out) fail("cannot write ", (dir / input).string(), " (the tokenizer's training text); check disk space");
  }

  // Keep these in step with SPM_ARGS in scripts/make_corpus.sh.
  const std::vector<std::string> argv = {
      "spm_train", "--input=" + input, "--model_prefix=" + stem,
      "--vocab_size=" + std::to_string(vocab_size), "--model_type=bpe", "--character_coverage=1.0",
      "--byte_fallback=true", "--split_digits=true", "--max_sentence_length=65536",
      "--input_sentence_size=0", "--num_threads=1", "--random_seed=1234", "--unk_id=0",
      "--bos_id=1", "--eos_id=2", "--pad_id=-1", "--minloglevel=1"};
  const int status = run_program(argv, dir.string());
  fs::remove(dir / input, ec);
  if (status != 0) {
    fail("spm_train exited with status ", status, " while training ", model_path,
         " (its messages are above); a vocabulary larger than the text supports is the usual ",
         "cause, so try a smaller --train-tokenizer size or more text");
  }
}

TokenizerFile tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return {(fs::path(path) / "tokenizer.json").string(), "tokenizer.json"};
  return {path, fs::path(path).extension() == ".json" ? "tokenizer.json" : "tokenizer.model"};
}

std::vector<std::string> tokenizer_companion_files(const std::string& path) {
  namespace fs = std::filesystem;
  const TokenizerFile file = tokenizer_file(path);
  std::vector<std::string> out;
  if (file.name != "tokenizer.json") return out;
  const fs::path dir = fs::path(file.path).parent_path();
  std::error_code ec;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"}) {
    if (fs::is_regular_file(dir / name, ec)) out.emplace_back(name);
  }
  if (fs::is_directory(dir / "additional_chat_templates", ec)) {
    std::vector<std::string> extra;
    for (const auto& e : fs::directory_iterator(dir / "additional_chat_templates", ec)) {
      if (e.path().extension() == ".jinja") extra.push_back("additional_chat_templates/" + e.path().filename().string());
    }
    std::sort(extra.begin(), extra.end());
    out.insert(out.end(), extra.begin(), extra.end());
  }
  return out;
}

}  // namespace shardlm::data
