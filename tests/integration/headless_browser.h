// HeadlessBrowser: Debian's headless Chromium, driven over the Chrome
// DevTools Protocol on a pipe (--remote-debugging-pipe: the browser reads
// commands on its fd 3 and writes answers and events on its fd 4, each one
// JSON message ended by a NUL byte), so a test needs no WebSocket client.
// One page (tab); every call waits for its answer. Thread-compatible.
#ifndef MUSTER_TESTS_INTEGRATION_HEADLESS_BROWSER_H_
#define MUSTER_TESTS_INTEGRATION_HEADLESS_BROWSER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muster {

class HeadlessBrowser {
 public:
  // The browser's executable ("" when none is installed).
  static std::string Find();

  // Starts the browser with a fresh profile under `profile_dir` and opens
  // one blank page of `width` x `height` CSS pixels. Errors: UNAVAILABLE
  // when it cannot be started or does not answer.
  static absl::StatusOr<std::unique_ptr<HeadlessBrowser>> Start(const std::string& profile_dir,
                                                                int width, int height);
  ~HeadlessBrowser();

  // Loads `url` and waits for its load event.
  absl::Status Navigate(const std::string& url, absl::Duration timeout = absl::Seconds(20));
  // Evaluates `expression` in the page (promises awaited); its value as
  // JSON. Errors: INTERNAL with the page's exception.
  absl::StatusOr<nlohmann::json> Evaluate(const std::string& expression);
  // Evaluates `expression` until it is true, every 50 ms. An evaluation that
  // fails (a page between two documents has no context) counts as not yet.
  // Errors: DEADLINE_EXCEEDED, with the last evaluation's error if any.
  absl::Status WaitFor(const std::string& expression, absl::Duration timeout);
  // The page as a PNG file's bytes.
  absl::StatusOr<std::string> Screenshot();
  // Every URL the page has requested so far (documents, scripts, fetches).
  const std::vector<std::string>& requested_urls() const { return requested_; }

 private:
  HeadlessBrowser() = default;
  // Sends one command (to the page's session unless `browser_level`) and
  // returns its result, keeping the events that arrive meanwhile.
  absl::StatusOr<nlohmann::json> Call(const std::string& method, nlohmann::json params,
                                      bool browser_level = false,
                                      absl::Duration timeout = absl::Seconds(20));
  // The next message from the browser, or DEADLINE_EXCEEDED.
  absl::StatusOr<nlohmann::json> Read(absl::Time deadline);
  void Note(const nlohmann::json& event);

  pid_t pid_ = -1;
  int to_browser_ = -1;
  int from_browser_ = -1;
  std::string buffer_;
  int next_id_ = 1;
  std::string session_;
  bool loaded_ = false;
  std::vector<std::string> requested_;
};

}  // namespace muster

#endif  // MUSTER_TESTS_INTEGRATION_HEADLESS_BROWSER_H_
