// Exact results of all_reduce, reduce_scatter and all_gather where they run through shared memory
// (comm/shm_group.h; every CPU collective of ranks on one machine): fp32, fp64, bf16 and int64,
// counts that are odd, smaller than the ranks, not divisible by them, and larger than one round
// of the segment; in place and not; on the world and on sub-communicators; several operations in
// flight at once, completed in any order. Expected values are summed in rank order in the
// accumulation type (float for bf16, rounded once), as the kernel does, so equality is exact.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/shm_group.h"

using namespace shardlm;

namespace {

// Rank p's input: distinct per rank and element, non-integer for the float types (so the sum's
// rounding matters), and exact in bf16 for the 16-bit case.
at::Tensor input(int p, int64_t n, at::ScalarType dtype, int64_t offset = 0) {
  auto i = at::arange(offset, offset + n, at::kDouble);
  if (dtype == at::kBFloat16) return ((i.remainder(13) + 1) * (p + 1) * 0.25).to(dtype);
  if (dtype == at::kLong) return (i * 3 + p * 1000003).to(dtype);
  return (at::sin(i * 0.37 + p) * (p + 1.5) + 0.1 * i).to(dtype);
}

// Sum over ranks 0..n-1 in order, in the accumulation type, rounded to dtype once.
at::Tensor ordered_sum(int n, int64_t count, at::ScalarType dtype, int64_t offset = 0) {
  const auto acc = dtype == at::kBFloat16 ? at::kFloat : dtype;
  auto s = input(0, count, dtype, offset).to(acc);
  for (int p = 1; p < n; ++p) s = s + input(p, count, dtype, offset).to(acc);
  return s.to(dtype);
}

std::vector<comm::CommPtr> communicators() {
  auto w = comm::mpi_world();
  const int r = w->rank();
  return {w, w->split(r % 2, r, "parity"), w->split(r / 2, r, "halves")};
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong};
// Counts that are odd, below the ranks, not divisible by them; fp32 on the world also gets one
// longer than a 1 MiB round (reduce_scatter's slot holds n chunks, so its chunk can be shorter).
std::vector<int64_t> counts(const comm::Communicator& c, at::ScalarType dtype, int64_t big) {
  if (dtype == at::kFloat && c.name() == "world") return {1, 3, 7, 1001, big};
  return {1, 3, 7, 1001};
}

// Every test checks which path its collectives took: the shared-memory kernel advanced when it is
// enabled (ranks on one machine), never when SHARDLM_COMM_SHM=0 sends them through OpenMPI's own
// collectives (ctest's mpi_2_ranks_without_shm) — so exact results here are the shm path's.
class ShmCollectives : public ::testing::Test {
 protected:
  void SetUp() override { steps_before_ = comm::shm::Op::steps_taken(); }
  void TearDown() override {
    const auto steps = comm::shm::Op::steps_taken() - steps_before_;
    if (comm::shm::Group::enabled()) EXPECT_GT(steps, 0u) << "the shared-memory path was not taken";
    else EXPECT_EQ(steps, 0u) << "SHARDLM_COMM_SHM=0, yet the shared-memory path ran";
  }
  uint64_t steps_before_ = 0;
};

}  // namespace

TEST_F(ShmCollectives, AllReduceIsExactForEveryCountAndDtype) {
  for (auto& c : communicators()) {
    const int r = c->rank(), n = c->size();
    for (auto dtype : kDtypes)
      for (int64_t count : counts(*c, dtype, 300 * 1000 + 7)) {
        auto t = input(r, count, dtype);
        c->all_reduce(t);
        EXPECT_TRUE(at::equal(t, ordered_sum(n, count, dtype))) << c->name() << " " << dtype << " count " << count;
        auto m = input(r, count, dtype);
        c->all_reduce(m, comm::ReduceOp::Max);
        auto want_max = input(0, count, dtype);
        for (int p = 1; p < n; ++p) want_max = at::maximum(want_max, input(p, count, dtype));
        EXPECT_TRUE(at::equal(m, want_max))
            << c->name() << " max " << dtype << " count " << count;
      }
  }
}

TEST_F(ShmCollectives, ReduceScatterIsExactInPlaceAndNot) {
  for (auto& c : communicators()) {
    const int r = c->rank(), n = c->size();
    for (auto dtype : kDtypes)
      for (int64_t chunk : counts(*c, dtype, 70 * 1000 * (4 / n) + 3)) {
        const auto want = ordered_sum(n, chunk, dtype, r * chunk);
        auto in = input(r, n * chunk, dtype);
        auto out = at::full({chunk}, -1, in.options());
        c->reduce_scatter(in, out);
        EXPECT_TRUE(at::equal(out, want)) << c->name() << " " << dtype << " chunk " << chunk;
        auto buf = input(r, n * chunk, dtype);
        auto mine = buf.narrow(0, r * chunk, chunk);  // the output is this rank's chunk of the input
        c->reduce_scatter(buf, mine);
        EXPECT_TRUE(at::equal(mine, want)) << c->name() << " in place " << dtype << " chunk " << chunk;
      }
  }
}

TEST_F(ShmCollectives, AllGatherIsExactInPlaceAndNot) {
  for (auto& c : communicators()) {
    const int r = c->rank(), n = c->size();
    for (auto dtype : kDtypes)
      for (int64_t chunk : counts(*c, dtype, 300 * 1000 + 1)) {
        std::vector<at::Tensor> parts;
        for (int p = 0; p < n; ++p) parts.push_back(input(p, chunk, dtype, p));
        const auto want = at::cat(parts);
        auto out = at::full({n * chunk}, -1, want.options());
        c->all_gather(input(r, chunk, dtype, r), out);
        EXPECT_TRUE(at::equal(out, want)) << c->name() << " " << dtype << " chunk " << chunk;
        auto buf = at::full({n * chunk}, -1, want.options());
        auto mine = buf.narrow(0, r * chunk, chunk);
        mine.copy_(input(r, chunk, dtype, r));
        c->all_gather(mine, buf);
        EXPECT_TRUE(at::equal(buf, want)) << c->name() << " in place " << dtype << " chunk " << chunk;
      }
  }
}

TEST_F(ShmCollectives, ManyInFlightOnTwoCommunicatorsCompleteInAnyOrder) {
  auto w = comm::mpi_world();
  const int r = w->rank(), n = w->size();
  auto sub = w->split(r % 2, r, "parity");
  std::vector<at::Tensor> bufs, gathered;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < 6; ++i) {  // larger than a round, so each needs several; interleaved over two groups
    bufs.push_back(at::full({300 * 1000 + i}, 1.0 + i, at::kFloat));
    works.push_back((i % 2 ? sub : w)->all_reduce_async(bufs.back()));
    gathered.push_back(at::empty({sub->size() * 3}, at::kDouble));
    works.push_back(sub->all_gather_async(at::full({3}, static_cast<double>(sub->rank()), at::kDouble),
                                          gathered.back()));
  }
  for (int i = static_cast<int>(works.size()) - 1; i >= 0; --i) works[i]->wait();
  for (int i = 0; i < 6; ++i) {
    const double members = i % 2 ? sub->size() : n;
    EXPECT_TRUE(at::equal(bufs[i], at::full_like(bufs[i], (1.0 + i) * members))) << i;
    EXPECT_EQ(gathered[i][sub->size() * 3 - 1].item<double>(), sub->size() - 1) << i;
  }
}

// Outputs of 4 MiB and more are written with streaming stores (shm_reduce.h): sizes past that
// threshold, at addresses one element off 16-byte alignment, odd counts, for the float sum's SSE
// kernel and the generic one (bf16), in place and not.
TEST_F(ShmCollectives, LargeMisalignedOutputsAreExact) {
  auto c = comm::mpi_world();
  const int r = c->rank(), n = c->size();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t big = (int64_t(5) << 20) / at::elementSize(dtype) / n + 3;  // a chunk: n chunks > 4 MiB
    auto off_by_one = [&](int64_t count) { return at::full({count + 1}, -1, at::TensorOptions(dtype)).narrow(0, 1, count); };

    auto t = off_by_one(n * big);
    t.copy_(input(r, n * big, dtype));
    c->all_reduce(t);
    EXPECT_TRUE(at::equal(t, ordered_sum(n, n * big, dtype))) << "all_reduce " << dtype;

    auto out = off_by_one(big);
    c->reduce_scatter(input(r, n * big, dtype), out);
    EXPECT_TRUE(at::equal(out, ordered_sum(n, big, dtype, r * big))) << "reduce_scatter " << dtype;
    auto buf = off_by_one(n * big);
    buf.copy_(input(r, n * big, dtype));
    auto own = buf.narrow(0, r * big, big);  // in place: the output is this rank's chunk of the input
    c->reduce_scatter(buf, own);
    EXPECT_TRUE(at::equal(own, ordered_sum(n, big, dtype, r * big))) << "reduce_scatter in place " << dtype;

    std::vector<at::Tensor> parts;
    for (int p = 0; p < n; ++p) parts.push_back(input(p, big, dtype, p));
    auto gathered = off_by_one(n * big);
    c->all_gather(input(r, big, dtype, r), gathered);
    EXPECT_TRUE(at::equal(gathered, at::cat(parts))) << "all_gather " << dtype;
    auto mine = gathered.narrow(0, r * big, big);  // in place
    gathered.fill_(-1);
    mine.copy_(input(r, big, dtype, r));
    c->all_gather(mine, gathered);
    EXPECT_TRUE(at::equal(gathered, at::cat(parts))) << "all_gather in place " << dtype;
  }
}
