// DeepSpeed's csv_monitor layout (deepspeed/monitor/csv_monitor.py): one file per tag in the
// monitor's directory, named by the tag with '/' and ' ' turned into '_' plus ".csv", holding a
// `step,<last part of the tag>` header and then `step,value` rows. Values are written as Python's
// csv module writes a float (the shortest text that reads back to the same double; nan, inf).
// A resumed run keeps each file's rows up to its checkpoint's step and drops the later ones, as
// metrics.jsonl does (lines_through_step), in every monitor file of the directory (also those of
// tags it does not write); a fresh run leaves each of them its header only.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "observe/metrics.h"

namespace shardlm::observe {

// The file name and header of a tag ("train/loss" -> "train_loss.csv", "step,loss").
std::string csv_file_name(const std::string& tag);
std::string csv_header(const std::string& tag);
// A value as Python's str(float) writes it.
std::string csv_value(double v);

class CsvMonitor : public MetricsSink {
 public:
  CsvMonitor(const std::string& dir, int64_t resumed_at_step);
  void write(const StepMetrics& m) override;  // one row in every tag's file (monitor_tag)
  void flush() override;                      // the queued rows, one write per file

 private:
  struct File {
    std::ofstream out;
    std::string pending;
  };
  File& open(const std::string& tag);
  std::string dir_;
  int64_t resumed_at_step_;
  std::map<std::string, File> files_;
};

}  // namespace shardlm::observe
