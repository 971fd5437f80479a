// Metrics files: JSON lines, and TensorBoard event files (scalars) that
// TensorBoard and tensorboard's Python EventFileReader read.
//
// TensorBoard's format is TFRecord framing (uint64 length, masked CRC-32C
// of the length, data, masked CRC-32C of the data) around serialized
// tensorflow.Event messages; the few fields needed are encoded here by hand
// (Event: wall_time=1 double, step=2 int64, file_version=3 string,
// summary=5; Summary.value=1; Value: tag=1 string, simple_value=2 float).
//
// Not thread-safe: one writer per thread.
#ifndef MUSTER_TRAINER_ELASTIC_EVENT_WRITER_H_
#define MUSTER_TRAINER_ELASTIC_EVENT_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace muster {

uint32_t Crc32c(const void* data, size_t n);

class EventWriter {
 public:
  // Creates DIR/events.out.tfevents.<unix seconds>.<host>.<pid>, the seconds and
  // the header's wall_time of `clock`'s WallNow() (used only here; not
  // owned). Errors: UNAVAILABLE when the file cannot be created.
  static absl::StatusOr<std::unique_ptr<EventWriter>> Create(const std::string& dir,
                                                             Clock* clock);
  ~EventWriter();
  void Scalar(const std::string& tag, float value, int64_t step, double wall_time);
  void Flush();
  const std::string& path() const { return path_; }

 private:
  EventWriter(std::FILE* f, std::string path) : file_(f), path_(std::move(path)) {}
  void WriteRecord(const std::string& data);
  std::FILE* file_;
  std::string path_;
};

class JsonLinesWriter {
 public:
  static absl::StatusOr<std::unique_ptr<JsonLinesWriter>> Create(const std::string& path);
  ~JsonLinesWriter();
  // One line: {"step": S, "time": T, "k": v, ...}.
  void Write(int64_t step, double wall_time, const std::map<std::string, double>& values);

 private:
  explicit JsonLinesWriter(std::FILE* f) : file_(f) {}
  std::FILE* file_;
};

}  // namespace muster

#endif  // MUSTER_TRAINER_ELASTIC_EVENT_WRITER_H_
