// `shardlm bench flight-recorder [--pairs N] [--repeats R]`: the flight recorder's own cost
// (comm/flight_recorder.h), timed on this machine: N begin/complete pairs as a backend records one
// collective, with and without the phase label the ZeRO engine builds per call, and the same calls
// with the recorder off (flight_recorder.enabled false). Multiplied by the records per step of a
// real run and divided by its step time (bench/flight_recorder_cost.py) it gives the recorder's
// share of a step. One process, no communication.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/flight_recorder.h"

namespace shardlm::cli {

int run_bench_flight_recorder(int argc, char** argv) {
  CLI::App app{"ns per recorded collective (FlightRecorder::begin + complete, 2000-entry ring), without and\n"
               "with the per-call phase label (FlightContext) the ZeRO engine builds, and the same calls with the\n"
               "recorder off (flight_recorder.enabled false); median, min, max of R.",
               "shardlm bench flight-recorder"};
  int64_t pairs = 200000;
  int repeats = 7;
  app.add_option("--pairs", pairs, "begin/complete pairs per measurement (200000)")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--repeats", repeats, "measurements; median, min and max are printed (7)")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto& recorder = comm::flight_recorder();
  comm::FlightChannel channel;
  channel.comm_name = "world";
  channel.size = 2;
  channel.world_ranks = {0, 1};
  const at::Tensor t = at::zeros({46208});
  const std::string unit = "layers.0";
  const comm::FlightContext train("train"), micro("backward micro 0");  // the scopes around a unit's call
  enum class Mode { Plain, Labelled, Off };
  const auto time_ns = [&](Mode mode) {
    recorder.configure(mode == Mode::Off ? 0 : comm::kFlightRecorderEntries, "", 0, 2);  // no directory: no file
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < pairs; ++i) {
      if (mode != Mode::Plain) {
        const comm::FlightContext l([&] { return "reduce-scatter " + unit; });  // as the ZeRO engine labels a call
        recorder.complete(recorder.begin(channel, i + 1, "reduce_scatter", &t, -1));
      } else {
        recorder.complete(recorder.begin(channel, i + 1, "reduce_scatter", &t, -1));
      }
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / pairs;
  };
  time_ns(Mode::Labelled);  // warm the ring and the allocator
  std::vector<double> plain, labelled, off;
  for (int r = 0; r < repeats; ++r) {  // interleaved, so that a busy moment hits all alike
    plain.push_back(time_ns(Mode::Plain));
    labelled.push_back(time_ns(Mode::Labelled));
    off.push_back(time_ns(Mode::Off));
  }
  const auto report = [](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    std::printf("%-34s median %7.1f ns  min %7.1f  max %7.1f  (%zu repeats)\n", what, v[v.size() / 2], v.front(),
                v.back(), v.size());
  };
  std::printf("flight recorder, %lld pairs per repeat, %zu-entry ring, context \"%s\"\n",
              static_cast<long long>(pairs), comm::kFlightRecorderEntries,
              (comm::FlightContext::current() + " / reduce-scatter " + unit).c_str());
  report("begin+complete", plain);
  report("begin+complete+phase label", labelled);
  report("recorder off (same calls)", off);
  return 0;
}

}  // namespace shardlm::cli
