// NVMe parameter offload's store (parallel/zero/param_offload.h) against the tensors it was given,
// which are the reference: after the constructor the shards hold no memory and their files hold their
// bytes; paging in reads them back exactly (with and without the read-ahead), zeroed pages stay zero,
// a page-out with write replaces the file and one without leaves it; never more than buffer_count
// shards in memory while a step walks the units; reads into caller memory (the gather buffers) give the
// same bytes; the files go away with the store; a missing directory names the key.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "parallel/zero/param_offload.h"
#include "util/error.h"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

std::string temp_dir() {
  char tmpl[] = "/var/tmp/shardlm_param_offload_XXXXXX";
  return ::mkdtemp(tmpl);
}

int64_t bytes_held(const at::Tensor& t) { return static_cast<int64_t>(t.storage().nbytes()); }

}  // namespace

TEST(ParamOffload, ShardsRoundTripThroughTheFilesWithinTheBufferBudget) {
  const std::string dir = temp_dir();
  at::manual_seed(3);
  // Five units: odd sizes (not multiples of 4096 bytes), one left in memory, bf16 and fp32.
  const std::vector<int64_t> sizes = {1000, 3001, 17, 5000, 2222};
  std::vector<at::Tensor> shards, originals;
  for (size_t u = 0; u < sizes.size(); ++u) {
    shards.push_back(at::randn({sizes[u]}, u == 1 ? at::kBFloat16 : at::kFloat));
    originals.push_back(shards.back().clone());
  }
  std::vector<at::Tensor> given = shards;
  given[2] = at::Tensor();  // stays in memory
  {
    parallel::ParamOffloadOptions o;
    o.dir = dir;
    o.buffer_count = 2;
    parallel::ParamOffload po(given, o);
    EXPECT_TRUE(po.offloaded(0));
    EXPECT_FALSE(po.offloaded(2));
    int64_t expect_bytes = 0;
    for (size_t u = 0; u < sizes.size(); ++u) {
      if (u == 2) {
        EXPECT_TRUE(at::equal(shards[u], originals[u]));
        continue;
      }
      expect_bytes += static_cast<int64_t>(originals[u].nbytes());
      EXPECT_EQ(bytes_held(shards[u]), 0) << u;
    }
    EXPECT_EQ(po.bytes(), expect_bytes);
    // A step walks the units in order: page in (reads ahead), change, page out with write.
    for (size_t u = 0; u < sizes.size(); ++u) {
      po.page_in(u, /*read=*/true);
      int64_t in_memory = 0;
      for (size_t v = 0; v < sizes.size(); ++v) in_memory += v != 2 && bytes_held(shards[v]) > 0 ? 1 : 0;
      EXPECT_LE(in_memory, 2) << "unit " << u;
      if (u == 2) continue;
      ASSERT_TRUE(po.paged_in(u));
      EXPECT_TRUE(at::equal(shards[u], originals[u])) << u;
      shards[u].mul_(2);
      po.page_out(u, /*write=*/true);
    }
    po.finish(/*write=*/true);
    for (size_t u = 0; u < sizes.size(); ++u)
      if (u != 2) EXPECT_EQ(bytes_held(shards[u]), 0) << u;
    // Read back: doubled. A page-out without write leaves the file as it was.
    for (size_t u : {0, 1, 3, 4}) {
      po.page_in(u, /*read=*/true);
      EXPECT_TRUE(at::equal(shards[u], originals[u] * 2)) << u;
      shards[u].zero_();
      po.page_out(u, /*write=*/false);
    }
    po.finish(/*write=*/false);
    // Into caller memory (a gather buffer's slot), unaligned.
    std::vector<char> buf(originals[3].nbytes() + 8);
    po.read_into(3, buf.data() + 8).wait();
    const auto got = at::from_blob(buf.data() + 8, {sizes[3]}, at::kFloat);
    EXPECT_TRUE(at::equal(got, originals[3] * 2));
    // Fresh zeroed memory (a 16-bit step casts the masters into it).
    po.page_in(4, /*read=*/false);
    EXPECT_EQ(shards[4].count_nonzero().item<int64_t>(), 0);
    po.finish(/*write=*/false);
    EXPECT_EQ(po.io_totals().bytes_written, 2 * expect_bytes);
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "the files outlive the store";
  fs::remove_all(dir);
}

TEST(ParamOffload, AMissingDirectoryOrTooFewBuffersNameTheKey) {
  parallel::ParamOffloadOptions o;
  o.dir = "/var/tmp/shardlm_no_such_dir_for_param_offload";
  try {
    parallel::ParamOffload po({at::randn({10})}, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.nvme_path = "
                                         "'/var/tmp/shardlm_no_such_dir_for_param_offload' does not exist"),
              std::string::npos)
        << e.what();
  }
  o.dir = "/var/tmp";
  o.buffer_count = 1;
  try {
    parallel::ParamOffload po({at::randn({10})}, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.buffer_count = 1"), std::string::npos)
        << e.what();
  }
}
