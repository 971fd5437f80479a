#include "trainer/elastic/event_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_name.h"

namespace muster {
namespace {

const uint32_t* Crc32cTable() {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  return table;
}

uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void Tag(std::string* out, int field, int wire) { Varint(out, (uint64_t(field) << 3) | wire); }

void Bytes(std::string* out, int field, const std::string& data) {
  Tag(out, field, 2);
  Varint(out, data.size());
  out->append(data);
}

template <typename T>
void Fixed(std::string* out, int field, T v) {
  Tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  Fixed<double>(&e, 1, wall_time);
  Tag(&e, 2, 0);
  Varint(&e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  const uint32_t* table = Crc32cTable();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::unique_ptr<EventWriter>> EventWriter::Create(const std::string& dir,
                                                                 Clock* clock) {
  // The file name and the header carry the wall clock's time (records);
  // the process id keeps two writers of one second and host apart (as
  // TensorBoard's own writers name their files).
  const absl::Time wall = clock->WallNow();
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(wall),
                                        ".", HostName(), ".", ::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<EventWriter> w(new EventWriter(f, path));
  std::string e = EventHeader(absl::ToUnixMicros(wall) / 1e6, 0);
  Bytes(&e, 3, "brain.Event:2");
  w->WriteRecord(e);
  return w;
}

EventWriter::~EventWriter() { std::fclose(file_); }

void EventWriter::WriteRecord(const std::string& data) {
  char header[12];
  const uint64_t len = data.size();
  std::memcpy(header, &len, 8);
  const uint32_t len_crc = Masked(Crc32c(header, 8));
  std::memcpy(header + 8, &len_crc, 4);
  const uint32_t data_crc = Masked(Crc32c(data.data(), data.size()));
  std::fwrite(header, 1, 12, file_);
  std::fwrite(data.data(), 1, data.size(), file_);
  std::fwrite(&data_crc, 1, 4, file_);
}

void EventWriter::Scalar(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  Bytes(&v, 1, tag);
  Fixed<float>(&v, 2, value);
  std::string summary;
  Bytes(&summary, 1, v);
  std::string e = EventHeader(wall_time, step);
  Bytes(&e, 5, summary);
  WriteRecord(e);
}

void EventWriter::Flush() { std::fflush(file_); }

absl::StatusOr<std::unique_ptr<JsonLinesWriter>> JsonLinesWriter::Create(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<JsonLinesWriter>(new JsonLinesWriter(f));
}

JsonLinesWriter::~JsonLinesWriter() { std::fclose(file_); }

void JsonLinesWriter::Write(int64_t step, double wall_time,
                            const std::map<std::string, double>& values) {
  std::string line = absl::StrFormat("{\"step\": %d, \"time\": %.3f", step, wall_time);
  for (const auto& [k, v] : values) {
    if (std::isfinite(v)) {
      absl::StrAppendFormat(&line, ", \"%s\": %.8g", k, v);
    } else {
      absl::StrAppendFormat(&line, ", \"%s\": null", k);
    }
  }
  line += "}\n";
  std::fputs(line.c_str(), file_);
  std::fflush(file_);
}

}  // namespace muster
