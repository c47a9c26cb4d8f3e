// See elastic.h.
#include "cli/elastic.h"

#include <dirent.h>
#include <sys/mman.h>
#include <csignal>
#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cli/launch.h"
#include "train/checkpoint.h"
#include "util/error.h"
#include "util/hostfile.h"

namespace shardlm::cli {
namespace {

// /dev/shm/shardlm-PID-N segments (comm/shm_group.cpp) whose creating process is gone: a rank killed
// between creating a segment and unlinking it would otherwise leave it until reboot.
int remove_orphaned_segments() {
  int removed = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  while (const dirent* e = readdir(d)) {
    int pid = 0, serial = 0;
    if (std::sscanf(e->d_name, "shardlm-%d-%d", &pid, &serial) != 2 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (shm_unlink(("/" + std::string(e->d_name)).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

// The hostfile's selection as it reads now.
std::vector<util::HostSlots> current_hosts(const ElasticOptions& o) {
  std::ifstream in(o.hostfile);
  if (!in) fail("--hostfile: cannot read '", o.hostfile, "' to restart the job");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto hosts = util::select_slots(util::parse_hostfile(text, o.hostfile), o.include, o.exclude, 0);
  // --nproc N takes the first N slots while there are that many; a file that shrank gives what it has.
  if (o.nproc_cap > 0 && util::total_slots(hosts) > o.nproc_cap) hosts = util::select_slots(std::move(hosts), "", "", o.nproc_cap);
  return hosts;
}

}  // namespace

int elastic_rank_count(int available, int min_nproc, int model_split, long long global_batch) {
  for (int n = available; n >= std::max(1, min_nproc); --n) {
    if (n % model_split != 0) continue;
    if (global_batch > 0 && global_batch % (n / model_split) != 0) continue;
    return n;
  }
  return 0;
}

void supervise(const train::TrainConfig& cfg, int nproc, std::string hosts_text, std::vector<std::string> command_args,
               const ElasticOptions& o) {
  const int split = cfg.parallelism.tensor_parallel * cfg.parallelism.pipeline_parallel;
  for (int restarts = 0;; ++restarts) {
    setenv("SHARDLM_RESTARTS", std::to_string(restarts).c_str(), 1);
    const int status = run_mpirun(nproc, command_args, hosts_text);
    if (status == 0 || stop_requested()) std::exit(status);
    const int segments = remove_orphaned_segments();
    if (restarts >= o.max_restarts) {
      std::fprintf(stderr, "shardlm train: the job failed (exit status %d)%s; --max-restarts %d %s, so it stops here\n",
                   status, segments ? (", " + std::to_string(segments) + " orphaned shared-memory segment(s) removed").c_str() : "",
                   o.max_restarts, o.max_restarts == 0 ? "allows no restart" : "restart(s) are used up");
      std::exit(status);
    }
    // What is available now, and the checkpoint the ranks will resume from.
    std::vector<util::HostSlots> hosts;
    int available = nproc;
    if (!o.hostfile.empty()) {
      hosts = current_hosts(o);
      available = util::total_slots(hosts);
    }
    const std::string dir = train::newest_usable_checkpoint(cfg.out_dir, [](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
    });
    long long global_batch = 0, step = 0;
    if (!dir.empty()) {
      std::ifstream in(dir + "/checkpoint.json");
      const auto meta = nlohmann::json::parse(in);
      global_batch = meta.value("global_batch_windows", 0LL);
      step = meta.value("step", 0LL);
    }
    const int n = elastic_rank_count(available, o.min_nproc, split, global_batch);
    if (n == 0)
      fail("the job failed (exit status ", status, ") and cannot restart: ", available, " rank(s) are available",
           o.hostfile.empty() ? "" : (" in " + o.hostfile).c_str(), ", and no count between --min-nproc ", o.min_nproc,
           " and that is a multiple of tensor x pipeline parallelism (", split, ") whose data-parallel size divides the "
           "checkpoint's ", global_batch, " micro-batches per step; add hosts or slots to the hostfile, or lower --min-nproc");
    if (!hosts.empty()) {
      hosts = util::select_slots(std::move(hosts), "", "", n);
      hosts_text = util::openmpi_hostfile(hosts);
      setenv("SHARDLM_HOST_SLOTS", util::host_slots_env(hosts).c_str(), 1);
    }
    std::fprintf(stderr, "shardlm train: the job failed (exit status %d); restart %d of %d on %d rank(s) (was %d) from %s\n",
                 status, restarts + 1, o.max_restarts, n, nproc,
                 dir.empty() ? "the start (no checkpoint yet)" : ("the checkpoint of step " + std::to_string(step)).c_str());
    std::filesystem::create_directories(cfg.out_dir);
    std::ofstream(cfg.out_dir + "/restarts.jsonl", std::ios::app)
        << nlohmann::json{{"restart", restarts + 1},
                          {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
                          {"exit_status", status}, {"ranks_before", nproc}, {"ranks", n}, {"resume_step", step},
                          {"orphaned_segments_removed", segments}}.dump()
        << "\n";
    nproc = n;
    if (restarts == 0) command_args.push_back("--resume=true");  // a config with resume=false would start over
    if (stop_requested()) std::exit(status);  // SIGTERM/SIGUSR1 while the job was down: no restart
  }
}

}  // namespace shardlm::cli
