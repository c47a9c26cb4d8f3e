// Dynamic loss scaling follows DeepSpeed's DynamicLossScaler step by step.
#include <gtest/gtest.h>

#include "precision/loss_scaler.h"

using shardlm::precision::LossScaler;
using shardlm::precision::LossScalerOptions;

TEST(LossScaler, HysteresisThenHalvingThenGrowthAfterTheWindow) {
  LossScalerOptions o;
  o.initial_scale_power = 4;  // 16
  o.loss_scale_window = 3;
  o.hysteresis = 2;
  o.min_loss_scale = 2;
  LossScaler s(o);
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // absorbed by hysteresis
  EXPECT_EQ(s.scale(), 16);
  s.update(true);  // now halves
  EXPECT_EQ(s.scale(), 8);
  s.update(true);  // hysteresis stays used up until a window of clean steps
  EXPECT_EQ(s.scale(), 4);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 4);
  s.update(false);  // 3 clean steps since the last overflow: double, hysteresis restored
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.at_floor());
}

TEST(LossScaler, FloorAndStaticScale) {
  LossScalerOptions o;
  o.initial_scale_power = 1;  // 2
  o.hysteresis = 1;
  o.min_loss_scale = 1;
  LossScaler s(o);
  EXPECT_FALSE(s.at_floor());
  s.update(true);
  EXPECT_EQ(s.scale(), 1);
  EXPECT_TRUE(s.at_floor());
  s.update(true);
  EXPECT_EQ(s.scale(), 1);  // never below the floor
  LossScalerOptions fixed;
  fixed.loss_scale = 128;
  LossScaler st(fixed);
  st.update(true);
  st.update(false);
  EXPECT_EQ(st.scale(), 128);
  EXPECT_TRUE(st.at_floor());  // a static scale cannot absorb an overflow
}
