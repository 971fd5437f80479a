# shellcheck shell=bash
# What deploy/slurm/train.sbatch and train-direct.sbatch have in common: start
# the coordinator on the first node, run the trainers as one job step, forward
# the time-limit warning, requeue after a checkpoint, stop the coordinator.
#
# Sourced by the batch scripts, which then call `muster_job_run agent` or
# `muster_job_run direct`. Executed as `muster-job.sh with-address CMD ARGS...`
# it is the per-task wrapper that appends this node's --address (see
# MUSTER_IFACE / MUSTER_HOST_SUFFIX below) and execs CMD.
#
# Settings (environment variables; the batch scripts set the defaults):
#   MUSTER_BIN             directory holding muster-coordinator, muster-train,
#                          muster-agent and muster (default: where muster-train
#                          is found on PATH; with MUSTER_EXEC: the PATH there)
#   MUSTER_EXEC            command words put before every muster program, e.g.
#                          "apptainer exec --nv muster-gpu.sif" (MUSTER_BIN is
#                          then a path inside the image, or empty)
#   MUSTER_JOB_DIR         shared directory for this job: token, coordinator
#                          state, checkpoints, logs (default
#                          ${SCRATCH:-$SLURM_SUBMIT_DIR}/muster-$SLURM_JOB_ID;
#                          the same after a requeue, so the job resumes)
#   MUSTER_PROCS_PER_NODE  trainers per node (default: GPUs on the node, else
#                          SLURM_NTASKS_PER_NODE, else 1)
#   MUSTER_PORT            coordinator port (default 29400 + job id mod 3000,
#                          below Linux's ephemeral ports)
#   MUSTER_LISTEN          coordinator --listen (default 0.0.0.0:MUSTER_PORT)
#   MUSTER_IFACE           network interface whose IPv4 address names each node
#                          (e.g. ib0), for the coordinator and the trainers
#   MUSTER_HOST_SUFFIX     or: appended to `hostname -s` (e.g. "i" where
#                          jwb0001i is jwb0001's InfiniBand name)
#   MUSTER_SPARE_NODES     agent mode: the last N nodes of the allocation run
#                          only hot spares (muster-agent --nproc-per-node 0
#                          --spares procs): warm trainers that wait outside the
#                          full world and take the place of a failed one in
#                          the next generation (default 0; see docs/elastic.md)
#   MUSTER_MIN_MEMBERS     coordinator --min-members (default: nodes x procs);
#                          below the whole world, the trainers go on when one
#                          fails for good; at it, without the agent, a failed
#                          trainer ends the step (srun --kill-on-bad-exit=1)
#   MUSTER_MAX_MEMBERS     coordinator --max-members (default: nodes x procs)
#                          (with spare nodes, "nodes" counts the others only)
#   MUSTER_TRAIN_ARGS      muster-train flags (words; no quoting)
#   MUSTER_AGENT_ARGS      muster-agent flags before `--`
#   MUSTER_COORDINATOR_ARGS extra muster-coordinator flags
#   MUSTER_COORDINATOR_RESTARTS how often a coordinator that died is restarted
#                          on the same state (default 5)
#   MUSTER_STANDBY         1: a standby coordinator runs on the second node (a
#                          job step beside the training step) on the same
#                          state dir, and takes over when the first one hangs
#                          or dies for good (docs/failover.md); every client
#                          follows the address file in the job dir. Default 0
#   MUSTER_STANDBY_PORT    the standby's port (default MUSTER_PORT + 1)
#   MUSTER_RELAY_EVERY     agent mode: K > 0 runs a muster-relay on nodes 0, K,
#                          2K, ... (a job step beside the training step), and
#                          each node's agent reaches the coordinator through
#                          the relay of its group of K nodes, with the
#                          coordinator itself as its second address (the
#                          relay's log: relay.log in the job dir; docs/relay.md).
#                          Default 0: agents connect to the coordinator
#   MUSTER_RELAY_PORT      the relays' port (default MUSTER_PORT + 2)
#   MUSTER_TLS             1 (default): the coordinator serves TLS with a
#                          certificate made for this run (job dir tls/, 0700,
#                          the key 0600), which every client pins as its CA;
#                          0: plain text (the token then crosses the network
#                          readable)
#   MUSTER_SRUN_ARGS       extra flags for the training step's srun
#   MUSTER_REQUEUE         1 (default): requeue the job after the trainers
#                          stopped at the time-limit warning; 0: just exit 75
#
# Signals to the batch shell:
#   SIGUSR1  (--signal=B:USR1@N before the time limit, or
#            `scancel --signal=USR1 --batch JOB`): the trainers checkpoint and
#            stop, then the job requeues itself
#   SIGUSR2  (`scancel --signal=USR2 --batch JOB`): the same without requeue
#   SIGTERM  (scancel, preemption, the time limit itself): Slurm sends it to
#            every task as well; without the agent the batch shell adds
#            SIGUSR1; Slurm kills what is left after KillWait
#
# Exit status of the batch job: 0 training completed; 75 the trainers
# checkpointed and stopped (requeued after SIGUSR1; otherwise submit again with
# the same MUSTER_JOB_DIR to resume); 1 an error (the trainers or agent
# failed, or the coordinator did not start); 2 a bad setting.

# Prints a log line with the time.
muster_log() { echo "muster-job: $(date '+%H:%M:%S') $*"; }

# This node's name on the network the job uses: MUSTER_IFACE's IPv4
# address; else the short host name plus MUSTER_HOST_SUFFIX, when a suffix
# is set; else the short host name where it resolves to an address other
# than loopback, and otherwise the address Slurm reaches this node at
# (its NodeAddr): a host without /etc/hosts, or whose name resolves to
# 127.0.1.1 as Debian's installer writes it.
muster_node_address() {
  if [ -n "${MUSTER_IFACE:-}" ]; then
    local addr
    addr="$(ip -4 -o addr show dev "$MUSTER_IFACE" 2>/dev/null |
      awk '{ split($4, a, "/"); print a[1]; exit }')"
    if [ -z "$addr" ]; then
      echo "muster-job: no IPv4 address on interface '$MUSTER_IFACE' on $(hostname -s)" >&2
      return 1
    fi
    echo "$addr"
    return
  fi
  local name ip node_addr
  name="$(hostname -s)"
  if [ -n "${MUSTER_HOST_SUFFIX:-}" ]; then
    echo "$name$MUSTER_HOST_SUFFIX"
    return
  fi
  ip="$(getent ahostsv4 "$name" 2>/dev/null | awk '{ print $1; exit }')"
  if [ -n "$ip" ] && [[ "$ip" != 127.* ]]; then
    echo "$name"
    return
  fi
  node_addr="$(scontrol show node "${SLURMD_NODENAME:-$name}" -o 2>/dev/null |
    tr ' ' '\n' | sed -n 's/^NodeAddr=//p')"
  if [ -n "$node_addr" ]; then
    echo "$node_addr"
  elif [ -n "$ip" ]; then
    echo "$name"  # loopback, and Slurm names nothing better: a one-host job
  else
    echo "muster-job: this node's name '$name' does not resolve and Slurm gives no NodeAddr" \
      "for it: set MUSTER_IFACE to the interface of the job's network" >&2
    return 1
  fi
}

# A self-signed certificate for the coordinators at HOSTS (names, or IPv4
# addresses with MUSTER_IFACE; two with a standby), made fresh for each run
# (the coordinator may land on another node after a requeue). Sets
# MUSTER_TLS_SERVER_ARGS and MUSTER_TLS_CLIENT_ARGS (empty with MUSTER_TLS=0).
muster_make_tls() {  # HOST...
  local dir="$MUSTER_JOB_DIR/tls" san="" host
  MUSTER_TLS_SERVER_ARGS=()
  MUSTER_TLS_CLIENT_ARGS=()
  if [ "${MUSTER_TLS:-1}" = 0 ]; then
    muster_log "MUSTER_TLS=0: the coordinator serves plain text"
    return 0
  fi
  if ! command -v openssl > /dev/null; then
    echo "muster-job: openssl is needed for the coordinator's certificate (or set MUSTER_TLS=0)" >&2
    return 1
  fi
  for host in "$@"; do
    if [[ "$host" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
      san="${san:+$san,}IP:$host"
    else
      san="${san:+$san,}DNS:$host"
    fi
  done
  (umask 077 && mkdir -p "$dir" && rm -f "$dir/key.pem" "$dir/cert.pem" &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
      -subj "/CN=muster-${SLURM_JOB_ID:-job}" -addext "subjectAltName=$san" \
      -keyout "$dir/key.pem" -out "$dir/cert.pem" > /dev/null 2>&1) || {
    echo "muster-job: could not make the coordinator's certificate in $dir" >&2
    return 1
  }
  chmod 0700 "$dir"
  chmod 0600 "$dir/key.pem"
  MUSTER_TLS_SERVER_ARGS=(--tls-cert "$dir/cert.pem" --tls-key "$dir/key.pem")
  MUSTER_TLS_CLIENT_ARGS=(--tls-ca "$dir/cert.pem")
}

# The path of muster program NAME: under MUSTER_BIN, or bare (found on PATH).
muster_prog() { echo "${MUSTER_BIN:+$MUSTER_BIN/}$1"; }

# Trainers per node: MUSTER_PROCS_PER_NODE, else the node's GPUs, else
# Slurm's tasks per node, else 1.
muster_procs_per_node() {
  local n="${MUSTER_PROCS_PER_NODE:-}"
  if [ -z "$n" ] && [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then n="$SLURM_GPUS_ON_NODE"; fi
  if [ -z "$n" ] && [ -n "${SLURM_NTASKS_PER_NODE:-}" ]; then n="${SLURM_NTASKS_PER_NODE%%(*}"; fi
  echo "${n:-1}"
}

# Starts the coordinator in a session of its own, so that a SIGTERM to the
# whole job (scancel, preemption) does not stop it while the trainers are
# still writing their last checkpoint. A guard shell stops it when the batch
# shell ends, however it ends, and restarts it on the same state dir and port
# when it dies otherwise (a crash, the OOM killer): up to
# MUSTER_COORDINATOR_RESTARTS times (default 5), one second apart. Exit 0 (a
# shutdown) and 3 (the job ended: --pause-timeout) are not restarted. The
# trainers and agents reconnect and re-register on their own
# (docs/coordinator.md, "Restart"). Sets MUSTER_GUARD_PID.
muster_start_coordinator() {
  local listen="$1" shell_pid="$$"
  local -a coord=("${MUSTER_EXEC_ARGS[@]}" "$(muster_prog muster-coordinator)" --listen "$listen"
    "${MUSTER_COORDINATOR_COMMON[@]}" "${MUSTER_FAILOVER_ARGS[@]}")
  local -a extra=()
  read -ra extra <<< "${MUSTER_COORDINATOR_ARGS:-}"
  # shellcheck disable=SC2016  # the guard's script expands its own variables
  setsid bash -c '
    shell_pid="$1"; restarts="$2"; shift 2
    stopping=0 n=0 coordinator=""
    stop() { stopping=1; [ -z "$coordinator" ] || kill -TERM "$coordinator" 2>/dev/null; }
    trap stop TERM
    while :; do
      "$@" &
      coordinator=$!
      while [ "$stopping" = 0 ] && kill -0 "$shell_pid" 2>/dev/null &&
          kill -0 "$coordinator" 2>/dev/null; do
        sleep 1 &
        wait $!
      done
      kill -0 "$shell_pid" 2>/dev/null || stop
      wait "$coordinator"; rc=$?
      while kill -0 "$coordinator" 2>/dev/null; do wait "$coordinator"; rc=$?; done
      if [ "$stopping" = 1 ] || [ "$rc" = 0 ] || [ "$rc" = 3 ]; then exit "$rc"; fi
      if [ "$n" -ge "$restarts" ]; then
        echo "muster-coordinator-guard: the coordinator exited ($rc) after $n restarts; giving up"
        exit "$rc"
      fi
      n=$((n + 1))
      echo "muster-coordinator-guard: $(date +%H:%M:%S) the coordinator exited ($rc);" \
        "restart $n of $restarts on the same state"
      sleep 1 &
      wait $!
      [ "$stopping" = 0 ] || exit "$rc"
    done
  ' muster-coordinator-guard "$shell_pid" "${MUSTER_COORDINATOR_RESTARTS:-5}" \
    "${coord[@]}" "${extra[@]}" \
    >> "$MUSTER_JOB_DIR/coordinator.log" 2>&1 < /dev/null &
  MUSTER_GUARD_PID=$!
}

# Starts the standby coordinator at HOST:PORT as a job step on the second
# node (--relative=1), beside the training step (--overlap); its log is
# standby.log in the job dir. It waits while the first coordinator's lease
# beats and takes over when they stop (docs/failover.md). Sets
# MUSTER_STANDBY_PID (the step's srun).
muster_start_standby() {  # HOST PORT
  local -a extra=()
  read -ra extra <<< "${MUSTER_COORDINATOR_ARGS:-}"
  srun --overlap --nodes=1 --ntasks=1 --relative=1 --kill-on-bad-exit=0 \
    "${MUSTER_EXEC_ARGS[@]}" "$(muster_prog muster-coordinator)" --listen "0.0.0.0:$2" \
    "${MUSTER_COORDINATOR_COMMON[@]}" --address-file "$MUSTER_JOB_DIR/coordinator.address" \
    --advertise "$1:$2" "${extra[@]}" \
    >> "$MUSTER_JOB_DIR/standby.log" 2>&1 < /dev/null &
  MUSTER_STANDBY_PID=$!
}

# The address of the second node of the job (as muster_node_address says
# there), from a one-task step.
muster_second_node_address() {
  # shellcheck disable=SC2153  # MUSTER_JOB_LIB: set by the batch scripts
  srun --overlap --nodes=1 --ntasks=1 --relative=1 --kill-on-bad-exit=0 \
    bash "$MUSTER_JOB_LIB" node-address
}

# The addresses of nodes 0, K, 2K, ... of the job (as muster_node_address
# says on each), one per line in node order, from a one-task-per-node step.
muster_relay_node_addresses() {  # NODES K
  srun --overlap --nodes="$1" --ntasks="$1" --ntasks-per-node=1 --label --kill-on-bad-exit=0 \
    bash "$MUSTER_JOB_LIB" node-address |
    awk -v k="$2" -F': ' '$1 % k == 0 { print $1, $2 }' | sort -n | awk '{ print $2 }'
}

# Starts the relays as one job step over every node (relay-role runs one on
# nodes 0, K, 2K, ...), relaying to TARGET with the job's token and TLS
# (they serve the job's certificate, which names their nodes, and verify
# the coordinator's). Their log: relay.log in the job dir. Sets
# MUSTER_RELAY_PID (the step's srun).
muster_start_relays() {  # NODES K TARGET
  local -a tls=("${MUSTER_TLS_SERVER_ARGS[@]}")
  if [ ${#MUSTER_TLS_CLIENT_ARGS[@]} -gt 0 ]; then
    tls+=(--coordinator-tls-ca "${MUSTER_TLS_CLIENT_ARGS[1]}")
  fi
  srun --overlap --nodes="$1" --ntasks="$1" --ntasks-per-node=1 --kill-on-bad-exit=0 \
    --job-name=muster-relay bash "$MUSTER_JOB_LIB" relay-role "$2" \
    "${MUSTER_EXEC_ARGS[@]}" "$(muster_prog muster-relay)" --listen "0.0.0.0:$MUSTER_RELAY_PORT" \
    --coordinator "$3" --token-file "$MUSTER_JOB_DIR/token" "${tls[@]}" \
    >> "$MUSTER_JOB_DIR/relay.log" 2>&1 < /dev/null &
  MUSTER_RELAY_PID=$!
}

# Stops the relays, then the coordinators: the standby first (a lease given
# back at the primary's shutdown would otherwise pass to it), then the
# primary (SIGTERM, then waits for it to finish).
muster_stop_coordinator() {
  if [ -n "${MUSTER_RELAY_PID:-}" ]; then
    # SIGTERM to the relays themselves (srun answers its own SIGTERM by
    # killing the step): they log what they carried and stop.
    local step
    step="$(squeue --steps --jobs "$SLURM_JOB_ID" --noheader --format '%i %j' 2>/dev/null |
      awk '$2 == "muster-relay" { print $1; exit }')"
    [ -z "$step" ] || scancel --signal=TERM "$step" 2>/dev/null || true
    for _ in $(seq 20); do
      kill -0 "$MUSTER_RELAY_PID" 2>/dev/null || break
      sleep 0.5
    done
    kill -TERM "$MUSTER_RELAY_PID" 2>/dev/null || true
    wait "$MUSTER_RELAY_PID" 2>/dev/null || true
    MUSTER_RELAY_PID=""
  fi
  if [ -n "${MUSTER_STANDBY_PID:-}" ]; then
    kill -TERM "$MUSTER_STANDBY_PID" 2>/dev/null || true
    wait "$MUSTER_STANDBY_PID" 2>/dev/null || true
    MUSTER_STANDBY_PID=""
  fi
  [ -n "${MUSTER_GUARD_PID:-}" ] || return 0
  kill -TERM "$MUSTER_GUARD_PID" 2>/dev/null || true
  wait "$MUSTER_GUARD_PID" 2>/dev/null || true
  MUSTER_GUARD_PID=""
}

# Waits until TARGET answers `muster status` (60 s at most), while process
# PID (what serves it) lives; otherwise prints the tail of LOG, naming WHAT.
muster_wait_answer() {  # TARGET PID LOG WHAT
  for _ in $(seq 120); do
    if "${MUSTER_EXEC_ARGS[@]}" "$(muster_prog muster)" --coordinator "$1" \
        --token-file "$MUSTER_JOB_DIR/token" "${MUSTER_TLS_CLIENT_ARGS[@]}" \
        --timeout 2s status > /dev/null 2>&1; then
      return 0
    fi
    kill -0 "$2" 2>/dev/null || break
    sleep 0.5
  done
  muster_log "$4 did not come up at $1; its log ($3):"
  tail -n 20 "$3" >&2
  return 1
}

# Waits until the coordinator answers (60 s at most).
muster_wait_coordinator() {  # TARGET
  muster_wait_answer "$1" "$MUSTER_GUARD_PID" "$MUSTER_JOB_DIR/coordinator.log" "the coordinator"
}

# Waits until every relay answers: `muster status` through it.
muster_wait_relays() {  # HOST:PORT...
  local relay
  for relay in "$@"; do
    muster_wait_answer "$relay" "$MUSTER_RELAY_PID" "$MUSTER_JOB_DIR/relay.log" "a relay" ||
      return 1
  done
}

# A signal to the batch shell: remember why the job stops and pass SIGNAL
# (if any) to the training step once it runs.
muster_on_signal() {  # REASON SIGNAL MESSAGE
  MUSTER_INTERRUPTED=1
  MUSTER_STOP_REASON="$1"
  muster_log "$3"
  if [ -n "$2" ] && [ -n "$MUSTER_STEP_PID" ]; then
    kill -"$2" "$MUSTER_STEP_PID" 2>/dev/null || true
  fi
}

# Installs the batch shell's signal handlers (see the top of this file).
muster_trap_signals() {  # MODE
  MUSTER_STOP_REASON=""
  MUSTER_INTERRUPTED=0
  MUSTER_STEP_PID=""
  # SIGUSR1 (Slurm's warning before the time limit, --signal=B:USR1@...) goes
  # to the trainers (srun passes it to every task; muster-agent to its
  # trainers); they checkpoint at the next step boundary and exit 75, and the
  # job requeues itself.
  trap 'muster_on_signal warning USR1 "SIGUSR1: the trainers checkpoint and stop"' USR1
  # SIGUSR2 (scancel --signal=USR2 --batch): the same without requeue.
  trap 'muster_on_signal stopped USR1 "SIGUSR2: the trainers checkpoint and stop; no requeue"' USR2
  # SIGTERM reaches the batch shell when the whole job ends (scancel,
  # preemption, the time limit), and Slurm sends it to every task too, but to
  # each node at its own moment; trainers that see SIGTERM on some ranks only
  # leave instead of stopping. Without the agent the batch shell therefore
  # also sends SIGUSR1, which stops every rank. Agents get Slurm's SIGTERM
  # themselves and forward it (an agent ignores further signals once it is
  # stopping); sending them SIGUSR1 as well is a possible improvement that the
  # tests do not cover yet. SIGTERM itself is not passed on again.
  if [ "$1" = direct ]; then
    trap 'muster_on_signal terminated USR1 "SIGTERM: the trainers checkpoint and stop"' TERM
  else
    trap 'muster_on_signal terminated "" "SIGTERM: the trainers checkpoint and stop"' TERM
  fi
}

# The job: mode "agent" (one muster-agent per node) or "direct" (one
# muster-train per slot, started by srun).
muster_job_run() {
  local mode="$1"
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    echo "muster-job: not inside a Slurm job (submit with sbatch)" >&2
    return 2
  fi
  muster_trap_signals "$mode"
  MUSTER_EXEC_ARGS=()
  read -ra MUSTER_EXEC_ARGS <<< "${MUSTER_EXEC:-}"
  if [ ${#MUSTER_EXEC_ARGS[@]} = 0 ]; then
    # The programs are on this file system: find and check them here.
    if [ -z "${MUSTER_BIN:-}" ]; then
      MUSTER_BIN="$(dirname "$(command -v muster-train 2>/dev/null || echo /nonexistent/x)")"
    fi
    local tool tools=(muster-coordinator muster-train muster)
    [ "$mode" = agent ] && tools+=(muster-agent)
    [ "${MUSTER_RELAY_EVERY:-0}" != 0 ] && tools+=(muster-relay)
    for tool in "${tools[@]}"; do
      if [ ! -x "$MUSTER_BIN/$tool" ]; then
        echo "muster-job: $MUSTER_BIN/$tool not found; set MUSTER_BIN or load the module" >&2
        return 2
      fi
    done
  fi

  local nodes procs world restarts spare_nodes="${MUSTER_SPARE_NODES:-0}"
  nodes="${SLURM_JOB_NUM_NODES:-1}"
  procs="$(muster_procs_per_node)"
  if ! [[ "$spare_nodes" =~ ^[0-9]+$ ]] || [ "$spare_nodes" -ge "$nodes" ]; then
    echo "muster-job: MUSTER_SPARE_NODES must be a whole number below the job's $nodes" \
      "nodes, not '$spare_nodes'" >&2
    return 2
  fi
  if [ "$spare_nodes" -gt 0 ] && [ "$mode" != agent ]; then
    echo "muster-job: MUSTER_SPARE_NODES needs train.sbatch (muster-agent starts the spares)" >&2
    return 2
  fi
  local relay_every="${MUSTER_RELAY_EVERY:-0}"
  if ! [[ "$relay_every" =~ ^[0-9]+$ ]]; then
    echo "muster-job: MUSTER_RELAY_EVERY must be a whole number of nodes, not '$relay_every'" >&2
    return 2
  fi
  if [ "$relay_every" -gt 0 ] && [ "$mode" != agent ]; then
    echo "muster-job: MUSTER_RELAY_EVERY needs train.sbatch (relays carry the agents' sessions)" >&2
    return 2
  fi
  world=$(((nodes - spare_nodes) * procs))
  restarts="${SLURM_RESTART_COUNT:-0}"
  : "${MUSTER_JOB_DIR:=${SCRATCH:-${SLURM_SUBMIT_DIR:-$PWD}}/muster-$SLURM_JOB_ID}"
  : "${MUSTER_PORT:=$((29400 + SLURM_JOB_ID % 3000))}"
  : "${MUSTER_MIN_MEMBERS:=$world}"
  : "${MUSTER_MAX_MEMBERS:=$world}"
  export MUSTER_BIN MUSTER_JOB_DIR
  # Private: the state, checkpoints (the model) and logs stay the job owner's
  # on a shared scratch file system.
  (umask 077 && mkdir -p "$MUSTER_JOB_DIR/state" "$MUSTER_JOB_DIR/checkpoints" "$MUSTER_JOB_DIR/logs")
  chmod 0700 "$MUSTER_JOB_DIR"

  # The job token: 0600, kept across requeues of this job.
  if [ ! -s "$MUSTER_JOB_DIR/token" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 > "$MUSTER_JOB_DIR/token")
  fi
  chmod 0600 "$MUSTER_JOB_DIR/token"

  local host target standby_host="" client_target
  host="$(muster_node_address)" || return 1
  target="$host:$MUSTER_PORT"
  client_target="$target"
  MUSTER_FAILOVER_ARGS=()
  MUSTER_STANDBY_PID=""
  if [ "${MUSTER_STANDBY:-0}" = 1 ]; then
    if [ "$nodes" -lt 2 ]; then
      echo "muster-job: MUSTER_STANDBY=1 needs a second node for the standby; this job has 1" >&2
      return 2
    fi
    : "${MUSTER_STANDBY_PORT:=$((MUSTER_PORT + 1))}"
    standby_host="$(muster_second_node_address)" || {
      echo "muster-job: could not learn the second node's address for the standby" >&2
      return 1
    }
    # Whoever holds the lease writes its address here; every client follows it.
    rm -f "$MUSTER_JOB_DIR/coordinator.address"
    MUSTER_FAILOVER_ARGS=(--address-file "$MUSTER_JOB_DIR/coordinator.address"
      --advertise "$target")
    client_target="file:$MUSTER_JOB_DIR/coordinator.address"
  fi
  local -a relay_hosts=() relays=()
  MUSTER_RELAY_PID=""
  if [ "$relay_every" -gt 0 ]; then
    : "${MUSTER_RELAY_PORT:=$((MUSTER_PORT + 2))}"
    mapfile -t relay_hosts < <(muster_relay_node_addresses "$nodes" "$relay_every")
    if [ ${#relay_hosts[@]} != $(((nodes + relay_every - 1) / relay_every)) ]; then
      echo "muster-job: could not learn the relay nodes' addresses (got ${#relay_hosts[@]})" >&2
      return 1
    fi
    local h
    for h in "${relay_hosts[@]}"; do relays+=("$h:$MUSTER_RELAY_PORT"); done
  fi
  # One certificate names every server of the job: coordinator, standby, relays.
  muster_make_tls "$host" ${standby_host:+"$standby_host"} "${relay_hosts[@]}" || return 1
  MUSTER_COORDINATOR_COMMON=(--state-dir "$MUSTER_JOB_DIR/state"
    --token-file "$MUSTER_JOB_DIR/token"
    --min-members "$MUSTER_MIN_MEMBERS" --max-members "$MUSTER_MAX_MEMBERS"
    "${MUSTER_TLS_SERVER_ARGS[@]}")
  muster_log "job $SLURM_JOB_ID run $((restarts + 1)) (SLURM_RESTART_COUNT=$restarts):" \
    "$nodes nodes x $procs trainers ($mode), coordinator $target, job dir $MUSTER_JOB_DIR"
  if [ -n "$standby_host" ]; then
    muster_log "standby coordinator $standby_host:$MUSTER_STANDBY_PORT on the second node;" \
      "clients follow $MUSTER_JOB_DIR/coordinator.address"
  fi
  if [ "$spare_nodes" -gt 0 ]; then
    muster_log "the last $spare_nodes nodes run spares only: a world of $world," \
      "$((spare_nodes * procs)) spares"
  fi

  muster_start_coordinator "${MUSTER_LISTEN:-0.0.0.0:$MUSTER_PORT}"
  # From here on the coordinator must be stopped however the script ends.
  trap 'muster_stop_coordinator' EXIT
  muster_wait_coordinator "$client_target" || return 1
  if [ -n "$standby_host" ]; then muster_start_standby "$standby_host" "$MUSTER_STANDBY_PORT"; fi
  if [ ${#relays[@]} -gt 0 ]; then
    muster_log "relays on every $relay_every nodes: ${relays[*]} (log: $MUSTER_JOB_DIR/relay.log)"
    muster_start_relays "$nodes" "$relay_every" "$client_target"
    muster_wait_relays "${relays[@]}" || return 1
    # agent-role puts each node's relay before the coordinator.
    MUSTER_AGENT_RELAYS="$(IFS=,; echo "${relays[*]}")"
    export MUSTER_AGENT_RELAYS MUSTER_RELAY_EVERY="$relay_every"
  fi

  local -a train=("$(muster_prog muster-train)" --coordinator "$client_target"
    --token-file "$MUSTER_JOB_DIR/token" "${MUSTER_TLS_CLIENT_ARGS[@]}"
    --checkpoint-dir "$MUSTER_JOB_DIR/checkpoints" --log-dir "$MUSTER_JOB_DIR/logs")
  # Without the agent, when the job cannot go on without every trainer
  # (MUSTER_MIN_MEMBERS is the whole world, the default), a trainer that fails
  # ends the step instead of leaving the others waiting for members until the
  # time limit. Exit 75 is no failure here: a trainer exits 75 only after the
  # checkpoint is committed, and the others then exit 75 on SIGTERM too. Not
  # with the agent: it restarts a failed trainer itself.
  local kill_on_bad_exit=0
  if [ "$mode" = direct ] && [ "$MUSTER_MIN_MEMBERS" -ge "$world" ]; then kill_on_bad_exit=1; fi
  local -a user_args=() agent_args=() srun_args=() wrapper=() step=()
  read -ra user_args <<< "${MUSTER_TRAIN_ARGS:-}"
  read -ra agent_args <<< "${MUSTER_AGENT_ARGS:-}"
  read -ra srun_args <<< "${MUSTER_SRUN_ARGS:-}"
  train+=("${user_args[@]}")
  if [ -n "${MUSTER_IFACE:-}${MUSTER_HOST_SUFFIX:-}" ]; then
    wrapper=(bash "$MUSTER_JOB_LIB" with-address)
  fi
  if [ "$mode" = agent ]; then
    # One agent per node, holding the CPUs of all its trainers and the
    # node's one session with the coordinator (--coordinator).
    local -a cpus=()
    if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
      cpus=(--cpus-per-task="$((procs * SLURM_CPUS_PER_TASK))")
    fi
    # Each node's task decides its role from SLURM_NODEID (see agent-role).
    step=(srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 "${cpus[@]}"
      --kill-on-bad-exit="$kill_on_bad_exit" "${srun_args[@]}" "${wrapper[@]}"
      bash "$MUSTER_JOB_LIB" agent-role "$((nodes - spare_nodes))" "$procs"
      "${MUSTER_EXEC_ARGS[@]}" "$(muster_prog muster-agent)"
      --coordinator "$client_target" --token-file "$MUSTER_JOB_DIR/token"
      "${MUSTER_TLS_CLIENT_ARGS[@]}" "${agent_args[@]}" -- "${train[@]}")
  else
    step=(srun --nodes="$nodes" --ntasks="$world" --ntasks-per-node="$procs"
      --kill-on-bad-exit="$kill_on_bad_exit" "${srun_args[@]}" "${wrapper[@]}"
      "${MUSTER_EXEC_ARGS[@]}" "${train[@]}")
  fi

  local rc=0 got
  if [ -n "$MUSTER_STOP_REASON" ]; then
    muster_log "told to stop before the trainers started"
    rc=75
  else
    "${step[@]}" &
    MUSTER_STEP_PID=$!
  fi
  # `wait` returns early when a trapped signal arrives; wait again until the
  # step itself has ended (127: its status was already collected).
  while [ -n "$MUSTER_STEP_PID" ]; do
    MUSTER_INTERRUPTED=0
    got=0
    wait "$MUSTER_STEP_PID" || got=$?
    [ "$got" = 127 ] && break
    rc="$got"
    [ "$MUSTER_INTERRUPTED" = 1 ] || break
  done
  trap - USR1 USR2 TERM
  muster_stop_coordinator
  trap - EXIT

  case "$rc" in
    0)
      muster_log "training completed (checkpoints in $MUSTER_JOB_DIR/checkpoints)"
      return 0 ;;
    75)
      if [ "$MUSTER_STOP_REASON" != terminated ] && [ "$MUSTER_STOP_REASON" != stopped ] &&
          [ "${MUSTER_REQUEUE:-1}" = 1 ]; then
        muster_log "the trainers checkpointed and stopped; requeueing job $SLURM_JOB_ID"
        scontrol requeue "$SLURM_JOB_ID" ||
          muster_log "scontrol requeue failed; resubmit with MUSTER_JOB_DIR=$MUSTER_JOB_DIR to resume"
      else
        muster_log "the trainers checkpointed and stopped (exit 75); start again with" \
          "MUSTER_JOB_DIR=$MUSTER_JOB_DIR to resume"
      fi
      return 75 ;;
    74)
      # Stopped, but the checkpoint of the last step did not commit (the
      # trainers' logs say why and which step a restart resumes from): a
      # restart still goes on from the newest committed checkpoint.
      if [ "$MUSTER_STOP_REASON" != terminated ] && [ "$MUSTER_STOP_REASON" != stopped ] &&
          [ "${MUSTER_REQUEUE:-1}" = 1 ]; then
        muster_log "the trainers stopped WITHOUT a checkpoint of their last step (exit 74);" \
          "requeueing job $SLURM_JOB_ID: it repeats the steps after the newest committed checkpoint"
        scontrol requeue "$SLURM_JOB_ID" ||
          muster_log "scontrol requeue failed; resubmit with MUSTER_JOB_DIR=$MUSTER_JOB_DIR to resume"
      else
        muster_log "the trainers stopped WITHOUT a checkpoint of their last step (exit 74);" \
          "a start with MUSTER_JOB_DIR=$MUSTER_JOB_DIR repeats the steps after the newest committed one"
      fi
      return 74 ;;
    *)
      muster_log "the training step failed (exit $rc)"
      return 1 ;;
  esac
}

# Executes CMD ARGS... with the agent's role flags put right after the word
# that names muster-agent (words before it, e.g. "apptainer exec IMAGE", stay
# first): nodes 0..FIRST_SPARE-1 run PROCS trainers, later nodes PROCS spares.
# With relays (MUSTER_AGENT_RELAYS: the relays' HOST:PORT in node order, one
# for every MUSTER_RELAY_EVERY nodes), the agent's --coordinator TARGET
# becomes "RELAY,TARGET": its group's relay first, the coordinator after it.
muster_agent_role() {  # FIRST_SPARE PROCS CMD ARGS...
  local first_spare="$1" procs="$2" i node="${SLURM_NODEID:-0}"
  shift 2
  local -a words=("$@") role=(--nproc-per-node="$procs") relays=()
  if [ "$node" -ge "$first_spare" ]; then
    role=(--nproc-per-node=0 --spares="$procs")
  fi
  if [ -n "${MUSTER_AGENT_RELAYS:-}" ]; then
    IFS=, read -ra relays <<< "$MUSTER_AGENT_RELAYS"
    local relay="${relays[$((node / MUSTER_RELAY_EVERY))]:-}"
    for i in "${!words[@]}"; do
      if [ "${words[$i]}" = --coordinator ] && [ -n "$relay" ]; then
        words[i + 1]="$relay,${words[i + 1]}"
        break
      fi
    done
  fi
  for i in "${!words[@]}"; do
    if [ "$(basename "${words[$i]}")" = muster-agent ]; then
      exec "${words[@]:0:$((i + 1))}" "${role[@]}" "${words[@]:$((i + 1))}"
    fi
  done
  echo "muster-job: agent-role: no muster-agent in '$*'" >&2
  exit 2
}

# Executed (not sourced): the per-task wrappers.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    with-address)
      shift
      address="$(muster_node_address)" || exit 1
      exec "$@" --address="$address" ;;
    agent-role)
      shift
      muster_agent_role "$@" ;;
    relay-role)
      # RELAY_EVERY CMD ARGS...: runs CMD on nodes 0, K, 2K, ...; elsewhere
      # this task has nothing to do.
      shift
      every="$1"
      shift
      if [ $((${SLURM_NODEID:-0} % every)) = 0 ]; then exec "$@"; fi
      exit 0 ;;
    node-address)
      muster_node_address ;;
    *)
      echo "usage: muster-job.sh with-address|agent-role|relay-role ... CMD [ARGS...] | node-address" \
        "(or source it)" >&2
      exit 2 ;;
  esac
fi
