// See hostfile.h.
#include "util/hostfile.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "util/error.h"

namespace shardlm::util {
namespace {

int to_count(const std::string& text, const std::string& what) {
  size_t used = 0;
  int v = -1;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || v < 0) fail(what, " must be a whole number >= 0, got '", text, "'");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// "worker-0@worker-1:0,2" -> {worker-0: {} (all), worker-1: {0, 2}}
std::map<std::string, std::set<int>> parse_spec(const std::string& spec, const std::string& flag,
                                                const std::vector<HostSlots>& hosts) {
  std::map<std::string, std::set<int>> out;
  for (const auto& part : split(spec, '@')) {
    if (part.empty()) fail(flag, " '", spec, "': an empty host between '@'s (e.g. worker-0@worker-1:0,2)");
    const auto colon = part.find(':');
    const std::string host = part.substr(0, colon);
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const HostSlots& h) { return h.host == host; });
    if (it == hosts.end()) {
      std::string names;
      for (const auto& h : hosts) names += (names.empty() ? "" : ", ") + h.host;
      fail(flag, " names host '", host, "', which the hostfile does not list (it lists ", names, ")");
    }
    auto& slots = out[host];
    if (colon == std::string::npos) continue;
    for (const auto& s : split(part.substr(colon + 1), ',')) {
      const int slot = to_count(s, flag + " slot of " + host);
      if (slot >= it->slots)
        fail(flag, " names slot ", slot, " of ", host, ", which has slots 0..", it->slots - 1, " (slots=", it->slots, ")");
      slots.insert(slot);
    }
  }
  return out;
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& where) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string at = where + ":" + std::to_string(n) + ": ";
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    HostSlots h;
    h.host = host;
    bool have_slots = false;
    while (words >> word) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
      if (key == "slots") {
        h.slots = to_count(value, at + "slots");
        have_slots = true;
      } else if (key == "max_slots" || key == "max-slots") {
        h.max_slots = to_count(value, at + "max_slots");
      } else {
        fail(at, "unknown entry '", word, "' for host ", host, ": a line is `HOST slots=N` (OpenMPI's max_slots=M "
             "allowed too)");
      }
    }
    if (!have_slots) fail(at, "host ", host, " has no slots=N (how many ranks it runs), e.g. `", host, " slots=8`");
    if (h.slots < 1) fail(at, "host ", host, " has slots=0; leave it out, or --exclude it");
    if (std::any_of(hosts.begin(), hosts.end(), [&](const HostSlots& o) { return o.host == host; }))
      fail(at, "host ", host, " is listed twice");
    for (int s = 0; s < h.slots; ++s) h.used.push_back(s);
    hosts.push_back(std::move(h));
  }
  if (hosts.empty()) fail(where, ": no hosts (expected lines like `worker-0 slots=8`)");
  return hosts;
}

std::vector<HostSlots> select_slots(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude, int nproc) {
  if (!include.empty() && !exclude.empty()) fail("--include and --exclude cannot be combined (as in DeepSpeed)");
  if (!include.empty()) {
    const auto keep = parse_spec(include, "--include", hosts);
    for (auto& h : hosts) {
      auto it = keep.find(h.host);
      if (it == keep.end()) h.used.clear();
      else if (!it->second.empty()) h.used.assign(it->second.begin(), it->second.end());
    }
  }
  if (!exclude.empty()) {
    const auto drop = parse_spec(exclude, "--exclude", hosts);
    for (auto& h : hosts) {
      auto it = drop.find(h.host);
      if (it == drop.end()) continue;
      if (it->second.empty()) h.used.clear();
      else h.used.erase(std::remove_if(h.used.begin(), h.used.end(), [&](int s) { return it->second.count(s) > 0; }),
                        h.used.end());
    }
  }
  hosts.erase(std::remove_if(hosts.begin(), hosts.end(), [](const HostSlots& h) { return h.used.empty(); }), hosts.end());
  const int available = total_slots(hosts);
  if (available == 0) fail("--include/--exclude leave no slot to run on");
  if (nproc > 0) {
    if (nproc > available)
      fail("--nproc ", nproc, " but the hostfile", include.empty() && exclude.empty() ? "" : " selection", " has ",
           available, " slot(s); drop --nproc to use them all, or list more slots");
    int left = nproc;
    for (auto& h : hosts) {
      if (static_cast<int>(h.used.size()) > left) h.used.resize(left);
      left -= static_cast<int>(h.used.size());
    }
    hosts.erase(std::remove_if(hosts.begin(), hosts.end(), [](const HostSlots& h) { return h.used.empty(); }),
                hosts.end());
  }
  return hosts;
}

int total_slots(const std::vector<HostSlots>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += static_cast<int>(h.used.size());
  return n;
}

std::string openmpi_hostfile(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) out += h.host + " slots=" + std::to_string(h.used.size()) + "\n";
  return out;
}

std::string host_slots_env(const std::vector<HostSlots>& hosts) {
  std::string out;
  for (const auto& h : hosts) {
    out += (out.empty() ? "" : ";") + h.host + "=";
    for (size_t i = 0; i < h.used.size(); ++i) out += (i ? "," : "") + std::to_string(h.used[i]);
  }
  return out;
}

std::vector<int> host_slots(const std::string& env_value, const std::string& hostname) {
  for (const auto& entry : split(env_value, ';')) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || entry.substr(0, eq) != hostname) continue;
    std::vector<int> slots;
    for (const auto& s : split(entry.substr(eq + 1), ',')) {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
        fail("SHARDLM_HOST_SLOTS '", env_value, "': slot '", s, "' of ", hostname, " is not a whole number");
      slots.push_back(std::stoi(s));
    }
    return slots;
  }
  return {};
}

}  // namespace shardlm::util
