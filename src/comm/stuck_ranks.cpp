// The store-based "who is missing" survey and the peer split shared by both backends (see stuck_ranks.h).
#include "comm/stuck_ranks.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

namespace shardlm::comm {
namespace {

std::string stuck_key(const std::string& prefix, int rank) { return prefix + "stuck/" + std::to_string(rank); }

std::set<int> watch_announcements(c10d::Store& store, const std::string& prefix, int rank, int size, int64_t seq,
                                  double grace_s) {
  std::set<int> heard;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  try {
    store.set(stuck_key(prefix, rank), "operation #" + std::to_string(seq));
    while (static_cast<int>(heard.size()) < size - 1) {
      for (int p = 0; p < size; ++p)
        if (p != rank && !heard.count(p) && store.check({stuck_key(prefix, p)})) heard.insert(p);
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    // The store is gone with its host rank; report the ranks heard so far.
  }
  return heard;
}

}  // namespace

double stuck_grace_seconds(double timeout_s) { return std::min(5.0, std::max(1.0, 0.2 * timeout_s)); }

PeerSplit split_peers(int rank, int size, int peer, const std::set<int>& heard) {
  PeerSplit split;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const bool missing = peer >= 0 ? p == peer : !heard.count(p);
    (missing ? split.missing : split.stuck).push_back(p);
  }
  return split;
}

std::set<int> survey_stuck_ranks(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                                 int size, int64_t seq, double grace_s) {
  // The survey runs on its own thread, which may stay blocked in a hung store after we give up.
  auto heard = std::make_shared<std::promise<std::set<int>>>();
  auto result = heard->get_future();
  std::thread([=] { heard->set_value(watch_announcements(*store, prefix, rank, size, seq, grace_s)); }).detach();
  if (result.wait_for(std::chrono::duration<double>(grace_s + 2.0)) != std::future_status::ready) return {};
  return result.get();
}

}  // namespace shardlm::comm
