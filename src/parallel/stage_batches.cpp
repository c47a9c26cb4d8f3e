// See stage_batches.h.
#include "parallel/stage_batches.h"

#include <chrono>
#include <memory>
#include <utility>

namespace shardlm::parallel {

std::function<data::DataLoader::Batch(int64_t)> stage_batches(data::BatchPrefetcher& batches, int64_t first,
                                                              double* seconds) {
  auto last = std::make_shared<std::pair<int64_t, data::DataLoader::Batch>>(-1, data::DataLoader::Batch{});
  return [&batches, first, seconds, last](int64_t m) {
    if (last->first != m) {
      const auto t0 = std::chrono::steady_clock::now();
      *last = {m, batches.batch(first + m)};
      *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return last->second;
  };
}

}  // namespace shardlm::parallel
