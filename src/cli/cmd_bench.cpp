// `shardlm bench comm [--nproc N] [--min-bytes 4K] [--max-bytes 256M] [--iters K] [--warmup W]
//                      [--dtype float32|bfloat16] [--json FILE]`
// nccl-tests-style table of the Communicator's collectives with the machine's memcpy bandwidth as
// the ceiling (src/comm/comm_bench.h has the definitions). --nproc relaunches under mpirun as
// `shardlm train --nproc` does; under mpirun/srun directly, omit it.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/launch.h"
#include "comm/comm_bench.h"
#include "comm/mpi_communicator.h"
#include "util/error.h"

namespace shardlm::cli {
namespace {

int to_int(const std::string& flag, const std::string& v, int min) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < min || x > 1000000000) fail(flag, " must be an integer >= ", min, ", got '", v, "'");
  return static_cast<int>(x);
}

std::vector<std::string> split_ops(const std::string& v) {
  std::vector<std::string> ops;
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    const std::string op = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!observe::is_comm_bench_op(op)) fail("--ops: unknown operation '", op, "' (", observe::comm_bench_ops(), ")");
    ops.push_back(op);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ops;
}

int run_bench_comm(int argc, char** argv) {
  CLI::App app{"nccl-tests-style bandwidth of all_reduce, reduce_scatter, all_gather, broadcast and all_to_all\n"
               "through the Communicator (OpenMPI), with the memcpy bandwidth measured in the same run as the\n"
               "ceiling. size, time, algbw and busbw follow nccl-tests: for reduce_scatter, all_gather and\n"
               "all_to_all the size is the full buffer of N chunks; busbw = algbw x 2(n-1)/n (all_reduce),\n"
               "(n-1)/n (reduce_scatter, all_gather, all_to_all), 1 (broadcast).",
               "shardlm bench comm"};
  // Values are read as text and checked below (the messages name the flag), then passed on as given.
  std::map<std::string, std::string> given;
  const std::vector<std::pair<std::string, std::string>> options = {
      {"--nproc", "start N local ranks through mpirun (omit under mpirun/srun)"},
      {"--min-bytes", "smallest message (4KiB); sizes take KiB, MiB, GiB (x1024) or KB, MB, GB (x1000)"},
      {"--max-bytes", "largest message (256MiB)"},
      {"--factor", "size multiplier between rows (4)"},
      {"--iters", "timed calls per size (default: about 1 GiB per row, 5..200)"},
      {"--warmup", "untimed calls before timing (default: iters/10, 1..20)"},
      {"--dtype", "element type: float32 (default) or bfloat16"},
      {"--ops", "comma-separated subset of all_reduce,reduce_scatter,all_gather,broadcast,all_to_all"},
      {"--timeout", "longest wait of one collective in seconds before exiting (300)"},
      {"--json", "also write the results as JSON (rank 0)"}};
  for (const auto& [flag, help] : options) app.add_option(flag, given[flag], help)->type_name("VALUE");
  bool nonblocking = false;
  app.add_flag("--nonblocking", nonblocking,
               "start calls with the _async form and poll test() until done (the trainer's way) instead of blocking");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  observe::CommBenchOptions opts;
  int nproc = 0;
  double timeout_s = 300;
  std::string json_path;
  std::vector<std::string> passthrough = {"bench", "comm"};
  for (const auto& [flag, help] : options) {
    if (app.count(flag) == 0) continue;
    const std::string& v = given[flag];
    if (flag == "--nproc") nproc = to_int(flag, v, 1);
    else if (flag == "--min-bytes") opts.min_bytes = observe::parse_bytes(v);
    else if (flag == "--max-bytes") opts.max_bytes = observe::parse_bytes(v);
    else if (flag == "--factor") opts.factor = to_int(flag, v, 2);
    else if (flag == "--iters") opts.iters = to_int(flag, v, 1);
    else if (flag == "--warmup") opts.warmup = to_int(flag, v, 0);
    else if (flag == "--ops") opts.ops = split_ops(v);
    else if (flag == "--timeout") timeout_s = to_int(flag, v, 1);
    else if (flag == "--json") json_path = v;
    else if (flag == "--dtype") {
      if (v == "float32" || v == "fp32" || v == "float") opts.dtype = at::kFloat;
      else if (v == "bfloat16" || v == "bf16") opts.dtype = at::kBFloat16;
      else fail("--dtype must be float32 or bfloat16, got '", v, "'");
    }
    if (flag != "--nproc") passthrough.push_back(flag + "=" + v);  // the relaunched ranks run under mpirun
  }
  opts.nonblocking = nonblocking;
  if (nonblocking) passthrough.push_back("--nonblocking");
  if (opts.max_bytes < opts.min_bytes)
    fail("--max-bytes (", opts.max_bytes, ") is below --min-bytes (", opts.min_bytes, ")");
  if (!json_path.empty()) {  // fail before starting ranks, not after the whole run
    std::ofstream probe(json_path, std::ios::app);
    if (!probe) fail("cannot write --json file '", json_path, "'");
  }
  if (nproc > 1 && !under_mpi_launcher()) relaunch_with_mpirun(nproc, passthrough);

  keep_freed_memory();
  comm::mpi_init(&argc, &argv);
  auto world = comm::mpi_world();
  world->set_timeout_seconds(timeout_s);
  if (nproc > 1 && world->size() != nproc)
    fail("--nproc ", nproc, " but the job has ", world->size(), " ranks; drop --nproc under mpirun/srun");
  // The benchmark computes nothing with libtorch; idle OpenMP threads would only compete with the
  // ranks for cores.
  at::set_num_threads(1);
  const bool printer = world->rank() == 0;
  observe::CommBenchResult res;
  try {
    res = observe::run_comm_bench(*world, opts, [printer](const std::string& line) {
      if (!printer) return;
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    });
    if (printer && !json_path.empty()) {
      std::ofstream out(json_path, std::ios::trunc);
      out << observe::to_json(res).dump(2) << "\n";
      if (!out) fail("could not write ", json_path);
    }
  } catch (const Error& e) {
    exit_after_rank_error("bench comm", world->rank(), world->size(), e);
  }
  comm::mpi_finalize();
  if (res.wrong() > 0) {
    if (printer) std::fprintf(stderr, "shardlm bench comm: error: %lld elements had wrong values (see #wrong)\n",
                              static_cast<long long>(res.wrong()));
    return 1;
  }
  return 0;
}

}  // namespace

int run_bench_flight_recorder(int argc, char** argv);  // bench_flight_recorder.cpp
int run_bench_machine(int argc, char** argv);          // cmd_bench_machine.cpp
int run_bench_monitors(int argc, char** argv);         // bench_monitors.cpp
int run_bench_qlora(int argc, char** argv);             // bench_qlora.cpp

int run_bench(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::printf("usage: shardlm bench comm [options]              (shardlm bench comm --help)\n"
                "       shardlm bench machine [options]           (shardlm bench machine --help)\n"
                "       shardlm bench flight-recorder [options]   (shardlm bench flight-recorder --help)\n"
                "       shardlm bench monitors [options]          (shardlm bench monitors --help)\n"
                "       shardlm bench qlora [options]             (shardlm bench qlora --help)\n");
    return argc < 2 ? 2 : 0;
  }
  const std::string what = argv[1];
  if (what == "comm") return run_bench_comm(argc - 1, argv + 1);
  if (what == "flight-recorder") return run_bench_flight_recorder(argc - 1, argv + 1);
  if (what == "machine") return run_bench_machine(argc - 1, argv + 1);
  if (what == "monitors") return run_bench_monitors(argc - 1, argv + 1);
  if (what == "qlora") return run_bench_qlora(argc - 1, argv + 1);
  fail("unknown benchmark '", what, "'; available: comm, machine, flight-recorder, monitors, qlora\n  usage: shardlm bench comm [options]");
}

}  // namespace shardlm::cli
