// `train --hostfile FILE [--include SPEC | --exclude SPEC]` (cli/cmd_train.cpp): the hosts and
// slots a multi-node job runs on, as DeepSpeed's launcher reads them, turned into an OpenMPI launch.
//   FILE: one host per line, `worker-1 slots=4` (DeepSpeed's format; OpenMPI's too, which may add
//         `max_slots=N`); `#` starts a comment. A host without slots= is refused (DeepSpeed needs
//         it, and OpenMPI's default differs between versions).
//   SPEC: hosts separated by `@`, each optionally restricted to slots: `worker-0@worker-1:0,2`.
//         --include keeps only those (a host alone: all its slots); --exclude removes them.
// Ranks fill the hosts in file order, slot by slot (mpirun --map-by slot). Which slots of a host a
// run uses is passed to the ranks as SHARDLM_HOST_SLOTS (`host=0,2;host2=1`): on a GPU, local rank
// i of a host takes device slots[i] (host_slots below, read by util/device.h).
#pragma once
#include <string>
#include <vector>

namespace shardlm::util {

struct HostSlots {
  std::string host;
  int slots = 0;             // in the file
  int max_slots = 0;         // OpenMPI's max_slots (0: not given)
  std::vector<int> used;     // the slot indices this run uses, ascending
};

// Parses FILE's text (`where` names it in errors).
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& where);
// Applies --include / --exclude (at most one non-empty) and, when nproc > 0, keeps the first nproc
// slots in host order (refused when fewer are left). Hosts left without slots are dropped.
std::vector<HostSlots> select_slots(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude, int nproc);
int total_slots(const std::vector<HostSlots>& hosts);
// The OpenMPI hostfile of the selection ("host slots=N" with N = the slots used).
std::string openmpi_hostfile(const std::vector<HostSlots>& hosts);
// SHARDLM_HOST_SLOTS's value: "host=0,2;host2=1".
std::string host_slots_env(const std::vector<HostSlots>& hosts);
// The slots SHARDLM_HOST_SLOTS's value gives `hostname`; empty when it names other hosts only.
std::vector<int> host_slots(const std::string& env_value, const std::string& hostname);

}  // namespace shardlm::util
