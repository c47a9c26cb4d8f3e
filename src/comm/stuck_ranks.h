// Who is a timed-out communication waiting for? Every rank that times out announces "I am stuck in
// operation #seq"; after a short grace period the peers that stayed silent are the missing ones.
// The MPI backend announces over MPI messages; the NCCL backend cannot (its watchdog thread may not
// call MPI, initialised MPI_THREAD_SERIALIZED), so it announces through a c10d::Store. Both split the
// peers the same way. Nothing here needs a GPU or MPI.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "comm/timeout_report.h"

namespace c10d {
class Store;
}

namespace shardlm::comm {

// How long a timed-out rank listens for the others' announcements: min(5, max(1, 0.2 x timeout)) s.
double stuck_grace_seconds(double timeout_s);

// peer >= 0 (send, recv, broadcast from a root): that peer is the one missing. Otherwise the peers
// in `heard` are stuck in the same wait and every other peer is missing.
PeerSplit split_peers(int rank, int size, int peer, const std::set<int>& heard);

// The time a survey reads and how it waits between two looks at the store: the steady clock and a
// real sleep, or a test's own clock that it steps (so a test never races a sleep against a grace).
struct SurveyClock {
  std::function<double()> now_s;          // seconds, monotonic
  std::function<void(double)> sleep_s;
  static SurveyClock steady();
};

// Writes "<prefix>stuck/<rank>" = "operation #<seq>", then watches the other ranks' keys, every 20 ms
// of `clock`, until all are heard or grace_s seconds have passed; returns the ranks whose key appeared.
// A failing store (its host process died) ends the watch early with what was heard so far.
std::set<int> watch_stuck_announcements(c10d::Store& store, const std::string& prefix, int rank, int size, int64_t seq,
                                        double grace_s, const SurveyClock& clock);

// watch_stuck_announcements on the steady clock, on a thread of its own: a store that stops answering
// (its host process hangs) makes it return nothing heard after grace_s + 2 s.
std::set<int> survey_stuck_ranks(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank,
                                 int size, int64_t seq, double grace_s);

}  // namespace shardlm::comm
