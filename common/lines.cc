#include "common/lines.h"

#include <iostream>
#include <mutex>

namespace muster {

LineSink StandardOutput() {
  return [](std::string_view line) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    std::cout << line << std::endl;
  };
}

}  // namespace muster
