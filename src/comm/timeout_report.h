// The words a rank prints when a communication fails: the operation, its size, its number and the
// ranks it waits for. Both backends (MPI, NCCL) print exactly this format, so users, the timeout
// tests and log scrapers read one message whichever backend ran.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::comm {

// Exit code of a rank that ends the job because a communication failed or timed out.
constexpr int kCommFailureExitCode = 3;

// " of 4 KiB (1024 x Float)", plus " to rank 2" / " from rank 2" for send and recv.
std::string operation_detail(const std::string& op, const at::Tensor& t, int peer);

// "shardlm: rank 1 of communicator 'dp' (world rank 3): "
std::string rank_prefix(int rank, const std::string& comm_name, int world_rank);

// The peers of a timed-out rank: missing (never arrived) and stuck (arrived, waiting like us).
struct PeerSplit {
  std::vector<int> missing, stuck;
};

struct TimeoutReport {
  int rank = 0;
  std::string comm_name;
  std::vector<int> world_ranks;  // communicator rank -> world rank
  std::string op, detail;        // detail as operation_detail() writes it
  double waited_s = 0;
  int64_t seq = 0;
  PeerSplit peers;
};

// Two lines ending in '\n': what timed out and who is missing, then the likely causes and the fix.
std::string timeout_message(const TimeoutReport& r);

// Writes the message to stderr and flushes both standard streams (the process exits next).
void write_failure(const std::string& message);

}  // namespace shardlm::comm
