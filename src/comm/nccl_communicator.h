// NCCL backend of Communicator (comm.backend=nccl): collectives on one GPU per rank, ordered on a
// communication stream of this rank's device instead of blocking the host.
//
// Semantics (communicator.h describes both backends):
// - CUDA tensors (of this communicator's device): an operation starts after the work already queued
//   on the caller's current stream; Work::wait() makes the caller's current stream wait for the
//   result and returns at once (the host never blocks); Work::test() asks whether it has finished.
// - CPU tensors (small host values: a loss, a grad norm) are copied to the device, reduced there,
//   and copied back inside wait(), which then blocks the host until the result is in the tensor.
//   barrier() also blocks the host.
// - send/recv: NCCL matches them in issue order per pair of ranks (the tag is not used), and one
//   rank's sends and recvs run one after the other on the stream, so a ring where every rank
//   sends before it receives can deadlock; pair them so each send meets a receive already issued.
// - Timeouts: a watchdog thread per communicator checks in-flight operations every 50 ms; one that
//   has not finished after timeout_seconds() (as set at launch) is reported like the MPI backend's
//   (operation, size, number, missing ranks, found through a c10d::Store side channel), then the
//   NCCL communicator is aborted and the process exits with code 3. Asynchronous NCCL errors end
//   the process the same way.
#pragma once
#include "comm/communicator.h"

namespace shardlm::comm {

// Whether this shardlm was built with NCCL (CMake found nccl.h and libnccl.so.2).
bool nccl_available();

// One NCCL communicator over every rank of `bootstrap` (e.g. mpi_world()), this rank on CUDA device
// device_index. Collective over bootstrap: the ncclUniqueId and the side channel's address travel
// through it. Refuses, before any NCCL call, a machine without a CUDA device, an index out of
// range and two ranks on one GPU (use comm.backend=mpi for that layout).
CommPtr nccl_world(const CommPtr& bootstrap, int device_index);

// The same without MPI, by torchrun's convention: MASTER_ADDR and MASTER_PORT locate a
// c10d::TCPStore (rank 0 hosts it unless torchrun's agent does), RANK and WORLD_SIZE place this
// process. MASTER_PORT=0 (an ephemeral port) only works with WORLD_SIZE=1.
CommPtr nccl_world_from_env(int device_index);

}  // namespace shardlm::comm
