// all_to_all with per-rank counts (Communicator::all_to_all_async): the one place its arguments are
// checked and turned into element counts and offsets, so that the MPI and NCCL backends, the
// default built from send/recv, and the checking decorator refuse the same calls with the same words.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::comm {

// A checked all_to_all call in elements: rank j's piece of the input starts at send_offsets[j]
// (elements from input's start) and holds send_elements[j]; likewise the output for recv_*.
struct AllToAllSplit {
  int64_t row_elements = 0;  // elements per row (product of dims 1..)
  std::vector<int64_t> send_elements, send_offsets, recv_elements, recv_offsets;
};

// Checks a call of rank `rank` on a communicator of `size` ranks (named `comm_name` in errors):
// tensors defined, contiguous, at least 1-D, of one dtype, device and row size; `size` counts each,
// none negative, summing to the rows of input and output; what this rank sends itself equal to what
// it receives from itself; input and output not overlapping. Throws shardlm::Error naming the
// argument and the fix. (Whether the peers' counts match needs the peers: checked_communicator.h.)
AllToAllSplit check_all_to_all(const std::string& comm_name, int rank, int size, const at::Tensor& input,
                               const at::Tensor& output, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts);

// "[3, 0, 5]": counts in messages.
std::string counts_text(const std::vector<int64_t>& counts);

}  // namespace shardlm::comm
