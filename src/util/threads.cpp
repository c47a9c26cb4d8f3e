// See threads.h.
#include "util/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace shardlm::util {

int configure_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
    n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
  }
  at::set_num_threads(n);
  // The torch wheel's BLAS (MKL) follows the line above. A libtorch built on OpenBLAS (Debian's)
  // does not: its pool starts one thread per core in every rank, so 2 ranks on 2 cores ran 4 busy
  // threads (measured: 12% slower, irregular steps). Size it too when OpenBLAS is in the process.
  using SetThreads = void (*)(int);
  if (auto set_blas_threads = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas_threads(n);
  return n;
}

}  // namespace shardlm::util
