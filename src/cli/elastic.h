// Elastic restarts (`shardlm train --max-restarts K [--min-nproc M]`): the launcher supervises the
// job. When it fails (a rank killed or crashed: mpirun exits non-zero), the launcher starts it again
// from the newest checkpoint that verifies, up to K times, as torchelastic's agent does:
//   - on the ranks available now: with --hostfile the file is read again before each restart, so a
//     lost node taken out of it (or given fewer slots) is left out; without one, the same --nproc;
//   - on the largest rank count <= what is available and >= M that tensor x pipeline parallelism
//     divides and whose data-parallel size divides the checkpoint's global batch (its micro-batches
//     per step); the trainer then scales gradient_accumulation_steps so that steps s+1 onward read
//     the same global samples (data/loader/data_position.h) — fewer than M, or no such count: it stops;
//   - with resume forced on (a config that says resume=false would start over);
//   - each restart appended to out_dir/restarts.jsonl (restart, time, exit status, ranks before and
//     after, the checkpoint's step) and passed to the ranks as SHARDLM_RESTARTS, which the trainer
//     writes into every step's metrics as `restarts`; `shardlm report` lists them.
// A stop requested with SIGTERM/SIGUSR1 (train/preemption.h) is not a failure: it is never restarted.
// After each failed attempt, shared-memory segments (/dev/shm/shardlm-PID-N) whose creating rank is
// gone are removed.
#pragma once
#include <string>
#include <vector>

#include "train/config.h"

namespace shardlm::cli {

struct ElasticOptions {
  int max_restarts = 0;
  int min_nproc = 1;
  // --hostfile with its selection, read again before each restart ("": the same --nproc each time).
  std::string hostfile, include, exclude;
  int nproc_cap = 0;  // --nproc with --hostfile: at most the first N slots
};

// The largest rank count in [min_nproc, available] that model_split (tp x pp) divides and whose
// data-parallel size divides `global_batch` (the checkpoint's micro-batches per step; 0: any); 0 if none.
int elastic_rank_count(int available, int min_nproc, int model_split, long long global_batch);

// Runs the job (run_mpirun) and restarts it as above; exits with the last attempt's status.
[[noreturn]] void supervise(const train::TrainConfig& cfg, int nproc, std::string hosts_text,
                            std::vector<std::string> command_args, const ElasticOptions& options);

}  // namespace shardlm::cli
