#!/usr/bin/env bash
# softib:// streaming from plain heap buffers beside tcp://, round by round.
#
#   benches/softib-heap-vs-tcp.sh IONET_PERF [ROUNDS] [pin] [SIZE]
#
# IONET_PERF is an `ionet-perf` binary (cargo build --release -p ionet-perf). Each round starts a
# fresh `ionet-perf server` on tcp://, runs `ionet-perf client --test bw --sizes SIZE (default 1m)
# --window 16 --sl bulk --runs 3` against it (heap buffers: what a program gets without
# `Endpoint::alloc`), then does the same on softib://; first with blocking waits, then with the
# library's default, adaptive waits (both ends). Unpinned, or with `pin` the client on CPU 0 and
# the server on CPU 1. Prints each round's GB/s and client CPU per GB, then per wait mode the
# median of the rounds' softib / tcp ratios with their min-max, and the medians.
set -euo pipefail
P="$(realpath "$1")"; rounds="${2:-5}"; pin="${3:-}"; size="${4:-1m}"
d=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$d"' EXIT
. "$(dirname "$0")/perf-run.sh"
spin=""; cpin=""
if [ "$pin" = pin ]; then spin="--cpu 1"; cpin="--cpu 0"; fi
one() { # transport wait -> "GB/s CPU-s/GB" of one client run against a fresh server
  perf_run "$P" "$1" bw "$size" "--wait $2 $spin" "--wait $2 $cpin"
}
: >"$d/block"; : >"$d/adaptive"
for r in $(seq "$rounds"); do
  for w in block adaptive; do
    read -r tg tc <<<"$(one tcp $w)"
    read -r sg sc <<<"$(one softib $w)"
    echo "round $r, $w waits: tcp $tg GB/s (client $tc s/GB), softib heap $sg GB/s (client $sc s/GB)"
    echo "$tg $tc $sg $sc" >>"$d/$w"
  done
done
for w in block adaptive; do
python3 - "$d/$w" "$size" "${pin:-unpinned}" "$w" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
def med(xs, f="%.3g", unit=""):
    return (f + unit + " (" + f + "-" + f + ")") % (statistics.median(xs), min(xs), max(xs))
ratio = [s / t for t, _, s, _ in rows]
cpu = [100 * sc / tc for _, tc, _, sc in rows]
print(f"{sys.argv[2]}, {sys.argv[3]}, {sys.argv[4]} waits, median of {len(rows)} rounds (min-max): softib heap / tcp "
      f"{med(ratio, '%.2f', 'x')}; GB/s tcp {med([r[0] for r in rows])}, softib "
      f"{med([r[2] for r in rows])}; client CPU per GB softib / tcp {med(cpu, '%.1f', ' %%')}")
EOF
done
