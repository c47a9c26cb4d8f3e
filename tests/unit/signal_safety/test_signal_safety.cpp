// The signal handlers in src/ do only async-signal-safe work (signal-safety(7)): no allocation, lock
// or stdio. This binary replaces malloc and its family with forwarders to glibc's own (which glibc
// supports: its internal calls and libstdc++'s operator new come here too) that end the process
// with exit code 86 when called while `g_forbidden` is set. Each test sets it just before a signal
// arrives and runs the handler in a child process (gtest death tests, re-executed: no fork of a
// threaded process):
//   - the flight recorder's fatal handler, for SIGSEGV (a real fault), SIGABRT (abort()), SIGBUS,
//     SIGFPE and SIGILL: the child dies of its signal, and the record it left is complete (every
//     entry the ring held, in order, each field as recorded) and parses as JSON;
//   - SIGUSR2 (the recorder's "dump now") and the preemption handler's SIGTERM and SIGUSR1;
//   - and, so that the guard itself is known to work, code that allocates (the recorder's normal
//     dump, which a handler used to call) under the guard ends with 86.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/flight_recorder.h"
#include "train/preemption.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
volatile sig_atomic_t g_forbidden = 0;
constexpr int kAllocatedInHandler = 86;

void check(const char* what) {
  if (!g_forbidden) return;
  const char prefix[] = "signal-safety test: ";
  const char suffix[] = " called where only async-signal-safe code may run\n";
  if (write(2, prefix, sizeof prefix - 1) < 0 || write(2, what, __builtin_strlen(what)) < 0 ||
      write(2, suffix, sizeof suffix - 1) < 0) {
  }
  _exit(kAllocatedInHandler);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  check("malloc");
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t size) {
  check("calloc");
  return __libc_calloc(n, size);
}
void* realloc(void* p, size_t n) {
  check("realloc");
  return __libc_realloc(p, n);
}
void free(void* p) {
  check("free");
  __libc_free(p);
}
void* memalign(size_t align, size_t n) {
  check("memalign");
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  check("aligned_alloc");
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  check("posix_memalign");
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}

using namespace shardlm;

namespace {
// One directory for a test and its death-test child (which re-runs the test body: it inherits the
// variable the parent set, so both use the parent's directory).
std::string test_dir(const std::string& name) {
  const std::string var = "SHARDLM_SIGNAL_TEST_DIR_" + name;
  if (const char* d = std::getenv(var.c_str())) return d;
  const auto dir = (std::filesystem::temp_directory_path() / ("shardlm_sig_" + name + "_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  setenv(var.c_str(), dir.c_str(), 1);
  return dir;
}

constexpr int kCapacity = 8, kRecorded = 11;

comm::FlightChannel channel(const std::string& name, int rank, int size, std::vector<int> world_ranks) {
  comm::FlightChannel c;
  c.comm_name = name, c.rank = rank, c.size = size, c.world_ranks = std::move(world_ranks);
  return c;
}

// What the child records: kRecorded operations into an 8-entry ring (the first three fall out),
// alternating between two communicators, every third failed, the last one left started.
void record_operations(const std::string& dir) {
  auto& fr = comm::flight_recorder();
  fr.configure(kCapacity, dir + "/flight_recorder", 1, 2);
  static comm::FlightChannel world = channel("world", 1, 2, {0, 1});
  static comm::FlightChannel pp = channel("pp", 0, 2, {1, 0});
  comm::FlightContext train("train");
  for (int i = 0; i < kRecorded; ++i) {
    comm::FlightContext label([&] { return "step " + std::to_string(i); });
    const int64_t h = i % 2 ? fr.begin(pp, i, "send", nullptr, 1) : fr.begin(world, i, "all_reduce", nullptr, -1);
    if (i == kRecorded - 1) break;
    if (i % 3 == 2) fr.fail(h);
    else fr.complete(h);
  }
}

void expect_complete_record(const std::string& dir, int sig) {
  const std::string path = dir + "/flight_recorder/rank1.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " missing";
  nlohmann::json j;
  ASSERT_NO_THROW(in >> j) << path << " is not JSON";
  EXPECT_EQ(j["reason"], "fatal signal " + std::to_string(sig) + " (" + strsignal(sig) + ")");
  EXPECT_EQ(j["written_by"], "fatal-signal handler");
  EXPECT_EQ(j["world_rank"], 1);
  EXPECT_EQ(j["recorded"], kRecorded);
  EXPECT_EQ(j["skipped"], 0);
  ASSERT_EQ(j["entries"].size(), static_cast<size_t>(kCapacity));
  int world_n = 0, pp_n = 0;
  for (int i = 0; i < kRecorded; ++i) (i % 2 ? pp_n : world_n)++;
  for (int k = 0; k < kCapacity; ++k) {
    const int i = kRecorded - kCapacity + k;  // the operation this entry holds
    const auto& e = j["entries"][k];
    EXPECT_EQ(e["seq"], i) << k;
    EXPECT_EQ(e["op"], i % 2 ? "send" : "all_reduce") << k;
    EXPECT_EQ(e["comm"], i % 2 ? "pp" : "world") << k;
    EXPECT_EQ(e["world_ranks"], i % 2 ? nlohmann::json({1, 0}) : nlohmann::json({0, 1})) << k;
    EXPECT_EQ(e["peer"], i % 2 ? 1 : -1) << k;
    EXPECT_EQ(e["context"], "train / step " + std::to_string(i)) << k;
    EXPECT_EQ(e["state"], i == kRecorded - 1 ? "started" : i % 3 == 2 ? "failed" : "completed") << k;
    EXPECT_GT(e["t_start"].get<double>(), 1.6e9) << k;
    if (i != kRecorded - 1) {
      EXPECT_GE(e["t_end"].get<double>(), e["t_start"].get<double>()) << k;
    }
  }
  // match_seq counts per communicator (world's collectives, pp's sends to peer 1), the last ones kept.
  EXPECT_EQ(j["entries"][kCapacity - 1]["match_seq"], world_n);
  EXPECT_EQ(j["entries"][kCapacity - 2]["match_seq"], pp_n);
  for (const auto& f : std::filesystem::directory_iterator(dir + "/flight_recorder"))
    EXPECT_EQ(f.path().filename().string().find(".tmp"), std::string::npos) << f.path();
}

void fault(int sig) {
  if (sig == SIGSEGV) {
    volatile int* volatile nowhere = nullptr;  // both volatile: the store is neither proven null nor dropped
    *nowhere = 1;  // a real fault: the handler runs, then the instruction faults again by default
  } else if (sig == SIGABRT) {
    std::abort();
  } else {
    raise(sig);
  }
}

class FatalSignal : public testing::TestWithParam<int> {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};
}  // namespace

TEST_P(FatalSignal, HandlerWritesACompleteRecordWithoutAllocating) {
  const int sig = GetParam();
  const std::string dir = test_dir(std::string("fatal") + std::to_string(sig));
  EXPECT_EXIT(
      {
        record_operations(dir);
        g_forbidden = 1;
        fault(sig);
      },
      testing::KilledBySignal(sig), "");
  expect_complete_record(dir, sig);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Signals, FatalSignal, testing::Values(SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL),
                         [](const testing::TestParamInfo<int>& p) { return std::string(sigabbrev_np(p.param)); });

TEST(SignalSafety, Usr2OnlySetsAFlagTheWatcherAnswers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = test_dir("usr2");
  EXPECT_EXIT(
      {
        record_operations(dir);
        g_forbidden = 1;
        raise(SIGUSR2);
        g_forbidden = 0;
        const std::string path = dir + "/flight_recorder/rank1.json";
        for (int i = 0; i < 100 && !std::filesystem::exists(path); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::ifstream in(path);
        nlohmann::json j;
        in >> j;
        std::exit(j.value("reason", "") == "SIGUSR2" ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  std::filesystem::remove_all(dir);
}

TEST(SignalSafety, PreemptionHandlerOnlyRecordsTheSignal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        train::install_stop_handlers();
        g_forbidden = 1;
        raise(SIGTERM);
        const int first = train::stop_signal_received();
        raise(SIGUSR1);
        const int second = train::stop_signal_received();
        g_forbidden = 0;
        std::exit(first == SIGTERM && second == SIGUSR1 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// The guard is live: the recorder's normal dump (what the fatal handler called before it was made
// async-signal-safe) allocates, and under the guard that ends the process with 86.
TEST(SignalSafety, GuardCatchesAnAllocatingDump) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = test_dir("guard");
  EXPECT_EXIT(
      {
        record_operations(dir);
        g_forbidden = 1;
        comm::flight_recorder().dump("fatal signal 11 (Segmentation fault)");
        g_forbidden = 0;
        std::exit(0);
      },
      testing::ExitedWithCode(kAllocatedInHandler), "malloc called where only async-signal-safe code may run");
  EXPECT_EXIT(
      {
        g_forbidden = 1;
        auto* p = new std::string(64, 'x');
        g_forbidden = 0;
        std::exit(p->size() == 64 ? 0 : 1);
      },
      testing::ExitedWithCode(kAllocatedInHandler), "");
  std::filesystem::remove_all(dir);
}
