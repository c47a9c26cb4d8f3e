// The flight recorder's record written from a fatal signal (see flight_signal_dump.h). Everything
// the handler touches was made beforehand: the file paths (set_paths), the output buffer (static),
// the alternate signal stack, and the ring's fixed-size slots with their preformatted communicator
// fields. The handler calls only functions signal-safety(7) lists (open, write, close, unlink,
// rename, mkdir, getpid, clock_gettime, raise), formats integers and strings by hand, uses only
// lock-free atomics, and reads the slots without a lock under their sequence lock.
// tests/unit/signal_safety checks that it allocates nothing, with malloc interposed.
#include "comm/flight_signal_dump.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "comm/flight_recorder.h"

namespace shardlm::comm {
namespace {

constexpr size_t kPathChars = 4096;
char g_dir[kPathChars], g_path[kPathChars], g_tmp[kPathChars];
std::atomic<bool> g_have_paths{false};
std::atomic<const FlightRecorder*> g_recorder{nullptr};
std::atomic<bool> g_usr2{false};
std::atomic<int> g_fatal_entered{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free &&
                  std::atomic<const FlightRecorder*>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free && std::atomic<size_t>::is_always_lock_free,
              "the signal handlers rely on lock-free atomics (async-signal-safe)");

// An alternate stack for the thread that configures the recorder (the main thread), so that its
// stack overflows still get a record.
alignas(16) char g_alt_stack[64 * 1024];

size_t length(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  return n;
}

// A buffered writer over a file descriptor: a static buffer (not the handler's stack), flushed
// with write(2). Used by one handler at a time (g_fatal_entered).
class Out {
 public:
  explicit Out(int fd) : fd_(fd) {}
  bool ok() const { return ok_; }
  void flush() {
    size_t done = 0;
    while (ok_ && done < n_) {
      const ssize_t w = write(fd_, buf_ + done, n_ - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) ok_ = false;
      else done += static_cast<size_t>(w);
    }
    n_ = 0;
  }
  void put(char c) {
    if (n_ == sizeof buf_) flush();
    buf_[n_++] = c;
  }
  void raw(const char* s, size_t n) {
    for (size_t i = 0; i < n; ++i) put(s[i]);
  }
  void raw(const char* s) { raw(s, length(s)); }
  void integer(long long v) {
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do digits[n++] = static_cast<char>('0' + u % 10); while ((u /= 10) != 0);
    if (v < 0) put('-');
    while (n > 0) put(digits[--n]);
  }
  // Nanoseconds as seconds with nine decimals: exact, and a JSON number.
  void seconds(int64_t ns) {
    if (ns < 0) put('-'), ns = -ns;
    integer(ns / 1000000000);
    put('.');
    const int64_t frac = ns % 1000000000;
    for (int64_t d = 100000000; d > 0; d /= 10) put(static_cast<char>('0' + frac / d % 10));
  }
  void string(const char* s) {
    static const char hex[] = "0123456789abcdef";
    put('"');
    for (; *s; ++s) {
      const auto c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') put('\\'), put(static_cast<char>(c));
      else if (c < 0x20) raw("\\u00"), put(hex[c >> 4]), put(hex[c & 15]);
      else put(static_cast<char>(c));
    }
    put('"');
  }
  void field(const char* name) {  // , "name":
    raw(", \"");
    raw(name);
    raw("\": ");
  }

 private:
  int fd_;
  bool ok_ = true;
  size_t n_ = 0;
  static char buf_[16384];
};
char Out::buf_[16384];

// One slot as read: a copy taken under the slot's sequence lock.
struct SlotCopy {
  int64_t handle;
  const FlightChannelInfo* channel;
  int64_t seq, match_seq, numel;
  int32_t peer, state;
  int64_t t_start_ns, t_end_ns;
  char op[FlightSlot::kOpChars], dtype[FlightSlot::kDtypeChars], context[FlightSlot::kContextChars];
};

template <size_t N>
void copy_chars(char (&dst)[N], const char (&src)[N]) {
  for (size_t i = 0; i < N; ++i) dst[i] = src[i];
  dst[N - 1] = '\0';
}

// False when the slot was being written (odd version, or changed while read) or holds another handle.
bool read_slot(const FlightSlot& s, int64_t handle, SlotCopy& c) {
  const uint64_t v1 = s.version.load(std::memory_order_acquire);
  if (v1 & 1) return false;
  c.handle = s.handle, c.channel = s.channel, c.seq = s.seq, c.match_seq = s.match_seq, c.numel = s.numel;
  c.peer = s.peer, c.state = s.state, c.t_start_ns = s.t_start_ns, c.t_end_ns = s.t_end_ns;
  copy_chars(c.op, s.op);
  copy_chars(c.dtype, s.dtype);
  copy_chars(c.context, s.context);
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.version.load(std::memory_order_relaxed) == v1 && c.handle == handle;
}

void write_entry(Out& out, const SlotCopy& e) {
  out.raw("\n  {");
  if (e.channel) out.raw(e.channel->json_fields.data(), e.channel->json_fields.size());  // preformatted, immutable
  else out.raw("\"comm\": \"?\", \"comm_rank\": 0, \"comm_size\": 1, \"world_ranks\": []");
  out.field("seq"), out.integer(e.seq);
  out.field("match_seq"), out.integer(e.match_seq);
  out.field("op"), out.string(e.op);
  out.field("dtype"), out.string(e.dtype);
  out.field("numel"), out.integer(e.numel);
  out.field("peer"), out.integer(e.peer);
  out.field("context"), out.string(e.context);
  out.field("t_start"), out.seconds(e.t_start_ns);
  out.field("t_end"), out.seconds(e.t_end_ns);
  out.field("state"), out.string(FlightRecorder::state_name(static_cast<FlightEntry::State>(e.state)));
  out.put('}');
}

void on_usr2(int) { g_usr2.store(true); }

void on_fatal(int sig) {
  const int saved_errno = errno;
  // One record per process: a second thread's fault meanwhile finds the default action restored
  // (SA_RESETHAND) or this flag set.
  if (g_fatal_entered.exchange(1) == 0) {
    if (const FlightRecorder* recorder = g_recorder.load()) {
      char reason[96];
      flight_signal::fatal_reason(sig, reason, sizeof reason);
      recorder->dump_from_signal(reason);
    }
  }
  errno = saved_errno;
  // The default action runs once the handler returns (the signal is blocked until then), so the exit
  // status and any core dump stay what they would have been.
  raise(sig);
}

// Copies a + b into dst (kPathChars); false when it does not fit.
bool join(char* dst, const char* a, const char* b) {
  const size_t na = length(a), nb = length(b);
  if (na + nb + 1 > kPathChars) return false;
  std::memcpy(dst, a, na);
  std::memcpy(dst + na, b, nb + 1);
  return true;
}

}  // namespace

namespace flight_signal {

void set_paths(const std::string& dir, int world_rank) {
  g_have_paths.store(false);
  if (dir.empty()) return;
  const std::string file = "/rank" + std::to_string(world_rank) + ".json";
  const std::string tmp = file + ".tmp" + std::to_string(getpid());
  g_have_paths.store(join(g_dir, dir.c_str(), "") && join(g_path, dir.c_str(), file.c_str()) &&
                     join(g_tmp, dir.c_str(), tmp.c_str()));
}

void install_handlers(const FlightRecorder* recorder) {
  g_recorder.store(recorder);
  stack_t alt {};
  alt.ss_sp = g_alt_stack;
  alt.ss_size = sizeof g_alt_stack;
  const bool on_alt_stack = sigaltstack(&alt, nullptr) == 0;
  struct sigaction fatal {};
  fatal.sa_handler = on_fatal;
  fatal.sa_flags = SA_RESETHAND | (on_alt_stack ? SA_ONSTACK : 0);
  sigemptyset(&fatal.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &fatal, nullptr);
  struct sigaction usr2 {};
  usr2.sa_handler = on_usr2;
  usr2.sa_flags = SA_RESTART;
  sigemptyset(&usr2.sa_mask);
  sigaction(SIGUSR2, &usr2, nullptr);
}

bool take_usr2() { return g_usr2.exchange(false); }

void fatal_reason(int sig, char* buf, unsigned long size) {
  // strsignal's wording for the signals the handler catches (glibc's, without its locale).
  const char* name = sig == SIGSEGV ? "Segmentation fault"
                     : sig == SIGBUS ? "Bus error"
                     : sig == SIGFPE ? "Floating point exception"
                     : sig == SIGILL ? "Illegal instruction"
                     : sig == SIGABRT ? "Aborted"
                                      : "signal";
  char digits[12];
  int nd = 0;
  unsigned u = static_cast<unsigned>(sig);
  do digits[nd++] = static_cast<char>('0' + u % 10); while ((u /= 10) != 0);
  size_t n = 0;
  const auto add = [&](char c) {
    if (n + 1 < size) buf[n++] = c;
  };
  for (const char* p = "fatal signal "; *p; ++p) add(*p);
  while (nd > 0) add(digits[--nd]);
  add(' '), add('(');
  for (const char* p = name; *p; ++p) add(*p);
  add(')');
  if (size > 0) buf[n] = '\0';
}

}  // namespace flight_signal

bool FlightRecorder::dump_from_signal(const char* reason) const noexcept {
  const size_t capacity = capacity_.load();
  if (!g_have_paths.load() || capacity == 0 || !slots_) return false;
  // Only into a run directory that exists (as dump()): its flight_recorder/ folder is made here.
  if (mkdir(g_dir, 0777) != 0 && errno != EEXIST) return false;
  const int fd = open(g_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  struct timespec now {};
  clock_gettime(CLOCK_REALTIME, &now);
  const int64_t next = next_.load(std::memory_order_acquire);
  Out out(fd);
  out.raw("{\"format\": \"shardlm flight recorder 1\"");
  out.field("world_rank"), out.integer(world_rank_);
  out.field("world_size"), out.integer(world_size_);
  out.field("reason"), out.string(reason);
  out.field("pid"), out.integer(getpid());
  out.field("time"), out.seconds(static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
  out.field("capacity"), out.integer(static_cast<long long>(capacity));
  out.field("recorded"), out.integer(next);
  out.field("written_by"), out.string("fatal-signal handler");
  out.field("entries"), out.put('[');
  long long skipped = 0;
  bool first = true;
  SlotCopy e;
  const int64_t from = next > static_cast<int64_t>(capacity) ? next - static_cast<int64_t>(capacity) : 0;
  for (int64_t h = from; h < next; ++h) {
    if (!read_slot(slots_[static_cast<size_t>(h % static_cast<int64_t>(capacity))], h, e)) {
      ++skipped;
      continue;
    }
    if (!first) out.put(',');
    first = false;
    write_entry(out, e);
  }
  out.raw("\n ]");
  out.field("skipped"), out.integer(skipped);
  out.raw("}\n");
  out.flush();
  const bool written = out.ok();
  close(fd);
  if (!written) {
    unlink(g_tmp);
    return false;
  }
  return rename(g_tmp, g_path) == 0;
}

}  // namespace shardlm::comm
