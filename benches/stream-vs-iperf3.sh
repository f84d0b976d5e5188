#!/usr/bin/env bash
# ionet tcp:// streaming beside iperf3 on loopback, interleaved round by round.
#
#   benches/stream-vs-iperf3.sh IONET_PERF [ROUNDS] [pin]
#
# IONET_PERF is an `ionet-perf` binary (cargo build --release -p ionet-perf). Each round runs
# `ionet-perf client --sizes 1m,4m` (median of 3) as `--test bw` (a window at a time, acknowledged,
# as osu_bw) and `--test stream` (a window kept in flight without pauses, as a socket stream),
# each with 16 and with 2 messages in flight, against a server with the same wait mode, first
# with blocking waits, then with the library's default, adaptive waits (both ends); then the
# raw-socket streamer and `iperf3 -l 1M -t 3`; all unpinned, or with
# `pin` the clients on CPU 0 and the servers on CPU 1. The receiver cycles through a window's
# worth of buffers (16 × 4 MiB = 64 MiB at window 16), where iperf3 reads into one 1 MiB
# buffer: window 2 is the closer match. The raw-socket streamer (`ionet-perf raw-client`, plain
# blocking writes and reads on sockets with ionet's default options, its receiver cycling
# through 2 messages' worth of memory as ionet's does at window 2) shows what the same sizes and
# footprint reach without ionet. iperf3 keeps the kernel's socket options. Prints each round's
# GB/s, then for each the median of the rounds' ratios to iperf3 with their min-max.
set -euo pipefail
command -v iperf3 >/dev/null || { echo "stream-vs-iperf3.sh: needs iperf3 (apt-get install iperf3)" >&2; exit 1; }
P="$(realpath "$1")"; rounds="${2:-5}"; pin="${3:-}"
d=$(mktemp -d)
scpu=(); ccpu=(); ia=()
if [ "$pin" = pin ]; then scpu=(--cpu 1); ccpu=(--cpu 0); ia=(-A 0,1); fi
declare -A A
sp=()
for wm in block adaptive; do
  "$P" server --listen tcp://127.0.0.1:0 --wait $wm "${scpu[@]}" >"$d/srv-$wm" 2>&1 &
  sp+=($!)
  for _ in $(seq 50); do grep -q LISTEN "$d/srv-$wm" 2>/dev/null && break; sleep 0.1; done
  A[$wm]=$(awk '/LISTEN/{print $2}' "$d/srv-$wm")
done
"$P" raw-server --listen 127.0.0.1:0 "${scpu[@]}" >"$d/raw" 2>&1 &
rp=$!
for _ in $(seq 50); do grep -q LISTEN "$d/raw" 2>/dev/null && break; sleep 0.1; done
R=$(awk '/LISTEN/{print $2}' "$d/raw")
iperf3 -s -p 5299 >/dev/null 2>&1 &
ip=$!
sleep 0.5
for r in $(seq "$rounds"); do
  line="round $r:"
  for wm in block adaptive; do
    for t in bw stream; do
      for w in 16 2; do
        out=$("$P" client --connect "${A[$wm]}" --test $t --sizes 1m,4m --window $w --runs 3 --wait $wm "${ccpu[@]}" 2>&1 | tail -2 | awk '{printf "%s ", $3}')
        line="$line $wm $t w$w 1m/4m $out;"
      done
    done
  done
  out=$("$P" raw-client --connect "$R" --test bw --sizes 1m,4m --window 2 --runs 3 "${ccpu[@]}" 2>&1 | tail -2 | awk '{printf "%s ", $3}')
  line="$line raw w2 1m/4m $out;"
  g=$(iperf3 -c 127.0.0.1 -p 5299 -l 1M -t 3 "${ia[@]}" -J | python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))')
  echo "$line iperf3 -l 1M $g"
  echo "$line iperf3 -l 1M $g" >>"$d/rounds"
done
python3 - "$d/rounds" "${pin:-unpinned}" <<'EOF'
import re, statistics, sys
rows = [dict((k, v.split()) for k, v in re.findall(r"((?:\w+ )?\w+ w\d+|iperf3) (?:1m/4m|-l 1M) ([\d. ]+)", l))
        for l in open(sys.argv[1])]
print(f"{sys.argv[2]}, median of {len(rows)} rounds of the ratio to iperf3 -l 1M (min-max):")
keys = [f"{wm} {t} w{w}" for wm in ("block", "adaptive") for t in ("bw", "stream") for w in (16, 2)]
for k in keys + ["raw w2"]:
    for i, size in enumerate(("1 MiB", "4 MiB")):
        r = [float(x[k][i]) / float(x["iperf3"][0]) for x in rows]
        print(f"  {k:19} {size}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
EOF
kill "${sp[@]}" $rp $ip 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$d"
