// The collective flight recorder: every rank keeps its last N communication operations (which
// communicator, its number there, the operation, element type and count, the peer, what the
// trainer was doing, when it started and ended, and whether it completed) in a ring buffer, on by
// default (config key flight_recorder.enabled), so that a hang or crash can be explained after the
// fact with the checks off (PyTorch's NCCL flight recorder is the model). Both backends record
// through it.
//
// A rank writes its buffer as JSON (`<dir>/rank<R>.json`, atomically) when
//   - one of its operations times out (before it exits), and it then asks every rank to write
//     theirs by creating `<dir>/dump_request`;
//   - it receives a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT): the handler
//     (flight_signal_dump.cpp) writes through async-signal-safe calls only, from the fixed-size
//     slots below, with no allocation, lock or stdio;
//   - `<dir>/dump_request` appears (a watcher thread looks every 100 ms: what a timed-out peer
//     or a user — `touch RUN/flight_recorder/dump_request` on a hanging job — asks), or SIGUSR2.
// `shardlm diagnose RUN_DIR` (report/flight_diagnosis.h) merges the ranks' files.
//
// Turned off (configure with capacity 0) it records nothing, labels no phase (FlightContext),
// starts no thread, installs no handler and writes no file: begin() returns at its first test.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::comm {

// What a communicator's entries share, fixed when it first records: kept for the life of the
// process (a fatal-signal dump reads it without a lock), with its JSON fields preformatted.
struct FlightChannelInfo {
  std::string comm_name;
  int rank = 0, size = 1;
  std::vector<int> world_ranks;
  std::string json_fields;  // "\"comm\": \"world\", \"comm_rank\": 0, \"comm_size\": 2, \"world_ranks\": [0, 1]"
};

// One communicator as the recorder knows it: a backend creates one per communicator.
struct FlightChannel {
  std::string comm_name;
  int rank = 0, size = 1;
  std::vector<int> world_ranks;  // communicator rank -> world rank
  // Collectives only, numbered from 1 on this communicator: the same number on every member means
  // the same call, which the diagnosis compares. Point-to-point calls are numbered per peer and
  // direction instead (the k-th send to p matches p's k-th receive from us).
  int64_t collectives = 0;
  std::vector<int64_t> sends, recvs;  // per peer
  const FlightChannelInfo* info = nullptr;  // made from the fields above by the first begin()
};
using FlightChannelPtr = std::shared_ptr<FlightChannel>;

struct FlightEntry {
  enum class State { Started, Completed, Failed };
  std::string comm_name;
  int comm_rank = 0, comm_size = 1;
  std::vector<int> world_ranks;
  int64_t seq = 0;          // the backend's operation number on this communicator (timeout messages)
  int64_t match_seq = 0;    // collective number, or p2p number for (peer, direction)
  std::string op;           // all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv, barrier
  std::string dtype;
  int64_t numel = 0;        // input elements (all_to_all: this rank's, which differ between ranks)
  int peer = -1;            // send/recv: the peer; broadcast: the root; -1 otherwise
  std::string context;      // what the caller was doing (FlightContext scopes), e.g. "backward micro 1 / layers.3"
  double t_start = 0, t_end = 0;  // seconds since the epoch (t_end 0 while started)
  State state = State::Started;
};

// One ring entry as stored: plain data of fixed size, so that a fatal-signal handler can read it
// without a lock or an allocation. `version` is a sequence lock: odd while an entry is written; a
// reader that sees it odd, or changed across its read, leaves the entry out.
struct FlightSlot {
  static constexpr size_t kOpChars = 24, kDtypeChars = 24, kContextChars = 160;  // each with its '\0'
  std::atomic<uint64_t> version{0};
  int64_t handle = -1;  // which operation the slot holds (handle % capacity == its index)
  const FlightChannelInfo* channel = nullptr;
  int64_t seq = 0, match_seq = 0, numel = 0;
  int32_t peer = -1;
  int32_t state = 0;  // FlightEntry::State
  int64_t t_start_ns = 0, t_end_ns = 0;  // since the epoch
  char op[kOpChars] = {}, dtype[kDtypeChars] = {}, context[kContextChars] = {};  // truncated, '\0'-ended
};

class FlightRecorder {
 public:
  static FlightRecorder& instance();

  // capacity 0 turns the recorder off (nothing recorded, no phase labels, no thread, no handler, no
  // file). dump_dir empty: buffers kept, never written (no run directory). Starts the request
  // watcher and installs the signal handlers once a directory is given. Call before the
  // communicators record (at start-up), not while they do.
  void configure(size_t capacity, const std::string& dump_dir, int world_rank, int world_size);
  bool enabled() const { return capacity_.load(std::memory_order_relaxed) > 0; }
  int64_t recorded() const { return next_.load(); }  // operations recorded since configure (also those the ring dropped)
  const std::string& dump_dir() const { return dump_dir_; }

  // Records an operation's start; returns its handle for complete()/fail() (-1 when disabled).
  int64_t begin(FlightChannel& channel, int64_t seq, const char* op, const at::Tensor* t, int peer);
  int64_t begin(FlightChannel& channel, int64_t seq, const std::string& op, const at::Tensor* t, int peer) {
    return begin(channel, seq, op.c_str(), t, peer);
  }
  void complete(int64_t handle);
  void fail(int64_t handle);

  // The entries still held, oldest first.
  std::vector<FlightEntry> snapshot() const;
  nlohmann::json to_json(const std::string& reason) const;
  // Writes <dump_dir>/rank<R>.json (write to a temporary name, then rename). Returns false when
  // there is nowhere to write or writing failed; never throws.
  bool dump(const std::string& reason) const;
  // The same file written from a signal handler: async-signal-safe calls only (open, write, rename,
  // mkdir, clock_gettime, getpid), no allocation or lock (flight_signal_dump.cpp). An entry being
  // written at that moment is left out (counted in the file's "skipped").
  bool dump_from_signal(const char* reason) const noexcept;
  // Creates <dump_dir>/dump_request, which makes every rank's watcher dump.
  void request_dumps() const;
  void clear();

  static const char* state_name(FlightEntry::State s);

 private:
  FlightRecorder();  // kFlightRecorderEntries slots until configure says otherwise
  void start_watcher();
  void finish(int64_t handle, FlightEntry::State state);
  const FlightChannelInfo* channel_info(FlightChannel& ch);
  mutable std::mutex mu_;  // serialises the writers; the signal dump reads without it
  std::unique_ptr<FlightSlot[]> slots_;
  std::atomic<size_t> capacity_{0};
  std::atomic<int64_t> next_{0};  // handle of the next entry; entry h lives at slots_[h % capacity_]
  std::string dump_dir_;
  int world_rank_ = 0, world_size_ = 1;
  bool watcher_started_ = false;
};

inline FlightRecorder& flight_recorder() { return FlightRecorder::instance(); }

// A timed-out rank's dump reason: "timeout in all_reduce #36 on communicator 'world'", then, once
// the survey of its peers is done, "; waiting for world rank(s) 1" (the ones that never answered).
std::string flight_timeout_reason(const std::string& op, int64_t seq, const std::string& comm_name,
                                  const std::vector<int>* missing_world_ranks = nullptr);

// The default number of entries each rank keeps.
constexpr size_t kFlightRecorderEntries = 2000;

// Labels the operations a thread records while it lives ("forward micro 0", "layers.3 gather"),
// nested scopes joined with " / ". With the recorder off it labels nothing: the form taking a
// function does not even build its label then, so a label costs nothing on an unrecorded run.
class FlightContext {
 public:
  explicit FlightContext(std::string label);
  explicit FlightContext(const char* label);
  template <typename MakeLabel, typename = std::enable_if_t<std::is_invocable_r_v<std::string, MakeLabel&>>>
  explicit FlightContext(MakeLabel&& make) {
    if (flight_recorder().enabled()) push(make());
  }
  ~FlightContext();
  FlightContext(const FlightContext&) = delete;
  FlightContext& operator=(const FlightContext&) = delete;
  static std::string current();
  // The current label written into buf (at most size - 1 characters and a '\0'); no allocation.
  static void current_into(char* buf, size_t size);

 private:
  void push(std::string label);
  bool pushed_ = false;
};

}  // namespace shardlm::comm
