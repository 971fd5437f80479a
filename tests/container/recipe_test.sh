#!/usr/bin/env bash
# Proves deploy/apptainer/muster-cpu.def without Apptainer (Debian 12 does
# not package it). It builds the recipe's root file system the way
# `apptainer build` does: debootstrap --variant=minbase with the header's
# OSVersion, MirrorURL and Include; then it applies the recipe's own %files,
# %post, %environment, %runscript, %help, %labels and %test sections, read
# from the .def file, and runs a job inside the tree with chroot, through the
# runscript as `apptainer run` would: a coordinator, two trainers (one node,
# shared memory) on Fashion-MNIST, and the muster client.
#
#   tests/container/recipe_test.sh BUILD_DIR
#
# BUILD_DIR stands for build-debian/ in %files: a build against Debian's
# LibTorch without the CUDA paths, which is what deploy/dev test
# makes:
#   MUSTER_TORCH=debian BUILD_DIR=build-debian deploy/dev build -DMUSTER_WITH_CUDA=OFF
#
# Needs root, debootstrap and Debian's mirror; exits 77 (skipped) without root
# or debootstrap. The debootstrap result is kept as a tarball in
# MUSTER_CACHE_DIR (default ~/.cache/muster), named by a hash of the
# debootstrap command line (suite, mirror, Include); MUSTER_REFRESH=1 makes it
# anew. MUSTER_KEEP_ROOTFS=1 keeps the tree for a look inside.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEF="$SRC/deploy/apptainer/muster-cpu.def"
BUILD="${1:?usage: tests/container/recipe_test.sh BUILD_DIR (a Debian-LibTorch build without CUDA)}"
CACHE="${MUSTER_CACHE_DIR:-${HOME:-/root}/.cache/muster}"
JOB_TIMEOUT=300

say() { printf 'recipe_test: %s\n' "$*"; }
fail() {  # MESSAGE [LOG...]: print what failed and the end of each log, then exit 1
  local msg="$1"
  shift
  printf 'recipe_test: FAIL: %s\n' "$msg" >&2
  for f in "$@"; do
    [ -f "$f" ] || continue
    printf -- '--- last lines of %s\n' "$f" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

if [ "$(id -u)" -ne 0 ]; then say "skipped: needs root (debootstrap, chroot, mount)"; exit 77; fi
for tool in debootstrap chroot mount python3; do
  command -v "$tool" >/dev/null || { say "skipped: $tool is missing (deploy/dev setup installs it)"; exit 77; }
done
[ -f "$DEF" ] || fail "no recipe at $DEF"
BUILD="$(cd "$BUILD" && pwd)"
for p in muster muster-coordinator muster-train; do
  [ -x "$BUILD/bin/$p" ] || fail "$BUILD/bin/$p is missing: build it with MUSTER_TORCH=debian BUILD_DIR=... deploy/dev build -DMUSTER_WITH_CUDA=OFF"
done
# The image has no CUDA: say so now rather than after debootstrap and %post.
cuda_libs="$(readelf -d "$BUILD"/bin/muster-* 2>/dev/null | grep -o -E 'lib(cudart|nccl)[^]]*' | sort -u | tr '\n' ' ' || true)"
if [ -n "$cuda_libs" ]; then
  fail "the binaries in $BUILD/bin link ${cuda_libs}which a CPU image does not have; rebuild that tree with -DMUSTER_WITH_CUDA=OFF"
fi

WORK="$(mktemp -d "${TMPDIR:-/var/tmp}/muster-recipe.XXXXXX")"
ROOTFS="$WORK/rootfs"
LOGS="$WORK/logs"
mkdir -p "$ROOTFS" "$LOGS"
PIDS=()
MOUNTS=()
exec 8>&1 9>&2

# Long commands run in a session of their own, in the background, so that a
# signal to this script interrupts its wait at once (bash runs traps only
# between commands) and cleanup can end each command with all its children.
spawn() {  # CMD...: start CMD in its own session; its pid is appended to PIDS
  setsid "$@" &
  PIDS+=($!)
}
reaped() {  # STATUS PID: forget PID (it was waited for), return STATUS
  local -a rest=()
  local p
  for p in "${PIDS[@]}"; do [ "$p" = "$2" ] || rest+=("$p"); done
  PIDS=("${rest[@]}")
  return "$1"
}
spawn_wait() {  # CMD...: spawn CMD and wait for it; returns its exit status
  spawn "$@"
  local pid=${PIDS[-1]} rc=0
  wait "$pid" || rc=$?
  reaped "$rc" "$pid"
}
alive() {  # PID: whether the session PID started still has a process (reaps PID once it ended)
  case "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" in
    ''|Z) wait "$1" 2>/dev/null || true ;;
  esac
  kill -0 -- "-$1" 2>/dev/null
}

cleanup() {
  local status=$? pid='' i
  set +eu  # best effort from here: every mount must come off, whatever fails
  exec 1>&8 2>&9  # a signal may land inside a command's redirection
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for i in 1 2 3 4 5 6 7 8 9 10; do
    for pid in "${PIDS[@]}"; do alive "$pid" && break; pid=; done
    [ -n "$pid" ] || break
    sleep 1
  done
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[$i]}" 2>/dev/null || umount -l "${MOUNTS[$i]}" 2>/dev/null ||
      say "could not unmount ${MOUNTS[$i]}"
  done
  if grep -q " $WORK/" /proc/self/mounts; then
    say "mounts remain under $WORK; not removing it"
  elif [ "${MUSTER_KEEP_ROOTFS:-0}" = 1 ]; then
    say "kept $WORK (rootfs/, logs/, job/)"
  elif [ "$status" -ne 0 ]; then
    rm -rf --one-file-system "$ROOTFS"
    say "logs kept in $WORK (logs/, job/); MUSTER_KEEP_ROOTFS=1 keeps the tree too"
  else
    rm -rf --one-file-system "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bind() {  # SOURCE TARGET_IN_ROOTFS: bind-mount a host file or directory into the tree
  local target="$ROOTFS$2"
  if [ -d "$1" ]; then mkdir -p "$target"
  else
    [ -L "$target" ] && rm -f "$target"
    mkdir -p "$(dirname "$target")"
    [ -e "$target" ] || touch "$target"
  fi
  mount --bind "$1" "$target"
  MOUNTS+=("$target")
}
mount_fs() {  # TYPE OPTIONS TARGET_IN_ROOTFS
  mkdir -p "$ROOTFS$3"
  mount -t "$1" -o "$2" "$1" "$ROOTFS$3"
  MOUNTS+=("$ROOTFS$3")
}

# ---- The recipe, split the way Apptainer splits it --------------------------
# The header is everything before the first line whose first word starts
# with %; each section runs from such a line to the next one.
header() {  # KEY: the value of "Key: value" in the header (keys ignore case)
  awk -v key="$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')" '
    substr($1, 1, 1) == "%" { exit }
    /^[[:space:]]*(#|$)/ { next }
    {
      line = $0; sub(/#.*/, "", line); i = index(line, ":"); if (i == 0) next
      k = tolower(substr(line, 1, i - 1)); gsub(/[[:space:]]/, "", k)
      if (k == key) { v = substr(line, i + 1); gsub(/^[[:space:]]+|[[:space:]]+$/, "", v); print v; exit }
    }' "$DEF"
}
section() {  # NAME: the bodies of every %NAME section, in order
  awk -v want="$1" '
    substr($1, 1, 1) == "%" { inside = (tolower(substr($1, 2)) == want); next }
    inside { print }' "$DEF"
}

[ "$(grep -c -i '^bootstrap:' "$DEF")" = 1 ] || fail "$DEF: one stage expected (one Bootstrap: line)"
[ "$(header Bootstrap)" = debootstrap ] || fail "$DEF: Bootstrap is '$(header Bootstrap)', this test builds debootstrap recipes"
for s in $(awk 'substr($1, 1, 1) == "%" { print tolower(substr($1, 2)) }' "$DEF" | sort -u); do
  case "$s" in
    files|post|environment|runscript|test|help|labels) ;;
    *) fail "$DEF: section %$s is not applied by this test; teach tests/container/recipe_test.sh or drop it" ;;
  esac
done
SUITE="$(header OSVersion)"
MIRROR="$(header MirrorURL)"
INCLUDE="$(header Include)"
[ -n "$SUITE" ] && [ -n "$MIRROR" ] || fail "$DEF: OSVersion and MirrorURL are required"

# ---- Bootstrap: debootstrap, as Apptainer runs it, or the cached result ----
t0=$SECONDS
include="apt${INCLUDE:+,$(printf '%s' "$INCLUDE" | tr -s ' \t' ',,')}"
DEBOOTSTRAP=(debootstrap --variant=minbase "--exclude=openssl,udev,debconf-i18n,e2fsprogs"
             "--include=$include" "--arch=$(dpkg --print-architecture)" "$SUITE")
key="$(printf '%s\n' "${DEBOOTSTRAP[@]}" "$MIRROR" | sha256sum | cut -c1-12)"
if command -v zstd >/dev/null; then ext=tar.zst; pack=(zstd -q -T0); unpack=(zstd -dc)
else ext=tar.gz; pack=(gzip -1); unpack=(gzip -dc); fi
TARBALL="$CACHE/debootstrap-$SUITE-minbase-$key.$ext"
if [ -f "$TARBALL" ] && [ "${MUSTER_REFRESH:-0}" != 1 ]; then
  say "bootstrap: unpacking $TARBALL"
  "${unpack[@]}" "$TARBALL" | tar --numeric-owner -C "$ROOTFS" -xpf - ||
    fail "could not unpack $TARBALL (delete it to start over)"
  bootstrap_how="cached"
else
  say "bootstrap: ${DEBOOTSTRAP[*]} ROOTFS $MIRROR"
  spawn_wait "${DEBOOTSTRAP[@]}" "$ROOTFS" "$MIRROR" > "$LOGS/debootstrap.log" 2>&1 ||
    fail "debootstrap failed" "$LOGS/debootstrap.log" "$ROOTFS/debootstrap/debootstrap.log"
  mkdir -p "$CACHE"
  tar --numeric-owner -C "$ROOTFS" -cf - . | "${pack[@]}" > "$TARBALL.tmp.$$"
  mv "$TARBALL.tmp.$$" "$TARBALL"
  say "bootstrap: cached as $TARBALL ($(du -h "$TARBALL" | cut -f1))"
  bootstrap_how="fresh"
fi
t_bootstrap=$((SECONDS - t0))

# What Apptainer gives a build and a container: /proc, /sys, a minimal /dev
# with a tmpfs /dev/shm (the shared-memory communicator needs it), and the
# host's /etc/resolv.conf and /etc/hosts where the host has them (Apptainer
# skips a bind path whose source is missing, and the image keeps its own).
mount_fs proc rw /proc
mount_fs sysfs ro /sys
for d in null zero full random urandom tty; do bind "/dev/$d" "/dev/$d"; done
mount_fs tmpfs mode=1777,size=512m /dev/shm
for f in /etc/resolv.conf /etc/hosts; do
  if [ -e "$f" ]; then bind "$f" "$f"; else say "the host has no $f; the image keeps its own"; fi
done
# debootstrap writes no /etc/hosts: without the host's, localhost resolves
# through a minimal one in the tree.
if [ ! -e "$ROOTFS/etc/hosts" ]; then
  rm -f "$ROOTFS/etc/hosts"  # a dangling link
  printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$ROOTFS/etc/hosts"
fi
mkdir -p "$ROOTFS/.singularity.d/env" "$ROOTFS/.singularity.d/libs"

# A clean environment, as Apptainer's build (--cleanenv) gives %post.
IN_ROOT=(chroot "$ROOTFS" /usr/bin/env -i HOME=/root LANG=C.UTF-8
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
# `apptainer exec IMAGE CMD...`: the image's environment scripts, then CMD.
IN_IMAGE=("${IN_ROOT[@]}" /bin/sh -c 'for f in /.singularity.d/env/*.sh; do . "$f"; done; exec "$@"' sh)

# ---- %files: each "SOURCE [DEST]", SOURCE globbed relative to the project --
# root (where `apptainer build` runs), with BUILD_DIR standing for build-debian.
t0=$SECONDS
CONTEXT="$WORK/context"
mkdir "$CONTEXT"
for entry in "$SRC"/* "$SRC"/.[!.]*; do
  [ -e "$entry" ] && ln -s "$entry" "$CONTEXT/$(basename "$entry")"
done
rm -f "$CONTEXT/build-debian"
ln -s "$BUILD" "$CONTEXT/build-debian"
while read -r src dst rest; do
  case "$src" in ''|'#'*) continue ;; esac
  [ -z "$rest" ] || fail "%files: '$src $dst $rest': one source and one destination per line"
  dst="${dst:-$src}"
  case "/$dst/" in */../*) fail "%files: destination $dst leaves the image" ;; esac
  matches=()
  while IFS= read -r -d '' m; do matches+=("$m"); done < <(
    cd "$CONTEXT" && for n in $src; do printf '%s\0' "$n"; done)
  for m in "${matches[@]}"; do
    [ -e "$CONTEXT/$m" ] || [ -e "$m" ] || fail "%files: $src matches nothing (in $CONTEXT)"
    target="$ROOTFS/${dst#/}"
    if [ "${dst%/}" != "$dst" ]; then mkdir -p "$target"; else mkdir -p "$(dirname "$target")"; fi
    (cd "$CONTEXT" && cp -fLr -- "$m" "$target") || fail "%files: cp $m $dst failed"
    say "files: $m -> $dst"
  done
done < <(section files)
t_files=$((SECONDS - t0))

# ---- %post, as Apptainer runs it: /bin/sh -ex in the tree ------------------
t0=$SECONDS
section post > "$ROOTFS/.post.script"
say "post: running (log $LOGS/post.log)"
if ! spawn_wait "${IN_ROOT[@]}" APPTAINER_ENVIRONMENT=/.singularity.d/env/91-environment.sh \
     /bin/sh -ex /.post.script > "$LOGS/post.log" 2>&1; then
  # The recipe's own messages first (a missing library, say), then the trace.
  fail "%post failed$(grep -E '^(muster: |/opt/muster/.*not found)' "$LOGS/post.log" | sed 's/^/\n  /' || true)" \
    "$LOGS/post.log"
fi
rm -f "$ROOTFS/.post.script"
t_post=$((SECONDS - t0))

# ---- The metadata Apptainer writes from the other sections -----------------
{ printf '#!/bin/sh\n# Custom environment shell code should follow\n\n'; section environment; } \
  > "$ROOTFS/.singularity.d/env/90-environment.sh"
{ printf '#!/bin/sh\n\n'; section runscript; } > "$ROOTFS/.singularity.d/runscript"
{ printf '#!/bin/sh\n\n'; section test; } > "$ROOTFS/.singularity.d/test"
chmod 755 "$ROOTFS/.singularity.d/runscript" "$ROOTFS/.singularity.d/test"
section help > "$ROOTFS/.singularity.d/runscript.help"
section labels | python3 -c '
import json, sys
labels = {}
for line in sys.stdin:
    line = line.strip()
    if line and not line.startswith("#"):
        key, _, value = line.partition(" ")
        labels[key] = value.strip()
json.dump(labels, sys.stdout, indent=2)' > "$ROOTFS/.singularity.d/labels.json"
[ -s "$ROOTFS/.singularity.d/runscript.help" ] || fail "%help is empty"
grep -q '"org.opencontainers.image.title"' "$ROOTFS/.singularity.d/labels.json" ||
  fail "%labels has no org.opencontainers.image.title"

# ---- The image as a user gets it -------------------------------------------
# Every library of every program resolves inside the image.
missing="$("${IN_IMAGE[@]}" /bin/sh -c \
  'for f in /opt/muster/bin/* /opt/muster/lib/*.so; do
     [ "$(head -c 4 "$f" | tr -d "\177")" = ELF ] || continue  # muster-lab is a script
     ldd "$f" | grep "not found" | sed "s|^|$f:|"; done')"
[ -z "$missing" ] || fail "libraries missing inside the image:
$missing"
for p in muster muster-coordinator muster-train; do
  [ -x "$ROOTFS/opt/muster/bin/$p" ] || fail "/opt/muster/bin/$p is not in the image"
done
[ -x "$ROOTFS/opt/muster/bin/muster-agent" ] || say "note: $BUILD has no muster-agent yet; the image has none"
spawn_wait "${IN_IMAGE[@]}" /bin/sh /.singularity.d/test > "$LOGS/test.log" 2>&1 || fail "%test failed" "$LOGS/test.log"

# `apptainer run IMAGE ARGS...`
RUN=("${IN_IMAGE[@]}" /.singularity.d/runscript)
rc=0; "${RUN[@]}" > "$LOGS/run-noargs.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q '^usage:' "$LOGS/run-noargs.log" ||
  fail "the runscript without a command should print its usage and exit 2 (exit $rc)" "$LOGS/run-noargs.log"
rc=0; "${RUN[@]}" no-such-command > "$LOGS/run-bad.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "the runscript should reject an unknown command with exit 2 (exit $rc)" "$LOGS/run-bad.log"
"${RUN[@]}" help > "$LOGS/run-help.log" 2>&1 || fail "the runscript's help failed" "$LOGS/run-help.log"

# ---- A job: coordinator, two trainers, the client, all through the runscript
# The job directory is bound in as `apptainer run --bind` would: token file,
# coordinator state, logs and summaries live on the host.
t0=$SECONDS
JOB="$WORK/job"
mkdir -p "$JOB"
bind "$JOB" /job
( umask 077; head -c 32 /dev/urandom | base64 > "$JOB/token" )
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
ADDR="127.0.0.1:$PORT"
if [ -d "$ROOTFS/usr/share/datasets/fashion-mnist" ]; then data=(--dataset fashion-mnist)
else data=(--dataset synthetic); fi
say "job: coordinator on $ADDR and 2 trainers (${data[1]}) inside the image"
spawn timeout -k 10 "$JOB_TIMEOUT" "${RUN[@]}" coordinator --listen "$ADDR" --token-file /job/token \
  --state-dir /job/state --min-members 2 --max-members 2 > "$JOB/coordinator.log" 2>&1
COORD=${PIDS[-1]}
TRAINERS=()
for rank in 0 1; do
  spawn timeout -k 10 "$JOB_TIMEOUT" "${RUN[@]}" train --coordinator "$ADDR" --token-file /job/token \
    --node-id node0 --local-rank "$rank" --model mlp "${data[@]}" --batch-size 64 --steps 40 \
    --warmup-steps 5 --log-every 10 --log-dir /job/logs --summary-json "/job/summary-$rank.json" \
    > "$JOB/trainer-$rank.log" 2>&1
  TRAINERS+=("${PIDS[-1]}")
done
for rank in 0 1; do
  rc=0; wait "${TRAINERS[$rank]}" || rc=$?
  reaped 0 "${TRAINERS[$rank]}"
  [ "$rc" = 0 ] || fail "trainer $rank exited $rc$([ "$rc" = 124 ] && echo " (timed out after ${JOB_TIMEOUT}s)")" \
    "$JOB/trainer-$rank.log" "$JOB/coordinator.log"
done
for rank in 0 1; do
  [ -s "$JOB/summary-$rank.json" ] || fail "trainer $rank wrote no summary" "$JOB/trainer-$rank.log"
done
python3 - "${data[1]}" "$JOB/summary-0.json" "$JOB/summary-1.json" <<'EOF' ||
import json, sys
s0, s1 = (json.load(open(p)) for p in sys.argv[2:])
for s in (s0, s1):
    assert s["world_size"] == 2 and s["steps"] == 40, s
# Both ranks end with the same parameters, as after every synchronised step.
assert s0["parameter_checksum"] == s1["parameter_checksum"], (s0, s1)
# Ten classes: chance is 10%; 40 steps of the MLP on Fashion-MNIST reach 60-70%.
floor = 0.5 if sys.argv[1] == "fashion-mnist" else 0.0
assert s0["test_accuracy"] > floor, f"test accuracy {s0['test_accuracy']} <= {floor}"
EOF
  fail "the job's summaries are wrong" "$JOB/summary-0.json" "$JOB/summary-1.json" "$JOB/trainer-0.log"
sed -n 's/^done:/recipe_test: rank 0: done:/p' "$JOB/trainer-0.log"
"${RUN[@]}" muster --coordinator "$ADDR" --token-file /job/token status > "$JOB/status.log" 2>&1 ||
  fail "muster status failed inside the image" "$JOB/status.log"
"${RUN[@]}" muster --coordinator "$ADDR" --token-file /job/token shutdown > "$JOB/shutdown.log" 2>&1 ||
  fail "muster shutdown failed inside the image" "$JOB/shutdown.log"
rc=0; wait "$COORD" || rc=$?
reaped 0 "$COORD"
[ "$rc" = 0 ] || fail "the coordinator exited $rc after shutdown" "$JOB/coordinator.log"
[ -f "$JOB/state/coordinator.db" ] || fail "the coordinator wrote no state into the bound directory"
t_job=$((SECONDS - t0))

say "rootfs $(du -sh --one-file-system "$ROOTFS" | cut -f1); bootstrap ${t_bootstrap}s ($bootstrap_how), files ${t_files}s, post ${t_post}s, job ${t_job}s, total ${SECONDS}s"
say "PASS: $DEF builds an image in which a coordinator and two trainers train and finish"
