// See job_world.h.
#include "comm/job_world.h"

#include "comm/nccl_communicator.h"

namespace shardlm::comm {

CommPtr job_world(CommPtr launcher, bool nccl, int device_index, double timeout_s) {
  launcher->set_timeout_seconds(timeout_s);  // the bootstrap's own collectives are bounded too
  if (!nccl) return launcher;
  auto world = nccl_world(launcher, device_index);
  world->set_timeout_seconds(timeout_s);
  return world;
}

}  // namespace shardlm::comm
