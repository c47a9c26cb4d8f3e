// MachineProfile's lookups and its JSON form (see machine_profile.h).
#include "plan/machine_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace shardlm::plan {

double collective_bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  return 1.0;  // broadcast, p2p
}

double MachineProfile::gemm_rate(const std::string& dtype, int64_t m, int64_t n, int64_t k) const {
  const std::string want = dtype == "fp16" && std::none_of(gemm.begin(), gemm.end(), [](const GemmRate& g) {
                             return g.dtype == "fp16";
                           })
                               ? "bf16"
                               : dtype;
  double best = std::numeric_limits<double>::infinity(), rate = 0;
  for (const auto& g : gemm) {
    if (g.dtype != want) continue;
    const double d = std::abs(std::log(static_cast<double>(m) / g.m)) + std::abs(std::log(static_cast<double>(n) / g.n)) +
                     std::abs(std::log(static_cast<double>(k) / g.k));
    if (d < best) best = d, rate = g.flops_per_s;
  }
  if (rate <= 0) fail("the machine profile has no ", dtype, " GEMM rate; measure it with `shardlm bench machine`");
  return rate;
}

double MachineProfile::gemm_peak(const std::string& dtype) const {
  double peak = 0;
  for (const auto& g : gemm)
    if (g.dtype == dtype || (dtype == "fp16" && g.dtype == "bf16")) peak = std::max(peak, g.flops_per_s);
  return peak;
}

double MachineProfile::attention_rate(const std::string& dtype, bool backward) const {
  const auto& rates = backward ? attention_backward : attention_forward;
  auto it = rates.find(dtype);
  if (it == rates.end() && dtype == "fp16") it = rates.find("bf16");
  if (it == rates.end() || it->second <= 0)
    fail("the machine profile has no ", dtype, " attention rate; measure it with `shardlm bench machine`");
  return it->second;
}

double MachineProfile::collective_seconds(const std::string& op, double bytes, int n) const {
  if (n <= 1 || bytes <= 0) return 0;
  const std::string want = op == "all_to_all" ? "all_gather" : op;  // same bus factor, until measured
  std::vector<const CollectiveRate*> rows;
  for (const auto& c : collectives)
    if (c.op == want && c.bytes > 0 && c.time_s > 0) rows.push_back(&c);
  if (rows.empty()) fail("the machine profile has no ", op, " measurement; measure it with `shardlm bench machine --nproc N`");
  std::sort(rows.begin(), rows.end(), [](const auto* a, const auto* b) { return a->bytes < b->bytes; });
  double t = 0;
  if (bytes <= rows.front()->bytes) {
    t = rows.front()->time_s;  // latency-bound: no faster than the smallest measured call
  } else if (bytes >= rows.back()->bytes) {
    t = rows.back()->time_s * bytes / static_cast<double>(rows.back()->bytes);
  } else {
    for (size_t i = 1; i < rows.size(); ++i) {
      if (bytes > rows[i]->bytes) continue;
      const double x0 = std::log(static_cast<double>(rows[i - 1]->bytes)), x1 = std::log(static_cast<double>(rows[i]->bytes));
      const double y0 = std::log(rows[i - 1]->time_s), y1 = std::log(rows[i]->time_s);
      t = std::exp(y0 + (y1 - y0) * (std::log(bytes) - x0) / (x1 - x0));
      break;
    }
  }
  // The same bus bandwidth on another number of ranks (nccl-tests' premise): time scales with the bus factor.
  const double measured = collective_bus_factor(want, ranks), asked = collective_bus_factor(want, n);
  return measured > 0 ? t * asked / measured : t;
}

double MachineProfile::require(double value, const char* field, const char* measure) {
  if (!(value > 0))
    fail("the machine profile has no ", field, " (a profile written before it was measured, or on a machine without ",
         "it); measure it with `", measure, "`");
  return value;
}

double MachineProfile::optimizer_rate(const std::string& state_precision) const {
  const auto it = optimizer_state_elements_per_s.find(state_precision);
  return it != optimizer_state_elements_per_s.end() && it->second > 0 ? it->second : optimizer_elements_per_s;
}

namespace {
// The disk row of the transfer size nearest `block_bytes` (log distance); null when none was measured.
const DiskRate* nearest_disk(const std::vector<DiskRate>& disk, double block_bytes) {
  double best = std::numeric_limits<double>::infinity();
  const DiskRate* out = nullptr;
  for (const auto& d : disk) {
    const double dist = std::abs(std::log(std::max(block_bytes, 1.0) / static_cast<double>(d.block_bytes)));
    if (dist < best) best = dist, out = &d;
  }
  return out;
}
}  // namespace

double MachineProfile::disk_seconds(double bytes, double block_bytes, bool write) const {
  if (bytes <= 0) return 0;
  const char* field = write ? "disk_write_bytes_per_s" : "disk_read_bytes_per_s";
  const auto* d = nearest_disk(disk, block_bytes);
  const double rate = !d ? 0 : write ? d->write_bytes_per_s : d->read_bytes_per_s;
  return bytes / require(rate, field, "shardlm bench machine --disk DIR");
}

double MachineProfile::disk_stream_seconds(double bytes, double block_bytes) const {
  const auto* d = nearest_disk(disk, block_bytes);
  if (bytes > 0 && d && d->stream_bytes_per_s > 0) return 2 * bytes / d->stream_bytes_per_s;
  return disk_seconds(bytes, block_bytes, false) + disk_seconds(bytes, block_bytes, true);
}

nlohmann::json to_json(const MachineProfile& p) {
  nlohmann::json gemm = nlohmann::json::array(), coll = nlohmann::json::array();
  for (const auto& g : p.gemm)
    gemm.push_back({{"dtype", g.dtype}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"flops_per_s", g.flops_per_s}});
  for (const auto& c : p.collectives)
    coll.push_back({{"op", c.op}, {"bytes", c.bytes}, {"busbw", c.busbw}, {"time_s", c.time_s}});
  nlohmann::json disk = nlohmann::json::array();
  for (const auto& d : p.disk)
    disk.push_back({{"block_bytes", d.block_bytes},
                    {"disk_write_bytes_per_s", d.write_bytes_per_s},
                    {"disk_read_bytes_per_s", d.read_bytes_per_s},
                    {"disk_stream_bytes_per_s", d.stream_bytes_per_s}});
  return {{"description", p.description},
          {"device", p.device},
          {"threads", p.threads},
          {"ranks", p.ranks},
          {"gemm", gemm},
          {"attention_forward", p.attention_forward},
          {"attention_backward", p.attention_backward},
          {"stream_bytes_per_s", p.stream_bytes_per_s},
          {"optimizer_elements_per_s", p.optimizer_elements_per_s},
          {"optimizer_state_elements_per_s", p.optimizer_state_elements_per_s},
          {"disk_dir", p.disk_dir},
          {"disk_io_path", p.disk_io_path},
          {"disk", disk},
          {"host_link_bytes_per_s", p.host_link_bytes_per_s},
          {"host_optimizer_elements_per_s", p.host_optimizer_elements_per_s},
          {"collectives", coll},
          {"overlap", p.overlap}};
}

MachineProfile machine_profile_from_json(const nlohmann::json& j) {
  static const std::vector<std::string> known = {
      "description", "device", "threads", "ranks", "gemm", "attention_forward", "attention_backward",
      "stream_bytes_per_s", "optimizer_elements_per_s", "optimizer_state_elements_per_s", "disk_dir", "disk_io_path",
      "disk", "host_link_bytes_per_s", "host_optimizer_elements_per_s", "collectives", "overlap"};
  for (const auto& [key, value] : j.items())
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      fail("machine profile: unknown key '", key, "' (a file written by `shardlm bench machine` has: ", list, ")");
    }
  MachineProfile p;
  try {
    p.description = j.value("description", "");
    p.device = j.value("device", "cpu");
    p.threads = j.value("threads", 1);
    p.ranks = j.value("ranks", 1);
    for (const auto& g : j.at("gemm"))
      p.gemm.push_back({g.at("dtype"), g.at("m"), g.at("n"), g.at("k"), g.at("flops_per_s")});
    p.attention_forward = j.at("attention_forward").get<std::map<std::string, double>>();
    p.attention_backward = j.at("attention_backward").get<std::map<std::string, double>>();
    p.stream_bytes_per_s = j.at("stream_bytes_per_s");
    p.optimizer_elements_per_s = j.at("optimizer_elements_per_s");
    // Measured later than the rest: a profile without them still loads (0 / empty: not measured).
    p.optimizer_state_elements_per_s =
        j.value("optimizer_state_elements_per_s", nlohmann::json::object()).get<std::map<std::string, double>>();
    p.disk_dir = j.value("disk_dir", "");
    p.disk_io_path = j.value("disk_io_path", "");
    for (const auto& d : j.value("disk", nlohmann::json::array()))
      p.disk.push_back({d.at("block_bytes"), d.at("disk_write_bytes_per_s"), d.at("disk_read_bytes_per_s"),
                        d.value("disk_stream_bytes_per_s", 0.0)});
    p.host_link_bytes_per_s = j.value("host_link_bytes_per_s", 0.0);
    p.host_optimizer_elements_per_s = j.value("host_optimizer_elements_per_s", 0.0);
    for (const auto& c : j.value("collectives", nlohmann::json::array()))
      p.collectives.push_back({c.at("op"), c.at("bytes"), c.at("busbw"), c.at("time_s")});
    p.overlap = j.value("overlap", 0.0);
  } catch (const nlohmann::json::exception& e) {
    fail("machine profile: ", e.what(), " (write it with `shardlm bench machine --out FILE`)");
  }
  if (p.stream_bytes_per_s <= 0 || p.optimizer_elements_per_s <= 0 || p.gemm.empty())
    fail("machine profile: stream_bytes_per_s, optimizer_elements_per_s and gemm must be measured (> 0)");
  if (p.overlap < 0 || p.overlap > 1) fail("machine profile: overlap must lie in [0, 1], got ", p.overlap);
  return p;
}

MachineProfile read_machine_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read the machine profile '", path, "' (write one with `shardlm bench machine --out ", path, "`)");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail("machine profile '", path, "' is not JSON: ", e.what());
  }
  return machine_profile_from_json(j);
}

}  // namespace shardlm::plan
