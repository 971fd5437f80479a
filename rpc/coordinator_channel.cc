#include "rpc/coordinator_channel.h"

#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "rpc/credentials.h"

namespace muster {
namespace {

constexpr absl::string_view kFilePrefix = "file:";

}  // namespace

absl::StatusOr<std::string> ResolveCoordinator(const std::string& target) {
  if (target.empty()) return absl::InvalidArgumentError("no coordinator address");
  if (!absl::StartsWith(target, kFilePrefix)) return target;
  const std::string path = target.substr(kFilePrefix.size());
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator's address file ", path, " cannot be read yet"));
  }
  const std::string address(absl::StripAsciiWhitespace(line));
  if (address.empty()) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator's address file ", path, " holds no address"));
  }
  return address;
}

absl::StatusOr<std::unique_ptr<CoordinatorChannel>> CoordinatorChannel::Create(
    const std::string& target, const TlsFiles& tls) {
  if (target.empty()) return absl::InvalidArgumentError("no coordinator address");
  std::unique_ptr<CoordinatorChannel> c(new CoordinatorChannel(target, tls));
  absl::StatusOr<std::string> address = ResolveCoordinator(target);
  // A file not written yet: a socket that does not exist fails each call
  // at once, until Refresh finds the file.
  const std::string first =
      address.ok() ? *address : absl::StrCat("unix:", target.substr(kFilePrefix.size()), ".absent");
  MUSTER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, MakeChannel(first, tls));
  absl::MutexLock lock(&c->mu_);
  c->address_ = first;
  c->channel_ = std::move(channel);
  return c;
}

std::shared_ptr<grpc::Channel> CoordinatorChannel::get() {
  absl::MutexLock lock(&mu_);
  return channel_;
}

std::string CoordinatorChannel::address() {
  absl::MutexLock lock(&mu_);
  return address_;
}

bool CoordinatorChannel::Refresh() {
  if (!absl::StartsWith(target_, kFilePrefix)) return false;
  absl::StatusOr<std::string> address = ResolveCoordinator(target_);
  if (!address.ok()) return false;
  {
    absl::MutexLock lock(&mu_);
    if (*address == address_) return false;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(*address, tls_);
  if (!channel.ok()) return false;
  absl::MutexLock lock(&mu_);
  address_ = *address;
  channel_ = std::move(*channel);
  return true;
}

}  // namespace muster
