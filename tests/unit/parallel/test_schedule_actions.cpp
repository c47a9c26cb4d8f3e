// Schedules as action lists (parallel/pipeline/schedule.h): 1F1B's warm-up, GPipe's all-forwards
// order, the one-stage schedule (F0 B0 F1 B1 ... whatever schedule the config names: GPipe on one
// stage would keep every micro-batch alive for nothing, and the planner counts one), Megatron's
// interleaved order and ZB-H1's B/W split. Every list is also run through a simulation of the
// stages (each blocks on its next action's receive, sends never block, as Pipeline::train does):
// every micro-batch runs F, then B (or B and W), once per chunk and in dependency order, without a
// deadlock, and the simulated idle time follows the schedule's formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "parallel/pipeline/schedule.h"

using namespace shardlm::parallel::pp;

namespace {
std::string text(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    const char* k = a.kind == Action::Forward ? "F" : a.kind == Action::Backward ? "B" : a.kind == Action::BackwardInput ? "b" : "w";
    s += k + std::to_string(a.micro) + (a.chunk ? "." + std::to_string(a.chunk) : "") + " ";
  }
  return s;
}

struct Simulated {
  bool deadlock = false;
  double span = 0;                 // time units to the last action's end (F = 1, B = 2 or b = w = 1)
  std::vector<double> bubble;      // per stage: 1 - busy / span of that stage (first start to last end)
  std::vector<int64_t> max_alive;  // per stage: micro-batch chunks between F and their last backward part
};

// Runs every stage's action list in order; an action starts when its stage is free and its input
// has arrived (at the end of the producing action: no transfer time). F of virtual stage k needs F
// of k - 1; B (whole or input part) of k needs B of k + 1, the last virtual stage its own F; W needs
// its own B. Virtual stage k = chunk·p + stage.
Simulated simulate(Schedule schedule, int p, int64_t m, int v, double f = 1, double b = 2) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(schedule_actions(schedule, s, p, m, v));
  const int V = p * v;
  std::map<std::tuple<int, int, int64_t>, double> done;  // (kind 0 F / 1 B-input / 2 W, virtual stage, micro) -> end
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0), first(p, -1), busy(p, 0);
  std::vector<int64_t> alive(p, 0);
  Simulated out;
  out.max_alive.assign(p, 0);
  std::set<std::tuple<int, int, int64_t>> seen;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == lists[s].size()) continue;
      const Action& a = lists[s][next[s]];
      const int k = a.chunk * p + s;
      double ready = -1;
      auto need = [&](int kind, int stage, int64_t micro) {
        auto it = done.find({kind, stage, micro});
        return it == done.end() ? -1.0 : it->second;
      };
      double cost = f;
      int kind = 0;
      if (a.kind == Action::Forward) {
        ready = k == 0 ? 0.0 : need(0, k - 1, a.micro);
      } else if (a.kind == Action::BackwardWeight) {
        ready = need(1, k, a.micro), kind = 2, cost = b / 2;
      } else {
        ready = k == V - 1 ? need(0, k, a.micro) : need(1, k + 1, a.micro), kind = 1;
        cost = a.kind == Action::Backward ? b : b / 2;
      }
      if (ready < 0) continue;
      EXPECT_TRUE(seen.insert({kind, k, a.micro}).second) << "action repeated on stage " << s;
      const double start = std::max(ready, free_at[s]);
      if (first[s] < 0) first[s] = start;
      free_at[s] = start + cost;
      busy[s] += cost;
      done[{kind, k, a.micro}] = free_at[s];
      if (a.kind == Action::Backward) done[{2, k, a.micro}] = free_at[s];  // W included
      if (a.kind == Action::Forward) out.max_alive[s] = std::max(out.max_alive[s], ++alive[s]);
      if (a.kind == Action::Backward || a.kind == Action::BackwardWeight) --alive[s];
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) {
    if (next[s] != lists[s].size()) out.deadlock = true;
    out.span = std::max(out.span, free_at[s]);
  }
  for (int s = 0; s < p; ++s) out.bubble.push_back(1 - busy[s] / (out.span - 0));
  // Every (virtual stage, micro-batch) ran F, its input backward and its weight backward exactly once.
  for (int k = 0; k < V; ++k)
    for (int64_t j = 0; j < m; ++j)
      for (int kind = 0; kind < 3; ++kind)
        if (!out.deadlock) {
          EXPECT_TRUE(done.count({kind, k, j})) << "missing kind " << kind << " of " << k << "/" << j;
        }
  return out;
}
}  // namespace

TEST(ScheduleActions, OneFOneBWarmsUpByTheStagesBelow) {
  EXPECT_EQ(text(schedule_actions(Schedule::OneFOneB, 0, 2, 4)), "F0 F1 B0 F2 B1 F3 B2 B3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::OneFOneB, 1, 2, 4)), "F0 B0 F1 B1 F2 B2 F3 B3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::OneFOneB, 0, 4, 2)), "F0 F1 B0 B1 ");  // fewer micro-batches than stages
}

TEST(ScheduleActions, GPipeRunsEveryForwardFirst) {
  EXPECT_EQ(text(schedule_actions(Schedule::GPipe, 0, 2, 3)), "F0 F1 F2 B0 B1 B2 ");
  EXPECT_EQ(text(schedule_actions(Schedule::GPipe, 1, 2, 3)), "F0 F1 F2 B0 B1 B2 ");
}

TEST(ScheduleActions, OneStageAlternatesWhateverTheSchedule) {
  for (Schedule s : {Schedule::OneFOneB, Schedule::GPipe, Schedule::ZeroBubbleH1})
    EXPECT_EQ(text(schedule_actions(s, 0, 1, 3)), "F0 B0 F1 B1 F2 B2 ");
}

// Megatron-LM's order, written out by hand from forward_backward_pipelining_with_interleaving for
// p = 2, v = 2, m = 4: rank 0 warms up with (p - 1)·2 + (v - 1)·p = 4 forwards (micro-batches 0, 1
// on chunk 0, then 0, 1 on chunk 1), rank 1 with 2; backwards start on the last chunk.
TEST(ScheduleActions, InterleavedFollowsMegatronsOrder) {
  EXPECT_EQ(text(schedule_actions(Schedule::Interleaved1F1B, 0, 2, 4, 2)),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::Interleaved1F1B, 1, 2, 4, 2)),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3 ");
  // m = p: every forward first (Megatron's all-warm-up case).
  EXPECT_EQ(text(schedule_actions(Schedule::Interleaved1F1B, 1, 2, 2, 2)), "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1 ");
}

// ZB-H1 from its definition (Qi et al. 2023, PyTorch's ScheduleInterleavedZeroBubble with one stage
// per rank): 1F1B's warm-up of p - s - 1 forwards, then F and B (input gradient) alternating, the W
// of micro-batch j after the B of j + s, the s last W at the end.
TEST(ScheduleActions, ZeroBubbleH1DefersWeightGradientsByTheStage) {
  EXPECT_EQ(text(schedule_actions(Schedule::ZeroBubbleH1, 0, 2, 4)), "F0 F1 b0 w0 F2 b1 w1 F3 b2 w2 b3 w3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::ZeroBubbleH1, 1, 2, 4)), "F0 b0 F1 b1 w0 F2 b2 w1 F3 b3 w2 w3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::ZeroBubbleH1, 3, 4, 4)), "F0 b0 F1 b1 F2 b2 F3 b3 w0 w1 w2 w3 ");
  EXPECT_EQ(text(schedule_actions(Schedule::ZeroBubbleH1, 0, 4, 4)), "F0 F1 F2 F3 b0 w0 b1 w1 b2 w2 b3 w3 ");
}

TEST(ScheduleActions, EveryScheduleRunsEachMicroBatchOnceWithoutDeadlock) {
  for (int p : {2, 3, 4})
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{12}}) {
      for (Schedule s : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubbleH1}) {
        SCOPED_TRACE(std::string(schedule_name(s)) + " p " + std::to_string(p) + " m " + std::to_string(m));
        const auto sim = simulate(s, p, m, 1);
        EXPECT_FALSE(sim.deadlock);
        // Peak micro-batches alive (F until the last backward part): GPipe m, 1F1B min(p - s, m),
        // ZB-H1 at most min(p, m) on any stage, 1F1B's largest (its stage 0).
        for (int st = 0; st < p; ++st) {
          const int64_t expected = s == Schedule::GPipe ? m : std::min<int64_t>(p - st, m);
          if (s == Schedule::ZeroBubbleH1) EXPECT_LE(sim.max_alive[st], std::min<int64_t>(p, m));
          else EXPECT_EQ(sim.max_alive[st], expected) << "stage " << st;
        }
      }
      if (m % p != 0) continue;
      for (int v : {2, 3}) {
        SCOPED_TRACE("interleaved p " + std::to_string(p) + " m " + std::to_string(m) + " v " + std::to_string(v));
        EXPECT_FALSE(simulate(Schedule::Interleaved1F1B, p, m, v).deadlock);
      }
    }
}

// The simulated idle time (F = 1, whole backward = 2 per virtual stage; a chunk costs 1/v of a
// stage) is each schedule's formula: (p - 1)/(m + p - 1) for 1F1B, (p - 1)/(v·m + p - 1) for
// interleaved; ZB-H1 with B = W = 1 lowers 1F1B's bubble on every stage.
TEST(ScheduleActions, SimulatedBubbleFollowsTheFormula) {
  for (int p : {2, 4})
    for (int64_t m : {int64_t{4}, int64_t{8}}) {
      const auto one = simulate(Schedule::OneFOneB, p, m, 1);
      EXPECT_NEAR(one.bubble[0], schedule_bubble(Schedule::OneFOneB, p, m), 1e-12);
      const int v = 2;
      const auto inter = simulate(Schedule::Interleaved1F1B, p, m, v, 1.0 / v, 2.0 / v);
      EXPECT_NEAR(inter.bubble[0], schedule_bubble(Schedule::Interleaved1F1B, p, m, v), 1e-12) << p << " " << m;
      const auto zb = simulate(Schedule::ZeroBubbleH1, p, m, 1);
      double zb_mean = 0, one_mean = 0;
      for (int s = 0; s < p; ++s) zb_mean += zb.bubble[s] / p, one_mean += one.bubble[s] / p;
      EXPECT_LT(zb.span, one.span) << p << " " << m;
      EXPECT_LT(zb_mean, one_mean);
    }
}

TEST(ScheduleActions, RefusesWhatASchedulesCannotRun) {
  auto error = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([] { check_schedule(Schedule::Interleaved1F1B, 2, 2, 3, 4); })
                .find("gradient_accumulation_steps = 3) to be a multiple of parallelism.pipeline_parallel = 2"),
            std::string::npos);
  EXPECT_NE(error([] { check_schedule(Schedule::Interleaved1F1B, 2, 1, 4, 4); }).find("virtual_pipeline_parallel >= 2"),
            std::string::npos);
  EXPECT_NE(error([] { check_schedule(Schedule::Interleaved1F1B, 2, 2, 4, 6); }).find("6 decoder layers must split"),
            std::string::npos);
  EXPECT_NE(error([] { check_schedule(Schedule::OneFOneB, 2, 2, 4, 4); }).find("needs parallelism.pipeline_schedule"),
            std::string::npos);
  EXPECT_NE(error([] { parse_schedule("dualpipe"); }).find("\"interleaved_1f1b\" or \"zb_h1\""), std::string::npos);
  EXPECT_NE(error([] { check_schedule(Schedule::Interleaved1F1B, 1, 2, 4, 4); }).find("needs parallelism.pipeline_parallel >= 2"),
            std::string::npos);
  EXPECT_EQ(error([] { check_schedule(Schedule::Interleaved1F1B, 2, 2, 4, 4); }), "");
  EXPECT_EQ(error([] { check_schedule(Schedule::Interleaved1F1B, 1, 1, 3, 4); }), "");  // one stage: nothing to interleave
}

// The library's simulation (the planner's time model uses it) agrees with the one above.
TEST(ScheduleActions, LibrarySimulationAgreesWithTheTests) {
  for (Schedule s : {Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved1F1B, Schedule::ZeroBubbleH1})
    for (int p : {2, 4})
      for (int64_t m : {int64_t{4}, int64_t{8}}) {
        const int v = s == Schedule::Interleaved1F1B ? 2 : 1;
        const auto mine = simulate(s, p, m, v, 1.0 / v, 2.0 / v);
        const auto lib = simulate_schedule(s, p, m, v, std::vector<ActionCost>(p * v, {1.0 / v, 2.0 / v, 1.0 / v, 1.0 / v}));
        EXPECT_FALSE(lib.deadlock);
        EXPECT_DOUBLE_EQ(lib.span, mine.span) << schedule_name(s) << " p " << p << " m " << m;
        for (int st = 0; st < p; ++st) {
          EXPECT_DOUBLE_EQ(1 - lib.busy[st] / lib.span, mine.bubble[st]);
          EXPECT_EQ(lib.max_alive[st], mine.max_alive[st]);
        }
      }
}
