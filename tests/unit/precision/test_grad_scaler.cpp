// The trainer's one loss-scaling object (precision/grad_scaler.h) in each of its modes.
#include <gtest/gtest.h>

#include <cmath>

#include "precision/grad_scaler.h"

using namespace shardlm::precision;

namespace {

GradScalerOptions fp16(bool per_unit) {
  GradScalerOptions o;
  o.enabled = true;
  o.per_unit_loss_scaling = per_unit;
  o.initial_scale_power = 4;  // 16
  o.hysteresis = 1;
  o.loss_scale_window = 2;
  o.min_loss_scale = 1;
  o.max_loss_scale = 1024;
  return o;
}

const std::vector<std::string> kNames = {"embed", "layers.0", "head"};

}  // namespace

TEST(GradScaler, WithoutFp16ItScalesByOneNeverReadsTheGradientsAndAlwaysSteps) {
  GradScaler s(GradScalerOptions{}, 3);
  EXPECT_EQ(s.loss_scale(), 1.0);
  EXPECT_TRUE(s.unit_scales().empty());
  bool read = false;
  const auto v = s.update(1, [&] { read = true; return std::vector<UnitGradient>(3); }, kNames);
  EXPECT_TRUE(v.step);
  EXPECT_FALSE(read);
  EXPECT_TRUE(s.metrics(kNames).empty());
}

TEST(GradScaler, OneDynamicScaleSkipsOnOverflowAndGrowsAfterTheWindow) {
  GradScaler s(fp16(false), 3);
  EXPECT_EQ(s.loss_scale(), 16.0);
  auto v = s.update(1, [] { return std::vector<UnitGradient>{{false, 1}, {true, 0}, {false, 1}}; }, kNames);
  EXPECT_FALSE(v.step);
  EXPECT_EQ(v.overflowed, "layers.0");
  EXPECT_EQ(s.loss_scale(), 8.0);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(s.update(2 + i, [] { return std::vector<UnitGradient>(3); }, kNames).step);
  EXPECT_EQ(s.loss_scale(), 16.0);  // doubled after loss_scale_window clean steps
  const auto m = s.metrics(kNames);
  EXPECT_EQ(m.size(), 3u);
  const auto restored_from = s.state();
  GradScaler t(fp16(false), 3);
  t.restore(restored_from);
  EXPECT_EQ(t.loss_scale(), 16.0);
  EXPECT_EQ(t.state().skipped_steps, 1);
}

TEST(GradScaler, PerUnitScalesFollowEachUnitsGradientsAndHalveOnlyTheHighestOverflow) {
  GradScaler s(fp16(true), 3);
  EXPECT_EQ(s.unit_scales(), (std::vector<double>{16, 16, 16}));
  EXPECT_TRUE(s.update(1, [] { return std::vector<UnitGradient>{{false, 1.0}, {false, 0}, {false, 3.0}}; }, kNames).step);
  // 2^floor(log2(4096 / max)): 4096 for max 1, capped at 1024; x16 for a unit without gradients; 1024 for 3.
  EXPECT_EQ(s.unit_scales(), (std::vector<double>{1024, 256, 1024}));
  EXPECT_EQ(s.loss_scale(), 1024.0);  // the head's
  const auto v = s.update(2, [] { return std::vector<UnitGradient>{{true, 0}, {true, 0}, {false, 1}}; }, kNames);
  EXPECT_FALSE(v.step);
  EXPECT_EQ(v.overflowed, "embed, layers.0");
  EXPECT_EQ(s.unit_scales(), (std::vector<double>{1024, 128, 1024}));  // only the highest overflowed unit halves
}

TEST(GradScaler, AnOverflowAtTheFloorStopsNamingTheUnits) {
  auto o = fp16(false);
  o.initial_scale_power = 0;  // already at min_loss_scale 1
  GradScaler s(o, 3);
  try {
    s.update(7, [] { return std::vector<UnitGradient>{{false, 0}, {false, 0}, {true, 0}}; }, kNames);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("head"), std::string::npos) << msg;
  }
}
