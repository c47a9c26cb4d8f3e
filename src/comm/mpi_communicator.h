// OpenMPI backend of Communicator: non-blocking MPI collectives whose waits poll with a deadline,
// so a missing peer turns into a clear message and a non-zero exit instead of a hang.
#pragma once
#include "comm/communicator.h"

namespace shardlm::comm {

// MPI is initialised once per process. Safe to call again; also works without mpirun (singleton).
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
bool mpi_initialized();
// Whether this node runs more ranks than it has cores (known after mpi_init): a rank waiting for
// its peers should then give its core up at once instead of spinning.
bool node_oversubscribed();
// Ranks of this job on this node (MPI's shared-memory split at mpi_init; 1 before it).
int node_ranks();

// The world communicator (all ranks of the job). Requires mpi_init.
CommPtr mpi_world();

}  // namespace shardlm::comm
