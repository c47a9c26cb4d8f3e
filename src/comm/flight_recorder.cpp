// See flight_recorder.h.
#include "comm/flight_recorder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <c10/core/ScalarType.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace shardlm::comm {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

thread_local std::vector<const std::string*> t_context;

std::atomic<bool> g_dump_signalled{false};
// The request file's modification time when this process wrote it: its watcher leaves that request
// to the others (it dumped with its own, more telling reason already).
std::atomic<int64_t> g_own_request_mtime{-1};

int64_t mtime_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void on_usr2(int) { g_dump_signalled.store(true); }

void on_fatal(int sig) {
  // Best effort: the recorder's lock is only tried (the signal may have interrupted a holder), and
  // the handler then re-raises with the default action (SA_RESETHAND), so the exit status and any
  // core dump stay what they would have been.
  FlightRecorder::instance().dump(std::string("fatal signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")");
  std::raise(sig);
}

const char* request_file_name() { return "dump_request"; }

}  // namespace

FlightRecorder& FlightRecorder::instance() {
  static auto* recorder = new FlightRecorder;  // never destroyed: signal handlers and threads may outlive statics
  return *recorder;
}

const char* FlightRecorder::state_name(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::State::Started: return "started";
    case FlightEntry::State::Completed: return "completed";
    case FlightEntry::State::Failed: return "failed";
  }
  return "?";
}

void FlightRecorder::configure(size_t capacity, const std::string& dump_dir, int world_rank, int world_size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = capacity;
    ring_.clear();
    ring_.reserve(capacity);
    next_ = 0;
    dump_dir_ = dump_dir;
    world_rank_ = world_rank;
    world_size_ = world_size;
  }
  if (dump_dir.empty() || capacity == 0) return;
  std::error_code ec;
  // A dump of an earlier run in this directory is kept as rank<R>.previous.json, so that the files
  // `shardlm diagnose` reads all belong to this run.
  const std::string mine = dump_dir + "/rank" + std::to_string(world_rank) + ".json";
  if (std::filesystem::exists(mine, ec))
    std::filesystem::rename(mine, dump_dir + "/rank" + std::to_string(world_rank) + ".previous.json", ec);
  start_watcher();
}

void FlightRecorder::start_watcher() {
  if (watcher_started_) return;
  watcher_started_ = true;
  struct sigaction fatal {};
  fatal.sa_handler = on_fatal;
  fatal.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &fatal, nullptr);
  struct sigaction usr2 {};
  usr2.sa_handler = on_usr2;
  usr2.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &usr2, nullptr);
  // Dumps when asked: a request file (a timed-out peer or a user) or SIGUSR2. Each request is
  // answered once; a newer request file (later modification time) is answered again.
  auto request_mtime = [](const std::string& dir) { return mtime_of(dir + "/" + request_file_name()); };
  // A request left by an earlier run counts as answered.
  std::thread([this, request_mtime, answered_mtime = request_mtime(dump_dir_)]() mutable {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::string dir;
      {
        std::lock_guard<std::mutex> lock(mu_);
        dir = dump_dir_;
      }
      if (dir.empty()) continue;
      if (g_dump_signalled.exchange(false)) dump("SIGUSR2");
      const int64_t mtime = request_mtime(dir);
      if (mtime < 0 || mtime == answered_mtime || mtime == g_own_request_mtime.load()) continue;
      answered_mtime = mtime;
      dump("requested (" + dir + "/" + request_file_name() + ")");
    }
  }).detach();
}

int64_t FlightRecorder::begin(FlightChannel& ch, int64_t seq, const std::string& op, const at::Tensor* t, int peer) {
  if (capacity_ == 0) return -1;
  FlightEntry e;
  e.comm_name = ch.comm_name;
  e.comm_rank = ch.rank;
  e.comm_size = ch.size;
  e.world_ranks = ch.world_ranks;
  e.seq = seq;
  e.op = op;
  e.peer = peer;
  if (t && t->defined()) {
    e.dtype = c10::toString(t->scalar_type());
    e.numel = t->numel();
  }
  e.context = FlightContext::current();
  e.t_start = now_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  const bool p2p = op == "send" || op == "recv";
  if (p2p && peer >= 0) {
    auto& counts = op == "send" ? ch.sends : ch.recvs;
    if (counts.size() < static_cast<size_t>(ch.size)) counts.resize(ch.size, 0);
    e.match_seq = ++counts[peer];
  } else {
    e.match_seq = ++ch.collectives;
  }
  const int64_t handle = next_++;
  const size_t slot = static_cast<size_t>(handle % static_cast<int64_t>(capacity_));
  if (slot < ring_.size()) ring_[slot] = std::move(e);
  else ring_.push_back(std::move(e));
  return handle;
}

namespace {
FlightEntry* live_entry(std::vector<FlightEntry>& ring, int64_t handle, int64_t next, size_t capacity) {
  if (handle < 0 || capacity == 0 || handle < next - static_cast<int64_t>(capacity)) return nullptr;  // overwritten
  return &ring[static_cast<size_t>(handle % static_cast<int64_t>(capacity))];
}
}  // namespace

void FlightRecorder::complete(int64_t handle) { finish(handle, FlightEntry::State::Completed); }

void FlightRecorder::fail(int64_t handle) { finish(handle, FlightEntry::State::Failed); }

void FlightRecorder::finish(int64_t handle, FlightEntry::State state) {
  if (handle < 0) return;
  const double t = now_seconds();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto* e = live_entry(ring_, handle, next_, capacity_)) {
    e->state = state;
    e->t_end = t;
  }
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  const int64_t first = std::max<int64_t>(0, next_ - static_cast<int64_t>(capacity_));
  for (int64_t h = first; h < next_; ++h) out.push_back(ring_[static_cast<size_t>(h % static_cast<int64_t>(capacity_))]);
  return out;
}

nlohmann::json FlightRecorder::to_json(const std::string& reason) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : snapshot())
    entries.push_back({{"comm", e.comm_name},       {"comm_rank", e.comm_rank}, {"comm_size", e.comm_size},
                       {"world_ranks", e.world_ranks}, {"seq", e.seq},          {"match_seq", e.match_seq},
                       {"op", e.op},                 {"dtype", e.dtype},        {"numel", e.numel},
                       {"peer", e.peer},             {"context", e.context},    {"t_start", e.t_start},
                       {"t_end", e.t_end},           {"state", state_name(e.state)}});
  return {{"format", "shardlm flight recorder 1"},
          {"world_rank", world_rank_},
          {"world_size", world_size_},
          {"reason", reason},
          {"pid", static_cast<int64_t>(getpid())},
          {"time", now_seconds()},
          {"capacity", capacity_},
          {"recorded", next_},
          {"entries", entries}};
}

bool FlightRecorder::dump(const std::string& reason) const {
  try {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || dump_dir_.empty() || capacity_ == 0) return false;
    const std::string dir = dump_dir_;
    const int rank = world_rank_;
    lock.unlock();
    const auto text = to_json(reason).dump(1);
    // Only into a run directory that exists: a run refused before it made one (bad data, a plan that
    // does not fit) leaves nothing behind. The flight_recorder/ folder itself is made here.
    std::error_code ec;
    const auto parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) return false;
    std::filesystem::create_directories(dir, ec);
    const std::string path = dir + "/rank" + std::to_string(rank) + ".json";
    const std::string tmp = path + ".tmp" + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text << "\n";
      if (!out.flush()) return false;
    }
    return std::rename(tmp.c_str(), path.c_str()) == 0;
  } catch (...) {
    return false;
  }
}

void FlightRecorder::request_dumps() const {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = dump_dir_;
  }
  if (dir.empty()) return;
  std::error_code ec;
  const auto parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) return;  // as in dump()
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/" + request_file_name();
  std::ofstream(path, std::ios::trunc) << "dump\n";
  g_own_request_mtime.store(mtime_of(path));
}

int64_t FlightRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

void FlightRecorder::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ring_.clear();
  next_ = 0;
}

std::string flight_timeout_reason(const std::string& op, int64_t seq, const std::string& comm_name,
                                  const std::vector<int>* missing) {
  std::string r = "timeout in " + op + " #" + std::to_string(seq) + " on communicator '" + comm_name + "'";
  if (missing && !missing->empty()) {
    r += "; waiting for world rank(s)";
    for (size_t i = 0; i < missing->size(); ++i) r += (i ? ", " : " ") + std::to_string((*missing)[i]);
  }
  return r;
}

FlightContext::FlightContext(std::string label) { t_context.push_back(new std::string(std::move(label))); }

FlightContext::~FlightContext() {
  delete t_context.back();
  t_context.pop_back();
}

std::string FlightContext::current() {
  std::string out;
  for (const auto* s : t_context) {
    if (!out.empty()) out += " / ";
    out += *s;
  }
  return out;
}

}  // namespace shardlm::comm
