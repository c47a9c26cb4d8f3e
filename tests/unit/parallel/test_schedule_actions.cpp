// Schedules as action lists (parallel/pipeline/schedule.h): 1F1B's warm-up, GPipe's all-forwards
// order, and the one-stage schedule, which is F0 B0 F1 B1 ... whatever schedule the config names
// (GPipe on one stage would keep every micro-batch alive for nothing, and the planner counts one).
#include <gtest/gtest.h>

#include <string>

#include "parallel/pipeline/schedule.h"

using namespace shardlm::parallel::pp;

namespace {
std::string text(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) s += (a.kind == Action::Forward ? "F" : "B") + std::to_string(a.micro) + " ";
  return s;
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
  for (Schedule s : {Schedule::OneFOneB, Schedule::GPipe})
    EXPECT_EQ(text(schedule_actions(s, 0, 1, 3)), "F0 B0 F1 B1 F2 B2 ");
}
