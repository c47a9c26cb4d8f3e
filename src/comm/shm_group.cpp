#include "comm/shm_group.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/shm_reduce.h"
#include "util/error.h"

namespace shardlm::comm::shm {
namespace {

// Bytes of one rank's slot in one of the two sets. Small enough that both sets of every rank's
// slots (4 MiB on 2 ranks) stay in the last-level cache, so the copy-in, the reduce and the
// copy-out move data between cache and the caller's buffers and DRAM sees about one read and one
// write of the message; large enough that the arrivals (microseconds each) cost little against
// the copies.
constexpr int64_t kSlotBytes = 1 << 20;
constexpr size_t kFlagBytes = 64;  // one cache line per rank's arrival counter
// Outputs at least this large are written with streaming stores (shm_reduce.h, stream_copy): they
// do not fit the caches anyway, and normal stores would read every destination line first.
constexpr int64_t kStreamMinBytes = 4 << 20;

std::atomic<uint64_t>* flag_at(char* base, int rank) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + kFlagBytes * rank);
}

template <typename F>
void dispatch(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    case at::kInt: return f(int32_t{});
    case at::kLong: return f(int64_t{});
    case at::kByte: return f(uint8_t{});
    case at::kChar: return f(int8_t{});
    default: fail("shared-memory collectives: no kernel for ", t);
  }
}

}  // namespace

bool Group::supports(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kHalf:
    case at::kInt: case at::kLong: case at::kByte: case at::kChar:
      return true;
    default:
      return false;
  }
}

bool Group::enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SHARDLM_COMM_SHM");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

std::unique_ptr<Group> Group::create(void* mpi_comm, int rank, int size, const std::function<void()>& barrier) {
  MPI_Comm comm = *static_cast<MPI_Comm*>(mpi_comm);
  // The MPI calls below block without a deadline; a timed barrier first turns a missing rank
  // into the communicator's timeout report instead of a hang.
  barrier();
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size) return nullptr;  // every rank sees the same inequality: all fall back together

  const size_t bytes = kFlagBytes * size + static_cast<size_t>(2 * kSlotBytes) * size;
  char name[64] = {0};
  if (rank == 0) {
    static int serial = 0;
    std::snprintf(name, sizeof name, "/shardlm-%d-%d", static_cast<int>(getpid()), serial++);
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      if (fd >= 0) {
        close(fd);
        shm_unlink(name);
      }
      name[0] = 0;  // no /dev/shm: tell the others, everyone falls back to MPI's collectives
    } else {
      close(fd);
    }
  }
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
  if (!name[0]) return nullptr;
  char* base = nullptr;
  const int fd = shm_open(name, O_RDWR, 0600);
  if (fd >= 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p != MAP_FAILED) base = static_cast<char*>(p);
  }
  int ok = base != nullptr, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (rank == 0) shm_unlink(name);  // every rank has it mapped (or gave up): the name is no longer needed
  if (!all_ok) {
    if (base) munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<Group>(new Group(rank, size, base, bytes, kSlotBytes));
}

Group::Group(int rank, int size, char* base, size_t bytes, int64_t slot_bytes)
    : rank_(rank), size_(size), base_(base), bytes_(bytes), slot_bytes_(slot_bytes) {}

Group::~Group() { munmap(base_, bytes_); }

char* Group::slot(int rank, int set) const {
  return base_ + kFlagBytes * size_ + static_cast<size_t>(slot_bytes_) * (2 * rank + set);
}

void Group::arrive(uint64_t target) { flag_at(base_, rank_)->store(target, std::memory_order_release); }

std::atomic<int64_t>* Group::word(int p, int set) const {
  static_assert(3 * sizeof(std::atomic<int64_t>) <= kFlagBytes, "the words share the counter's cache line");
  return reinterpret_cast<std::atomic<int64_t>*>(base_ + kFlagBytes * p + 8 * (1 + set));
}

bool Group::all_arrived(uint64_t target) const {
  for (int p = 0; p < size_; ++p)
    if (flag_at(base_, p)->load(std::memory_order_acquire) < target) return false;
  return true;
}

Op::Op(Group* g, Kind kind, at::ScalarType dtype, ReduceOp op, const void* in, void* out, int64_t count)
    : g_(g), kind_(kind), dtype_(dtype), op_(op), in_(static_cast<const char*>(in)), out_(static_cast<char*>(out)),
      count_(count), elt_(static_cast<int64_t>(c10::elementSize(dtype))) {
  const int64_t out_elems = kind == Kind::AllGather ? count * g->size_ : count;
  stream_ = out_elems * elt_ >= kStreamMinBytes;
}

Op::Op(Group* g, at::ScalarType dtype, const void* in, void* out, AllToAllBytes pieces)
    : g_(g), kind_(Kind::AllToAll), dtype_(dtype), op_(ReduceOp::Sum), in_(static_cast<const char*>(in)),
      out_(static_cast<char*>(out)), count_(0), elt_(static_cast<int64_t>(c10::elementSize(dtype))),
      pieces_(std::move(pieces)) {
  int64_t received = 0;
  for (int64_t b : pieces_.recv_bytes) received += b;
  stream_ = received >= kStreamMinBytes;
}

// all_to_all: the bytes of rank p's sub-slot (one per destination), a multiple of 64.
int64_t Op::sub_slot_bytes() const { return g_->slot_bytes_ / g_->size_ / 64 * 64; }

// Copies the round's piece for every peer into this rank's sub-slots (the first round also this
// rank's own piece straight to the output, and the rounds it needs), then arrives.
bool Op::start_all_to_all_round() {
  if (rounds_ >= 0 && round_ >= rounds_) return true;
  const int n = g_->size_, r = g_->rank_;
  const int set = static_cast<int>(g_->rounds_ % 2);
  const int64_t sub = sub_slot_bytes();
  char* mine = g_->slot(r, set);
  if (round_ == 0) {
    if (pieces_.send_bytes[r] > 0)
      std::memcpy(out_ + pieces_.recv_offsets[r], in_ + pieces_.send_offsets[r], pieces_.send_bytes[r]);
    int64_t needed = 1;  // the first round also tells the group how many follow
    for (int p = 0; p < n; ++p)
      if (p != r)
        needed = std::max({needed, (pieces_.send_bytes[p] + sub - 1) / sub, (pieces_.recv_bytes[p] + sub - 1) / sub});
    g_->word(r, set)->store(needed, std::memory_order_relaxed);  // published by the arrival's release
  }
  const int64_t lo = round_ * sub;
  for (int p = 0; p < n; ++p)
    if (p != r && lo < pieces_.send_bytes[p])
      std::memcpy(mine + p * sub, in_ + pieces_.send_offsets[p] + lo, std::min(sub, pieces_.send_bytes[p] - lo));
  target_ = ++g_->arrivals_;
  g_->arrive(target_);
  phase_ = 1;
  ++steps_;
  return false;
}

// Once every rank arrived: the pieces addressed to this rank, from every peer's sub-slot.
void Op::finish_all_to_all_round() {
  const int n = g_->size_, r = g_->rank_;
  const int set = static_cast<int>(g_->rounds_ % 2);
  const int64_t sub = sub_slot_bytes();
  if (round_ == 0) {
    rounds_ = 1;
    for (int p = 0; p < n; ++p) rounds_ = std::max(rounds_, g_->word(p, set)->load(std::memory_order_relaxed));
  }
  const int64_t lo = round_ * sub;
  for (int p = 0; p < n; ++p)
    if (p != r && lo < pieces_.recv_bytes[p])
      copy_out(out_ + pieces_.recv_offsets[p] + lo, g_->slot(p, set) + r * sub,
               std::min(sub, pieces_.recv_bytes[p] - lo), stream_);
  if (stream_) stream_fence();
  ++steps_;
  ++round_;
  ++g_->rounds_;
  phase_ = 0;
}

// The slice of a round's len elements that rank p reduces (all_reduce): [lo(p), lo(p+1)).
static int64_t slice_lo(int64_t len, int p, int n) { return len * p / n; }

bool Op::start_round() {
  if (pos_ >= count_) return true;
  const int n = g_->size_, r = g_->rank_;
  const int64_t slot_elems = g_->slot_bytes_ / elt_;
  char* mine = g_->slot(r, static_cast<int>(g_->rounds_ % 2));
  if (kind_ == Kind::AllReduce) {
    len_ = std::min(count_ - pos_, slot_elems);
    for (int p = 0; p < n; ++p) {  // the slices the others reduce; this rank's own is read in place
      if (p == r) continue;
      const int64_t lo = slice_lo(len_, p, n), hi = slice_lo(len_, p + 1, n);
      std::memcpy(mine + lo * elt_, out_ + (pos_ + lo) * elt_, (hi - lo) * elt_);
    }
  } else if (kind_ == Kind::ReduceScatter) {
    len_ = std::min(count_ - pos_, slot_elems / n);
    for (int p = 0; p < n; ++p)
      if (p != r) std::memcpy(mine + p * len_ * elt_, in_ + (p * count_ + pos_) * elt_, len_ * elt_);
  } else {
    len_ = std::min(count_ - pos_, slot_elems);
    char* own = out_ + (r * count_ + pos_) * elt_;
    const char* src = in_ + pos_ * elt_;
    const int64_t bytes = len_ * elt_;
    if (own == src) {  // in place: the input already is this rank's piece of the output
      std::memcpy(mine, src, bytes);
    } else if (own < src + bytes && src < own + bytes) {
      std::memcpy(mine, src, bytes);
      std::memmove(own, src, bytes);
    } else {
      copy_twice(mine, own, src, bytes, stream_);
    }
  }
  target_ = ++g_->arrivals_;
  g_->arrive(target_);
  phase_ = 1;
  ++steps_;
  return false;
}

template <typename T>
void Op::reduce_slice() {
  const int n = g_->size_, r = g_->rank_;
  const int set = static_cast<int>(g_->rounds_ % 2);
  const T* inputs[64];
  std::unique_ptr<const T*[]> many;
  const T** in = inputs;
  if (n > 64) {
    many.reset(new const T*[n]);
    in = many.get();
  }
  if (kind_ == Kind::AllReduce) {
    const int64_t lo = slice_lo(len_, r, n), hi = slice_lo(len_, r + 1, n);
    T* local = reinterpret_cast<T*>(out_ + (pos_ + lo) * elt_);
    for (int p = 0; p < n; ++p) in[p] = p == r ? local : reinterpret_cast<const T*>(g_->slot(p, set) + lo * elt_);
    reduce<T>(local, reinterpret_cast<T*>(g_->slot(r, set) + lo * elt_), in, n, hi - lo, op_, stream_);
  } else {
    for (int p = 0; p < n; ++p)
      in[p] = p == r ? reinterpret_cast<const T*>(in_ + (r * count_ + pos_) * elt_)
                     : reinterpret_cast<const T*>(g_->slot(p, set) + r * len_ * elt_);
    reduce<T>(reinterpret_cast<T*>(out_ + pos_ * elt_), nullptr, in, n, len_, op_, stream_);
  }
}

void Op::finish_round() {
  ++steps_;
  pos_ += len_;
  ++g_->rounds_;
  phase_ = 0;
}

bool Op::advance() {
  const int n = g_->size_, r = g_->rank_;
  if (kind_ == Kind::AllToAll) {
    for (;;) {
      if (phase_ == 0 && start_all_to_all_round()) return true;
      if (!g_->all_arrived(target_)) return false;
      finish_all_to_all_round();
    }
  }
  for (;;) {
    if (phase_ == 0 && start_round()) return true;
    if (!g_->all_arrived(target_)) return false;
    const int set = static_cast<int>(g_->rounds_ % 2);
    if (phase_ == 1 && kind_ == Kind::AllReduce) {
      dispatch(dtype_, [&](auto tag) { reduce_slice<decltype(tag)>(); });
      target_ = ++g_->arrivals_;
      g_->arrive(target_);
      phase_ = 2;
      ++steps_;
      continue;
    }
    if (phase_ == 1 && kind_ == Kind::ReduceScatter) {
      dispatch(dtype_, [&](auto tag) { reduce_slice<decltype(tag)>(); });
    } else if (phase_ == 1) {  // all_gather: the others' pieces
      for (int p = 0; p < n; ++p)
        if (p != r) copy_out(out_ + (p * count_ + pos_) * elt_, g_->slot(p, set), len_ * elt_, stream_);
    } else {  // all_reduce, after the reduce: the others' reduced slices
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        const int64_t lo = slice_lo(len_, p, n), hi = slice_lo(len_, p + 1, n);
        copy_out(out_ + (pos_ + lo) * elt_, g_->slot(p, set) + lo * elt_, (hi - lo) * elt_, stream_);
      }
    }
    if (stream_) stream_fence();
    finish_round();
  }
}

}  // namespace shardlm::comm::shm
