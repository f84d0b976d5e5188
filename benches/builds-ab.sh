#!/usr/bin/env bash
# Two builds of ionet-perf side by side, round by round: streaming and round trips over tcp://
# and softib://, with the library's default (adaptive) waits on both ends, unpinned.
#
#   benches/builds-ab.sh IONET_PERF_A IONET_PERF_B [ROUNDS]
#
# Build A from a worktree of the baseline commit, for instance
#   git worktree add /tmp/base BASE && (cd /tmp/base && CARGO_TARGET_DIR=/tmp/base-target \
#     cargo build --release -p ionet-perf)
# Each round runs, for each build in turn against a fresh server of the same build:
# `client --test bw --sizes 1m --window 16 --sl bulk --runs 3` (heap buffers) on both transports,
# and `client --test lat --runs 3` at 8 B, 64 KiB and 1 MiB on both. Prints each reading, then
# per figure the medians of the rounds (min-max) and B / A.
set -euo pipefail
A="$(realpath "$1")"; B="$(realpath "$2")"; rounds="${3:-5}"
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
. "$(dirname "$0")/perf-run.sh"
: >"$d/all"
for r in $(seq "$rounds"); do
  for t in "tcp bw 1m" "softib bw 1m" "tcp lat 8" "tcp lat 64k" "tcp lat 1m" "softib lat 8" "softib lat 64k" "softib lat 1m"; do
    read -r tr test size <<<"$t"
    for build in A B; do
      bin=$A; [ $build = B ] && bin=$B
      v=$(perf_run "$bin" "$tr" "$test" "$size")
      echo "round $r, $tr $test $size, $build: $v"
      echo "$tr $test $size $build $v" >>"$d/all"
    done
  done
done
python3 - "$d/all" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 5:
        continue
    t, test, size, build = f[:4]
    if test == "bw":
        d[(t, test, size, "GB/s", build)].append(float(f[4]))
        d[(t, test, size, "client CPU s/GB", build)].append(float(f[5]))
    else:
        d[(t, test, size, "RTT p50 us", build)].append(float(f[4]))
fmt = lambda xs: "%.3g (%.3g-%.3g)" % (statistics.median(xs), min(xs), max(xs))
for k in sorted({k[:4] for k in d}):
    a, b = d[k + ("A",)], d[k + ("B",)]
    if a and b:
        print(f"{' '.join(k)}: A {fmt(a)}, B {fmt(b)}, B / A {statistics.median(b) / statistics.median(a):.2f}")
EOF
