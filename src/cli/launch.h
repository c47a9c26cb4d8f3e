// What every multi-rank command does before it starts: `--nproc N` relaunches the binary as N local
// ranks through mpirun, and the process keeps freed memory instead of handing it back to the kernel.
#pragma once
#include <exception>
#include <string>
#include <vector>

namespace shardlm::cli {

// True when this process was started by mpirun/srun (rank and size then come from MPI).
bool under_mpi_launcher();

// Keeps freed memory in the process: every step allocates and frees the same large activation
// and communication buffers, and returning them to the kernel costs a page fault per 4 KiB on
// the next use (see STACK_NOTES: MPI reductions 250 ms -> 19 ms, a training step -25%).
// And one malloc arena for all threads: which arena a worker thread's allocation lands in varied
// from run to run, and with it the step's peak resident memory (the same bf16 run on an AVX2 CPU:
// 151-189 MB over forward + backward in four runs; 192.6-192.9 MB with one arena, at the same
// speed: demo run wall time 0.98x, median of 5 pairs). The planner's peak is checked against it.
// Call once at start-up, before the first large allocation.
void keep_freed_memory();

// Refuses (before mpirun starts anything) more local ranks than the machine's cores can run: a rank
// blocked in MPI spins its core, so beyond kMaxRanksPerCore ranks per core every collective waits on
// time slices and the job makes no visible progress (mpirun itself gives no message).
constexpr int kMaxRanksPerCore = 16;
void check_local_rank_count(int nproc);

// Runs `mpirun -n nproc <this executable> <command_args...>` as a child and exits with its status, setting
// OpenMPI's run-as-root variables and adding --oversubscribe when nproc exceeds the cores.
// command_args starts with the subcommand, e.g. {"train", "--config=x.json"} or {"bench", "comm", ...}.
// hostfile_text (OpenMPI's format, cli/hostfile.h): the ranks go to those hosts (mpirun --hostfile,
// --map-by slot) instead of this machine.
[[noreturn]] void relaunch_with_mpirun(int nproc, const std::vector<std::string>& command_args,
                                       const std::string& hostfile_text = "");
// The same, returning mpirun's exit status (128 + signal when it was killed) instead of exiting:
// the elastic supervisor (cli/elastic.h) runs it once per attempt.
int run_mpirun(int nproc, const std::vector<std::string>& command_args, const std::string& hostfile_text = "");
// Whether SIGTERM or SIGUSR1 reached this launcher (forwarded to mpirun as SIGUSR1: a stop, not a
// failure to restart from).
bool stop_requested();

// Reports an error raised on this rank and ends the process with exit code 1. Rank 0 reports at
// once; the others wait a moment, so a problem every rank hits (bad data, bad batch arithmetic) is
// usually printed once while a problem only one rank hits is still printed. Does not call
// MPI_Finalize: it would wait for ranks that may never arrive.
[[noreturn]] void exit_after_rank_error(const char* command, int rank, int size, const std::exception& error);

}  // namespace shardlm::cli
