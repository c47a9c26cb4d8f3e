// `shardlm train --config FILE [--nproc N] [--section.key=value ...]`
// With --nproc N (and not already under mpirun/srun) it re-launches itself as N local ranks through
// mpirun, setting what OpenMPI needs as root and when ranks outnumber cores. Under mpirun/srun the
// rank and size come from MPI.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "util/hostfile.h"
#include "cli/elastic.h"
#include "cli/launch.h"
#include "comm/flight_recorder.h"
#include "comm/mpi_communicator.h"
#include "observe/monitors.h"
#include "train/config.h"
#include "train/plan_check.h"
#include "train/preemption.h"
#include "train/trainer.h"
#include "util/device.h"
#include "util/error.h"
#include "util/out_dir_lock.h"
#include "util/process_memory.h"
#include "util/writable_dir.h"

namespace shardlm::cli {
namespace {

// A whole number >= min, else an error naming the flag (typed options would answer in CLI11's words).
int whole_at_least(const std::string& flag, const std::string& v, int min, const std::string& what) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < min || x > 1000000000) fail(flag, " must be ", what, ", got '", v, "'");
  return static_cast<int>(x);
}

}  // namespace

int run_train(int argc, char** argv) {
  CLI::App app{"Train a model from a config; every config key (docs/configuration.md) can be overridden on the "
               "command line.",
               "shardlm train"};
  app.allow_extras();  // the --section.key=value overrides, checked below
  std::string config_path, nproc_text, hostfile, include, exclude, device, restarts_text, min_nproc_text;
  app.add_option("--config", config_path, "DeepSpeed-style JSON config (see configs/)")->type_name("FILE");
  app.add_option("--nproc", nproc_text, "start N local ranks through mpirun (omit under mpirun/srun)")->type_name("N");
  app.add_option("--hostfile", hostfile,
                 "start the ranks on FILE's hosts (`host slots=N` lines, DeepSpeed's and OpenMPI's format) through "
                 "mpirun; with --nproc N, the first N slots")
      ->type_name("FILE");
  app.add_option("--include", include, "only these hosts/slots of the hostfile, e.g. worker-0@worker-1:0,2")->type_name("SPEC");
  app.add_option("--exclude", exclude, "all but these hosts/slots (same syntax; not with --include)")->type_name("SPEC");
  app.add_option("--max-restarts", restarts_text,
                 "restart a failed job from its newest checkpoint up to K times (elastic; with --hostfile on the "
                 "slots the file lists at each restart)")
      ->type_name("K");
  app.add_option("--min-nproc", min_nproc_text, "with --max-restarts: never restart on fewer than M ranks (default 1)")
      ->type_name("M");
  app.add_option("--device", device, "cpu or cuda: where to train; rank r uses GPU local_rank mod GPUs")
      ->type_name("cpu|cuda");
  app.footer("  --section.key=value         override a config key, e.g. --steps=50 --optimizer.params.lr=1e-3");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<std::string> overrides, passthrough;
  if (!config_path.empty()) passthrough.push_back("--config=" + config_path);
  for (const auto& a : app.remaining()) {
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos)
      fail("unexpected argument '", a, "': config keys are overridden as --section.key=value\n", app.help());
    overrides.push_back(a.substr(2));
    passthrough.push_back(a);
  }
  if (app.count("--device")) {
    overrides.push_back("device=" + device);
    passthrough.push_back("--device=" + device);
  }
  int nproc = app.count("--nproc") ? whole_at_least("--nproc", nproc_text, 1, "a positive integer") : 0;
  ElasticOptions elastic;
  const bool elastic_asked = app.count("--max-restarts") + app.count("--min-nproc") > 0;
  if (app.count("--max-restarts"))
    elastic.max_restarts = whole_at_least("--max-restarts", restarts_text, 0, "an integer >= 0");
  if (app.count("--min-nproc")) elastic.min_nproc = whole_at_least("--min-nproc", min_nproc_text, 1, "a positive integer");
  if (config_path.empty()) fail("--config FILE is required (try configs/demo.json)\n", app.help());
  // Validate before launching ranks: a bad key should fail once, fast, not N times.
  train::TrainConfig cfg = train::load_train_config(config_path, overrides);
  require_device(cfg.device);  // --device cuda without a GPU: stop now, not in every rank
  util::require_writable_dir(cfg.out_dir, "out_dir");  // a read-only out_dir: stop now, not after the model is built
  observe::check_monitor_dirs(cfg.tensorboard, cfg.csv_monitor);  // tensorboard / csv_monitor: the same, before training
  std::string hosts_text;  // the hostfile selection, in OpenMPI's format
  int nproc_asked = 0;      // --nproc with --hostfile: the first N slots
  if ((!include.empty() || !exclude.empty()) && hostfile.empty()) fail("--include/--exclude need --hostfile FILE");
  if (!hostfile.empty() && !under_mpi_launcher()) {
    std::ifstream in(hostfile);
    if (!in) fail("--hostfile: cannot read '", hostfile, "'");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nproc_asked = nproc;
    const auto hosts = util::select_slots(util::parse_hostfile(text, hostfile), include, exclude, nproc);
    nproc = util::total_slots(hosts);
    hosts_text = util::openmpi_hostfile(hosts);
    setenv("SHARDLM_HOST_SLOTS", util::host_slots_env(hosts).c_str(), 1);  // which device slots each host's ranks take
  }
  if (elastic_asked && (under_mpi_launcher() || (nproc <= 1 && hosts_text.empty())))
    fail("--max-restarts and --min-nproc supervise the ranks from the launcher: use them with --nproc N (N > 1) or ",
         "--hostfile; under mpirun/srun restart the job with the scheduler (e.g. srun --requeue), which resumes from ",
         "the newest checkpoint");
  if (elastic.min_nproc > 1 && elastic.max_restarts == 0) fail("--min-nproc needs --max-restarts K (K > 0)");
  if ((nproc > 1 || !hosts_text.empty()) && !under_mpi_launcher()) {
    if (hosts_text.empty()) check_local_rank_count(nproc);  // --nproc 100000: refused here, not left spinning
    OutDirLock::check_free(cfg.out_dir);  // another job writing out_dir: refused once, before ranks start
    cfg.resolve_for(nproc);   // the model split divides the job; batch arithmetic over what it leaves
    // Without device_memory: the memory this machine has free, shared by the ranks (on a GPU each rank checks its own).
    if (cfg.device_memory > 0) train::check_plan_fits(cfg, nproc);
    else if (cfg.device != "cuda" && hosts_text.empty())  // other hosts' memory is not known here
      train::check_plan_fits_available_memory(cfg, nproc, nproc, resident_bytes());
    passthrough.insert(passthrough.begin(), "train");
    if (elastic_asked) {
      elastic.hostfile = hostfile, elastic.include = include, elastic.exclude = exclude, elastic.nproc_cap = nproc_asked;
      supervise(cfg, nproc, hosts_text, passthrough, elastic);  // cli/elastic.h
    }
    relaunch_with_mpirun(nproc, passthrough, hosts_text);
  }

  keep_freed_memory();
  comm::mpi_init(&argc, &argv);
  auto world = comm::mpi_world();
  if (nproc > 1 && world->size() != nproc)
    fail("--nproc ", nproc, " but the job has ", world->size(), " ranks; drop --nproc under mpirun/srun");
  train::install_stop_handlers();  // SIGTERM / SIGUSR1: stop after the step with a checkpoint (train/preemption.h)
  // Every rank keeps its last collectives, written to out_dir/flight_recorder on a timeout, a fatal
  // signal or a request (comm/flight_recorder.h); `shardlm diagnose out_dir` reads them. Off
  // (flight_recorder.enabled false): nothing recorded, no handler, no file.
  comm::flight_recorder().configure(cfg.flight_recorder.enabled ? comm::kFlightRecorderEntries : 0,
                                    cfg.out_dir + "/flight_recorder", world->rank(), world->size());
  // The trainer lives outside the try block: an error is reported (and the process ends) before
  // its communicators are torn down, which on NCCL could wait for peers that never come.
  std::unique_ptr<train::Trainer> trainer;
  try {
    cfg.resolve_for(world->size());  // batch keys left out of the config follow from the job's size
    trainer = std::make_unique<train::Trainer>(cfg, world);
    trainer->run();
  } catch (const std::exception& e) {  // shardlm's errors and the library's (e.g. CUDA out of memory)
    exit_after_rank_error("train", world->rank(), world->size(), e);
  }
  trainer.reset();
  train::exit_if_launcher_is_ending_the_job();  // mpirun got SIGTERM: it would not answer MPI_Finalize
  comm::mpi_finalize();
  return 0;
}

}  // namespace shardlm::cli
