// See flight_recorder.h. The ring's writers and the dumps that may allocate (a timeout, a request,
// SIGUSR2, an error) live here; the fatal-signal dump is flight_signal_dump.cpp.
#include "comm/flight_recorder.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <c10/core/ScalarType.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/flight_signal_dump.h"

namespace shardlm::comm {
namespace {

int64_t now_ns() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double now_seconds() { return static_cast<double>(now_ns()) * 1e-9; }

// The phase labels of this thread, outermost first (FlightContext).
thread_local std::vector<std::string> t_context;

// The request file's modification time when this process wrote it: its watcher leaves that request
// to the others (it dumped with its own, more telling reason already).
std::atomic<int64_t> g_own_request_mtime{-1};

int64_t mtime_of(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

const char* request_file_name() { return "dump_request"; }

// Copies src into dst[size] with its '\0', cut at a UTF-8 character boundary when it does not fit.
void copy_text(char* dst, size_t size, const char* src) {
  size_t n = 0;
  while (n + 1 < size && src[n]) ++n;
  if (src[n] && n > 0)  // cut: do not end inside a multi-byte character
    while (n > 0 && (static_cast<unsigned char>(src[n]) & 0xC0) == 0x80) --n;
  std::memcpy(dst, src, n);
  dst[n] = '\0';
}

// Sequence-lock writes of one slot (the reader is the fatal-signal dump; writers hold mu_).
void open_slot(FlightSlot& s) {
  s.version.store(s.version.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}
void close_slot(FlightSlot& s) { s.version.store(s.version.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

}  // namespace

FlightRecorder::FlightRecorder() : slots_(new FlightSlot[kFlightRecorderEntries]), capacity_(kFlightRecorderEntries) {}

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
    slots_.reset(capacity > 0 ? new FlightSlot[capacity] : nullptr);
    capacity_.store(capacity);
    next_.store(0);
    dump_dir_ = capacity > 0 ? dump_dir : "";
    world_rank_ = world_rank;
    world_size_ = world_size;
  }
  flight_signal::set_paths(dump_dir_, world_rank);
  if (dump_dir_.empty()) return;
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
  flight_signal::install_handlers(this);
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
      if (flight_signal::take_usr2()) dump("SIGUSR2");
      const int64_t mtime = request_mtime(dir);
      if (mtime < 0 || mtime == answered_mtime || mtime == g_own_request_mtime.load()) continue;
      answered_mtime = mtime;
      dump("requested (" + dir + "/" + request_file_name() + ")");
    }
  }).detach();
}

const FlightChannelInfo* FlightRecorder::channel_info(FlightChannel& ch) {
  if (ch.info) return ch.info;
  // Kept for the life of the process: slots and a signal handler point at them.
  static auto* kept = new std::vector<std::unique_ptr<FlightChannelInfo>>;
  auto info = std::make_unique<FlightChannelInfo>();
  info->comm_name = ch.comm_name;
  info->rank = ch.rank;
  info->size = ch.size;
  info->world_ranks = ch.world_ranks;
  const nlohmann::json fields = {{"comm", ch.comm_name}, {"comm_rank", ch.rank}, {"comm_size", ch.size},
                                 {"world_ranks", ch.world_ranks}};
  const std::string text = fields.dump();  // {"comm":...,"world_ranks":[...]} in key order
  info->json_fields = text.substr(1, text.size() - 2);
  kept->push_back(std::move(info));
  return ch.info = kept->back().get();
}

int64_t FlightRecorder::begin(FlightChannel& ch, int64_t seq, const char* op, const at::Tensor* t, int peer) {
  const size_t capacity = capacity_.load(std::memory_order_relaxed);
  if (capacity == 0) return -1;
  const int64_t t_start = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  const bool send = std::strcmp(op, "send") == 0;
  int64_t match_seq;
  if ((send || std::strcmp(op, "recv") == 0) && peer >= 0) {
    auto& counts = send ? ch.sends : ch.recvs;
    if (counts.size() < static_cast<size_t>(ch.size)) counts.resize(ch.size, 0);
    match_seq = ++counts[peer];
  } else {
    match_seq = ++ch.collectives;
  }
  const int64_t handle = next_.load(std::memory_order_relaxed);
  FlightSlot& e = slots_[static_cast<size_t>(handle % static_cast<int64_t>(capacity))];
  open_slot(e);
  e.handle = handle;
  e.channel = channel_info(ch);
  e.seq = seq;
  e.match_seq = match_seq;
  e.peer = peer;
  e.state = static_cast<int32_t>(FlightEntry::State::Started);
  e.t_start_ns = t_start;
  e.t_end_ns = 0;
  copy_text(e.op, sizeof e.op, op);
  const bool tensor = t && t->defined();
  copy_text(e.dtype, sizeof e.dtype, tensor ? c10::toString(t->scalar_type()) : "");
  e.numel = tensor ? t->numel() : 0;
  FlightContext::current_into(e.context, sizeof e.context);
  close_slot(e);
  next_.store(handle + 1, std::memory_order_release);
  return handle;
}

void FlightRecorder::complete(int64_t handle) { finish(handle, FlightEntry::State::Completed); }

void FlightRecorder::fail(int64_t handle) { finish(handle, FlightEntry::State::Failed); }

void FlightRecorder::finish(int64_t handle, FlightEntry::State state) {
  if (handle < 0) return;
  const int64_t t = now_ns();
  std::lock_guard<std::mutex> lock(mu_);
  const size_t capacity = capacity_.load(std::memory_order_relaxed);
  if (capacity == 0) return;
  FlightSlot& e = slots_[static_cast<size_t>(handle % static_cast<int64_t>(capacity))];
  if (e.handle != handle) return;  // overwritten by a later operation
  open_slot(e);
  e.state = static_cast<int32_t>(state);
  e.t_end_ns = t;
  close_slot(e);
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  const auto capacity = static_cast<int64_t>(capacity_.load());
  const int64_t next = next_.load();
  for (int64_t h = std::max<int64_t>(0, next - capacity); h < next; ++h) {
    const FlightSlot& s = slots_[static_cast<size_t>(h % capacity)];
    FlightEntry e;
    if (s.channel) {
      e.comm_name = s.channel->comm_name;
      e.comm_rank = s.channel->rank;
      e.comm_size = s.channel->size;
      e.world_ranks = s.channel->world_ranks;
    }
    e.seq = s.seq;
    e.match_seq = s.match_seq;
    e.op = s.op;
    e.dtype = s.dtype;
    e.numel = s.numel;
    e.peer = s.peer;
    e.context = s.context;
    e.t_start = static_cast<double>(s.t_start_ns) * 1e-9;
    e.t_end = static_cast<double>(s.t_end_ns) * 1e-9;
    e.state = static_cast<FlightEntry::State>(s.state);
    out.push_back(std::move(e));
  }
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
          {"capacity", capacity_.load()},
          {"recorded", next_.load()},
          {"entries", entries}};
}

bool FlightRecorder::dump(const std::string& reason) const {
  try {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || dump_dir_.empty() || capacity_.load() == 0) return false;
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

void FlightRecorder::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t capacity = capacity_.load();
  for (size_t i = 0; i < capacity; ++i) {
    open_slot(slots_[i]);
    slots_[i].handle = -1;
    close_slot(slots_[i]);
  }
  next_.store(0);
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

FlightContext::FlightContext(std::string label) {
  if (flight_recorder().enabled()) push(std::move(label));
}

FlightContext::FlightContext(const char* label) {
  if (flight_recorder().enabled()) push(label);
}

void FlightContext::push(std::string label) {
  t_context.push_back(std::move(label));
  pushed_ = true;
}

FlightContext::~FlightContext() {
  if (pushed_) t_context.pop_back();
}

std::string FlightContext::current() {
  std::string out;
  for (const auto& s : t_context) {
    if (!out.empty()) out += " / ";
    out += s;
  }
  return out;
}

void FlightContext::current_into(char* buf, size_t size) {
  if (size == 0) return;
  size_t n = 0;
  bool first = true;
  for (const auto& s : t_context) {
    for (const char* part : {first ? "" : " / ", s.c_str()})
      for (const char* c = part; *c && n + 1 < size; ++c) buf[n++] = *c;
    first = false;
  }
  // A cut label must not end inside a multi-byte character (the dump is JSON, UTF-8).
  if (n + 1 == size && n > 0) {
    size_t lead = n - 1;
    while (lead > 0 && (static_cast<unsigned char>(buf[lead]) & 0xC0) == 0x80) --lead;
    const auto c = static_cast<unsigned char>(buf[lead]);
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (lead + len > n) n = lead;
  }
  buf[n] = '\0';
}

}  // namespace shardlm::comm
