#!/usr/bin/env bash
# Creates of small files, as archive tools and copies make them: through the FUSE mount and
# through `stripefs cp -r`.
#
#   sudo benches/small-files.sh STRIPEFS [RUNS] [DIR]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse` (the default). Each of RUNS rounds
# (default 5) starts a local cluster of 4 io servers over tcp:// with its data under DIR (default
# /var/tmp, the disk; /dev/shm takes the disk's flushes out), mounts it with the default options,
# then times by the wall clock:
#   mount-create  2000 empty files made through the mount (open with O_CREAT|O_EXCL, close)
#   cp-r          `stripefs cp -r` of 2000 files of 4 KiB from /dev/shm (each file synced)
# and prints one line per round; the medians with their spread come last.
set -euo pipefail
stripefs="$(realpath "$1")"
runs=${2:-5}
root=${3:-/var/tmp}
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../fs/tests/local-mount.sh"
src="$(mktemp -d -p /dev/shm)"
work=""
cleanup() {
  if [ -n "$work" ]; then unmount_local_cluster "$work"; rm -rf "$work"; fi
  rm -rf "$src"
}
trap cleanup EXIT
for f in $(seq 2000); do head -c 4096 /dev/urandom > "$src/f$f"; done
now() { date +%s.%N; }
results=()
for r in $(seq "$runs"); do
  work="$(mktemp -d -p "$root")"
  mount_local_cluster "$stripefs" "$work" 4
  # Let the meta server make its first files' objects ahead, as on a cluster that has run.
  sleep 0.5
  t0=$(now)
  python3 - "$work/mnt/c" <<'PY'
import os, sys
d = sys.argv[1]
os.mkdir(d)
for i in range(2000):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
PY
  t1=$(now)
  "$stripefs" --cluster "$work/data/cluster.toml" cp -r "$src" sfs:/cp >/dev/null
  t2=$(now)
  line=$(python3 -c "print('%.3f %.3f' % ($t1 - $t0, $t2 - $t1))")
  echo "round $r: mount-create $(cut -d' ' -f1 <<<"$line") s, cp-r $(cut -d' ' -f2 <<<"$line") s"
  results+=("$line")
  unmount_local_cluster "$work"
  rm -rf "$work"
  work=""
done
printf '%s\n' "${results[@]}" | python3 -c '
import sys, statistics as st
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
for i, name in enumerate(["mount-create 2000", "cp-r 2000 x 4 KiB"]):
    v = [r[i] for r in rows]
    print(f"{name}: median {st.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})")
'
