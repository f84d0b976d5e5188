#!/usr/bin/env bash
# A sparse file copied out of the FUSE mount with `cp`, as copies and backups of disk images and
# checkpoints make them.
#
#   sudo benches/sparse-copy.sh STRIPEFS [RUNS] [DIR]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse` (the default). A local cluster of
# 4 io servers over tcp:// with its data under DIR (default /var/tmp, the disk), mounted with the
# default options, holds a 1 GiB file with 1 MiB of data at each end, written through the mount.
# Each of RUNS rounds (default 5) drops the page cache, times `cp --sparse=auto` of the file to
# DIR by the wall clock, compares the copy with it, and prints the time and the 512-byte blocks
# the file and the copy hold; the median with its spread comes last.
set -euo pipefail
stripefs="$(realpath "$1")"
runs=${2:-5}
root=${3:-/var/tmp}
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../fs/tests/local-mount.sh"
work="$(mktemp -d -p "$root")"
cleanup() {
  unmount_local_cluster "$work"
  rm -rf "$work"
}
trap cleanup EXIT
mount_local_cluster "$stripefs" "$work" 4
python3 - "$work/mnt/f" <<'PY'
import os, sys
with open(sys.argv[1], "wb") as f:
    f.write(os.urandom(1 << 20))
    f.seek((1 << 30) - (1 << 20))
    f.write(os.urandom(1 << 20))
PY
now() { date +%s.%N; }
times=()
for r in $(seq "$runs"); do
  rm -f "$work/copy"
  sync
  echo 3 >/proc/sys/vm/drop_caches
  t0=$(now)
  cp --sparse=auto "$work/mnt/f" "$work/copy"
  t1=$(now)
  cmp -s "$work/mnt/f" "$work/copy" || { echo "round $r: the copy differs" >&2; exit 1; }
  t=$(python3 -c "print('%.4f' % ($t1 - $t0))")
  echo "round $r: cp $t s, blocks: file $(stat -c %b "$work/mnt/f"), copy $(stat -c %b "$work/copy")"
  times+=("$t")
done
printf '%s\n' "${times[@]}" | python3 -c '
import sys, statistics as st
v = [float(l) for l in sys.stdin if l.strip()]
print(f"cp --sparse=auto of 1 GiB holding 2 MiB: median {st.median(v):.4f} s ({min(v):.4f}-{max(v):.4f})")
'
