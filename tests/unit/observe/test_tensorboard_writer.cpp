// The hand-written TensorBoard encoder (observe/tensorboard_writer.h, protobuf_wire.h) against the
// pinned tensorboard package: CRC-32C and TFRecord's masked CRC, varints, and four events compared
// byte for byte with tests/golden/tensorboard_events.bin, which tests/reference/
// make_tensorboard_golden.py writes with tensorboard's own RecordWriter and protobuf. Then the file
// writer (names, resume), the CSV monitor's layout and resume truncation, and the monitors' tags
// and directories.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../data/test_helpers.h"
#include "observe/csv_monitor.h"
#include "observe/monitors.h"
#include "observe/protobuf_wire.h"
#include "observe/tensorboard_writer.h"
#include "util/crc32c.h"
#include "util/error.h"

using namespace shardlm;
using namespace shardlm::observe;
namespace fs = std::filesystem;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string varint(uint64_t v) {
  std::string out;
  pb::put_varint(out, v);
  return out;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += std::string{digits[c >> 4], digits[c & 15], ' '};
  return out;
}

}  // namespace

TEST(TensorBoardEncoder, Crc32cAndTheMaskedCrcAreTensorboards) {
  // tensorboard.compat.tensorflow_stub.pywrap_tensorflow: crc32c(b"123456789") 0xe3069283,
  // masked_crc32c of it 0xc78ab0e5, of b"" 0xa282ead8.
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xe3069283u);
  EXPECT_EQ(tb::masked_crc32c("123456789"), 0xc78ab0e5u);
  EXPECT_EQ(tb::masked_crc32c(""), 0xa282ead8u);
}

TEST(TensorBoardEncoder, VarintsAreLittleEndianBase128) {
  EXPECT_EQ(hex(varint(0)), "00 ");
  EXPECT_EQ(hex(varint(1)), "01 ");
  EXPECT_EQ(hex(varint(127)), "7f ");
  EXPECT_EQ(hex(varint(128)), "80 01 ");
  EXPECT_EQ(hex(varint(300)), "ac 02 ");
  EXPECT_EQ(hex(varint(uint64_t{1} << 40)), "80 80 80 80 80 20 ");
  EXPECT_EQ(hex(varint(~uint64_t{0})), "ff ff ff ff ff ff ff ff ff 01 ");
  std::string minus_one;
  pb::put_int64(minus_one, 2, -1);  // proto3 int64: 10 bytes after the tag
  EXPECT_EQ(hex(minus_one), "10 ff ff ff ff ff ff ff ff ff 01 ");
}

TEST(TensorBoardEncoder, EventsEqualTensorboardsOwnBytes) {
  const double wall = 1765000000.25;
  std::string mine = tb::record(tb::file_version_event(wall)) + tb::record(tb::session_start_event(wall, 7)) +
                     tb::record(tb::scalars_event(1765000012.5, 300,
                                                  {{"train/loss", 2.75},
                                                   {"train/learning_rate", 3e-4},
                                                   {"train/grad_norm", NAN},
                                                   {"train/tokens_per_s", 123456.789},
                                                   {"train/zero", 0.0},
                                                   {"train/negative", -1e-20},
                                                   {"train/huge", 1e39}})) +
                     tb::record(tb::scalars_event(0.0, int64_t{1} << 40, {{"eval/loss", 0.5}}));
  const std::string golden = read_file(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/tensorboard_events.bin");
  ASSERT_FALSE(golden.empty()) << "tests/golden/tensorboard_events.bin is missing (tests/reference/make_tensorboard_golden.py)";
  EXPECT_EQ(hex(mine), hex(golden));
}

TEST(TensorBoardWriter, NewFileAfterTheOnesThereWithStartAtTheFirstStep) {
  data::testing::TempDir tmp;
  const std::string dir = tmp.file("tb/job/nested");
  std::string first;
  {
    TensorBoardWriter w(dir, 1);
    first = w.path();
    w.add_scalars(1, {{"train/loss", 1.5}});
    EXPECT_EQ(read_file(first).size(), tb::record(tb::file_version_event(1)).size() +
                                           tb::record(tb::session_start_event(1, 1)).size())
        << "queued records reach the file at flush";
  }  // closing flushes
  const std::string name = fs::path(first).filename().string();
  ASSERT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(getpid()) + ".0"), std::string::npos) << name;
  const std::string bytes = read_file(first);
  const std::string head = tb::record(tb::file_version_event(0));  // its length: the wall time is 8 bytes either way
  ASSERT_GT(bytes.size(), head.size());
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  // A resumed run: the old file stays as it was; the new one sorts after it and starts at step 4.
  TensorBoardWriter resumed(dir, 4);
  EXPECT_NE(resumed.path(), first);
  EXPECT_GT(fs::path(resumed.path()).filename().string(), name);
  EXPECT_EQ(read_file(first), bytes);
  const std::string start = tb::session_start_event(0, 4);  // no wall time: its tail is the step and status
  EXPECT_NE(read_file(resumed.path()).find(start), std::string::npos);
}

TEST(CsvMonitor, DeepSpeedsLayoutAndPythonsFloats) {
  EXPECT_EQ(csv_file_name("train/loss"), "train_loss.csv");
  EXPECT_EQ(csv_file_name("Train/Samples/elapsed time"), "Train_Samples_elapsed_time.csv");
  EXPECT_EQ(csv_header("train/learning_rate"), "step,learning_rate");
  EXPECT_EQ(csv_header("loss"), "step,loss");
  EXPECT_EQ(csv_value(0.1), "0.1");
  EXPECT_EQ(csv_value(3.0), "3.0");
  EXPECT_EQ(csv_value(1e-05), "1e-05");
  EXPECT_EQ(csv_value(NAN), "nan");
  EXPECT_EQ(csv_value(-INFINITY), "-inf");
}

TEST(CsvMonitor, AResumedRunDropsTheRowsPastItsStep) {
  data::testing::TempDir tmp;
  const std::string dir = tmp.file("csv");
  auto step = [](int64_t s, double loss) {
    StepMetrics m;
    m.step = s, m.loss = loss, m.lr = 0.01;
    return m;
  };
  {
    CsvMonitor csv(dir, 0);
    for (int s = 1; s <= 5; ++s) csv.write(step(s, s * 0.5));
    csv.flush();
  }
  EXPECT_EQ(read_file(dir + "/train_loss.csv"), "step,loss\n1,0.5\n2,1.0\n3,1.5\n4,2.0\n5,2.5\n");
  std::ofstream(dir + "/train_loss.csv", std::ios::app) << "6,3.";  // a row cut by a kill
  std::ofstream(dir + "/train_other.csv") << "step,other\n2,1.0\n4,2.0\n";  // a tag the resumed run never writes
  std::ofstream(dir + "/notes.csv") << "mine\n";                              // not a monitor file
  {
    CsvMonitor csv(dir, 3);
    csv.write(step(4, 9.0));
    csv.flush();
  }
  EXPECT_EQ(read_file(dir + "/train_loss.csv"), "step,loss\n1,0.5\n2,1.0\n3,1.5\n4,9.0\n");
  EXPECT_EQ(read_file(dir + "/train_learning_rate.csv"), "step,learning_rate\n1,0.01\n2,0.01\n3,0.01\n4,0.01\n");
  EXPECT_EQ(read_file(dir + "/train_other.csv"), "step,other\n2,1.0\n");
  EXPECT_EQ(read_file(dir + "/notes.csv"), "mine\n");
  {
    CsvMonitor fresh(dir, 0);  // a run that starts over
    fresh.write(step(1, 7.0));
  }  // not flushed: the header alone
  EXPECT_EQ(read_file(dir + "/train_loss.csv"), "step,loss\n");
  EXPECT_EQ(read_file(dir + "/train_other.csv"), "step,other\n");
}

TEST(Monitors, TagsAreHuggingFacesWhereItHasOne) {
  EXPECT_EQ(monitor_tag("loss"), "train/loss");
  EXPECT_EQ(monitor_tag("lr"), "train/learning_rate");
  EXPECT_EQ(monitor_tag("grad_norm"), "train/grad_norm");
  EXPECT_EQ(monitor_tag("val_loss"), "eval/loss");
  EXPECT_EQ(monitor_tag("tokens_per_s"), "train/tokens_per_s");
  EXPECT_EQ(monitor_tag("moe_dropped_tokens"), "train/moe_dropped_tokens");
}

TEST(Monitors, DirectoriesFollowDeepSpeedAndRefuseClimbingOut) {
  MonitorConfig m;
  EXPECT_EQ(monitor_dir(m, "tensorboard"), "DeepSpeedJobName");
  m.output_path = "/tmp/tb", m.job_name = "exp1/run2";
  EXPECT_EQ(monitor_dir(m, "tensorboard"), "/tmp/tb/exp1/run2");
  for (const char* bad : {"../up", "a/../../b", "..", "/abs"}) {
    m.job_name = bad;
    try {
      monitor_dir(m, "csv_monitor");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("csv_monitor.job_name"), std::string::npos) << e.what();
    }
  }
}
