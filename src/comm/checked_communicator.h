// Desync detection (debug.check_collectives): a decorator over any Communicator that makes a rank
// calling a different collective than its peers — another operation, dtype, element count, reduce
// op or root, or one call too many — fail at once with both calls named, instead of hanging until
// comm.timeout_s or silently reducing mismatched buffers.
//
// Each collective (blocking or async, and split) is prefixed by an all-gather of a fixed-size
// signature (op, dtype, elements in/out, root, reduce op, call number) over the group; every rank
// compares them, so every rank of the group fails with the same message. An async collective thus
// waits, at the call, for its group to reach the same call (the operation itself still runs
// asynchronously). all_to_all's element counts differ between ranks by design: its signature
// carries the row size, and a second exchange of every rank's counts (and whether its arguments
// passed the local checks) makes rank i's send_counts[j] meet rank j's recv_counts[i], so a pair that
// disagrees, or one rank's bad arguments, stops the whole group with the same words.
// Point-to-point calls carry their signature to the peer ahead of the data, on a tag of its own
// (data tags must stay below 16384), and the receiver checks it in wait()/test() before the data is
// used, so a receive posted early never blocks. Only the public Communicator
// interface of the wrapped backend is used; stats() are the backend's without the signatures'
// calls and bytes (their time stays in: it is what this debug mode costs).
#pragma once
#include "comm/communicator.h"

namespace shardlm::comm {

// Wraps `inner` (and, through split, every communicator split from it). `world_rank` names this
// process in messages (inner->rank() when inner is the world).
CommPtr checked_communicator(CommPtr inner, int world_rank);

}  // namespace shardlm::comm
