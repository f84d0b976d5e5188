#!/usr/bin/env bash
# QoS with the link as the bottleneck (the QoS experiment over TCP): `ionet-perf qos` runs
# inside a fresh network namespace whose loopback is shaped to RATE (default 2gbit) by an htb
# qdisc with two classes — the control class's DSCP (AF41, TOS 0x88) in one, everything else in
# the other — so a control-class ping no longer queues behind the bulk stream's packets when
# service levels are on. On the unshaped loopback of a 2-core machine the CPU, not the link, is
# the bottleneck and service levels cannot show (benchmarks/journal/qos-readings.md).
#
#   sudo benches/qos-netns.sh [--runs 5] [--out DIR]     # needs root, iproute2 (ip, tc)
#
# Extra arguments go to `ionet-perf qos`. The namespace is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${RATE:-2gbit}"
target="${CARGO_TARGET_DIR:-target}"
ns="ionet-qos-$$"
cargo build --release -q -p ionet-perf
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
in_ns() { ip netns exec "$ns" "$@"; }
in_ns ip link set lo up
# htb warns that a 2 Gbit/s class's quantum is big; r2q keeps it in range.
in_ns tc qdisc add dev lo root handle 1: htb default 20 r2q 1000
in_ns tc class add dev lo parent 1: classid 1:1 htb rate "$rate" burst 256k
in_ns tc class add dev lo parent 1:1 classid 1:10 htb rate 100mbit ceil "$rate" prio 0 burst 64k
in_ns tc class add dev lo parent 1:1 classid 1:20 htb rate 100mbit ceil "$rate" prio 1 burst 256k
in_ns tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip tos 0x88 0xfc flowid 1:10
echo "== ionet-perf qos in netns $ns, loopback shaped to $rate (htb: control class by DSCP / the rest)"
in_ns "$target/release/ionet-perf" qos --transports tcp "$@"
echo "== qdisc classes after the run"
in_ns tc -s class show dev lo
