#!/usr/bin/env bash
# Time goes through common/clock.h (docs/coordinator.md, "Time: two clocks"):
# durations and deadlines on Clock::Now() (monotonic), records on
# Clock::WallNow(). No source reads the wall clock itself, except
# common/clock.cc (RealClock) and common/logging.cc (the log lines' stamps),
# nor hands an absl::Time to a call that compares it with the wall clock
# (absl's ...WithDeadline, absl::ToChronoTime), nor waits with absl's
# ...WithTimeout, which Debian's Abseil turns into a wall clock deadline
# (common/monotonic_wait.h); what follows // on a line is not checked. Exits 1 naming each one and what to use instead.
#   clock_test.sh SOURCE_DIR
set -uo pipefail
src=$1
here=$(cd "$(dirname "$0")" && pwd)
cd "$src" || exit 1
reads='absl::Now[(][)]|system_clock::now|std::time[(]|time[(](nullptr|NULL)[)]|gettimeofday'
reads+='|CLOCK_REALTIME|WithDeadline[(]|WithTimeout[(]|ToChronoTime[(]'
# Prints FILE:LINE and a hint for each wall clock read in the files named.
scan() {
  awk -v re="$reads" '
    FNR == 1 { file = FILENAME }
    {
      code = $0
      sub(/\/\/.*/, "", code)
      if (code !~ re) next
      hint = "Clock::Now() for a duration or deadline, Clock::WallNow() for a record"
      if (code ~ /system_clock::now|ToChronoTime/) {
        hint = "SystemDeadline(deadline, clock) where an API takes a wall time point"
      }
      if (code ~ /WithDeadline|WithTimeout/) {
        hint = "AwaitFor, SleepUnlessNotified or MutexPoker (common/monotonic_wait.h: " \
               "the timed waits of absl stall while the wall clock is set back)"
      }
      printf "%s:%d: wall clock; use %s (the injected Clock, else " \
             "RealClock::Get(); common/clock.h)\n", file, FNR, hint
    }' "$@"
}
mapfile -t folders < <("$here/source_folders.sh" .)
files=$(find "${folders[@]}" -type f \
          \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) 2>/dev/null |
        grep -vxE 'common/clock\.cc|common/logging\.cc' | sort)
if [[ -z $files ]]; then
  echo "no sources under $src: is it the source tree?"
  exit 1
fi
# Sanity: RealClock reads the wall clock, so the pattern must find it there.
if [[ -z $(scan common/clock.cc 2>/dev/null) ]]; then
  echo "the pattern finds no wall clock read in common/clock.cc: is the check broken?"
  exit 1
fi
# shellcheck disable=SC2086  # project paths hold no blanks
found=$(scan $files)
if [[ -n $found ]]; then
  echo "$found"
  exit 1
fi

# Clocks are given, not fetched: RealClock::Get() only where objects are
# composed (each program's main.cc; the library's Distributed::Start in
# trainer/lib/engine.cc; the coordinator's CoordinatorServer::Start in
# coordinator/server.cc; the agent's RunAgent in agent/agent.cc) and where
# it is defined. Everything else takes a Clock* from whoever composes it.
roots='(^|/)main\.cc$|^common/clock\.cc$|^trainer/lib/engine\.cc$|^coordinator/server\.cc$|^agent/agent\.cc$'
failed=0
# shellcheck disable=SC2086
while IFS= read -r f; do
  [[ -z $f || $f =~ $roots ]] && continue
  grep -n 'RealClock::Get()' "$f" | sed "s|^|$f:|" |
    sed 's/$/  <- take a Clock* from whoever composes this object (common\/clock.h)/'
  failed=1
done < <(grep -l 'RealClock::Get()' $files)
((failed == 0)) || exit 1
echo "wall clock reads only through common/clock.h; RealClock::Get() in composition roots only"
