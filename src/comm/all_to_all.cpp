// See all_to_all.h. Also the default Communicator::all_to_all_async, built from point-to-point
// calls, for communicators that do not override it (decorators such as the fault-injecting ones).
#include "comm/all_to_all.h"

#include <ATen/ATen.h>

#include <numeric>
#include <utility>

#include "comm/communicator.h"
#include "util/error.h"

namespace shardlm::comm {

std::string counts_text(const std::vector<int64_t>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? ", " : "") + std::to_string(counts[i]);
  return s + "]";
}

namespace {

int64_t row_elements_of(const at::Tensor& t) {
  int64_t e = 1;
  for (int64_t d = 1; d < t.dim(); ++d) e *= t.size(d);
  return e;
}

void check_counts(const std::string& where, const char* which, const std::vector<int64_t>& counts, int size,
                  int64_t rows, const char* tensor) {
  if (static_cast<int>(counts.size()) != size)
    fail(where, which, " has ", counts.size(), " entries ", counts_text(counts), "; it needs one per rank (", size,
         ")");
  for (size_t j = 0; j < counts.size(); ++j)
    if (counts[j] < 0) fail(where, which, "[", j, "] is ", counts[j], "; counts are rows and cannot be negative");
  const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (sum != rows)
    fail(where, which, " ", counts_text(counts), " add up to ", sum, " rows, but ", tensor, " has ", rows,
         " rows (dim 0); the counts must split ", tensor, " exactly");
}

void offsets(const std::vector<int64_t>& counts, int64_t row, std::vector<int64_t>* elements,
             std::vector<int64_t>* offs) {
  int64_t at = 0;
  for (int64_t c : counts) {
    elements->push_back(c * row);
    offs->push_back(at);
    at += c * row;
  }
}

}  // namespace

AllToAllSplit check_all_to_all(const std::string& comm_name, int rank, int size, const at::Tensor& input,
                               const at::Tensor& output, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts) {
  const std::string where = "all_to_all on communicator '" + comm_name + "': ";
  if (!input.defined() || !output.defined()) fail(where, "input and output must both be tensors");
  if (input.dim() < 1 || output.dim() < 1)
    fail(where, "input (", input.dim(), "-D) and output (", output.dim(),
         "-D) need at least one dimension: the counts are rows along dim 0");
  if (!input.is_contiguous() || !output.is_contiguous())
    fail(where, "needs contiguous tensors (input ", input.is_contiguous() ? "is" : "is not", ", output ",
         output.is_contiguous() ? "is" : "is not", "); call .contiguous() first");
  if (input.scalar_type() != output.scalar_type())
    fail(where, "input is ", input.scalar_type(), " but output is ", output.scalar_type(), "; they must match");
  if (input.device() != output.device())
    fail(where, "input is on ", input.device(), " but output on ", output.device(), "; they must be on one device");
  AllToAllSplit s;
  s.row_elements = row_elements_of(input);
  if (row_elements_of(output) != s.row_elements)
    fail(where, "a row (dim 0 slice) of input holds ", s.row_elements, " elements, of output ",
         row_elements_of(output), "; the dims after the first must hold the same number of elements");
  check_counts(where, "send_counts", send_counts, size, input.size(0), "input");
  check_counts(where, "recv_counts", recv_counts, size, output.size(0), "output");
  if (send_counts[rank] != recv_counts[rank])
    fail(where, "rank ", rank, " sends itself ", send_counts[rank], " rows (send_counts[", rank, "]) but expects ",
         recv_counts[rank], " from itself (recv_counts[", rank, "]); they must be equal");
  if (input.numel() > 0 && output.numel() > 0) {
    const auto* a = static_cast<const char*>(input.data_ptr());
    const auto* b = static_cast<const char*>(output.data_ptr());
    if (a < b + output.nbytes() && b < a + input.nbytes())
      fail(where, "input and output overlap in memory; all_to_all cannot run in place, give it another output");
  }
  offsets(send_counts, s.row_elements, &s.send_elements, &s.send_offsets);
  offsets(recv_counts, s.row_elements, &s.recv_elements, &s.recv_offsets);
  return s;
}

namespace {

// Every piece's handle as one.
class AllWork : public Work {
 public:
  explicit AllWork(std::vector<WorkPtr> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& p : parts_) p->wait();
  }
  bool test() override {
    bool done = true;
    for (auto& p : parts_) done = p->test() && done;  // test every piece: each makes progress
    return done;
  }

 private:
  std::vector<WorkPtr> parts_;
};

// The default's point-to-point tag: the highest debug.check_collectives allows.
constexpr int kAllToAllTag = (1 << 14) - 1;

}  // namespace

// Receives are posted first, then sends; this rank's own piece is copied. Each piece has its own
// send/recv (stats, timeout, flight record); empty pieces are not sent.
WorkPtr Communicator::all_to_all_async(const at::Tensor& input, const at::Tensor& output,
                                       const std::vector<int64_t>& send_counts,
                                       const std::vector<int64_t>& recv_counts) {
  const auto s = check_all_to_all(name(), rank(), size(), input, output, send_counts, recv_counts);
  const int me = rank(), n = size();
  const auto flat_in = input.view({-1}), flat_out = output.view({-1});
  std::vector<WorkPtr> parts;
  for (int p = 0; p < n; ++p)
    if (p != me && s.recv_elements[p] > 0)
      parts.push_back(recv_async(flat_out.narrow(0, s.recv_offsets[p], s.recv_elements[p]), p, kAllToAllTag));
  for (int p = 0; p < n; ++p)
    if (p != me && s.send_elements[p] > 0)
      parts.push_back(send_async(flat_in.narrow(0, s.send_offsets[p], s.send_elements[p]), p, kAllToAllTag));
  if (s.send_elements[me] > 0)
    flat_out.narrow(0, s.recv_offsets[me], s.recv_elements[me]).copy_(flat_in.narrow(0, s.send_offsets[me], s.send_elements[me]));
  return std::make_shared<AllWork>(std::move(parts));
}

}  // namespace shardlm::comm
