#include "tests/integration/headless_browser.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace muster {

std::string HeadlessBrowser::Find() {
  for (const char* path : {"/usr/bin/chromium-headless-shell", "/usr/bin/chromium"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<HeadlessBrowser>> HeadlessBrowser::Start(
    const std::string& profile_dir, int width, int height) {
  const std::string exe = Find();
  if (exe.empty()) return absl::UnavailableError("no headless Chromium is installed");
  int commands[2], answers[2];  // [0] read end, [1] write end
  if (::pipe2(commands, O_CLOEXEC) != 0 || ::pipe2(answers, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> argv = {exe,
                                   "--headless",
                                   "--remote-debugging-pipe",
                                   "--no-sandbox",  // tests run as root
                                   "--disable-gpu",
                                   "--no-first-run",
                                   "--hide-scrollbars",
                                   "--user-data-dir=" + profile_dir,
                                   absl::StrCat("--window-size=", width, ",", height),
                                   "about:blank"};
  const std::string log = profile_dir + ".log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The protocol's descriptors: commands in on 3, answers out on 4. Moved
    // above 4 first (either pipe end may be 3 or 4 already), and dup2
    // clears close-on-exec on the copies.
    const int in = ::fcntl(commands[0], F_DUPFD, 10);
    const int out_fd = ::fcntl(answers[1], F_DUPFD, 10);
    ::dup2(in, 3);
    ::dup2(out_fd, 4);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(commands[0]);
  ::close(answers[1]);
  std::unique_ptr<HeadlessBrowser> b(new HeadlessBrowser);
  b->pid_ = pid;
  b->to_browser_ = commands[1];
  b->from_browser_ = answers[0];
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));

  // The page opened with the browser, and a session attached to it.
  absl::StatusOr<nlohmann::json> targets =
      b->Call("Target.getTargets", nlohmann::json::object(), true, absl::Seconds(30));
  if (!targets.ok()) return targets.status();
  std::string target;
  for (const auto& t : (*targets)["targetInfos"]) {
    if (t["type"] == "page") target = t["targetId"];
  }
  if (target.empty()) {
    absl::StatusOr<nlohmann::json> created =
        b->Call("Target.createTarget", {{"url", "about:blank"}}, true);
    if (!created.ok()) return created.status();
    target = (*created)["targetId"];
  }
  absl::StatusOr<nlohmann::json> attached =
      b->Call("Target.attachToTarget", {{"targetId", target}, {"flatten", true}}, true);
  if (!attached.ok()) return attached.status();
  b->session_ = (*attached)["sessionId"];
  for (const char* domain : {"Page.enable", "Network.enable", "Runtime.enable"}) {
    if (absl::StatusOr<nlohmann::json> r = b->Call(domain, nlohmann::json::object()); !r.ok()) {
      return r.status();
    }
  }
  absl::StatusOr<nlohmann::json> sized = b->Call(
      "Emulation.setDeviceMetricsOverride",
      {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", false}});
  if (!sized.ok()) return sized.status();
  return b;
}

HeadlessBrowser::~HeadlessBrowser() {
  if (to_browser_ >= 0) ::close(to_browser_);  // the browser exits when its pipe closes
  if (from_browser_ >= 0) ::close(from_browser_);
  if (pid_ > 0) {
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (absl::Now() > end) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
}

absl::StatusOr<nlohmann::json> HeadlessBrowser::Read(absl::Time deadline) {
  for (;;) {
    const size_t end = buffer_.find('\0');
    if (end != std::string::npos) {
      nlohmann::json message = nlohmann::json::parse(buffer_.substr(0, end), nullptr, false);
      buffer_.erase(0, end + 1);
      if (message.is_discarded()) return absl::InternalError("the browser sent malformed JSON");
      return message;
    }
    const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (wait_ms <= 0) return absl::DeadlineExceededError("the browser did not answer in time");
    pollfd p{from_browser_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait_ms)) <= 0) continue;
    char buf[1 << 16];
    const ssize_t n = ::read(from_browser_, buf, sizeof(buf));
    if (n <= 0) return absl::UnavailableError("the browser closed its pipe (it exited)");
    buffer_.append(buf, n);
  }
}

void HeadlessBrowser::Note(const nlohmann::json& event) {
  const std::string method = event.value("method", "");
  if (method == "Network.requestWillBeSent") {
    requested_.push_back(event["params"]["request"]["url"]);
  } else if (method == "Page.loadEventFired") {
    loaded_ = true;
  }
}

absl::StatusOr<nlohmann::json> HeadlessBrowser::Call(const std::string& method,
                                                     nlohmann::json params, bool browser_level,
                                                     absl::Duration timeout) {
  const int id = next_id_++;
  nlohmann::json command = {{"id", id}, {"method", method}, {"params", std::move(params)}};
  if (!browser_level) command["sessionId"] = session_;
  const std::string text = command.dump() + std::string(1, '\0');
  for (size_t sent = 0; sent < text.size();) {
    const ssize_t n = ::write(to_browser_, text.data() + sent, text.size() - sent);
    if (n <= 0) return absl::UnavailableError(absl::StrCat(method, ": the browser's pipe broke"));
    sent += static_cast<size_t>(n);
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<nlohmann::json> message = Read(deadline);
    if (!message.ok()) {
      return absl::Status(message.status().code(),
                          absl::StrCat(method, ": ", message.status().message()));
    }
    if (!message->contains("id")) {
      Note(*message);
      continue;
    }
    if ((*message)["id"] != id) continue;
    if (message->contains("error")) {
      return absl::InternalError(absl::StrCat(method, ": ", (*message)["error"].dump()));
    }
    return (*message)["result"];
  }
}

absl::Status HeadlessBrowser::Navigate(const std::string& url, absl::Duration timeout) {
  loaded_ = false;
  absl::StatusOr<nlohmann::json> r = Call("Page.navigate", {{"url", url}});
  if (!r.ok()) return r.status();
  if (r->contains("errorText")) {
    return absl::UnavailableError(absl::StrCat("cannot load ", url, ": ", (*r)["errorText"].dump()));
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!loaded_) {
    absl::StatusOr<nlohmann::json> event = Read(deadline);
    if (!event.ok()) return event.status();
    Note(*event);
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> HeadlessBrowser::Evaluate(const std::string& expression) {
  absl::StatusOr<nlohmann::json> r =
      Call("Runtime.evaluate",
           {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}});
  if (!r.ok()) return r.status();
  if (r->contains("exceptionDetails")) {
    return absl::InternalError(
        absl::StrCat("the page threw on `", expression, "`: ", (*r)["exceptionDetails"].dump()));
  }
  return (*r)["result"].value("value", nlohmann::json());
}

absl::Status HeadlessBrowser::WaitFor(const std::string& expression, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  absl::Status last_error = absl::OkStatus();
  for (;;) {
    // A page that is navigating (a form just submitted) has, for a moment,
    // no context to evaluate in: that is "not yet", not a failure.
    absl::StatusOr<nlohmann::json> v = Evaluate(expression);
    if (v.ok() && *v == true) return absl::OkStatus();
    if (!v.ok()) last_error = v.status();
    if (absl::Now() > end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "`", expression, "` did not become true within ", absl::FormatDuration(timeout),
          last_error.ok() ? "" : absl::StrCat(" (last error: ", last_error.ToString(), ")")));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<std::string> HeadlessBrowser::Screenshot() {
  absl::StatusOr<nlohmann::json> r =
      Call("Page.captureScreenshot", {{"format", "png"}, {"captureBeyondViewport", true}});
  if (!r.ok()) return r.status();
  std::string png;
  if (!absl::Base64Unescape((*r)["data"].get<std::string>(), &png)) {
    return absl::InternalError("the screenshot is not base64");
  }
  return png;
}

}  // namespace muster
