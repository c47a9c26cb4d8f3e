// ModelStateMemory's report forms (strategy.h): what memory.json and the start-up line show.
#include <cstdio>

#include "parallel/strategy.h"
#include "util/units.h"

namespace shardlm::parallel {

nlohmann::json ModelStateMemory::to_json() const {
  return {{"compute_params", compute_params},     {"gradients", gradients},
          {"master_params", master_params},       {"optimizer_states", optimizer_states},
          {"gathered_peak", gathered_peak},       {"padding_elements", padding_elements},
          {"offloaded", offloaded},       {"host", host},
          {"total_model_states", total()}};
}

std::string ModelStateMemory::describe(int64_t held) const {
  const auto size = [](int64_t bytes) { return util::format_bytes(static_cast<double>(bytes)); };
  char line[256];
  std::snprintf(line, sizeof line,
                "model states per rank: params %s, grads %s, fp32 master %s, optimizer %s = %s (%.2f bytes/param)",
                size(compute_params).c_str(), size(gradients).c_str(), size(master_params).c_str(),
                size(optimizer_states).c_str(), size(total()).c_str(), static_cast<double>(total()) / held);
  std::string out = line;
  if (offloaded > 0) out += "; on disk (NVMe offload) " + size(offloaded);
  if (host > 0) out += "; in host memory (offload_optimizer cpu) " + size(host);
  return out;
}

}  // namespace shardlm::parallel
