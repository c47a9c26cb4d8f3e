// The NCCL backend's construction errors, which need no GPU: a machine without CUDA devices, a bad
// device index, torchrun variables that are missing or wrong, two ranks on one physical GPU, and a
// build without NCCL. Each must name the problem and the fix before any NCCL call.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl_bootstrap.h"
#include "comm/nccl_communicator.h"
#include "util/error.h"
#include "../../support/error_of.h"

using namespace shardlm;

namespace {
using shardlm::test_support::error_of;

// A one-rank bootstrap communicator that fails any communication: construction errors must come
// before the ranks talk.
class SoloComm : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  comm::WorkPtr all_reduce_async(const at::Tensor&, comm::ReduceOp) override { return talk(); }
  comm::WorkPtr reduce_scatter_async(const at::Tensor&, const at::Tensor&, comm::ReduceOp) override { return talk(); }
  comm::WorkPtr all_gather_async(const at::Tensor&, const at::Tensor&) override { return talk(); }
  comm::WorkPtr broadcast_async(const at::Tensor&, int) override { return talk(); }
  comm::WorkPtr send_async(const at::Tensor&, int, int) override { return talk(); }
  comm::WorkPtr recv_async(const at::Tensor&, int, int) override { return talk(); }
  comm::WorkPtr barrier_async() override { return talk(); }
  std::shared_ptr<Communicator> split(int, int, const std::string&) override { talk(); }

 private:
  [[noreturn]] comm::WorkPtr talk() { fail("SoloComm: communicated before the construction checks"); }
  std::string name_ = "solo";
};

using EnvVars = std::map<std::string, std::optional<std::string>>;

// Sets (or with nullopt unsets) environment variables for one test and restores them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(const EnvVars& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      put(k, v);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) put(k, v);
  }

 private:
  static void put(const std::string& k, const std::optional<std::string>& v) {
    if (v) setenv(k.c_str(), v->c_str(), 1);
    else unsetenv(k.c_str());
  }
  EnvVars saved_;
};

const EnvVars kGoodEnv = {
    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}};

bool has_gpu() { return torch::cuda::device_count() > 0; }

}  // namespace

TEST(NcclConstruction, BuildWithoutNcclSaysSo) {
  if (comm::nccl_available()) GTEST_SKIP() << "built with NCCL";
  const auto bootstrap = std::make_shared<SoloComm>();
  for (const auto& msg : {error_of([&] { comm::nccl_world(bootstrap, 0); }),
                          error_of([] { comm::nccl_world_from_env(0); })}) {
    EXPECT_NE(msg.find("this shardlm was built without NCCL"), std::string::npos) << msg;
    EXPECT_NE(msg.find("comm.backend=mpi"), std::string::npos) << msg;
  }
}

TEST(NcclConstruction, NoGpuIsRefusedNamingTheFixes) {
  if (!comm::nccl_available() || has_gpu()) GTEST_SKIP() << "needs an NCCL build on a machine without GPUs";
  ScopedEnv env(EnvVars{{"CUDA_VISIBLE_DEVICES", "7"}});
  const auto msg = error_of([] { comm::nccl_world(std::make_shared<SoloComm>(), 0); });
  EXPECT_NE(msg.find("comm.backend=nccl needs a CUDA GPU, and torch sees none"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA_VISIBLE_DEVICES=7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--device cpu / comm.backend=mpi"), std::string::npos) << msg;
}

TEST(NcclConstruction, DeviceIndexOutOfRangeIsRefused) {
  if (!comm::nccl_available() || !has_gpu()) GTEST_SKIP() << "needs an NCCL build and a GPU";
  const auto msg = error_of([] { comm::nccl_world(std::make_shared<SoloComm>(), 999); });
  EXPECT_NE(msg.find("device_index 999 is out of range"), std::string::npos) << msg;
}

TEST(NcclConstruction, MissingBootstrapIsRefused) {
  if (!comm::nccl_available()) GTEST_SKIP() << "built without NCCL";
  const auto msg = error_of([] { comm::nccl_world(nullptr, 0); });
  EXPECT_NE(msg.find("needs a bootstrap communicator"), std::string::npos) << msg;
}

TEST(NcclConstruction, EnvFactoryNamesEachMissingVariable) {
  if (!comm::nccl_available()) GTEST_SKIP() << "built without NCCL";
  for (const char* var : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) {
    auto vars = kGoodEnv;
    vars[var] = std::nullopt;
    ScopedEnv env(vars);
    const auto msg = error_of([] { comm::nccl_world_from_env(0); });
    EXPECT_NE(msg.find(std::string("environment variable ") + var + " is not set"), std::string::npos) << msg;
  }
}

TEST(NcclConstruction, EnvFactoryRefusesBadValues) {
  if (!comm::nccl_available()) GTEST_SKIP() << "built without NCCL";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"RANK", "abc"}, {"WORLD_SIZE", "0"}, {"MASTER_PORT", "70000"}, {"RANK", "1"}};  // RANK=1 of WORLD_SIZE=1
  for (const auto& [var, value] : bad) {
    auto vars = kGoodEnv;
    vars[var] = value;
    ScopedEnv env(vars);
    const auto msg = error_of([] { comm::nccl_world_from_env(0); });
    EXPECT_NE(msg.find("environment variable " + var + "='" + value + "' is not an integer in"), std::string::npos)
        << msg;
  }
  auto two_ranks = kGoodEnv;
  two_ranks["WORLD_SIZE"] = "2";
  ScopedEnv env(two_ranks);
  const auto msg = error_of([] { comm::nccl_world_from_env(0); });
  EXPECT_NE(msg.find("MASTER_PORT=0 (an ephemeral port) only works with WORLD_SIZE=1"), std::string::npos) << msg;
}

TEST(NcclConstruction, EnvFactoryChecksTheGpuAfterTheVariables) {
  if (!comm::nccl_available() || has_gpu()) GTEST_SKIP() << "needs an NCCL build on a machine without GPUs";
  ScopedEnv env(kGoodEnv);
  const auto msg = error_of([] { comm::nccl_world_from_env(0); });
  EXPECT_NE(msg.find("comm.backend=nccl needs a CUDA GPU"), std::string::npos) << msg;
}

TEST(NcclConstruction, TwoRanksOnOnePhysicalGpuAreRefused) {
  const comm::GpuIdentity a{0, "GPU-aa", "0000:01:00.0", "node1"}, b{1, "GPU-bb", "0000:02:00.0", "node1"};
  // The same PCI address on another host is another GPU.
  const comm::GpuIdentity c{0, "GPU-cc", "0000:01:00.0", "node2"};
  EXPECT_NO_THROW(comm::refuse_shared_gpus({a, b, c}));
  // Rank 3 sees GPU-aa as its device 1 (another CUDA_VISIBLE_DEVICES order): still the same GPU.
  const comm::GpuIdentity a_again{1, "GPU-aa", "0000:01:00.0", "node1"};
  const auto msg = error_of([&] { comm::refuse_shared_gpus({a, b, c, a_again}); });
  EXPECT_NE(msg.find("NCCL cannot run two ranks on one GPU: ranks 0 and 3 both use GPU 0 (PCI 0000:01:00.0 on host "
                     "node1, GPU-aa; rank 3 calls it GPU 1)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("use comm.backend=mpi for that layout, or one rank per GPU"), std::string::npos) << msg;
}

TEST(NcclConstruction, GpuIdentitySurvivesTheExchangeEncoding) {
  const comm::GpuIdentity g{3, "GPU-0123", "0000:c1:00.0", "gpu-node-7"};
  const auto back = comm::decode_gpu_identity(comm::encode(g));
  EXPECT_EQ(back.device_index, 3);
  EXPECT_EQ(back.uuid, g.uuid);
  EXPECT_EQ(back.pci_bus_id, g.pci_bus_id);
  EXPECT_EQ(back.host, g.host);
}
