// TensorBoard event files (events.out.tfevents.*) written without TensorFlow or a protobuf library:
// TFRecord framing (length, masked CRC-32C of the length, the record, masked CRC-32C of the record)
// around hand-encoded `Event` messages (tensorboard/compat/proto/event.proto): file_version
// "brain.Event:2" first, then a SessionLog START at the first step this run writes (so TensorBoard
// purges what a crashed run wrote past its checkpoint, as torch's SummaryWriter(purge_step=...)
// does), then one Event per step whose Summary holds every scalar as a `simple_value`.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm::observe {

using Scalars = std::vector<std::pair<std::string, double>>;  // (tag, value)

namespace tb {
// TFRecord's masked CRC-32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length, masked crc of those 8 bytes, the data, masked crc of the data.
std::string record(std::string_view data);
// Serialised Event messages (fields in number order, proto3 defaults left out, as protobuf writes them).
std::string file_version_event(double wall_time);
std::string session_start_event(double wall_time, int64_t step);
std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars);
// "events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>.0", the name tensorboard's
// EventFileWriter gives (torch's SummaryWriter uses it).
std::string event_file_name(int64_t unix_seconds, const std::string& host, int64_t pid);
}  // namespace tb

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it, leaving existing ones untouched. Its time field is
  // at least one second past every event file already there, so TensorBoard (which reads a
  // directory's files in name order) reads this run after the runs it continues; `first_step`
  // is the step of its SessionLog START.
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Queues one step's scalars; they reach the file at flush().
  void add_scalars(int64_t step, const Scalars& scalars);
  // Writes the queued records with one write(2), so a kill leaves whole records behind.
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_, pending_;
  int fd_ = -1;
};

}  // namespace shardlm::observe
