#include "rpc/coordinator_channel.h"

#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "rpc/credentials.h"

namespace muster {
namespace {

constexpr absl::string_view kFilePrefix = "file:";

std::vector<std::string> Entries(const std::string& target) {
  std::vector<std::string> entries;
  for (absl::string_view e : absl::StrSplit(target, ',')) {
    entries.emplace_back(absl::StripAsciiWhitespace(e));
  }
  return entries;
}

// One entry of a target: a host:port, or the address its file holds.
absl::StatusOr<std::string> ResolveEntry(const std::string& target) {
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

// Where an entry points until its address file can be read: a socket that
// does not exist fails each call at once, until Refresh finds the file.
std::string Absent(const std::string& target) {
  return absl::StrCat("unix:", target.substr(kFilePrefix.size()), ".absent");
}

}  // namespace

absl::StatusOr<std::string> ResolveCoordinator(const std::string& target) {
  return ResolveEntry(Entries(target).front());
}

absl::StatusOr<std::unique_ptr<CoordinatorChannel>> CoordinatorChannel::Create(
    const std::string& target, const TlsFiles& tls, int connection) {
  if (target.empty()) return absl::InvalidArgumentError("no coordinator address");
  std::vector<std::string> targets = Entries(target);
  for (const std::string& t : targets) {
    if (t.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("an empty coordinator address in \"", target, "\""));
    }
  }
  std::unique_ptr<CoordinatorChannel> c(
      new CoordinatorChannel(std::move(targets), tls, connection));
  absl::StatusOr<std::string> address = ResolveEntry(c->targets_.front());
  const std::string first = address.ok() ? *address : Absent(c->targets_.front());
  MUSTER_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                          MakeChannel(first, tls, connection));
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

void CoordinatorChannel::MoveOn(bool wrap) {
  absl::MutexLock lock(&mu_);
  if (!wrap && current_ + 1 >= targets_.size()) return;
  move_on_ = true;
}

bool CoordinatorChannel::Refresh() {
  // One address, no file: nothing to follow (callers refresh before every
  // call).
  if (targets_.size() == 1 && !absl::StartsWith(targets_[0], kFilePrefix)) return false;
  size_t current, next;
  std::string current_address;
  {
    absl::MutexLock lock(&mu_);
    current = next = current_;
    current_address = address_;
    if (targets_.size() > 1 &&
        (std::exchange(move_on_, false) ||
         channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_TRANSIENT_FAILURE)) {
      next = (current_ + 1) % targets_.size();
    }
  }
  absl::StatusOr<std::string> address = ResolveEntry(targets_[next]);
  if (!address.ok()) {
    if (next == current) return false;
    address = Absent(targets_[next]);
  }
  if (next == current && *address == current_address) return false;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(*address, tls_, connection_);
  if (!channel.ok()) return false;
  absl::MutexLock lock(&mu_);
  current_ = next;
  address_ = *address;
  channel_ = std::move(*channel);
  return true;
}

}  // namespace muster
