// See stage_batches.h.
#include "parallel/stage_batches.h"

#include <chrono>
#include <memory>
#include <utility>

namespace shardlm::parallel {

std::function<data::DataLoader::Batch(int64_t)> stage_batches(const data::DataLoader& loader, int64_t first,
                                                              c10::Device device, double* seconds) {
  auto last = std::make_shared<std::pair<int64_t, data::DataLoader::Batch>>(-1, data::DataLoader::Batch{});
  return [&loader, first, device, seconds, last](int64_t m) {
    if (last->first != m) {
      const auto t0 = std::chrono::steady_clock::now();
      *last = {m, loader.batch(first + m, device)};
      *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return last->second;
  };
}

}  // namespace shardlm::parallel
