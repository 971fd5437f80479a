// Minimal leveled logging to stderr: one line per message, with UTC time,
// level and source location. Thread-safe (each line is written with a single
// write call).
//
//   MUSTER_LOG(INFO) << "generation " << gen << " formed";
//
// The minimum level comes from SetMinLogLevel() (default INFO).
#ifndef MUSTER_COMMON_LOGGING_H_
#define MUSTER_COMMON_LOGGING_H_

#include <sstream>

namespace muster {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

// One message; written when destroyed.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace muster

#define MUSTER_LOG_LEVEL_DEBUG ::muster::LogLevel::kDebug
#define MUSTER_LOG_LEVEL_INFO ::muster::LogLevel::kInfo
#define MUSTER_LOG_LEVEL_WARNING ::muster::LogLevel::kWarning
#define MUSTER_LOG_LEVEL_ERROR ::muster::LogLevel::kError

namespace muster {
// Turns `stream << ...` into void so it can stand in a conditional
// expression (which keeps MUSTER_LOG safe inside an unbraced if/else).
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace muster

#define MUSTER_LOG(level)                                        \
  (MUSTER_LOG_LEVEL_##level < ::muster::MinLogLevel())           \
      ? (void)0                                                  \
      : ::muster::LogVoidify() &                                 \
            ::muster::LogMessage(MUSTER_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#endif  // MUSTER_COMMON_LOGGING_H_
