// The encoder pool and the staging file of prepare_stream.h.
#include "data/prep/prepare_stream.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <thread>

#include "util/error.h"

namespace shardlm::data {

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

EncoderPool::EncoderPool(const std::string& tokenizer, int threads,
                         const std::function<void(const Tokenizer&)>& check, const std::string& eos_token) {
  if (threads < 0) fail("--threads ", threads, " must be >= 0 (0: every core)");
  const int n = threads > 0 ? threads : usable_cores();
  tokenizers_.push_back(std::make_unique<Tokenizer>(tokenizer, eos_token));
  if (check) check(*tokenizers_[0]);
  while (static_cast<int>(tokenizers_.size()) < n)
    tokenizers_.push_back(std::make_unique<Tokenizer>(tokenizer, eos_token));
}

void EncoderPool::run(const std::vector<size_t>& bytes,
                      const std::function<void(size_t, size_t, size_t, const Tokenizer&)>& work) const {
  const size_t threads = tokenizers_.size();
  size_t total = 0;
  for (size_t b : bytes) total += b;
  // Contiguous parts of about equal bytes, one per thread.
  std::vector<size_t> cut{0};
  size_t acc = 0;
  for (size_t d = 0; d < bytes.size(); ++d) {
    acc += bytes[d];
    if (acc * threads >= total * cut.size() && cut.size() < threads) cut.push_back(d + 1);
  }
  while (cut.size() <= threads) cut.push_back(bytes.size());
  std::vector<std::exception_ptr> errors(threads);
  const auto part = [&](size_t t) {
    try {
      work(t, cut[t], cut[t + 1], *tokenizers_[t]);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(part, t);
  part(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

Staging::Staging(const std::string& out_dir)
    : path_((std::filesystem::path(out_dir) / (".prepare-" + std::to_string(::getpid()) + ".staging")).string()) {
  file_ = std::fopen(path_.c_str(), "w+b");
  if (!file_) fail("cannot create ", path_, ": ", std::strerror(errno), "; check that ", out_dir, " is writable");
  // Unlinked at once: the open file stays usable, and a killed prepare leaves nothing behind.
  std::remove(path_.c_str());
}

Staging::~Staging() { std::fclose(file_); }

void Staging::append(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes) {
    fail("cannot write ", path_, ": ", std::strerror(errno), "; check free disk space (the staging file holds ",
         "every encoded token until prepare ends)");
  }
  bytes_ += static_cast<int64_t>(bytes);
}

void Staging::seek(int64_t offset) {
  if (std::fflush(file_) != 0 || fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) {
    fail("cannot read back ", path_, ": ", std::strerror(errno), "; check the disk and rerun");
  }
}

void Staging::read(void* data, size_t bytes) {
  if (std::fread(data, 1, bytes, file_) != bytes) {
    fail("cannot read back ", path_, ": ", std::strerror(errno), "; check the disk and rerun");
  }
}

OutputFolder::OutputFolder(const std::string& out_dir) {
  std::error_code ec;
  if (!std::filesystem::exists(out_dir, ec)) made_ = out_dir;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) fail("cannot create output folder ", out_dir, ": ", ec.message(), "; check the path");
}

OutputFolder::~OutputFolder() {
  std::error_code ec;
  if (!made_.empty() && std::filesystem::is_empty(made_, ec)) std::filesystem::remove(made_, ec);
}

std::string token_file_path(const std::string& out_dir, const std::string& split, bool sharded, size_t shard) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%06zu", shard);
  return (std::filesystem::path(out_dir) / (split + (sharded ? buf : "") + ".bin")).string();
}

}  // namespace shardlm::data
