// Scratch folders and byte-level file helpers shared by the data-layer tests.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/loader/token_file.h"
#include "util/error.h"

namespace shardlm::data::testing {

inline std::string source_path(const std::string& relative) {
  return std::string(SHARDLM_SOURCE_DIR) + "/" + relative;
}

// A fresh folder under the system temp dir, removed at scope end; unique per process and
// instance so tests run in parallel (ctest -j) do not collide.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("shardlm_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Tokens first, first + 1, ... held in memory: a window's content names its own position (and, with
// another `first`, its dataset).
inline std::shared_ptr<const Tokens> iota_tokens(int64_t n, uint32_t first = 0) {
  std::vector<uint32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return std::make_shared<const Tokens>(v);
}

// Plain gtest (the test binaries do not link gmock): substring check that prints both strings.
inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\n  text: " << text << "\n  lacks: " << part;
}

// Runs f, expects shardlm::Error, and returns its message for the caller to inspect.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const shardlm::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected shardlm::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected shardlm::Error, nothing was thrown";
  return "";
}

}  // namespace shardlm::data::testing
