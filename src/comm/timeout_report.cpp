// One formatting of communication failures for every backend (see timeout_report.h).
#include "comm/timeout_report.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

#include "util/units.h"

namespace shardlm::comm {
namespace {

std::string human_bytes(int64_t b) { return util::format_bytes(static_cast<double>(b)); }

// "1, 3 (world 5)": communicator ranks, with the world rank where it differs.
std::string rank_list(const std::vector<int>& ranks, const std::vector<int>& world_ranks) {
  std::ostringstream out;
  for (int p : ranks) {
    out << (out.tellp() > 0 ? ", " : "") << p;
    if (world_ranks[p] != p) out << " (world " << world_ranks[p] << ")";
  }
  return out.str();
}

}  // namespace

std::string operation_detail(const std::string& op, const at::Tensor& t, int peer) {
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  std::ostringstream detail;
  detail << " of " << human_bytes(bytes) << " (" << t.numel() << " x " << t.scalar_type() << ")";
  if (peer >= 0 && op != "broadcast") detail << (op == "send" ? " to" : " from") << " rank " << peer;
  return detail.str();
}

std::string rank_prefix(int rank, const std::string& comm_name, int world_rank) {
  std::ostringstream out;
  out << "shardlm: rank " << rank << " of communicator '" << comm_name << "' (world rank " << world_rank << "): ";
  return out.str();
}

std::string timeout_message(const TimeoutReport& r) {
  const std::string missing = rank_list(r.peers.missing, r.world_ranks);
  const std::string stuck = rank_list(r.peers.stuck, r.world_ranks);
  std::ostringstream out;
  out << rank_prefix(r.rank, r.comm_name, r.world_ranks[r.rank]) << r.op << r.detail << " timed out after "
      << std::fixed << std::setprecision(1) << r.waited_s << " s (operation #" << r.seq
      << "). Waiting for rank(s): " << (missing.empty() ? "none identified" : missing) << ".";
  if (!stuck.empty()) out << " Also stuck in the same wait: rank(s) " << stuck << ".";
  out << "\nshardlm: a peer process died, hangs, or runs a different operation; if steps are legitimately "
         "this slow, raise comm.timeout_s. Exiting.\n";
  return out.str();
}

void write_failure(const std::string& message) {
  std::fputs(message.c_str(), stderr);
  std::fflush(stderr);
  std::fflush(stdout);
}

}  // namespace shardlm::comm
