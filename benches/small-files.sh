#!/usr/bin/env bash
# Small files, as archive tools and copies make them: through the FUSE mount and through
# `stripefs cp -r`.
#
#   sudo benches/small-files.sh STRIPEFS [RUNS] [DIR]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse` (the default). Each of RUNS rounds
# (default 5) starts a local cluster of 4 io servers over tcp:// with its data under DIR (default
# /var/tmp, the disk; /dev/shm takes the disk's flushes out), mounts it with the default options,
# then times by the wall clock:
#   mount-create  2000 empty files made through the mount (open with O_CREAT|O_EXCL, close)
#   tar-x         `tar -x` through the mount of 20 directories of 100 files of 4 KiB (GNU tar
#                 sets each file's times, owner and mode after writing it)
#   rm-r          `rm -r` of those through the mount
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
mkdir "$src/flat" "$src/tree"
for f in $(seq 2000); do head -c 4096 /dev/urandom > "$src/flat/f$f"; done
for d in $(seq 20); do
  mkdir "$src/tree/d$d"
  for f in $(seq 100); do cp "$src/flat/f$(( (d - 1) * 100 + f ))" "$src/tree/d$d/f$f"; done
done
tar -C "$src" -cf "$src/tree.tar" tree
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
  tar -C "$work/mnt" -xf "$src/tree.tar"
  t2=$(now)
  rm -r "$work/mnt/tree"
  t3=$(now)
  "$stripefs" --cluster "$work/data/cluster.toml" cp -r "$src/flat" sfs:/cp >/dev/null
  t4=$(now)
  line=$(python3 -c "print('%.3f %.3f %.3f %.3f' % ($t1 - $t0, $t2 - $t1, $t3 - $t2, $t4 - $t3))")
  read -r mc tx rr cp <<<"$line"
  echo "round $r: mount-create $mc s, tar-x $tx s, rm-r $rr s, cp-r $cp s"
  results+=("$line")
  unmount_local_cluster "$work"
  rm -rf "$work"
  work=""
done
printf '%s\n' "${results[@]}" | python3 -c '
import sys, statistics as st
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
for i, name in enumerate(["mount-create 2000", "tar-x 2000 x 4 KiB", "rm-r 2000", "cp-r 2000 x 4 KiB"]):
    v = [r[i] for r in rows]
    print(f"{name}: median {st.median(v):.3f} s ({min(v):.3f}-{max(v):.3f})")
'
