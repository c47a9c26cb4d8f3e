// MPI implementation of Communicator. Each operation is started with a non-blocking MPI call and
// completed by polling MPI_Test against a deadline: MPI itself has no timeouts, and a rank blocked
// in a collective on a dead or stuck peer would otherwise wait forever. On timeout the waiting
// rank asks every peer (on a duplicated control communicator) whether it is stuck in the same
// operation; those that do not answer are named as the missing ranks. Debian's OpenMPI cannot read
// GPU memory, so CUDA tensors are staged through pinned host copies (comm/staging.h).
// all_reduce, reduce_scatter, all_gather and all_to_all of CPU tensors among ranks of one machine
// run through a shared-memory segment instead (comm/shm_group.h: several times OpenMPI's bandwidth
// there), advanced by the same polling wait, so they keep the deadline and the report of missing
// ranks.
#include "comm/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <deque>
#include <set>
#include <thread>

#include "comm/all_to_all.h"
#include "comm/flight_recorder.h"
#include "comm/shm_group.h"
#include "comm/staging.h"
#include "comm/stuck_ranks.h"
#include "comm/timeout_report.h"
#include "util/error.h"

namespace shardlm::comm {
namespace {
// More ranks on this node than cores (set by mpi_init): a waiting rank yields its core at once.
bool g_oversubscribed = false;
int g_node_ranks = 1;
}  // namespace

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutTag = 7001;

// bf16/fp16 reductions: MPI has no such types, so the data travels as 16-bit words and these
// user-defined ops reduce them by widening to float.
template <typename T, typename F>
void reduce16(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
void bf16_sum(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::BFloat16>(in, io, n, [](float a, float b) { return a + b; }); }
void bf16_max(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::BFloat16>(in, io, n, [](float a, float b) { return a > b ? a : b; }); }
void bf16_min(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::BFloat16>(in, io, n, [](float a, float b) { return a < b ? a : b; }); }
void f16_sum(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::Half>(in, io, n, [](float a, float b) { return a + b; }); }
void f16_max(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::Half>(in, io, n, [](float a, float b) { return a > b ? a : b; }); }
void f16_min(void* in, void* io, int* n, MPI_Datatype*) { reduce16<c10::Half>(in, io, n, [](float a, float b) { return a < b ? a : b; }); }

struct Ops16 {
  MPI_Op bf16[3];
  MPI_Op f16[3];
};
Ops16& ops16() {
  static Ops16 ops = [] {
    Ops16 o{};
    MPI_Op_create(&bf16_sum, 1, &o.bf16[0]);
    MPI_Op_create(&bf16_max, 1, &o.bf16[1]);
    MPI_Op_create(&bf16_min, 1, &o.bf16[2]);
    MPI_Op_create(&f16_sum, 1, &o.f16[0]);
    MPI_Op_create(&f16_max, 1, &o.f16[1]);
    MPI_Op_create(&f16_min, 1, &o.f16[2]);
    return o;
  }();
  return ops;
}

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kChar: return MPI_INT8_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;
    default: fail("communicator: unsupported dtype ", t.scalar_type());
  }
}

MPI_Op mpi_op(const at::Tensor& t, ReduceOp op) {
  const int i = static_cast<int>(op);
  if (t.scalar_type() == at::kBFloat16) return ops16().bf16[i];
  if (t.scalar_type() == at::kHalf) return ops16().f16[i];
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

int checked_count(const at::Tensor& t, const char* op) {
  if (!t.is_contiguous()) fail("communicator: ", op, " needs a contiguous tensor");
  if (!t.device().is_cpu() && !t.device().is_cuda())
    fail("communicator: the MPI backend takes CPU or CUDA tensors, got ", t.device());
  if (t.numel() > INT_MAX) fail("communicator: ", op, " of ", t.numel(), " elements exceeds MPI's int count; split it");
  return static_cast<int>(t.numel());
}

class MpiCommunicator;

// Progress of every communicator's shared-memory operations (whichever operation a rank waits
// for, as OpenMPI's progress engine advances all its requests in any MPI call).
void progress_all_shm();

// An operation completed by polling: wait() polls test() against the communicator's deadline.
class PolledWork : public Work {
 public:
  PolledWork(MpiCommunicator* comm, std::string op, std::string detail, int64_t bytes, int64_t seq, int peer,
             std::vector<at::Tensor> keep_alive, Staging staging)
      : comm_(comm), op_(std::move(op)), detail_(std::move(detail)), bytes_(bytes), seq_(seq), peer_(peer),
        keep_alive_(std::move(keep_alive)), staging_(std::move(staging)) {}
  bool test() override;
  void wait() override;
  void set_flight(int64_t handle) { flight_ = handle; }

 protected:
  // One non-blocking attempt to make progress; true once the operation is complete.
  virtual bool poll() = 0;
  MpiCommunicator* comm_;

 private:
  std::string op_, detail_;
  int64_t bytes_, seq_;
  int peer_;  // for send/recv: the rank waited on; -1 for collectives
  std::vector<at::Tensor> keep_alive_;
  Staging staging_;
  bool done_ = false;
  int64_t flight_ = -1;  // the flight recorder's entry
  Clock::time_point launched_ = Clock::now();
};

class MpiWork : public PolledWork {
 public:
  using PolledWork::PolledWork;
  MPI_Request* request() { return &req_; }

 private:
  bool poll() override {
    progress_all_shm();
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
};

// A shared-memory collective; its communicator advances it (in launch order) in progress_shm().
class ShmWork : public PolledWork {
 public:
  ShmWork(MpiCommunicator* comm, std::string op, std::string detail, int64_t bytes, int64_t seq,
          std::vector<at::Tensor> keep_alive, shm::Op shm_op)
      : PolledWork(comm, std::move(op), std::move(detail), bytes, seq, -1, std::move(keep_alive), Staging(at::kCPU)),
        op_(shm_op) {}
  shm::Op& op() { return op_; }
  void mark_complete() { complete_ = true; }

 private:
  bool poll() override;
  shm::Op op_;
  bool complete_ = false;
  int polls_ = 0;
};

class MpiCommunicator : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_dup(comm_, &control_);
    MPI_Group group, world_group;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> local(size_);
    for (int i = 0; i < size_; ++i) local[i] = i;
    world_ranks_.resize(size_);
    MPI_Group_translate_ranks(group, size_, local.data(), world_group, world_ranks_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    flight_.comm_name = name_;
    flight_.rank = rank_;
    flight_.size = size_;
    flight_.world_ranks = world_ranks_;
  }
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  WorkPtr all_reduce_async(const at::Tensor& t, ReduceOp op) override {
    const int n = checked_count(t, "all_reduce");
    if (auto* g = shm_for(t)) return start_shm(g, shm::Kind::AllReduce, "all_reduce", t, op, t.data_ptr(), t, t.numel());
    Staging staging(at::kCPU);
    const auto h = staging.stage(t, Flow::InOut);
    auto w = start("all_reduce", t, -1, {t}, std::move(staging));
    MPI_Iallreduce(MPI_IN_PLACE, h.data_ptr(), n, mpi_type(t), mpi_op(t, op), comm_, w->request());
    return w;
  }
  WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, ReduceOp op) override {
    const int n = checked_count(out, "reduce_scatter");
    checked_count(in, "reduce_scatter");
    if (in.numel() != out.numel() * size_ || in.scalar_type() != out.scalar_type())
      fail("reduce_scatter: input has ", in.numel(), " elements, output ", out.numel(), "; need input = ", size_,
           " x output and equal dtypes");
    if (auto* g = shm_for(in))
      return start_shm(g, shm::Kind::ReduceScatter, "reduce_scatter", in, op, in.data_ptr(), out, out.numel());
    Staging staging(at::kCPU);
    const auto hin = staging.stage(in, Flow::In), hout = staging.stage(out, Flow::Out);
    auto w = start("reduce_scatter", in, -1, {in, out}, std::move(staging));
    MPI_Ireduce_scatter_block(hin.data_ptr(), hout.data_ptr(), n, mpi_type(in), mpi_op(in, op), comm_, w->request());
    return w;
  }
  WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    const int n = checked_count(in, "all_gather");
    checked_count(out, "all_gather");
    if (out.numel() != in.numel() * size_ || in.scalar_type() != out.scalar_type())
      fail("all_gather: input has ", in.numel(), " elements, output ", out.numel(), "; need output = ", size_,
           " x input and equal dtypes");
    if (auto* g = shm_for(in))
      return start_shm(g, shm::Kind::AllGather, "all_gather", in, ReduceOp::Sum, in.data_ptr(), out, in.numel());
    Staging staging(at::kCPU);
    const auto hin = staging.stage(in, Flow::In), hout = staging.stage(out, Flow::Out);
    auto w = start("all_gather", in, -1, {in, out}, std::move(staging));
    // MPI may not read the input from inside its output: this rank's own chunk is MPI_IN_PLACE.
    const bool in_place = hin.data_ptr() == static_cast<char*>(hout.data_ptr()) + rank_ * hin.nbytes();
    MPI_Iallgather(in_place ? MPI_IN_PLACE : hin.data_ptr(), n, mpi_type(in), hout.data_ptr(), n, mpi_type(out), comm_,
                   w->request());
    return w;
  }
  WorkPtr broadcast_async(const at::Tensor& t, int root) override {
    const int n = checked_count(t, "broadcast");
    Staging staging(at::kCPU);
    const auto h = staging.stage(t, root == rank_ ? Flow::In : Flow::Out);
    auto w = start("broadcast", t, root == rank_ ? -1 : root, {t}, std::move(staging));
    MPI_Ibcast(h.data_ptr(), n, mpi_type(t), root, comm_, w->request());
    return w;
  }
  WorkPtr send_async(const at::Tensor& t, int dst, int tag) override {
    const int n = checked_count(t, "send");
    Staging staging(at::kCPU);
    const auto h = staging.stage(t, Flow::In);
    auto w = start("send", t, dst, {t}, std::move(staging));
    MPI_Isend(h.data_ptr(), n, mpi_type(t), dst, tag, comm_, w->request());
    return w;
  }
  WorkPtr recv_async(const at::Tensor& t, int src, int tag) override {
    const int n = checked_count(t, "recv");
    Staging staging(at::kCPU);
    const auto h = staging.stage(t, Flow::Out);
    auto w = start("recv", t, src, {t}, std::move(staging));
    MPI_Irecv(h.data_ptr(), n, mpi_type(t), src, tag, comm_, w->request());
    return w;
  }
  WorkPtr barrier_async() override {
    auto w = std::make_shared<MpiWork>(this, "barrier", "", 0, ++seq_, -1, std::vector<at::Tensor>{}, Staging(at::kCPU));
    w->set_flight(flight_recorder().begin(flight_, seq_, "barrier", nullptr, -1));
    stats_["barrier"].calls++;
    MPI_Ibarrier(comm_, w->request());
    return w;
  }
  // Through the shared-memory group where it serves (sub-slots per destination, shm_group.h), else
  // MPI_Ialltoallv in elements; its count and displacement arrays live in the handle until
  // completion, as a non-blocking call needs.
  WorkPtr all_to_all_async(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& recv_counts) override {
    const auto s = check_all_to_all(name_, rank_, size_, in, out, send_counts, recv_counts);
    checked_count(in, "all_to_all");
    checked_count(out, "all_to_all");  // every count and offset is below the total, so fits an int too
    const std::string detail =
        ", sending " + counts_text(send_counts) + " rows, receiving " + counts_text(recv_counts) + " rows";
    if (auto* g = shm_for(in)) {
      const int64_t e = in.element_size();
      shm::AllToAllBytes b;
      for (int p = 0; p < size_; ++p) {
        b.send_bytes.push_back(s.send_elements[p] * e);
        b.send_offsets.push_back(s.send_offsets[p] * e);
        b.recv_bytes.push_back(s.recv_elements[p] * e);
        b.recv_offsets.push_back(s.recv_offsets[p] * e);
      }
      return launch_shm("all_to_all", in, out, shm::Op(g, in.scalar_type(), in.data_ptr(), out.data_ptr(), std::move(b)),
                        detail);
    }
    auto arrays = at::empty({4, size_}, at::kInt);  // send counts, send displacements, recv counts, recv displacements
    auto* a = arrays.data_ptr<int>();
    for (int p = 0; p < size_; ++p) {
      a[p] = static_cast<int>(s.send_elements[p]);
      a[size_ + p] = static_cast<int>(s.send_offsets[p]);
      a[2 * size_ + p] = static_cast<int>(s.recv_elements[p]);
      a[3 * size_ + p] = static_cast<int>(s.recv_offsets[p]);
    }
    Staging staging(at::kCPU);
    const auto hin = staging.stage(in, Flow::In), hout = staging.stage(out, Flow::Out);
    auto w = start("all_to_all", in, -1, {in, out, arrays}, std::move(staging), detail);
    MPI_Ialltoallv(hin.data_ptr(), a, a + size_, mpi_type(in), hout.data_ptr(), a + 2 * size_, a + 3 * size_,
                   mpi_type(out), comm_, w->request());
    return w;
  }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    // MPI_Comm_split blocks with no deadline; meeting in a timed barrier first means a rank that
    // never arrives is reported like any other missing peer instead of hanging the job.
    barrier();
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    auto c = std::make_shared<MpiCommunicator>(sub, name);
    c->set_timeout_seconds(timeout_s_);
    return c;
  }

  // Advances this communicator's shared-memory operations, oldest first, as far as the peers allow.
  void progress_shm() {
    while (!shm_queue_.empty() && shm_queue_.front()->op().advance()) {
      shm_queue_.front()->mark_complete();
      shm_queue_.pop_front();
    }
  }
  MPI_Comm mpi_comm() const { return comm_; }

  void add_wait_time(const std::string& op, double s) { stats_[op].wait_seconds += s; }
  void add_inflight_time(const std::string& op, double s) { stats_[op].inflight_seconds += s; }

  // Never returns: names the operation and the ranks that did not arrive, then exits non-zero.
  // Every rank's flight recorder is asked to dump first, so that they write while we listen.
  [[noreturn]] void timeout_exit(const std::string& op, const std::string& detail, int64_t seq, int peer,
                                 double waited, int64_t flight) {
    auto& recorder = flight_recorder();
    recorder.fail(flight);
    recorder.request_dumps();
    recorder.dump(flight_timeout_reason(op, seq, name_));
    const std::set<int> heard = peer < 0 ? hear_stuck_peers(seq) : std::set<int>{};
    const PeerSplit peers = split_peers(rank_, size_, peer, heard);
    std::vector<int> missing;
    for (int p : peers.missing) missing.push_back(world_ranks_[p]);
    recorder.dump(flight_timeout_reason(op, seq, name_, &missing));  // now naming whom it waited for
    write_failure(timeout_message({rank_, name_, world_ranks_, op, detail, waited, seq, peers}));
    std::_Exit(kCommFailureExitCode);
  }

 private:
  // Tells every peer we are stuck in op #seq, and listens for the same from them for a short grace
  // period: whoever stays silent is the rank this collective is waiting for.
  std::set<int> hear_stuck_peers(int64_t seq) {
    std::set<int> heard;
    static int64_t msg[2];  // static: sends may still be pending when the process exits
    msg[0] = seq;
    msg[1] = rank_;
    std::vector<MPI_Request> sends(size_, MPI_REQUEST_NULL);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) MPI_Isend(msg, 2, MPI_INT64_T, p, kTimeoutTag, control_, &sends[p]);
    const auto until = Clock::now() + std::chrono::duration<double>(stuck_grace_seconds(timeout_s_));
    while (Clock::now() < until && static_cast<int>(heard.size()) < size_ - 1) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kTimeoutTag, control_, &flag, &st);
      if (flag) {
        int64_t in[2];
        MPI_Recv(in, 2, MPI_INT64_T, st.MPI_SOURCE, kTimeoutTag, control_, MPI_STATUS_IGNORE);
        heard.insert(st.MPI_SOURCE);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return heard;
  }

  // extra: appended to the operation's detail in a timeout message.
  std::shared_ptr<MpiWork> start(const char* op, const at::Tensor& t, int peer, std::vector<at::Tensor> keep,
                                 Staging staging, const std::string& extra = "") {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto& s = stats_[op];
    s.calls++;
    s.bytes += bytes;
    auto w = std::make_shared<MpiWork>(this, op, operation_detail(op, t, peer) + extra, bytes, ++seq_, peer, std::move(keep),
                                       std::move(staging));
    w->set_flight(flight_recorder().begin(flight_, seq_, op, &t, peer));
    return w;
  }

  // The shared-memory group for a collective on t, or nullptr when OpenMPI serves it: t not in CPU
  // memory, an element type without a kernel, a single rank, ranks on several machines, or
  // SHARDLM_COMM_SHM=0. Created (collectively) by the first collective that qualifies.
  shm::Group* shm_for(const at::Tensor& t) {
    if (size_ < 2 || !t.device().is_cpu() || !shm::Group::supports(t.scalar_type()) || !shm::Group::enabled())
      return nullptr;
    if (!shm_tried_) {
      shm_tried_ = true;
      shm_ = shm::Group::create(&comm_, rank_, size_, [this] { barrier(); });
      if (shm_) shm_comms().push_back(this);
    }
    return shm_.get();
  }
  WorkPtr start_shm(shm::Group* g, shm::Kind kind, const char* op_name, const at::Tensor& in, ReduceOp op,
                    const void* src, const at::Tensor& out, int64_t count) {
    return launch_shm(op_name, in, out, shm::Op(g, kind, in.scalar_type(), op, src, out.data_ptr(), count));
  }
  // extra: appended to the operation's detail in a timeout message.
  WorkPtr launch_shm(const char* op_name, const at::Tensor& in, const at::Tensor& out, shm::Op shm_op,
                     const std::string& extra = "") {
    const int64_t bytes = in.numel() * static_cast<int64_t>(in.element_size());
    auto& s = stats_[op_name];
    s.calls++;
    s.bytes += bytes;
    auto w = std::make_shared<ShmWork>(this, op_name, operation_detail(op_name, in, -1) + extra, bytes, ++seq_,
                                       std::vector<at::Tensor>{in, out}, std::move(shm_op));
    w->set_flight(flight_recorder().begin(flight_, seq_, op_name, &in, -1));
    shm_queue_.push_back(w);
    progress_shm();  // the copy-in of the first round starts now
    return w;
  }

 public:
  // Communicators with a shared-memory group, for progress_all_shm().
  static std::vector<MpiCommunicator*>& shm_comms() {
    static auto* comms = new std::vector<MpiCommunicator*>;  // never destroyed: communicators may outlive statics
    return *comms;
  }

 private:
  std::unique_ptr<shm::Group> shm_;
  bool shm_tried_ = false;
  std::deque<std::shared_ptr<ShmWork>> shm_queue_;
  MPI_Comm comm_;
  MPI_Comm control_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int64_t seq_ = 0;
  std::vector<int> world_ranks_;
  FlightChannel flight_;
};

MpiCommunicator::~MpiCommunicator() {
  auto& comms = shm_comms();
  for (size_t i = 0; i < comms.size(); ++i)
    if (comms[i] == this) comms.erase(comms.begin() + static_cast<std::ptrdiff_t>(i));
}

void progress_all_shm() {
  for (auto* c : MpiCommunicator::shm_comms()) c->progress_shm();
}

bool ShmWork::poll() {
  progress_all_shm();
  // While a rank waits here it makes no MPI call; let OpenMPI move this rank's other requests
  // (a pipeline send a peer waits for before it reaches this collective) now and then.
  if (!complete_ && ++polls_ % 64 == 0) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_->mpi_comm(), &flag, MPI_STATUS_IGNORE);
  }
  return complete_;
}

bool PolledWork::test() {
  if (done_) return true;
  if (poll()) {
    done_ = true;
    staging_.finish();
    keep_alive_.clear();
    flight_recorder().complete(flight_);
    comm_->add_inflight_time(op_, std::chrono::duration<double>(Clock::now() - launched_).count());
  }
  return done_;
}

void PolledWork::wait() {
  if (done_) return;
  const auto t0 = Clock::now();
  const double limit = comm_->timeout_seconds();
  int64_t spins = 0;
  auto idle_since = t0;
  uint64_t steps_seen = shm::Op::steps_taken();
  while (!test()) {
    ++spins;
    const auto now = Clock::now();
    const double waited = std::chrono::duration<double>(now - t0).count();
    if (waited > limit) comm_->timeout_exit(op_, detail_, seq_, peer_, waited, flight_);
    // A shared-memory collective moved on (the peers are here): back to spinning, or every later
    // round of a long message would pay a sleep.
    if (shm::Op::steps_taken() != steps_seen) {
      steps_seen = shm::Op::steps_taken();
      spins = 0;
      idle_since = now;
    }
    // Spin briefly (low latency), then yield, then sleep: with more ranks than cores a spinning
    // rank would steal the core its peer needs to reach the collective, so there it yields at once.
    if (spins > (g_oversubscribed ? 0 : 2000)) {
      if (std::chrono::duration<double>(now - idle_since).count() > 0.005)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else sched_yield();
    }
  }
  comm_->add_wait_time(op_, std::chrono::duration<double>(Clock::now() - t0).count());
}

bool g_we_initialized = false;

}  // namespace

void mpi_init(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  // SERIALIZED, not FUNNELED: on a GPU the autograd engine runs backward (and the gradient hooks that
  // launch reductions) on its device thread while the main thread waits in backward().
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED)
    fail("this MPI library provides thread level ", provided, " but shardlm needs MPI_THREAD_SERIALIZED (",
         MPI_THREAD_SERIALIZED, "): backward's gradient hooks start reductions from the autograd thread");
  g_we_initialized = true;
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_ranks = 1;
  MPI_Comm_size(node, &node_ranks);
  MPI_Comm_free(&node);
  g_node_ranks = node_ranks;
  g_oversubscribed = node_ranks > static_cast<int>(std::thread::hardware_concurrency());
}

bool node_oversubscribed() { return g_oversubscribed; }

int node_ranks() { return g_node_ranks; }

bool mpi_initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  return inited != 0;
}

void mpi_finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !finalized) MPI_Finalize();
}

CommPtr mpi_world() {
  if (!mpi_initialized()) fail("mpi_world() called before mpi_init()");
  static CommPtr world = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, "world");
  return world;
}

}  // namespace shardlm::comm
