#!/usr/bin/env bash
# muster-lab's teardown leaves nothing (docs/lab.md): a lab whose owner is
# SIGKILLed while processes run inside it is removed by `gc` with its
# namespaces, links, processes and state (and left alone by a gc that does
# not hold its state: another /run's); its faults take effect and are
# verified, and a fault that matched nothing fails verification.
# Usage: lab_test.sh BIN_DIR. Skips (77) without root or nft.
set -uo pipefail
LAB="$1/muster-lab"
[[ $(id -u) == 0 ]] || { echo "lab_test: skipped: needs root"; exit 77; }
command -v nft >/dev/null || { echo "lab_test: skipped: needs nft (nftables)"; exit 77; }
name="t$(( $$ % 100000 ))"
fail() { echo "lab_test: FAIL: $*"; "$LAB" down "$name" >/dev/null 2>&1; exit 1; }
leftovers() {
  { ip netns list | awk '{ print $1 }' | grep "^ml$name-"
    ip -o link show | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E "^ml$name-"
    pgrep -f "lab_test_sleeper_$name"
    ls -d "/run/muster-lab/$name" 2>/dev/null
  } 2>/dev/null
}

# An owner shell makes the lab, starts a process in each host and is killed.
bash -c "\"$LAB\" up $name --nodes 2 --hosts coord --rate 1gbit --data-network --owner \$\$ >/dev/null || exit 1
         for h in node0 node1 coord; do
           \"$LAB\" exec $name \$h -- bash -c 'exec -a lab_test_sleeper_$name sleep 300' &
         done
         sleep 300" &
owner=$!
for _ in $(seq 100); do
  [[ $(pgrep -fc "lab_test_sleeper_$name") == 3 ]] && break
  sleep 0.1
done
[[ $(pgrep -fc "lab_test_sleeper_$name") == 3 ]] || fail "the lab did not start its processes"

# Addresses on both networks; the rate is in place.
a0=$("$LAB" addr "$name" node0) && a1=$("$LAB" addr "$name" node1) || fail "no addresses"
d1=$("$LAB" addr "$name" node1 --data) || fail "no data address"
[[ "$a1" != "$d1" ]] || fail "one address for both networks"
ip netns exec "ml$name-node1" tc qdisc show dev eth0 | grep -q "tbf.*rate 1Gbit" ||
  fail "node1's link is not shaped"

# A fault that matched no packet fails verification; one that did passes.
"$LAB" fault "$name" node1 isolate node0 || fail "isolate"
"$LAB" verify "$name" node1 >/dev/null 2>&1 && fail "a rule that matched nothing verified"
probe() {  # HOST ADDRESS: whether a TCP connection to ADDRESS:9 gets an answer in 1 s
  "$LAB" exec "$name" "$1" -- python3 -c "
import socket, sys
s = socket.socket(); s.settimeout(1)
try: s.connect(('$2', 9))
except ConnectionRefusedError: sys.exit(0)
except OSError: sys.exit(1)"
}
probe node0 "$a1" && fail "node0 reached node1 through the isolation"
probe node0 "$d1" && fail "node0 reached node1's data address through the isolation"
probe node1 "$a0" && fail "node1 reached node0 through the isolation"
probe node1 "$("$LAB" addr "$name" coord)" || fail "node1 lost the coordinator's host too"
"$LAB" verify "$name" node1 >/dev/null || fail "the isolation did not verify after it dropped packets"
"$LAB" heal "$name" node1 || fail "heal"
probe node0 "$a1" || fail "node0 cannot reach node1 after heal"

kill -KILL "$owner"
wait "$owner" 2>/dev/null
[[ -n "$(leftovers)" ]] || fail "the lab vanished with its owner before gc (nothing to test)"
# Seen from another /run (a chroot or container on this network stack),
# the lab has no state: gc there must leave it alone, dead owner or not.
away="$(mktemp -d)"
mv "/run/muster-lab/$name" "$away/" || fail "cannot move the lab's state aside"
"$LAB" gc >/dev/null || fail "gc failed"
ip link show "ml$name-bm" >/dev/null 2>&1 || fail "gc removed a lab whose state it does not hold"
mv "$away/$name" /run/muster-lab/ && rmdir "$away" || fail "cannot put the lab's state back"
"$LAB" gc >/dev/null || fail "gc failed"
left=$(leftovers)
[[ -z "$left" ]] || fail "left behind after gc: $left"
echo "lab_test: ok"
