// The one byte-size convention (util/units.h): K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024,
// and what format_bytes prints parses back.
#include <gtest/gtest.h>

#include <cmath>

#include "util/error.h"
#include "util/units.h"

using shardlm::util::format_bytes;
using shardlm::util::parse_bytes;

TEST(Units, ParsesSiAndIecSizes) {
  EXPECT_DOUBLE_EQ(parse_bytes("4KB"), 4000);
  EXPECT_DOUBLE_EQ(parse_bytes("4K"), 4000);
  EXPECT_DOUBLE_EQ(parse_bytes("4kb"), 4000);
  EXPECT_DOUBLE_EQ(parse_bytes("4KiB"), 4096);
  EXPECT_DOUBLE_EQ(parse_bytes("4Ki"), 4096);
  EXPECT_DOUBLE_EQ(parse_bytes("16MB"), 16e6);
  EXPECT_DOUBLE_EQ(parse_bytes("16 MiB"), 16.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(parse_bytes("32GB"), 32e9);
  EXPECT_DOUBLE_EQ(parse_bytes("80GiB"), 80.0 * (1ll << 30));
  EXPECT_DOUBLE_EQ(parse_bytes("1TiB"), 1099511627776.0);
  EXPECT_DOUBLE_EQ(parse_bytes("2e8"), 2e8);
  EXPECT_DOUBLE_EQ(parse_bytes("4096"), 4096);
  EXPECT_DOUBLE_EQ(parse_bytes("1.5GB"), 1.5e9);
  EXPECT_DOUBLE_EQ(parse_bytes("512B"), 512);
  for (const char* bad : {"", "MB", "-1GB", "4XB", "4KIIB", "nan", "inf", "4 K B", "12BB"})
    EXPECT_THROW(parse_bytes(bad), shardlm::Error) << bad;
}

TEST(Units, FormatsExactBinarySizesInIecAndTheRestInSi) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(4096), "4 KiB");
  EXPECT_EQ(format_bytes(256 << 20), "256 MiB");
  EXPECT_EQ(format_bytes(2.0 * (1ll << 30)), "2 GiB");
  EXPECT_EQ(format_bytes(1536.0 * 1024), "1.6 MB");  // 1536 KiB: not a round binary size
  EXPECT_EQ(format_bytes(1.2e6), "1.2 MB");
  EXPECT_EQ(format_bytes(32e9), "32.0 GB");
  EXPECT_EQ(format_bytes(896e9), "896.0 GB");
  EXPECT_EQ(format_bytes(3.5e12), "3.5 TB");
  for (double b : {4096.0, 3.0 * (1 << 20), 123456789.0, 7e9, 999.0}) {
    const double back = parse_bytes(format_bytes(b));
    EXPECT_NEAR(back, b, 0.05 * b) << format_bytes(b);
  }
}

TEST(Units, FormatsDurations) {
  using shardlm::util::format_duration;
  EXPECT_EQ(format_duration(0.0125), "12.5 ms");
  EXPECT_EQ(format_duration(2.345), "2.35 s");
  EXPECT_EQ(format_duration(62), "62 s");
  EXPECT_EQ(format_duration(250), "4m10s");
  EXPECT_EQ(format_duration(3 * 3600 + 5 * 60 + 7), "3h05m");
  EXPECT_EQ(format_duration(-0.5), "-500 ms");
  EXPECT_EQ(format_duration(NAN), "?");
}
