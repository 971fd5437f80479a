#include "coordinator/status_page.h"

#include <CivetServer.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/token.h"
#include "coordinator/web/assets.h"
#include "nlohmann/json.hpp"

namespace muster {
namespace {

constexpr char kCookie[] = "muster_session";
constexpr size_t kMaxSessions = 64;
constexpr absl::Duration kSessionLife = absl::Hours(12);
constexpr size_t kEvents = 300;

void Send(mg_connection* conn, int code, const char* reason, const char* type,
          absl::string_view body, const std::string& extra_headers = "") {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            "X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n%s\r\n",
            code, reason, type, body.size(), extra_headers.c_str());
  mg_write(conn, body.data(), body.size());
}

void Redirect(mg_connection* conn, const char* to, const std::string& extra_headers = "") {
  mg_printf(conn,
            "HTTP/1.1 303 See Other\r\nLocation: %s\r\nContent-Length: 0\r\n"
            "Cache-Control: no-store\r\n%s\r\n",
            to, extra_headers.c_str());
}

std::string RandomId() {
  unsigned char bytes[16] = {};
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::read(fd, bytes, sizeof(bytes)) == sizeof(bytes);
  if (fd >= 0) ::close(fd);
  if (!ok) return "";
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

// The value of form field `name` in an application/x-www-form-urlencoded
// body.
std::string FormField(const std::string& body, const char* name) {
  std::vector<char> out(body.size() + 1);
  const int n = mg_get_var(body.data(), body.size(), name, out.data(), out.size());
  return n < 0 ? "" : std::string(out.data(), static_cast<size_t>(n));
}

class StatusPageImpl final : public StatusPage, public CivetHandler {
 public:
  StatusPageImpl(std::string token, Coordinator* coordinator)
      : token_(std::move(token)), coordinator_(coordinator) {}

  absl::Status Init(const std::string& listen) {
    // CivetWeb takes "host:port"; an IPv6 host would need brackets.
    const std::vector<std::string> options = {
        "listening_ports", listen, "num_threads", "4", "request_timeout_ms", "10000",
        "enable_keep_alive", "yes", "max_request_size", "16384"};
    try {
      server_ = std::make_unique<CivetServer>(options);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve the status page on ", listen, ": ", e.what()));
    }
    const std::vector<int> ports = server_->getListeningPorts();
    if (ports.empty() || ports[0] <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot serve the status page on ", listen));
    }
    port_ = ports[0];
    server_->addHandler("/", this);
    MUSTER_LOG(INFO) << "status page on port " << port_
                     << (token_.empty() ? ", no token" : ", token required");
    return absl::OkStatus();
  }

  ~StatusPageImpl() override {
    if (server_ != nullptr) server_->close();
  }

  int port() const override { return port_; }

  bool handleGet(CivetServer* /*server*/, mg_connection* conn) override {
    const std::string uri = mg_get_request_info(conn)->local_uri;
    if (uri == "/login") {
      Send(conn, 200, "OK", "text/html; charset=utf-8", web::kLoginHtml);
      return true;
    }
    const bool authorized = Authorized(conn);
    if (uri == "/api/status") {
      if (!authorized) {
        Send(conn, 401, "Unauthorized", "application/json",
             R"json({"error": "the job token is needed (Authorization: Bearer, or /login)"})json",
             "WWW-Authenticate: Bearer realm=\"muster\"\r\n");
        return true;
      }
      Send(conn, 200, "OK", "application/json", StatusJson(coordinator_));
      return true;
    }
    if (uri == "/" || uri == "/index.html") {
      if (!authorized) {
        Redirect(conn, "/login");
        return true;
      }
      Send(conn, 200, "OK", "text/html; charset=utf-8", web::kIndexHtml);
      return true;
    }
    if (uri == "/app.js") {
      Send(conn, 200, "OK", "text/javascript; charset=utf-8", web::kAppJs);
      return true;
    }
    if (uri == "/style.css") {
      Send(conn, 200, "OK", "text/css; charset=utf-8", web::kStyleCss);
      return true;
    }
    Send(conn, 404, "Not Found", "text/plain", "not found\n");
    return true;
  }

  bool handlePost(CivetServer* /*server*/, mg_connection* conn) override {
    const std::string uri = mg_get_request_info(conn)->local_uri;
    if (uri == "/logout") {
      std::string id;
      if (CivetServer::getCookie(conn, kCookie, id) > 0) {
        absl::MutexLock lock(&mu_);
        sessions_.erase(id);
      }
      Redirect(conn, "/login",
               absl::StrCat("Set-Cookie: ", kCookie, "=; Max-Age=0; Path=/; HttpOnly; "
                            "SameSite=Strict\r\n"));
      return true;
    }
    if (uri != "/login") {
      Send(conn, 404, "Not Found", "text/plain", "not found\n");
      return true;
    }
    std::string body(16384, '\0');
    int n = 0, got = 0;
    while (got < static_cast<int>(body.size()) &&
           (n = mg_read(conn, body.data() + got, body.size() - got)) > 0) {
      got += n;
    }
    body.resize(static_cast<size_t>(got));
    if (!token_.empty() && !ConstantTimeEquals(FormField(body, "token"), token_)) {
      std::string page(web::kLoginHtml);
      const std::string marker = "<!--error-->";
      const size_t at = page.find(marker);
      if (at != std::string::npos) {
        page.replace(at, marker.size(), "<p class=\"error\">That is not this job's token.</p>");
      }
      Send(conn, 401, "Unauthorized", "text/html; charset=utf-8", page);
      return true;
    }
    const std::string id = NewSession();
    if (id.empty()) {
      Send(conn, 500, "Internal Server Error", "text/plain", "no randomness\n");
      return true;
    }
    Redirect(conn, "/",
             absl::StrCat("Set-Cookie: ", kCookie, "=", id,
                          "; Path=/; HttpOnly; SameSite=Strict; Max-Age=",
                          absl::ToInt64Seconds(kSessionLife), "\r\n"));
    return true;
  }

 private:
  bool Authorized(mg_connection* conn) {
    if (token_.empty()) return true;
    if (const char* auth = mg_get_header(conn, "Authorization"); auth != nullptr) {
      const absl::string_view value(auth);
      if (absl::StartsWith(value, "Bearer ") &&
          ConstantTimeEquals(value.substr(7), token_)) {
        return true;
      }
    }
    std::string id;
    if (CivetServer::getCookie(conn, kCookie, id) <= 0) return false;
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return false;
    if (coordinator_->options().clock->Now() > it->second) {
      sessions_.erase(it);
      return false;
    }
    return true;
  }

  std::string NewSession() {
    const std::string id = RandomId();
    if (id.empty()) return id;
    const absl::Time now = coordinator_->options().clock->Now();
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      it = now > it->second ? sessions_.erase(it) : std::next(it);
    }
    if (sessions_.size() >= kMaxSessions) {
      // The oldest session gives way.
      auto oldest = sessions_.begin();
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (it->second < oldest->second) oldest = it;
      }
      sessions_.erase(oldest);
    }
    sessions_[id] = now + kSessionLife;
    return id;
  }

  const std::string token_;
  Coordinator* const coordinator_;
  std::unique_ptr<CivetServer> server_;
  int port_ = 0;
  absl::Mutex mu_;
  std::map<std::string, absl::Time> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string StatusJson(Coordinator* coordinator) {
  const StatusSnapshot s = coordinator->GetStatus();
  nlohmann::json j;
  j["job_state"] = JobStateName(s.job_state);
  j["generation"] = s.generation;
  j["world_size"] = s.world_size;
  j["min_members"] = s.rules.min_members;
  j["max_members"] = s.rules.max_members;
  j["uptime_ms"] = absl::ToInt64Milliseconds(s.uptime);
  j["now_unix_ms"] = absl::ToUnixMillis(s.wall_now);
  j["committed_checkpoints"] = s.committed_checkpoints;
  j["latest_committed_step"] = s.latest_committed_step;
  nlohmann::json& members = j["members"] = nlohmann::json::array();
  for (const MemberRow& row : s.members) {
    members.push_back({{"id", row.info.key.id},
                       {"incarnation", std::to_string(row.info.key.incarnation)},
                       {"node", row.info.node},
                       {"local_rank", row.info.local_rank},
                       {"state", row.spare ? "spare" : MemberStateName(row.info.state)},
                       {"rank", row.rank},
                       {"step", row.info.step},
                       {"samples", row.info.samples},
                       {"heartbeat_age_ms", absl::ToInt64Milliseconds(s.now - row.info.last_seen)},
                       {"reason", row.info.reason}});
  }
  nlohmann::json& checkpoints = j["checkpoints"] = nlohmann::json::array();
  for (const CheckpointRecord& r : coordinator->ListCheckpoints(/*all=*/true)) {
    checkpoints.push_back({{"id", r.id},
                           {"step", r.step},
                           {"generation", r.generation},
                           {"state", CheckpointStateName(r.state)},
                           {"world_size", r.world_size()},
                           {"created_unix_ms", absl::ToUnixMillis(r.created)},
                           {"committed_unix_ms", absl::ToUnixMillis(r.committed)},
                           {"bytes", r.total_bytes()},
                           {"reason", r.reason}});
  }
  nlohmann::json& events = j["events"] = nlohmann::json::array();
  absl::StatusOr<std::vector<JobEvent>> recent = coordinator->RecentEvents(kEvents);
  if (!recent.ok()) {
    // The page still shows the job; the missing log says why it is missing.
    events.push_back({{"unix_ms", absl::ToUnixMillis(s.wall_now)},
                      {"kind", "error"},
                      {"detail", absl::StrCat("the event log cannot be read: ",
                                              recent.status().message())}});
  }
  for (const JobEvent& e : recent.ok() ? *recent : std::vector<JobEvent>()) {
    events.push_back(
        {{"unix_ms", absl::ToUnixMillis(e.time)}, {"kind", e.kind}, {"detail", e.detail}});
  }
  // Invalid UTF-8 in a member's free text must not make the answer fail.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<StatusPage>> StatusPage::Start(const std::string& listen,
                                                              const std::string& token,
                                                              Coordinator* coordinator) {
  // CivetWeb is initialised once per process by its C++ wrapper.
  auto page = std::make_unique<StatusPageImpl>(token, coordinator);
  if (absl::Status s = page->Init(listen); !s.ok()) return s;
  return std::unique_ptr<StatusPage>(std::move(page));
}

}  // namespace muster
