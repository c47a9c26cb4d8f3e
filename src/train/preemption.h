// Preemption: a scheduler's warning signal (SIGTERM as srun and Kubernetes send it, SIGUSR1 as
// `sbatch --signal=USR1@120` or `mpirun` forwards it) reaching any one rank stops the run cleanly.
// The handler only sets a flag; after each step every rank contributes its flag to one all-reduce
// (MAX), so all ranks agree on the same stop step, write the checkpoint of that step, and exit 0.
// Rerunning the same command resumes from it.
//
// A SIGTERM sent to OpenMPI 4.1's own `mpirun` cannot be forwarded (ess_base_frame.c refuses it):
// mpirun ends the job instead (ess_hnp_module.c clean_abort, its exit status forced to 1 there), and
// its daemon, blocked in odls_base_default_fns.c kill_local_procs, sends each rank SIGCONT, sleeps
// odls_base_sigkill_timeout seconds (1 by default), sends SIGTERM, sleeps as long again, then sends
// SIGKILL. With the timeout raised (README, Preemption) the ranks finish the step and checkpoint in
// the second sleep; a rank recognises this SIGTERM by its sender (its parent, the OpenMPI daemon)
// and then exits 0 right after the checkpoint instead of waiting in MPI_Finalize for a daemon that
// sleeps until its SIGKILL, and stops blocking on a stdout pseudo-terminal nobody reads.
#pragma once
#include <cstdint>
#include <string>

#include "comm/communicator.h"

namespace shardlm::train {

// Installs the SIGTERM and SIGUSR1 handlers (once per process).
void install_stop_handlers();
// The signal that asked this rank to stop (0: none).
int stop_signal_received();
// One all-reduce over `world`: the signal any rank received (the largest number), 0 when none did.
int agreed_stop_signal(comm::Communicator& world);
// Whether the SIGTERM came from this rank's parent, the OpenMPI daemon (mpirun or orted) that started
// it: the launcher is ending the job and will SIGKILL this rank odls_base_sigkill_timeout seconds later.
bool launcher_is_ending_the_job();
// Called after the run stopped and its checkpoint is written: when the launcher is ending the job,
// flushes the output and ends the process with exit code 0 without MPI_Finalize (which would wait for
// the daemon, asleep until it sends SIGKILL); otherwise returns.
void exit_if_launcher_is_ending_the_job();
// "SIGTERM" / "SIGUSR1" / "signal N".
std::string signal_name(int sig);

}  // namespace shardlm::train

namespace shardlm::train {

// What the trainer does after step `step` (1-based) of `steps`: write a checkpoint (every
// `interval` steps, 0 never, or because a stop was agreed) and stop (the agreed signal, 0 none).
// The last step checks nothing: the run ends and saves there anyway.
struct StepEnd {
  bool checkpoint = false;
  int stop_signal = 0;
};
StepEnd step_end(int64_t step, int64_t steps, int64_t interval, comm::Communicator& world);
// "shardlm: SIGTERM received: stopped after step 84 of 400 with its checkpoint; run the same command to resume".
std::string stop_message(int sig, int64_t step, int64_t steps);

}  // namespace shardlm::train
