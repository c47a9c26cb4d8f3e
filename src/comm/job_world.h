// The communicator a training job's collectives go over, from the launcher's world: the MPI world
// itself, or an NCCL communicator bootstrapped over it, with the job's timeout set before any
// split (sub-communicators copy it). It exists so that the choice of backend is made here, once,
// and the trainer only receives a world.
#pragma once
#include "comm/communicator.h"

namespace shardlm::comm {

// `launcher`: every rank of the job (mpi_world()); nccl: this rank on CUDA device device_index.
CommPtr job_world(CommPtr launcher, bool nccl, int device_index, double timeout_s);

}  // namespace shardlm::comm
