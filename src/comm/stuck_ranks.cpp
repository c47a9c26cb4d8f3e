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

}  // namespace

SurveyClock SurveyClock::steady() {
  return {[] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); },
          [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }};
}

std::set<int> watch_stuck_announcements(c10d::Store& store, const std::string& prefix, int rank, int size, int64_t seq,
                                        double grace_s, const SurveyClock& clock) {
  std::set<int> heard;
  const double until = clock.now_s() + grace_s;
  try {
    store.set(stuck_key(prefix, rank), "operation #" + std::to_string(seq));
    for (;;) {
      for (int p = 0; p < size; ++p)
        if (p != rank && !heard.count(p) && store.check({stuck_key(prefix, p)})) heard.insert(p);
      // Stop once every peer is heard (at once, without a last sleep) or the grace is over.
      if (static_cast<int>(heard.size()) >= size - 1 || clock.now_s() >= until) break;
      clock.sleep_s(0.02);
    }
  } catch (const std::exception&) {
    // The store is gone with its host rank; report the ranks heard so far.
  }
  return heard;
}

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
  std::thread([=] {
    heard->set_value(watch_stuck_announcements(*store, prefix, rank, size, seq, grace_s, SurveyClock::steady()));
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(grace_s + 2.0)) != std::future_status::ready) return {};
  return result.get();
}

}  // namespace shardlm::comm
