// See checked_communicator.h.
#include "comm/checked_communicator.h"

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <utility>
#include <vector>

#include "comm/all_to_all.h"
#include "util/error.h"

namespace shardlm::comm {
namespace {

enum Op : int64_t { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kBarrier, kSplit, kSend, kRecv, kAllToAll };
// Fields of a signature; the last (the caller's world rank) names it and is not compared.
enum Field { kOp, kDtype, kIn, kOut, kRoot, kReduce, kSeq, kWorldRank, kFields };
using Signature = std::array<int64_t, kFields>;
// Point-to-point signatures travel on tag kSignatureTags + the data's tag (MPI guarantees tags up
// to 32767).
constexpr int kSignatureTags = 1 << 14;

const char* reduce_name(int64_t op) {
  return op == static_cast<int64_t>(ReduceOp::Max) ? "max" : op == static_cast<int64_t>(ReduceOp::Min) ? "min" : "sum";
}

std::string describe(const Signature& s) {
  const std::string dtype = c10::toString(static_cast<at::ScalarType>(s[kDtype]));
  const auto n = [](int64_t e) { return std::to_string(e) + " element" + (e == 1 ? "" : "s"); };
  std::string call;
  switch (s[kOp]) {
    case kAllReduce: call = "all_reduce(" + dtype + ", " + n(s[kIn]) + ", " + reduce_name(s[kReduce]) + ")"; break;
    case kReduceScatter:
      call = "reduce_scatter(" + dtype + ", " + n(s[kIn]) + " -> " + n(s[kOut]) + ", " + reduce_name(s[kReduce]) + ")";
      break;
    case kAllGather: call = "all_gather(" + dtype + ", " + n(s[kIn]) + " -> " + n(s[kOut]) + ")"; break;
    case kBroadcast: call = "broadcast(" + dtype + ", " + n(s[kIn]) + ", root " + std::to_string(s[kRoot]) + ")"; break;
    case kBarrier: call = "barrier()"; break;
    case kSplit: call = "split()"; break;
    // Its element counts differ between ranks by design: the row size must agree (the counts are
    // compared apart, in check_all_to_all_counts).
    case kAllToAll: call = "all_to_all(" + dtype + ", rows of " + n(s[kIn]) + ")"; break;
    case kSend: call = "send(" + dtype + ", " + n(s[kIn]) + ", tag " + std::to_string(s[kRoot]) + ")"; break;
    default: call = "an unknown call (op code " + std::to_string(s[kOp]) + ")";
  }
  return call + " as its call #" + std::to_string(s[kSeq]);
}

bool same_call(const Signature& a, const Signature& b) {
  for (int f = 0; f < kWorldRank; ++f)
    if (a[f] != b[f]) return false;
  return true;
}

// in_numel: the elements compared as the input's (-1: in.numel()).
Signature signature(Op op, const at::Tensor& in, int64_t out_numel, int64_t root, ReduceOp reduce, int64_t seq,
                    int world_rank, int64_t in_numel = -1) {
  const bool data = in.defined();
  return {op, data ? static_cast<int64_t>(in.scalar_type()) : -1, data ? (in_numel >= 0 ? in_numel : in.numel()) : 0,
          out_numel, root, static_cast<int64_t>(reduce), seq, world_rank};
}

at::Tensor to_tensor(const Signature& s) { return at::tensor(std::vector<int64_t>(s.begin(), s.end()), at::kLong); }

Signature from_tensor(const at::Tensor& t, int64_t offset = 0) {
  Signature s{};
  const auto* p = t.data_ptr<int64_t>() + offset;
  for (int f = 0; f < kFields; ++f) s[f] = p[f];
  return s;
}

// Both sends (signature, then data) as one handle.
class SendWork : public Work {
 public:
  SendWork(WorkPtr sig, WorkPtr data, at::Tensor keep) : sig_(std::move(sig)), data_(std::move(data)), keep_(std::move(keep)) {}
  void wait() override {
    sig_->wait();
    data_->wait();
  }
  bool test() override { return sig_->test() && data_->test(); }

 private:
  WorkPtr sig_, data_;
  at::Tensor keep_;
};

// The receive: the peer's signature is checked against this call before the data is reported.
class RecvWork : public Work {
 public:
  RecvWork(WorkPtr sig, WorkPtr data, at::Tensor received, Signature expected, std::string group, int src)
      : sig_(std::move(sig)), data_(std::move(data)), received_(std::move(received)), expected_(expected),
        group_(std::move(group)), src_(src) {}
  void wait() override {
    if (!checked_) {
      sig_->wait();
      check();
    }
    data_->wait();
  }
  bool test() override {
    if (!checked_) {
      if (!sig_->test()) return false;
      check();
    }
    return data_->test();
  }

 private:
  void check() {
    checked_ = true;
    auto sent = from_tensor(received_);
    sent[kOp] = kRecv;  // compare as the receive it must match
    if (same_call(sent, expected_)) return;
    sent[kOp] = kSend;
    // A message no larger than the posted buffer still lands in it: complete the receive first, so
    // nothing writes into the buffer after the error (a larger one would fail truncated: leave it).
    const auto bytes = [](const Signature& s) { return s[kIn] * c10::elementSize(static_cast<at::ScalarType>(s[kDtype])); };
    if (sent[kDtype] >= 0 && bytes(sent) <= bytes(expected_)) data_->wait();
    auto mine = expected_;
    mine[kOp] = kSend;
    std::string recv_call = describe(mine);
    recv_call.replace(0, 4, "recv");
    fail("point-to-point mismatch on communicator '", group_, "' (debug.check_collectives): world rank ",
         expected_[kWorldRank], " posted ", recv_call, " from rank ", src_, ", but that peer (world rank ",
         sent[kWorldRank], ") sent ", describe(sent),
         ". Sender and receiver must agree on dtype, element count and tag, message for message.");
  }
  WorkPtr sig_, data_;
  at::Tensor received_;
  Signature expected_;
  std::string group_;
  int src_;
  bool checked_ = false;
};

class CheckedCommunicator : public Communicator {
 public:
  CheckedCommunicator(CommPtr inner, int world_rank) : inner_(std::move(inner)), world_rank_(world_rank) {
    timeout_s_ = inner_->timeout_seconds();
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  WorkPtr all_reduce_async(const at::Tensor& t, ReduceOp op) override {
    check_group(signature(kAllReduce, t, t.numel(), -1, op, seq_++, world_rank_));
    return inner_->all_reduce_async(t, op);
  }
  WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override {
    check_group(signature(kReduceScatter, in, out.numel(), -1, op, seq_++, world_rank_));
    return inner_->reduce_scatter_async(in, out, op);
  }
  WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    check_group(signature(kAllGather, in, out.numel(), -1, ReduceOp::Sum, seq_++, world_rank_));
    return inner_->all_gather_async(in, out);
  }
  WorkPtr broadcast_async(const at::Tensor& t, int root) override {
    check_group(signature(kBroadcast, t, t.numel(), root, ReduceOp::Sum, seq_++, world_rank_));
    return inner_->broadcast_async(t, root);
  }
  // Checked in two exchanges: the call's signature (operation, dtype, row size, call number), then
  // every rank's counts and whether its own arguments passed the local checks, so that rank i's
  // send_counts[j] is compared with rank j's recv_counts[i], and a rank whose arguments are bad
  // stops its peers with it instead of leaving them in the collective.
  WorkPtr all_to_all_async(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) override {
    std::string refused;
    try {
      check_all_to_all(inner_->name(), rank(), size(), in, out, send_counts, recv_counts);
    } catch (const Error& e) {
      refused = e.what();
    }
    int64_t row = -1;
    if (in.defined() && in.dim() >= 1) {
      row = 1;
      for (int64_t d = 1; d < in.dim(); ++d) row *= in.size(d);
    }
    check_group(signature(kAllToAll, in, 0, -1, ReduceOp::Sum, seq_++, world_rank_, row));
    check_all_to_all_counts(send_counts, recv_counts, refused);
    return inner_->all_to_all_async(in, out, send_counts, recv_counts);
  }
  WorkPtr barrier_async() override {
    check_group(signature(kBarrier, at::Tensor(), 0, -1, ReduceOp::Sum, seq_++, world_rank_));
    return inner_->barrier_async();
  }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    check_group(signature(kSplit, at::Tensor(), 0, -1, ReduceOp::Sum, seq_++, world_rank_));
    return checked_communicator(inner_->split(color, key, name), world_rank_);
  }

  WorkPtr send_async(const at::Tensor& t, int dst, int tag) override {
    check_tag(tag);
    auto sig = to_tensor(signature(kSend, t, t.numel(), tag, ReduceOp::Sum, sends_[{dst, tag}]++, world_rank_));
    auto sig_work = inner_->send_async(sig, dst, kSignatureTags + tag);
    count_signature("send", sig);
    return std::make_shared<SendWork>(std::move(sig_work), inner_->send_async(t, dst, tag), sig);
  }
  WorkPtr recv_async(const at::Tensor& t, int src, int tag) override {
    check_tag(tag);
    const auto expected = signature(kRecv, t, t.numel(), tag, ReduceOp::Sum, receives_[{src, tag}]++, world_rank_);
    auto received = at::empty({kFields}, at::kLong);
    auto sig_work = inner_->recv_async(received, src, kSignatureTags + tag);
    count_signature("recv", received);
    return std::make_shared<RecvWork>(std::move(sig_work), inner_->recv_async(t, src, tag), received, expected,
                                      inner_->name(), src);
  }

  // The wrapped backend's totals, less the signatures' calls and bytes (their time stays in: it is
  // what this mode costs), plus "collective_checks": the signatures' calls, bytes and the seconds
  // the group exchanges took (in wait_seconds; the metrics' comm_collective_checks_wait_s).
  const std::map<std::string, OpStats>& stats() const override {
    view_ = inner_->stats();
    OpStats checks;
    for (const auto& [op, own] : signature_stats_) {
      checks.calls += own.calls;
      checks.bytes += own.bytes;
      auto it = view_.find(op);
      if (it == view_.end()) continue;
      it->second.calls -= own.calls;
      it->second.bytes -= own.bytes;
      if (it->second.calls <= 0) view_.erase(it);
    }
    checks.wait_seconds = check_seconds_;
    if (checks.calls > 0) view_["collective_checks"] = checks;
    return view_;
  }
  void reset_stats() override {
    inner_->reset_stats();
    signature_stats_.clear();
    check_seconds_ = 0;
  }

 private:
  void check_tag(int tag) const {
    if (tag < 0 || tag >= kSignatureTags)
      fail("internal: debug.check_collectives needs point-to-point tags in [0, ", kSignatureTags, "), got ", tag);
  }
  void count_signature(const std::string& op, const at::Tensor& sig) {
    signature_stats_[op].calls++;
    signature_stats_[op].bytes += sig.nbytes();
  }
  // Every rank of the group gets every signature; all compare, so all fail with the same message.
  void check_group(const Signature& mine) {
    const int n = inner_->size();
    auto all = at::empty({n * kFields}, at::kLong);
    const auto sent = to_tensor(mine);
    const auto start = std::chrono::steady_clock::now();
    inner_->all_gather(sent, all);
    check_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    count_signature("all_gather", sent);
    std::vector<Signature> sigs;
    for (int r = 0; r < n; ++r) sigs.push_back(from_tensor(all, r * kFields));
    bool agree = true;
    for (const auto& s : sigs) agree = agree && same_call(s, sigs[0]);
    if (agree) return;
    // The call most ranks made is the reference (ties: group rank 0's); the others are named.
    std::vector<std::vector<int>> classes;  // group ranks per distinct call, in order of first rank
    for (int r = 0; r < n; ++r) {
      bool placed = false;
      for (auto& c : classes)
        if (!placed && same_call(sigs[c[0]], sigs[r])) c.push_back(r), placed = true;
      if (!placed) classes.push_back({r});
    }
    size_t ref = 0;
    for (size_t c = 1; c < classes.size(); ++c)
      if (classes[c].size() > classes[ref].size()) ref = c;
    auto ranks = [&sigs](const std::vector<int>& group_ranks) {
      std::string s = group_ranks.size() == 1 ? "world rank " : "world ranks ";
      for (size_t i = 0; i < group_ranks.size(); ++i)
        s += (i ? ", " : "") + std::to_string(sigs[group_ranks[i]][kWorldRank]);
      return s;
    };
    std::string differing;
    for (size_t c = 0; c < classes.size(); ++c)
      if (c != ref) differing += (differing.empty() ? "" : "; ") + ranks(classes[c]) + " called " + describe(sigs[classes[c][0]]);
    fail("collective mismatch on communicator '", inner_->name(), "' (debug.check_collectives): ", differing,
         ", while ", ranks(classes[ref]), " called ", describe(sigs[classes[ref][0]]),
         ". Every rank of a group must make the same collective calls, with the same dtype and element counts, in the "
         "same order; the differing rank(s) took another code path.");
  }

  // Every rank gets every rank's (world rank, arguments valid, send counts, recv counts) and
  // compares them, so all fail together, naming each pair that disagrees (the first few).
  void check_all_to_all_counts(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts,
                               const std::string& refused) {
    const int n = inner_->size();
    const int64_t width = 2 + 2 * n;
    std::vector<int64_t> mine{world_rank_, refused.empty() ? 1 : 0};
    for (const auto* counts : {&send_counts, &recv_counts})
      for (int j = 0; j < n; ++j) mine.push_back(j < static_cast<int>(counts->size()) ? (*counts)[j] : -1);
    const auto sent = at::tensor(mine, at::kLong);
    auto all = at::empty({n * width}, at::kLong);
    const auto start = std::chrono::steady_clock::now();
    inner_->all_gather(sent, all);
    check_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    count_signature("all_gather", sent);
    const auto* a = all.data_ptr<int64_t>();
    const auto world = [&](int r) { return std::to_string(a[r * width]); };
    if (!refused.empty())
      fail(refused, " (debug.check_collectives stopped the other ranks of the group too)");
    std::string refusing;
    for (int r = 0; r < n; ++r)
      if (a[r * width + 1] == 0) refusing += (refusing.empty() ? "" : ", ") + world(r);
    if (!refusing.empty())
      fail("all_to_all on communicator '", inner_->name(), "' (debug.check_collectives): world rank(s) ", refusing,
           " called it with invalid arguments (their own error says which); this rank stops with them");
    const auto sends = [&](int i, int j) { return a[i * width + 2 + j]; };
    const auto expects = [&](int j, int i) { return a[j * width + 2 + n + i]; };  // rank j's recv_counts[i]
    std::string pairs;
    int bad = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (sends(i, j) != expects(j, i) && ++bad <= 4)
          pairs += std::string(pairs.empty() ? "" : "; ") + "world rank " + world(i) + " sends " +
                   std::to_string(sends(i, j)) + " rows to world rank " + world(j) + ", which expects " +
                   std::to_string(expects(j, i)) + " from it";
    if (bad == 0) return;
    if (bad > 4) pairs += "; and " + std::to_string(bad - 4) + " more pair(s)";
    fail("all_to_all count mismatch on communicator '", inner_->name(), "' (debug.check_collectives): ", pairs,
         ". Rank i's send_counts[j] must equal rank j's recv_counts[i]; exchange the send counts first (an "
         "all_to_all of one count per rank: parallel/expert/all_to_all_ops.h) to learn the receive counts.");
  }

  CommPtr inner_;
  int world_rank_;
  int64_t seq_ = 0;
  std::map<std::pair<int, int>, int64_t> sends_, receives_;  // per (peer, tag)
  std::map<std::string, OpStats> signature_stats_;
  double check_seconds_ = 0;  // in the group exchanges
  mutable std::map<std::string, OpStats> view_;
};

}  // namespace

CommPtr checked_communicator(CommPtr inner, int world_rank) {
  return std::make_shared<CheckedCommunicator>(std::move(inner), world_rank);
}

}  // namespace shardlm::comm
