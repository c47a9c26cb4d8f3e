// See tensorboard_writer.h. Event (event.proto): wall_time = 1 (double), step = 2 (int64),
// file_version = 3 (string), summary = 5 (Summary), session_log = 7 (SessionLog), source_metadata =
// 10 (SourceMetadata: writer = 1). Summary: value = 1 (repeated Value: tag = 1, simple_value = 2
// (float)). SessionLog: status = 1 (START = 1).
#include "observe/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "observe/protobuf_wire.h"
#include "util/crc32c.h"
#include "util/error.h"

namespace shardlm::observe {
namespace fs = std::filesystem;

namespace tb {

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(0, data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string record(std::string_view data) {
  std::string out, length;
  pb::put_little_endian(length, static_cast<uint64_t>(data.size()));
  out.reserve(data.size() + 16);
  out += length;
  pb::put_little_endian(out, masked_crc32c(length));
  out.append(data.data(), data.size());
  pb::put_little_endian(out, masked_crc32c(data));
  return out;
}

namespace {
// Event's wall_time and step; proto3 leaves zeros out.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  if (wall_time != 0) pb::put_double(e, 1, wall_time);
  if (step != 0) pb::put_int64(e, 2, step);
  return e;
}
}  // namespace

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0), source;
  pb::put_bytes(e, 3, "brain.Event:2");
  pb::put_bytes(source, 1, "shardlm");
  pb::put_bytes(e, 10, source);
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string e = event_head(wall_time, step), log;
  pb::put_int64(log, 1, 1);  // SessionLog.START
  pb::put_bytes(e, 7, log);
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary, value;
  for (const auto& [tag, v] : scalars) {
    value.clear();
    pb::put_bytes(value, 1, tag);
    pb::put_float(value, 2, static_cast<float>(v));  // a oneof member: written even when 0
    pb::put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  pb::put_bytes(e, 5, summary);
  return e;
}

std::string event_file_name(int64_t unix_seconds, const std::string& host, int64_t pid) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(unix_seconds));
  return "events.out.tfevents." + std::string(seconds) + "." + host + "." + std::to_string(pid) + ".0";
}

}  // namespace tb

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The time field of the newest event file in `dir` (0 when there is none).
int64_t newest_event_seconds(const std::string& dir) {
  const std::string prefix = "events.out.tfevents.";
  int64_t newest = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    newest = std::max<int64_t>(newest, std::strtoll(name.c_str() + prefix.size(), nullptr, 10));
  }
  return newest;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create the TensorBoard directory '", dir, "': ", ec.message());
  const double wall = now_seconds();
  const int64_t seconds = std::max(static_cast<int64_t>(wall), newest_event_seconds(dir) + 1);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = (fs::path(dir) / tb::event_file_name(seconds, host, getpid())).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create TensorBoard event file '", path_, "': ", std::strerror(errno));
  pending_ = tb::record(tb::file_version_event(wall)) + tb::record(tb::session_start_event(wall, first_step));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const Error& e) {
    std::fprintf(stderr, "shardlm: %s\n", e.what());
  }
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::add_scalars(int64_t step, const Scalars& scalars) {
  pending_ += tb::record(tb::scalars_event(now_seconds(), step, scalars));
}

void TensorBoardWriter::flush() {
  size_t done = 0;
  while (done < pending_.size()) {
    const ssize_t n = ::write(fd_, pending_.data() + done, pending_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing TensorBoard events to '", path_, "' failed: ", std::strerror(errno), " (disk full?)");
    done += static_cast<size_t>(n);
  }
  pending_.clear();
}

}  // namespace shardlm::observe
