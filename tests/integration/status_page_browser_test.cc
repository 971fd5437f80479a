// The status page in a real browser: a coordinator with --http-listen and a
// job token, two muster-agents with two muster-train each; one trainer is
// SIGKILLed and its agent restarts it. Debian's headless Chromium opens the
// page and the test reads what a person would see: the world grid going
// from four trainers to three and back to four, the failure and both
// regroups with their durations in the timeline, the login that keeps the
// token out of every URL. It leaves a screenshot (status_page.png) in the
// test's directory, or in $MUSTER_SCREENSHOT_DIR when that is set.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/headless_browser.h"
#include "tests/integration/subprocess.h"

namespace muster {
namespace {

const std::string kBin = MUSTER_BIN_DIR;
constexpr char kToken[] = "f3a9c1d07be24c55a8e6d2b4c9f0e1a7";

// Trainer cells of the world grid in `state` ("training", "failed", ...).
std::string Cells(const std::string& state) {
  return absl::StrCat("document.querySelectorAll('#world .cell[data-state=\"", state,
                      "\"]').length");
}

// Every trainer cell's step (in its title) is 30 or more.
constexpr char kEveryCellPast30[] =
    "[...document.querySelectorAll('#world .cell')].every("
    "(c) => +c.title.match(/step (\\d+)/)[1] >= 30)";

class StatusPageBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (HeadlessBrowser::Find().empty()) GTEST_SKIP() << "no headless Chromium (deploy/dev setup)";
    if (::access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
      GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/status_page", ::getpid());
    std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str());
    const std::string token_file = dir_ + "/token";
    std::ofstream(token_file) << kToken;
    ::chmod(token_file.c_str(), 0600);
    ::setenv("MUSTER_TOKEN_FILE", token_file.c_str(), 1);  // the agents' and trainers'
    target_ = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
    http_port_ = FreeLoopbackPort();
    coordinator_ = SpawnLogged(
        {kBin + "/muster-coordinator", "--listen=" + target_, "--token-file=" + token_file,
         absl::StrCat("--http-listen=127.0.0.1:", http_port_), "--min-members=3",
         "--max-members=4", "--last-call=200ms", "--heartbeat-interval=200ms",
         "--heartbeat-timeout=2s", "--keep-last=0"},
        dir_ + "/coordinator.log");
  }
  void TearDown() override {
    for (pid_t pid : agents_) ::kill(pid, SIGTERM);
    for (pid_t pid : agents_) WaitExit(pid);
    if (coordinator_ > 0) {
      ::kill(coordinator_, SIGTERM);
      WaitExit(coordinator_);
    }
    ::unsetenv("MUSTER_TOKEN_FILE");
  }

  // A node of two trainers. The restart waits 3 s, so that the world of
  // three lasts long enough to be seen on a page that refreshes every second.
  pid_t Agent(const std::string& node) {
    return SpawnLogged(
        {kBin + "/muster-agent", "--nproc-per-node=2", "--restart-backoff=3s",
         "--max-restarts=2", "--node-id=" + node, "--coordinator=" + target_, "--",
         kBin + "/muster-train", "--coordinator=" + target_, "--model=mlp", "--steps=100000",
         "--batch-size=32", "--log-every=10", "--threads=1", "--backend=auto",
         "--checkpoint-dir=" + dir_ + "/checkpoints", "--checkpoint-every=100",
         absl::StrCat("--job=sp", ::getpid())},
        absl::StrCat(dir_, "/", node, ".log"));
  }

  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", http_port_, path);
  }

  std::string dir_, target_;
  int http_port_ = 0;
  pid_t coordinator_ = -1;
  std::vector<pid_t> agents_;
};

TEST_F(StatusPageBrowserTest, TheWorldGridAndTimelineFollowAKilledAndRestartedTrainer) {
  agents_ = {Agent("a"), Agent("b")};
  absl::StatusOr<std::unique_ptr<HeadlessBrowser>> started =
      HeadlessBrowser::Start(dir_ + "/chromium", 1280, 1000);
  ASSERT_TRUE(started.ok()) << started.status() << "\n" << ReadText(dir_ + "/chromium.log");
  HeadlessBrowser& browser = **started;

  // Without the token: the page sends the browser to the login form, and
  // the data answers 401.
  ASSERT_TRUE(browser.Navigate(Url("/")).ok());
  EXPECT_EQ(*browser.Evaluate("location.pathname"), "/login");
  EXPECT_EQ(*browser.Evaluate("fetch('/api/status').then((r) => r.status)"), 401);

  // Log in as a person would: type the token into the form and submit it.
  ASSERT_TRUE(browser
                  .Evaluate(absl::StrCat("document.querySelector('input[name=token]').value = '",
                                         kToken, "'; document.querySelector('form').submit(); 1"))
                  .ok());
  ASSERT_TRUE(browser.WaitFor("location.pathname === '/' && document.readyState === 'complete'",
                              absl::Seconds(10))
                  .ok())
      << *browser.Evaluate("location.href");

  // Four trainers training, on two nodes.
  absl::Status s = browser.WaitFor(Cells("training") + " === 4", absl::Seconds(90));
  ASSERT_TRUE(s.ok()) << s << "\n" << ReadText(dir_ + "/coordinator.log");
  EXPECT_EQ(*browser.Evaluate("document.querySelectorAll('#world tbody tr').length"), 2);
  ASSERT_TRUE(browser.WaitFor(kEveryCellPast30, absl::Seconds(60)).ok());

  // The rates come from the heartbeats: steps, and the samples each
  // trainer's world has taken (relayed by the agents).
  s = browser.WaitFor(
      "/ [1-9][0-9.]* steps\\/s · [1-9][0-9]* samples\\/s/.test("
      "document.getElementById('summary').textContent)",
      absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s << "\n" << browser.Evaluate("document.getElementById('summary').textContent")->dump();

  const pid_t victim = LastTrainerPid(dir_ + "/b.log", 1);
  ASSERT_GT(victim, 0) << ReadText(dir_ + "/b.log");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  s = browser.WaitFor(Cells("training") + " === 3", absl::Seconds(20));
  EXPECT_TRUE(s.ok()) << s << "\n" << ReadText(dir_ + "/coordinator.log");
  s = browser.WaitFor(Cells("training") + " === 4", absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s << "\n" << ReadText(dir_ + "/coordinator.log");

  // The timeline: the failure with its cause, then the regroup to three and
  // the one back to four, each with how long it took.
  s = browser.WaitFor(
      "[...document.querySelectorAll('#events li[data-kind=complete]')].some("
      "(li) => / all 4 members in /.test(li.textContent))"
      " && document.querySelectorAll('#events li[data-kind=complete]').length >= 3",
      absl::Seconds(10));
  EXPECT_TRUE(s.ok()) << s;
  const nlohmann::json events = *browser.Evaluate(
      "[...document.querySelectorAll('#events li')].reverse().map("
      "(li) => li.dataset.kind + ': ' + li.textContent)");
  std::vector<std::string> lines;
  for (const auto& e : events) lines.push_back(e.get<std::string>());
  const std::string timeline = absl::StrJoin(lines, "\n");
  const std::regex in_order(
      "fail: [0-9:]+fail(b/1 incarnation [0-9]+: [^\\n]*reported by muster-agent of node b)"
      "[\\s\\S]*complete: [0-9:]+complete(generation [0-9]+: all 3 members in (0|[0-9.]+m?s))"
      "[\\s\\S]*complete: [0-9:]+complete(generation [0-9]+: all 4 members in (0|[0-9.]+m?s))");
  EXPECT_TRUE(std::regex_search(timeline, in_order)) << timeline;

  // The catalog, with the checkpoints the job committed.
  s = browser.WaitFor("document.querySelectorAll('#checkpoints tbody tr.committed').length >= 1",
                      absl::Seconds(30));
  EXPECT_TRUE(s.ok()) << s;

  // The screenshot for people (and the README), once the restarted trainer
  // has reported its step too.
  browser.WaitFor(kEveryCellPast30, absl::Seconds(10)).IgnoreError();
  const char* out = std::getenv("MUSTER_SCREENSHOT_DIR");
  const std::string shot = absl::StrCat(out != nullptr ? out : dir_, "/status_page.png");
  absl::StatusOr<std::string> png = browser.Screenshot();
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->rfind("\x89PNG", 0), 0u);
  std::ofstream(shot, std::ios::binary) << *png;
  std::cout << "screenshot: " << shot << "\n";

  // The token was never in a URL the page loaded or showed.
  EXPECT_EQ(browser.Evaluate("location.href")->get<std::string>().find(kToken), std::string::npos);
  ASSERT_FALSE(browser.requested_urls().empty());
  for (const std::string& url : browser.requested_urls()) {
    EXPECT_EQ(url.find(kToken), std::string::npos) << url;
  }
}

}  // namespace
}  // namespace muster
