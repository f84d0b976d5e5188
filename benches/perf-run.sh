# One `ionet-perf client` run against a fresh `ionet-perf server`, for the bench scripts. Source
# it, then:
#
#   perf_run IONET_PERF TRANSPORT TEST SIZE [SERVER_ARGS] [CLIENT_ARGS]
#
# TEST is `bw` (`--window 16 --sl bulk --runs 3`, heap buffers; prints "GB/s client-CPU-s/GB")
# or `lat` (`--runs 3`; prints the round trip's p50 in µs). SERVER_ARGS and CLIENT_ARGS are extra
# flags, split on spaces (`--wait block --cpu 1`).
perf_run() {
  local p="$1" t="$2" test="$3" size="$4" sargs="${5:-}" cargs="${6:-}" log sp a
  log="$(mktemp)"
  # shellcheck disable=SC2086 # the extra flags are meant to split
  "$p" server --listen "$t://127.0.0.1:0" $sargs >"$log" 2>&1 &
  sp=$!
  for _ in $(seq 50); do grep -q LISTEN "$log" 2>/dev/null && break; sleep 0.1; done
  a=$(awk '/LISTEN/{print $2}' "$log")
  if [ "$test" = bw ]; then
    # shellcheck disable=SC2086
    "$p" client --connect "$a" --test bw --sizes "$size" --window 16 --sl bulk --runs 3 $cargs 2>&1 \
      | awk '/GB\/s/{for (i = 1; i <= NF; i++) { if ($i == "GB/s") g = $(i-1); if ($i == "s/GB") c = $(i-1) } print g, c}'
  else
    # shellcheck disable=SC2086
    "$p" client --connect "$a" --test lat --sizes "$size" --runs 3 $cargs 2>&1 \
      | awk '/RTT p50/{for (i = 1; i <= NF; i++) if ($i == "p50") print $(i+1)}'
  fi
  kill "$sp" 2>/dev/null || true; wait "$sp" 2>/dev/null || true
  rm -f "$log"
}
