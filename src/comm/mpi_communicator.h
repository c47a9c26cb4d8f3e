// OpenMPI backend of Communicator: non-blocking MPI collectives whose waits poll with a deadline,
// so a missing peer turns into a clear message and a non-zero exit instead of a hang.
#pragma once
#include "comm/communicator.h"

namespace shardlm::comm {

// MPI is initialised once per process. Safe to call again; also works without mpirun (singleton).
void mpi_init(int* argc, char*** argv);
void mpi_finalize();
bool mpi_initialized();

// The world communicator (all ranks of the job). Requires mpi_init.
CommPtr mpi_world();

}  // namespace shardlm::comm
