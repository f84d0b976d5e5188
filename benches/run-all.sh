#!/usr/bin/env bash
# The transport A/B benchmark suite in one command: builds the release binaries,
# runs the criterion micro-benchmarks and `stripefs-bench all` (ionet-perf ab / calibrate / qos,
# E1-E5, CPU), writes CSV, Markdown and SVG plots under benchmarks/, and regenerates the suite's
# summary of BENCHMARKS.md (between its "GENERATED" markers; text around them is kept) and
# benchmarks/REPORT.md, every table of the run.
#
#   benches/run-all.sh                # everything, BENCHMARKS.md updated
#   benches/run-all.sh --quick        # smoke check: short runs, output in target/bench-quick,
#                                     # BENCHMARKS.md untouched
#   benches/run-all.sh --runs 7 ...   # extra arguments go to `stripefs-bench all`
#
# Run it on a quiet machine: the figures are wall-clock measurements. Servers are child
# processes on loopback; their data lives on tmpfs (/dev/shm) when present. The run gives up
# (and cleans up) after --timeout-min minutes (default 40).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
target="${CARGO_TARGET_DIR:-target}"
started=$SECONDS

quick=0
for a in "$@"; do [ "$a" = "--quick" ] && quick=1; done

echo "== build (release)"
# The suite runs the stripefs and ionet-perf binaries it finds beside its own.
cargo build --release -p stripefs -p ionet-perf -p stripefs-bench

bench_args=(-- --warm-up-time 1 --measurement-time 3)
if [ "$quick" = 1 ]; then bench_args=(-- --warm-up-time 0.2 --measurement-time 0.5); fi
criterion_cmd="cargo bench -p ionet --bench regcache --bench wire --bench matching --bench flowctl ${bench_args[*]} && cargo bench -p stripefs --bench layout ${bench_args[*]}"
echo "== criterion micro-benchmarks"
cargo bench -p ionet --bench regcache --bench wire --bench matching --bench flowctl "${bench_args[@]}"
cargo bench -p stripefs --bench layout "${bench_args[@]}"

if command -v iperf3 >/dev/null; then
  echo "== iperf3 found: used as a reference"
else
  echo "== iperf3 not installed: its reference row is left out (apt-get install iperf3 to include it)"
fi

echo "== stripefs-bench all"
update=(--update BENCHMARKS.md --out benchmarks)
if [ "$quick" = 1 ]; then update=(); fi
"$target/release/stripefs-bench" all "${update[@]}" \
  --criterion "$target/criterion" --criterion-cmd "$criterion_cmd" "$@"

echo "== done in $(( (SECONDS - started) / 60 )) min $(( (SECONDS - started) % 60 )) s"
