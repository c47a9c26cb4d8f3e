// CRC-32C, which checkpoint.json records per shard: the standard check value, continuation across
// blocks (files are read in 4 MiB pieces), and one flipped bit changing it.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "util/crc32c.h"

using namespace shardlm;

TEST(Crc32c, StandardCheckValueAndContinuation) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(0, s.data(), s.size()), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c(crc32c(0, s.data(), 4), s.data() + 4, 5), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  EXPECT_EQ(crc32c_portable(0, s.data(), s.size()), 0xE3069283u);
}

TEST(Crc32c, InstructionPathEqualsTablesAtEveryLengthAndAlignment) {
  std::string data(4099, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 2654435761u >> 11);
  for (size_t start : {0, 1, 3, 7})
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 4000}) {
      const uint32_t seed = static_cast<uint32_t>(start * 977 + len);
      EXPECT_EQ(crc32c(seed, data.data() + start, len), crc32c_portable(seed, data.data() + start, len))
          << "start " << start << " len " << len;
    }
}

TEST(Crc32c, FileMatchesBufferAndSeesOneFlippedBit) {
  std::string data(10 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 2654435761u >> 13);
  const std::string path = ::testing::TempDir() + "/crc32c_test.bin";
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  const uint32_t whole = crc32c(0, data.data(), data.size());
  EXPECT_EQ(crc32c_file(path), whole);
  data[7 << 20] ^= 0x10;
  EXPECT_NE(crc32c(0, data.data(), data.size()), whole);
  std::remove(path.c_str());
}
