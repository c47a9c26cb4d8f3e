// `shardlm bench machine [--nproc N] [--threads T] [--model M --micro-batch B --seq-len S --tp T]
//                        [--dtypes fp32,bf16] [--no-grid] [--max-bytes SIZE] [--disk DIR|none] [--disk-bytes SIZE]
//                        [--out FILE]`
// Measures the rates the planner's time model prices a step at (plan/machine_profile.h) and writes
// them as JSON for `shardlm plan --machine FILE`. Run it the way training will run: the same ranks
// per node and threads per rank (every rank measures at once, sharing cores and memory bandwidth).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/comm_bench.h"
#include "comm/mpi_communicator.h"
#include "model/llama_config.h"
#include "plan/measure_machine.h"
#include "util/error.h"
#include "util/threads.h"

namespace shardlm::cli {

int run_bench_machine(int argc, char** argv) {
  CLI::App app{"Measure this machine's GEMM, attention, memory, optimizer and collective rates for the planner's "
               "time model",
               "shardlm bench machine"};
  int nproc = 0, threads = 0;
  std::string model_name, out_path, dtypes = "fp32,bf16";
  plan::MeasureOptions o;
  app.add_option("--nproc", nproc, "start N local ranks through mpirun (omit under mpirun/srun)")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "libtorch threads per rank (0: cores / local ranks, as training)");
  app.add_option("--model", model_name, "also measure this model's products and attention (preset or HF config.json)");
  app.add_option("--micro-batch", o.micro_batch, "sequences per rank per micro-step (with --model)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq-len", o.seq_len, "sequence length (with --model)")->check(CLI::Range(1, 1 << 24));
  app.add_option("--tp", o.tp, "tensor-parallel size whose shards to measure (with --model)")->check(CLI::Range(1, 1024));
  app.add_option("--dtypes", dtypes, "comma-separated dtypes of the products: fp32, bf16, fp16");
  app.add_option("--seconds", o.seconds_per_item, "timed seconds per measurement")->check(CLI::Range(0.01, 60.0));
  app.add_option("--out", out_path, "write the profile here (JSON; rank 0)");
  bool no_grid = false;
  std::string max_bytes = "64MiB";
  app.add_flag("--no-grid", no_grid, "measure only the --model's products, not the fixed grid of shapes");
  app.add_option("--max-bytes", max_bytes, "largest collective message (64MiB; from 64KiB up by 4x)");
  std::string disk = std::filesystem::is_directory("/var/tmp") ? "/var/tmp" : std::filesystem::temp_directory_path().string();
  app.add_option("--disk", disk,
                 "a directory on the disk NVMe offload will use (its nvme_path): O_DIRECT write and read bandwidth at "
                 "the offload's transfer sizes, what the planner prices offload at (default /var/tmp; none: skip)");
  std::string disk_bytes = "128MiB";
  app.add_option("--disk-bytes", disk_bytes, "bytes written and read per transfer size on --disk (128MiB)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.grid = !no_grid;
  if (disk != "none") {
    if (!std::filesystem::is_directory(disk)) fail("--disk '", disk, "' is not a directory (give the offload's nvme_path, or none)");
    o.disk_dir = disk;
    o.disk_bytes = std::max<int64_t>(4 << 20, observe::parse_bytes(disk_bytes));
  }
  o.collective_max_bytes = std::max<int64_t>(64 << 10, observe::parse_bytes(max_bytes));
  o.dtypes.clear();
  for (size_t start = 0; start <= dtypes.size();) {
    const size_t comma = dtypes.find(',', start);
    const std::string d = dtypes.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (d != "fp32" && d != "bf16" && d != "fp16") fail("--dtypes: unknown dtype '", d, "' (fp32, bf16, fp16)");
    o.dtypes.push_back(d);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!model_name.empty()) {
    o.model = std::filesystem::exists(model_name)
                  ? model::read_hf_config(std::filesystem::is_directory(model_name) ? model_name + "/config.json" : model_name)
                  : model::preset(model_name);
  }
  if (!out_path.empty()) {  // fail before starting ranks, not after the measurements
    std::ofstream probe(out_path, std::ios::app);
    if (!probe) fail("cannot write --out file '", out_path, "'");
  }
  if (nproc > 1 && !under_mpi_launcher()) {
    std::vector<std::string> args = {"bench", "machine"};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--nproc") {
        ++i;
        continue;
      }
      if (a.rfind("--nproc=", 0) == 0) continue;
      args.push_back(a);
    }
    relaunch_with_mpirun(nproc, args);
  }
  keep_freed_memory();
  comm::mpi_init(&argc, &argv);
  auto world = comm::mpi_world();
  world->set_timeout_seconds(600);
  if (nproc > 1 && world->size() != nproc)
    fail("--nproc ", nproc, " but the job has ", world->size(), " ranks; drop --nproc under mpirun/srun");
  util::configure_threads(threads);
  const bool printer = world->rank() == 0;
  try {
    const auto profile = plan::measure_machine(*world, o, [printer](const std::string& line) {
      if (!printer) return;
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
    if (printer && !out_path.empty()) {
      std::ofstream out(out_path, std::ios::trunc);
      out << plan::to_json(profile).dump(2) << "\n";
      if (!out) fail("could not write ", out_path);
      std::printf("wrote %s\n", out_path.c_str());
    }
  } catch (const Error& e) {
    exit_after_rank_error("bench machine", world->rank(), world->size(), e);
  }
  comm::mpi_finalize();
  return 0;
}

}  // namespace shardlm::cli
