// The run diagnosis (report/diagnosis.h) walks seed 003's order on a run's measured phases: data,
// then communication over 30% of the step, then memory near device_memory, then the phase furthest
// from its prediction, else compute; its phase table is the medians after the first two steps.
#include <gtest/gtest.h>

#include <cmath>

#include "report/diagnosis.h"

using namespace shardlm;

namespace {

// Six steps whose phases are constant after two slow warm-up steps: step 1 s, forward 0.3, backward
// 0.5, optimizer 0.05; `comm` seconds of exposed all-reduce waits, `data` seconds of batch assembly.
observe::RunData run_with(double comm, double data) {
  observe::RunData r;
  r.dir = "test";
  r.steps = {1, 2, 3, 4, 5, 6};
  auto col = [&](const std::string& name, double v) {
    r.columns[name] = {10 * v, 10 * v, v, v, v, v};  // warm-up steps far off: must not move the medians
  };
  col("step_time_s", 1.0);
  col("time_forward_s", 0.3);
  col("time_backward_s", 0.5);
  col("time_optimizer_s", 0.05);
  col("comm_all_reduce_wait_s", comm);
  col("time_data_s", data);
  return r;
}

}  // namespace

TEST(Diagnosis, PhaseTableIsTheSteadyMedians) {
  const auto d = observe::diagnose(run_with(0.1, 0.0));
  ASSERT_EQ(d.phases.size(), 6u);
  EXPECT_EQ(d.phases[0].phase, "forward");
  EXPECT_DOUBLE_EQ(d.phases[0].measured_s, 0.3);
  EXPECT_DOUBLE_EQ(d.phases[3].measured_s, 0.1);  // communication (exposed)
  EXPECT_DOUBLE_EQ(d.phases[5].measured_s, 1.0);  // step
  EXPECT_LT(d.phases[0].predicted_s, 0);          // no plan.json prediction
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_EQ(d.findings[0].rfind("compute:", 0), 0u) << d.findings[0];
  EXPECT_NE(d.findings[0].find("80%"), std::string::npos) << d.findings[0];
}

TEST(Diagnosis, CommunicationOverThirtyPercentComesBeforeMemoryAndDataBeforeBoth) {
  auto r = run_with(0.4, 0.0);
  auto d = observe::diagnose(r);
  ASSERT_FALSE(d.findings.empty());
  EXPECT_EQ(d.findings[0].rfind("communication:", 0), 0u) << d.findings[0];
  EXPECT_NE(d.findings[0].find("40%"), std::string::npos);
  r = run_with(0.29, 0.0);
  EXPECT_EQ(observe::diagnose(r).findings[0].rfind("compute:", 0), 0u);  // under 30%: not a finding
  // Memory at 95% of device_memory: after communication.
  r = run_with(0.4, 0.0);
  r.columns["memory_peak_rss_max"] = std::vector<double>(6, 950e6);
  r.config = nlohmann::json{{"device_memory", "1GB"}};
  d = observe::diagnose(r);
  ASSERT_EQ(d.findings.size(), 2u);
  EXPECT_EQ(d.findings[1].rfind("memory:", 0), 0u) << d.findings[1];
  EXPECT_NE(d.findings[1].find("95%"), std::string::npos) << d.findings[1];
  // The data loader at 10% of the step: first of all.
  r = run_with(0.4, 0.1);
  d = observe::diagnose(r);
  EXPECT_EQ(d.findings[0].rfind("data:", 0), 0u) << d.findings[0];
}

TEST(Diagnosis, NamesThePhaseFurthestFromItsPrediction) {
  auto r = run_with(0.1, 0.0);
  r.plan = nlohmann::json{{"predicted",
                           {{"forward_s", 0.29}, {"backward_s", 0.25}, {"optimizer_s", 0.05}, {"comm_exposed_s", 0.1},
                            {"step_s", 0.7}}}};
  const auto d = observe::diagnose(r);
  EXPECT_DOUBLE_EQ(d.phases[1].predicted_s, 0.25);
  ASSERT_FALSE(d.findings.empty());
  EXPECT_EQ(d.findings[0].rfind("prediction: backward took 0.500 s, 2.00x", 0), 0u) << d.findings[0];
  // Within 15% everywhere: no prediction finding.
  r.plan = nlohmann::json{{"predicted", {{"forward_s", 0.3}, {"backward_s", 0.45}, {"optimizer_s", 0.05}}}};
  EXPECT_EQ(observe::diagnose(r).findings[0].rfind("compute:", 0), 0u);
}

TEST(Diagnosis, SectionSaysWhenThereAreNoStepTimes) {
  observe::RunData r;
  r.steps = {1};
  EXPECT_NE(observe::diagnosis_section(r).find("no step_time_s"), std::string::npos);
  const auto html = observe::diagnosis_section(run_with(0.4, 0.0));
  EXPECT_NE(html.find("<td>communication (exposed)</td><td>0.4000</td>"), std::string::npos) << html;
}

// A device_memory the diagnosis cannot read is named as unreadable, not taken as 0 (which used to
// skip the memory check without a word).
TEST(Diagnosis, AnUnreadableDeviceMemoryIsNamedNotReadAsZero) {
  for (const auto& bad : {nlohmann::json("32 gigs"), nlohmann::json(-1), nlohmann::json(true),
                          nlohmann::json::array({1})}) {
    auto r = run_with(0.1, 0.0);
    r.columns["memory_peak_rss_max"] = std::vector<double>(6, 950e6);
    r.config = nlohmann::json{{"device_memory", bad}};
    const auto d = observe::diagnose(r);
    bool named = false;
    for (const auto& f : d.findings)
      named = named || (f.find("unreadable") != std::string::npos && f.find(bad.dump()) != std::string::npos);
    EXPECT_TRUE(named) << "device_memory " << bad.dump() << ": " << (d.findings.empty() ? "" : d.findings[0]);
  }
  // Absent or 0: no memory finding at all.
  auto r = run_with(0.1, 0.0);
  r.config = nlohmann::json{{"device_memory", 0}};
  for (const auto& f : observe::diagnose(r).findings) EXPECT_EQ(f.find("device_memory"), std::string::npos) << f;
}
