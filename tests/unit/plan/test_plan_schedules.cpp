// The planner and the time model know each pipeline schedule (parallel/pipeline/schedule.h): the
// bubble fraction per schedule ((p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1)), the micro-batches each
// stage keeps alive (from the schedule's own action list: interleaved rank 0 holds (p-1)·2 + (v-1)·p + 1
// chunks' activations, Megatron's count; ZB-H1 keeps each micro-batch until its W, min(p, m) on every
// stage), what an interleaved rank holds (its v chunks of L/(p·v) layers), the refusals, and the
// predicted bubble seconds: interleaved's below 1F1B's by about v, ZB-H1's below 1F1B's.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "model/llama_config.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "util/error.h"

using namespace shardlm;

namespace {
plan::PlanRequest tiny_pipeline(int pp, int64_t layers, const std::string& schedule, int vpp = 1) {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.model.num_hidden_layers = layers;
  r.devices = pp;
  r.pp = pp;
  r.seq_len = 16;
  r.precision = "fp32";
  r.zero_stage = 0;
  r.accumulation = 8;
  r.pipeline_schedule = schedule;
  r.virtual_pipeline = vpp;
  return r;
}

plan::MachineProfile flat_profile() {
  plan::MachineProfile p;
  p.ranks = 2;
  p.gemm.push_back({"fp32", 64, 64, 64, 1e9});
  p.attention_forward["fp32"] = p.attention_backward["fp32"] = 1e9;
  p.stream_bytes_per_s = p.optimizer_elements_per_s = 1e15;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "p2p"})
    for (int64_t bytes : {1 << 10, 1 << 30}) p.collectives.push_back({op, bytes, 1e15, 1e-15 * bytes});
  return p;
}
}  // namespace

TEST(PlannerSchedules, BubbleAndMicroBatchesAlivePerSchedule) {
  const auto one = plan::make_plan(tiny_pipeline(4, 8, "1f1b"));
  const auto inter = plan::make_plan(tiny_pipeline(4, 8, "interleaved_1f1b", 2));
  const auto zb = plan::make_plan(tiny_pipeline(4, 8, "zb_h1"));
  EXPECT_DOUBLE_EQ(one.pipeline_bubble, 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(inter.pipeline_bubble, 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(zb.pipeline_bubble, 3.0 / 11.0);  // the formula's shape; its seconds come from the time model
  ASSERT_EQ(inter.pipeline_stages.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(one.pipeline_stages[s].micro_batches_alive, 4 - s);
    EXPECT_EQ(zb.pipeline_stages[s].micro_batches_alive, 4);  // each micro-batch alive until its W
    // Megatron's warm-up (p - s - 1)·2 + (v - 1)·p forwards plus one, in chunks of half a stage.
    EXPECT_EQ(inter.pipeline_stages[s].micro_batches_alive, ((4 - s - 1) * 2 + 4 + 1 + 1) / 2) << s;
    // Two chunks of one layer each: the same parameters as 1F1B's two consecutive layers (the
    // embedding on stage 0, the head on stage 3).
    EXPECT_EQ(inter.pipeline_stages[s].layers, 2);
    EXPECT_EQ(inter.pipeline_stages[s].parameters, one.pipeline_stages[s].parameters) << s;
  }
  // Rank 0 runs chunks 0 (embedding, layer 0) and 1 (layer 4): units 0 .. 5.
  EXPECT_EQ(inter.pipeline_stages[0].first_unit, 0u);
  EXPECT_EQ(inter.pipeline_stages[0].last_unit, 5u);
  const auto text = plan::format_plan(inter);
  EXPECT_NE(text.find("(p-1)/(v*m+p-1) = 0.158 (interleaved_1f1b)"), std::string::npos) << text;
}

TEST(PlannerSchedules, RefusesWhatTheScheduleCannotRun) {
  auto r = tiny_pipeline(4, 8, "interleaved_1f1b", 2);
  r.accumulation = 6;
  try {
    plan::make_plan(r);
    FAIL() << "6 micro-batches over 4 stages should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient_accumulation_steps = 6) to be a multiple of"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(plan::make_plan(tiny_pipeline(4, 6, "interleaved_1f1b", 2)), Error);  // 6 layers over 8 chunks
  EXPECT_THROW(plan::make_plan(tiny_pipeline(4, 8, "1f1b", 2)), Error);              // chunks need interleaved
}

// Balanced stages, no communication: 1F1B's bubble is (p - 1) micro-batch times of a stage;
// interleaved's the same over v; ZB-H1 splits the same backward into B and W (its weight products,
// half of the linear layers' backward) and fills the drain with the Ws: less idle time, same compute.
TEST(PlannerSchedules, TimeModelPricesEachSchedulesBubble) {
  const auto mp = flat_profile();
  auto predict = [&](const std::string& schedule, int vpp) {
    return plan::predict_step_time(plan::make_plan(tiny_pipeline(2, 4, schedule, vpp)), 0, mp);
  };
  const auto one = predict("1f1b", 1), inter = predict("interleaved_1f1b", 2), zb = predict("zb_h1", 1);
  EXPECT_GT(one.bubble_s, 0);
  EXPECT_LT(inter.bubble_s, 0.75 * one.bubble_s);
  EXPECT_GT(inter.bubble_s, 0.25 * one.bubble_s);
  EXPECT_NEAR(inter.forward_s + inter.backward_s, one.forward_s + one.backward_s, 1e-12 * one.step_s);
  EXPECT_LT(zb.bubble_s, 0.9 * one.bubble_s);
  EXPECT_NEAR(zb.forward_s + zb.backward_s, one.forward_s + one.backward_s, 1e-12 * one.step_s);
}

// plan --search weighs the schedules too: at pp 2 it lists interleaved (v = 2, where the micro-batches
// and layers divide) and ZB-H1 (without ZeRO-3; with recomputation too) beside 1F1B, named in the layout,
// emitted in the JSON, and ranked by the predicted step.
TEST(PlannerSchedules, SearchConsidersTheSchedules) {
  auto r = tiny_pipeline(2, 4, "1f1b");
  r.pp = 1;
  r.accumulation = 4;
  r.zero_stage = -1;
  const auto mp = flat_profile();
  const auto found = plan::search_layouts(r, &mp);
  int interleaved = 0, zb = 0, zb_recomputing = 0;
  for (const auto& c : found.fitting) {
    if (c.request.pipeline_schedule == "interleaved_1f1b") {
      ++interleaved;
      EXPECT_EQ(c.request.pp, 2);
      EXPECT_EQ(c.request.virtual_pipeline, 2);
      EXPECT_EQ(c.request.accumulation % 2, 0);
    }
    if (c.request.pipeline_schedule == "zb_h1") {
      ++zb;
      zb_recomputing += c.request.recompute != "none";
      EXPECT_LT(c.request.zero_stage, 3);
    }
  }
  EXPECT_GT(interleaved, 0);
  EXPECT_GT(zb, 0);
  EXPECT_GT(zb_recomputing, 0);
  for (size_t i = 1; i < found.fitting.size(); ++i)
    EXPECT_LE(found.fitting[i - 1].time.step_s, found.fitting[i].time.step_s);
  const auto j = plan::search_to_json(found);
  bool named = false;
  for (const auto& c : j["fitting"]) named = named || c["pipeline_schedule"] == "interleaved_1f1b";
  EXPECT_TRUE(named);
  EXPECT_NE(plan::format_search(found, 1000).find("interleaved_1f1b v=2"), std::string::npos);
}
