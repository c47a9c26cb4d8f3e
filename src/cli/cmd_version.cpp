// `shardlm --version`: what this binary was built with, so a bug report or a benchmark names the
// exact stack: shardlm, the PyTorch C++ library, whether CUDA and NCCL are in it (and which), MPI,
// and the path bf16 products take on this CPU.
#include <CLI/CLI.hpp>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <mpi.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/headeronly/version.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "comm/nccl_communicator.h"
#include "model/fp32_products.h"

namespace shardlm::cli {

int run_version(int argc, char** argv) {
  CLI::App app{"Print shardlm's, libtorch's, CUDA's, NCCL's and MPI's versions and the bf16 products' path",
               "shardlm version"};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::printf("shardlm %s\n", SHARDLM_VERSION);
  std::printf("libtorch %s\n", TORCH_VERSION);
  const auto& cuda = at::detail::getCUDAHooks();
  if (at::Context::hasCUDART()) {
    const long v = cuda.versionCUDART();
    std::printf("CUDA: compiled into libtorch (runtime %ld.%ld); %d GPU(s) visible\n", v / 1000, (v % 1000) / 10,
                at::hasCUDA() ? static_cast<int>(cuda.deviceCount()) : 0);
    const auto n = torch::cuda::nccl::version();
    std::printf("NCCL: compiled into libtorch (%llu.%llu.%llu); shardlm's NCCL backend (comm.backend=nccl) %s\n",
                static_cast<unsigned long long>(n >> 32), static_cast<unsigned long long>((n >> 16) & 0xffff),
                static_cast<unsigned long long>(n & 0xffff), comm::nccl_available() ? "built" : "not built");
  } else {
    std::printf("CUDA: not compiled in\nNCCL: not compiled in\n");
  }
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string first_line(mpi, static_cast<size_t>(len));
  first_line = first_line.substr(0, first_line.find_first_of(",\n"));
  std::printf("MPI: %s\n", first_line.c_str());
  std::printf("%s\n", model::describe_bf16_products().c_str());
  return 0;
}

}  // namespace shardlm::cli
