// StatusPage: the coordinator's status page over HTTP (--http-listen), for
// people watching a job: a few static files (coordinator/web/, compiled in)
// and one JSON endpoint, /api/status, built from what the coordinator
// already knows (members and their steps, the catalog, the event log).
//
// Access needs the job token, as the rpcs do: `Authorization: Bearer
// <token>` (scripts, curl), or a session cookie that the login form (POST
// /login, the token in the body) hands out. The token never goes in a URL.
// Without either, /api/status answers 401 and the page redirects to
// /login. Sessions are random 128-bit ids kept in memory (at most 64, for
// 12 hours each); the cookie is HttpOnly and SameSite=Strict.
//
// Served by CivetWeb (Debian's libcivetweb, which prometheus-cpp already
// brings) on its own threads.
#ifndef MUSTER_COORDINATOR_STATUS_PAGE_H_
#define MUSTER_COORDINATOR_STATUS_PAGE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace muster {

class StatusPage {
 public:
  // Serves on `listen` (host:port; port 0 picks one). `token` empty: no
  // authentication (the coordinator's --no-auth). Errors: UNAVAILABLE when
  // the address cannot be served.
  static absl::StatusOr<std::unique_ptr<StatusPage>> Start(const std::string& listen,
                                                           const std::string& token,
                                                           Coordinator* coordinator);
  virtual ~StatusPage() = default;
  virtual int port() const = 0;
};

// The body of /api/status (exposed for the benchmark and tests).
std::string StatusJson(Coordinator* coordinator);

}  // namespace muster

#endif  // MUSTER_COORDINATOR_STATUS_PAGE_H_
