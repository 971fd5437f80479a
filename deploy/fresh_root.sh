#!/usr/bin/env bash
# deploy/dev fresh-root: the README's two commands the way a newcomer runs
# them on a plain Debian 12 host. It builds such a host with debootstrap
# (minbase plus sudo, git, ca-certificates and python3: no CUDA, no
# /etc/hosts), clones this checkout's HEAD to /root/project inside it (mode
# 700, as root's home is), and runs, as root inside it:
#   ./deploy/dev demo
#   ./deploy/dev test
# It prints each command's exit status and time, the test count, and a line
# for the README. The root's mounts (/proc, /sys, /dev, /dev/shm, /run) come
# off on every exit, an interruption (Ctrl-C, SIGTERM) included, after the
# commands' processes are ended.
#
#   deploy/fresh_root.sh [demo|test]...   (default: demo test)
#
# Needs root, debootstrap and Debian's mirror (MUSTER_FRESH_MIRROR, default
# http://deb.debian.org/debian). The tree lives under MUSTER_FRESH_DIR
# (default /var/tmp/muster-fresh-root.PID) and is removed at the end unless
# MUSTER_KEEP_ROOTFS=1; the logs (demo.log, test.log) are kept beside it.
# Expect about two hours on two cores: everything is installed and built cold.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIRROR="${MUSTER_FRESH_MIRROR:-http://deb.debian.org/debian}"
WORK="${MUSTER_FRESH_DIR:-/var/tmp/muster-fresh-root.$$}"
ROOTFS="$WORK/rootfs"
LOGS="$WORK/logs"
COMMANDS=("$@")
[ ${#COMMANDS[@]} -gt 0 ] || COMMANDS=(demo test)

say() { printf 'fresh-root: %s\n' "$*"; }
die() { printf 'fresh-root: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts)"
command -v debootstrap >/dev/null || die "needs debootstrap (deploy/dev setup installs it)"
for c in "${COMMANDS[@]}"; do
  case "$c" in demo|test) ;; *) die "unknown command '$c' (demo, test)" ;; esac
done
commit="$(git -C "$SRC" rev-parse --short HEAD)"
[ -z "$(git -C "$SRC" status --porcelain --untracked-files=no)" ] ||
  say "note: uncommitted changes in $SRC are not in the clone (it takes HEAD, $commit)"

mkdir -p "$ROOTFS" "$LOGS"
PIDS=()
MOUNTS=()

cleanup() {
  local status=$? pid i
  set +eu
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  for i in $(seq 20); do
    local left=0
    for pid in "${PIDS[@]}"; do kill -0 -- "-$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 1
  done
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  # Whatever still runs inside the root (a daemon a test started).
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$ROOTFS" ] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
  # The mounts the commands made inside the root, deepest first, then ours.
  awk -v root="$ROOTFS/" 'index($2, root) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null
  done
  if grep -q " $ROOTFS" /proc/self/mounts; then
    say "mounts remain under $ROOTFS; not removing it"
  elif [ "${MUSTER_KEEP_ROOTFS:-0}" = 1 ]; then
    say "kept $ROOTFS"
  else
    rm -rf --one-file-system "$ROOTFS"
  fi
  say "logs in $LOGS"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A command in a session of its own, waited for: a signal interrupts the
# wait at once, and cleanup ends the session with all its children.
run() {
  setsid "$@" &
  PIDS+=($!)
  local rc=0
  wait "${PIDS[-1]}" || rc=$?
  unset 'PIDS[-1]'
  return "$rc"
}

say "debootstrap bookworm (minbase, sudo git ca-certificates python3) from $MIRROR"
t0=$SECONDS
run debootstrap --variant=minbase --include=sudo,git,ca-certificates,python3 \
  "--arch=$(dpkg --print-architecture)" bookworm "$ROOTFS" "$MIRROR" \
  > "$LOGS/debootstrap.log" 2>&1 || die "debootstrap failed (log: $LOGS/debootstrap.log)"
say "debootstrap: $((SECONDS - t0)) s"
# A host like the one the issue describes: no /etc/hosts, apt able to reach
# the mirror.
rm -f "$ROOTFS/etc/hosts"
cp -L /etc/resolv.conf "$ROOTFS/etc/resolv.conf"

mount_in() {  # TYPE OPTIONS TARGET_IN_ROOTFS [SOURCE]
  mkdir -p "$ROOTFS$3"
  mount -t "$1" -o "$2" "${4:-$1}" "$ROOTFS$3"
  MOUNTS+=("$ROOTFS$3")
}
# The root is a mount point of its own, as / is on a host: `ip netns exec`
# (the network lab's tests) makes / a slave mount, which fails otherwise.
mount --bind "$ROOTFS" "$ROOTFS"
MOUNTS+=("$ROOTFS")
mount_in proc rw /proc
mount_in sysfs ro /sys
mkdir -p "$ROOTFS/dev"
mount --bind /dev "$ROOTFS/dev"
MOUNTS+=("$ROOTFS/dev")
mount_in devpts rw,newinstance,ptmxmode=0666 /dev/pts
mount_in tmpfs mode=1777,size=1g /dev/shm
mount_in tmpfs mode=0755 /run

# HEAD of this checkout, cloned as a newcomer clones: from a read-only view.
mkdir -p "$ROOTFS/mnt/source"
mount --bind -o ro "$SRC" "$ROOTFS/mnt/source"
MOUNTS+=("$ROOTFS/mnt/source")
IN_ROOT=(chroot "$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
run "${IN_ROOT[@]}" git -c safe.directory='*' clone -q /mnt/source /root/project \
  > "$LOGS/clone.log" 2>&1 || die "git clone failed (log: $LOGS/clone.log)"
umount "$ROOTFS/mnt/source"
unset 'MOUNTS[-1]'
chmod 700 "$ROOTFS/root"

results=()
tests=""
for c in "${COMMANDS[@]}"; do
  say "./deploy/dev $c (log: $LOGS/$c.log)"
  t0=$SECONDS
  rc=0
  run "${IN_ROOT[@]}" /bin/bash -c "cd /root/project && ./deploy/dev $c" \
    > "$LOGS/$c.log" 2>&1 || rc=$?
  results+=("$c: exit $rc in $((SECONDS - t0)) s")
  say "${results[-1]}"
  if [ "$c" = test ]; then
    tests="$(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$LOGS/test.log" | tail -1)"
    [ -n "$tests" ] && say "ctest: $tests"
  fi
done
say "README: $(date -u +%Y-%m-%d), commit $commit: $(IFS=';'; echo "${results[*]}")${tests:+; $tests}"
for r in "${results[@]}"; do
  case "$r" in *": exit 0 "*) ;; *) exit 1 ;; esac
done
