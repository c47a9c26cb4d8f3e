// See flight_diagnosis.h.
#include "report/flight_diagnosis.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "util/error.h"

namespace shardlm::observe {
namespace {
using json = nlohmann::json;

bool is_p2p(const std::string& op) { return op == "send" || op == "recv"; }

// What must agree between the members of one collective call.
std::string signature(const json& e) {
  std::ostringstream s;
  s << e.value("op", "?");
  // all_to_all's input size differs between ranks by design (per-rank counts): only its dtype must agree.
  if (e.value("op", "") == "all_to_all") s << " of " << e.value("dtype", "");
  else if (!e.value("dtype", std::string()).empty()) s << " of " << e.value("numel", 0LL) << " x " << e.value("dtype", "");
  // A broadcast records the root as the peer it receives from, -1 on the root itself.
  if (e.value("op", "") == "broadcast") s << " (root " << (e.value("peer", -1) < 0 ? e.value("comm_rank", 0) : e.value("peer", -1)) << ")";
  return s.str();
}

std::string describe(const json& e) {
  std::ostringstream s;
  s << signature(e) << " #" << e.value("seq", 0LL) << " on '" << e.value("comm", "?") << "'";
  if (is_p2p(e.value("op", ""))) s << (e.value("op", "") == "send" ? " to " : " from ") << "rank " << e.value("peer", -1);
  s << ", " << e.value("state", "?");
  const std::string ctx = e.value("context", "");
  if (!ctx.empty()) s << ", during " << ctx;
  return s.str();
}

std::string comm_key(const json& e) {
  std::string k = e.value("comm", "?") + "[";
  for (const auto& r : e.at("world_ranks")) k += std::to_string(r.get<int>()) + ",";
  return k + "]";
}

struct Rank {
  int world_rank = -1;
  const json* dump = nullptr;
  // comm key -> match_seq -> entry, collectives only
  std::map<std::string, std::map<long long, const json*>> collectives;
  // (comm key, op, peer) -> match_seq -> entry
  std::map<std::tuple<std::string, std::string, int>, std::map<long long, const json*>> p2p;
  const json* last = nullptr;  // latest-started entry
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? (i + 1 == ranks.size() ? " and " : ", ") : "") + std::to_string(ranks[i]);
  return s;
}

std::string last_of(const Rank& r) {
  return r.last ? "its last recorded operation: " + describe(*r.last) : "it recorded no operation";
}

// What the two sides of a desync at collective k most likely did: one side skipped a call (its #k
// is the other side's #k+1: same operation, size and phase), or both made the same call with
// different sizes. Empty when neither fits (or more than two different calls were made).
template <typename Ranks>
std::string desync_hint(Ranks& ranks, const std::string& key, long long k,
                        const std::map<std::string, std::vector<int>>& by_signature) {
  if (by_signature.size() != 2) return "";
  const auto& a = *by_signature.begin();
  const auto& b = *std::next(by_signature.begin());
  const auto call = [&](int rank, long long n) -> const json* {
    const auto& mine = ranks[rank].collectives[key];
    auto it = mine.find(n);
    return it == mine.end() ? nullptr : it->second;
  };
  const auto same_call = [](const json* x, const json* y) {
    return x && y && signature(*x) == signature(*y) && x->value("context", "") == y->value("context", "");
  };
  const json* ea = call(a.second.front(), k);
  const json* eb = call(b.second.front(), k);
  for (const auto* side : {&a, &b}) {
    const auto* other = side == &a ? &b : &a;
    const json* mine = side == &a ? ea : eb;
    const json* theirs = side == &a ? eb : ea;
    if (same_call(mine, call(other->second.front(), k + 1)))
      return "\n  rank" + std::string(side->second.size() > 1 ? "s " : " ") + join_ranks(side->second) +
             " skipped a collective: " + (side->second.size() > 1 ? "their" : "its") + " #" + std::to_string(k) +
             " is what rank" + (other->second.size() > 1 ? "s " : " ") + join_ranks(other->second) + " called as #" +
             std::to_string(k + 1) + ", so the call " + (side->second.size() > 1 ? "they" : "it") + " left out is #" +
             std::to_string(k) + ": " + describe(*theirs) + ".";
  }
  if (ea && eb && ea->value("op", "") == eb->value("op", "") && ea->value("op", "") != "all_to_all" &&
      ea->value("numel", 0LL) != eb->value("numel", 0LL))
    return "\n  the same operation with different sizes: " + std::to_string(ea->value("numel", 0LL)) + " elements on rank" +
           (a.second.size() > 1 ? "s " : " ") + join_ranks(a.second) + ", " + std::to_string(eb->value("numel", 0LL)) +
           " on rank" + (b.second.size() > 1 ? "s " : " ") + join_ranks(b.second) + ".";
  return "";
}

// A run whose train_config.json says flight_recorder.enabled false recorded nothing: said so, with
// a word about records an earlier run may have left in the same directory.
void refuse_if_recorder_was_off(const std::filesystem::path& run_dir) {
  namespace fs = std::filesystem;
  std::ifstream in(run_dir / "train_config.json");
  if (!in) return;
  const json cfg = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!cfg.is_object() || !cfg.contains("flight_recorder") || !cfg["flight_recorder"].is_object() ||
      cfg["flight_recorder"].value("enabled", true) != false)
    return;
  const fs::path records = run_dir / "flight_recorder";
  std::error_code ec;
  const bool stale = fs::is_directory(records, ec);
  fail("diagnose: the flight recorder was off in this run (flight_recorder.enabled is false in ",
       (run_dir / "train_config.json").string(), "), so its ranks kept no flight records",
       stale ? " (the files in " + records.string() + " are an earlier run's)" : std::string(),
       "; run again with flight_recorder.enabled true (the default) to diagnose a hang or a crash");
}

using RankMap = std::map<int, Rank>;

// Step 1: each rank's record indexed by communicator and number; a rank that crashed or failed
// becomes a "crash" finding. world_size grows to what the records say.
RankMap index_records(const std::vector<json>& dumps, int& world_size, FlightDiagnosis& d) {
  RankMap ranks;
  for (const auto& dump : dumps) {
    Rank r;
    r.world_rank = dump.at("world_rank").get<int>();
    r.dump = &dump;
    world_size = std::max(world_size, dump.value("world_size", 0));
    for (const auto& e : dump.at("entries")) {
      const std::string key = comm_key(e);
      if (is_p2p(e.value("op", "")))
        r.p2p[{key, e.value("op", ""), e.value("peer", -1)}][e.value("match_seq", 0LL)] = &e;
      else r.collectives[key][e.value("match_seq", 0LL)] = &e;
      if (!r.last || e.value("t_start", 0.0) >= r.last->value("t_start", 0.0)) r.last = &e;
    }
    const std::string reason = dump.value("reason", "?");
    d.dump_reasons.push_back("rank " + std::to_string(r.world_rank) + ": " + reason);
    // A rank that crashed or failed wrote its record as it went: that is the likeliest first cause.
    if (reason.rfind("fatal signal", 0) == 0 || reason.rfind("error: ", 0) == 0) {
      FlightFinding f;
      f.kind = "crash";
      f.t = r.last ? r.last->value("t_start", 0.0) : dump.value("time", 0.0);
      f.message = "rank " + std::to_string(r.world_rank) + " ended with " + reason + "; " + last_of(r);
      d.findings.push_back(f);
    }
    ranks[r.world_rank] = std::move(r);
  }
  return ranks;
}

// Step 2b: what collective number k of one communicator says, as a finding in `f` (message
// included); false when its members agree there. hi: the highest number every member still holds.
bool diagnose_collective(RankMap& ranks, const std::string& key, const std::string& name, const std::vector<int>& members,
                         long long k, long long hi, FlightFinding& f) {
  std::map<std::string, std::vector<int>> by_signature;
  std::vector<int> absent, no_dump, waiting;
  const json* first = nullptr;
  for (int m : members) {
    auto it = ranks.find(m);
    if (it == ranks.end()) {
      no_dump.push_back(m);
      continue;
    }
    const auto& mine = it->second.collectives[key];
    auto e = mine.find(k);
    if (e == mine.end()) {
      absent.push_back(m);
      continue;
    }
    by_signature[signature(*e->second)].push_back(m);
    if (e->second->value("state", "") != "completed") waiting.push_back(m);
    if (!first || e->second->value("t_start", 0.0) < first->value("t_start", 0.0)) first = e->second;
  }
  // A record written before the others even started #k (dumps on request are not simultaneous)
  // says nothing about #k: those ranks are not absent, their record just ends earlier.
  if (first) {
    const double started = first->value("t_start", 0.0);
    absent.erase(std::remove_if(absent.begin(), absent.end(),
                                [&](int a) { return ranks[a].dump->value("time", started) < started; }),
                 absent.end());
  }
  f.comm = name;
  f.match_seq = k;
  f.t = first ? first->value("t_start", 0.0) : 0;
  std::ostringstream msg;
  if (by_signature.size() > 1) {
    f.kind = "desync";
    msg << "desync on communicator '" << name << "' at collective " << k << ": its members called different "
        << "operations:";
    for (const auto& [sig, rs] : by_signature) {
      const json& e = *ranks[rs.front()].collectives[key][k];
      msg << "\n    rank" << (rs.size() > 1 ? "s " : " ") << join_ranks(rs) << ": " << describe(e);
    }
    msg << desync_hint(ranks, key, k, by_signature);
    msg << "\n  Every rank must issue the same collectives in the same order; look at the code that runs "
           "during the named phases (a branch taken on some ranks only, or shapes that differ between ranks).";
  } else if (!absent.empty() && !by_signature.empty()) {
    f.kind = "stuck";
    const json& e = *ranks[by_signature.begin()->second.front()].collectives[key][k];
    msg << "stuck: on communicator '" << name << "', rank" << (by_signature.begin()->second.size() > 1 ? "s " : " ")
        << join_ranks(by_signature.begin()->second) << " started " << describe(e) << "; rank"
        << (absent.size() > 1 ? "s " : " ") << join_ranks(absent) << " never did:";
    for (int a : absent) msg << "\n    rank " << a << ": " << last_of(ranks[a]);
    msg << "\n  The absent rank" << (absent.size() > 1 ? "s are" : " is")
        << " busy elsewhere (a long computation, a deadlock in another communicator, a crash) or took another "
           "code path; its last operation says where it was.";
  } else if (!no_dump.empty() && !waiting.empty()) {
    f.kind = "stuck";
    const json& e = *ranks[waiting.front()].collectives[key][k];
    msg << "stuck: on communicator '" << name << "', rank" << (waiting.size() > 1 ? "s " : " ") << join_ranks(waiting)
        << (waiting.size() > 1 ? " wait in " : " waits in ") << describe(e) << "; rank" << (no_dump.size() > 1 ? "s " : " ") << join_ranks(no_dump)
        << " left no flight record, so where " << (no_dump.size() > 1 ? "they were" : "it was") << " is unknown "
        << "(killed before writing, or its recorder was off).";
  } else if (!waiting.empty() && k == hi) {
    f.kind = "in_progress";
    const json& e = *ranks[waiting.front()].collectives[key][k];
    msg << "in progress: every member of '" << name << "' reached " << describe(e)
        << " and it had not completed on rank" << (waiting.size() > 1 ? "s " : " ") << join_ranks(waiting)
        << " when they wrote their records.";
    // A member that timed out in it names, in its record's reason, the peers that never answered:
    // those are inside the call but not moving (stopped, or starved of the CPU).
    for (int w : waiting) {
      const std::string reason = ranks[w].dump->value("reason", "");
      const auto at = reason.find("; waiting for world rank(s)");
      if (reason.rfind("timeout in ", 0) == 0 && at != std::string::npos)
        msg << "\n    rank " << w << " timed out in it" << reason.substr(at) << " (they did not answer its survey)";
    }
  } else {
    return false;
  }
  f.message = msg.str();
  return true;
}

// Step 2: the first number at which each communicator's members disagree (desync), some never
// started (stuck), or the call had not completed (in progress).
void find_collective_problems(RankMap& ranks, FlightDiagnosis& d) {
  // Every communicator any rank recorded, with its members (world ranks).
  std::map<std::string, std::pair<std::string, std::vector<int>>> comms;
  for (const auto& [w, r] : ranks)
    for (const auto& [key, entries] : r.collectives) {
      const json& e = *entries.begin()->second;
      comms[key] = {e.value("comm", "?"), e.at("world_ranks").get<std::vector<int>>()};
    }

  for (const auto& [key, info] : comms) {
    const auto& [name, members] = info;
    // The numbers every member still holds (each ring may have dropped its oldest entries).
    long long lo = 0, hi = 0;
    for (int m : members) {
      auto it = ranks.find(m);
      if (it == ranks.end()) continue;
      auto c = it->second.collectives.find(key);
      if (c == it->second.collectives.end() || c->second.empty()) continue;
      lo = std::max(lo, c->second.begin()->first);
      hi = std::max(hi, c->second.rbegin()->first);
    }
    for (long long k = std::max(1LL, lo); k <= hi; ++k) {
      FlightFinding f;
      if (!diagnose_collective(ranks, key, name, members, k, hi, f)) continue;
      d.findings.push_back(f);
      break;  // later numbers of this communicator follow from the first disagreement
    }
  }
}

// Step 3: a started send/recv whose counterpart the peer never posted.
void find_unmatched_p2p(RankMap& ranks, FlightDiagnosis& d) {
  for (const auto& [w, r] : ranks)
    for (const auto& [k, entries] : r.p2p) {
      const auto& [key, op, peer_comm_rank] = k;
      for (const auto& [n, e] : entries) {
        if (e->value("state", "") == "completed") continue;
        const auto members = e->at("world_ranks").get<std::vector<int>>();
        if (peer_comm_rank < 0 || peer_comm_rank >= static_cast<int>(members.size())) continue;
        const int peer = members[peer_comm_rank];
        const int me = e->value("comm_rank", 0);
        auto pit = ranks.find(peer);
        const std::string other = op == "send" ? "recv" : "send";
        bool matched = false;
        if (pit != ranks.end()) {
          auto q = pit->second.p2p.find({key, other, me});
          matched = q != pit->second.p2p.end() && q->second.count(n);
        }
        if (matched) continue;
        FlightFinding f;
        f.kind = op == "send" ? "unmatched_send" : "unmatched_recv";
        f.comm = e->value("comm", "?");
        f.match_seq = n;
        f.t = e->value("t_start", 0.0);
        std::ostringstream msg;
        msg << "stuck: rank " << w << " waits in " << describe(*e) << " (" << op << " number " << n
            << (op == "send" ? " to" : " from") << " that peer); world rank " << peer << " never posted the matching " << other << ": "
            << (pit == ranks.end() ? std::string("it left no flight record") : last_of(pit->second));
        f.message = msg.str();
        d.findings.push_back(f);
        break;
      }
    }
}


}  // namespace

std::vector<json> read_flight_records(const std::string& dir) {
  namespace fs = std::filesystem;
  refuse_if_recorder_was_off(dir);
  fs::path base(dir);
  if (fs::is_directory(base / "flight_recorder")) base /= "flight_recorder";
  if (!fs::is_directory(base))
    fail("diagnose: no flight records in '", dir, "': expected ", (fs::path(dir) / "flight_recorder").string(),
         " (a run directory whose ranks wrote their records on a timeout, a fatal signal or a request)");
  const std::regex name(R"(rank(\d+)\.json)");
  std::vector<std::pair<int, json>> found;
  for (const auto& entry : fs::directory_iterator(base)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    std::ifstream in(entry.path());
    json j;
    try {
      in >> j;
    } catch (const std::exception& e) {
      fail("diagnose: ", entry.path().string(), " is not valid JSON (", e.what(), "); a rank may have died while writing it");
    }
    found.emplace_back(std::stoi(m[1]), std::move(j));
  }
  if (found.empty())
    fail("diagnose: ", base.string(), " holds no rank<N>.json: no rank wrote its flight record (ask a hanging job for "
         "them with `touch ", (base / "dump_request").string(), "`)");
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<json> out;
  for (auto& [rank, j] : found) out.push_back(std::move(j));
  return out;
}

FlightDiagnosis diagnose_flight_records(const std::vector<json>& dumps, int world_size) {
  FlightDiagnosis d;
  RankMap ranks = index_records(dumps, world_size, d);
  d.world_size = world_size;
  for (int w = 0; w < world_size; ++w) (ranks.count(w) ? d.ranks_with_dump : d.ranks_without_dump).push_back(w);
  find_collective_problems(ranks, d);
  find_unmatched_p2p(ranks, d);
  std::stable_sort(d.findings.begin(), d.findings.end(),
                   [](const FlightFinding& a, const FlightFinding& b) { return a.t < b.t; });
  return d;
}

std::string FlightDiagnosis::summary() const {
  std::ostringstream out;
  out << "flight records of " << ranks_with_dump.size() << " of " << world_size << " rank(s)";
  if (!ranks_without_dump.empty()) out << "; no record from rank" << (ranks_without_dump.size() > 1 ? "s " : " ") << join_ranks(ranks_without_dump);
  out << "\n";
  for (const auto& r : dump_reasons) out << "  " << r << "\n";
  if (findings.empty()) {
    out << "no disagreement: in these records every communicator's members issued the same operations, and none "
           "waits for an absent peer\n";
    return out.str();
  }
  out << "first problem (the likely cause):\n  " << findings.front().message << "\n";
  if (findings.size() > 1) {
    out << "then (" << findings.size() - 1 << " more, in time order):\n";
    for (size_t i = 1; i < findings.size(); ++i) out << "  " << findings[i].message << "\n";
  }
  return out.str();
}

json FlightDiagnosis::to_json() const {
  json f = json::array();
  for (const auto& x : findings)
    f.push_back({{"kind", x.kind}, {"comm", x.comm}, {"match_seq", x.match_seq}, {"t", x.t}, {"message", x.message}});
  return {{"world_size", world_size},
          {"ranks_with_dump", ranks_with_dump},
          {"ranks_without_dump", ranks_without_dump},
          {"dump_reasons", dump_reasons},
          {"findings", f}};
}

}  // namespace shardlm::observe
