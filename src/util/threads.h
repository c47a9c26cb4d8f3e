// How many threads a rank computes with: libtorch's intra-op pool and, when the process has one,
// OpenBLAS's own pool (which does not follow libtorch's setting), sized together so the ranks on a
// node use one thread per core overall.
#pragma once

namespace shardlm::util {

// Sets libtorch's intra-op threads: `requested`, or the machine's cores divided among the ranks
// that share this node (OMPI_COMM_WORLD_LOCAL_SIZE). Returns the number set.
int configure_threads(int requested);

}  // namespace shardlm::util
