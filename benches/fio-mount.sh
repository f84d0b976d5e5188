#!/usr/bin/env bash
# fio through the FUSE mount of a local cluster: what a user of the mount sees.
#
#   sudo benches/fio-mount.sh STRIPEFS [RUNS] [SIZE]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse`. Starts a local cluster of 4 io
# servers over tcp:// with its data on the disk file system (under /var/tmp, not tmpfs), mounts
# it, and runs RUNS times (default 5): a sequential write of SIZE (default 1G) in 1 MiB psync
# writes ending with an fsync, then a sequential read of it. Prints one line per run with both
# rates in MiB/s as fio reports them, then the medians. Give two binaries' figures side by side
# by running it twice in one sitting.
set -euo pipefail
stripefs="$(realpath "$1")"
runs="${2:-5}"
size="${3:-1G}"
command -v fio >/dev/null || { echo "fio-mount.sh: needs fio (apt-get install fio)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "fio-mount.sh: mounting needs root" >&2; exit 1; }
work="$(mktemp -d -p /var/tmp)"
. "$(dirname "$0")/../fs/tests/local-mount.sh"
cleanup() { unmount_local_cluster "$work"; rm -rf "$work"; }
trap cleanup EXIT
mount_local_cluster "$stripefs" "$work" 4

rate() { # fio's JSON -> MiB/s of the job's reads or writes
  python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0][sys.argv[1]]; print("%.0f" % (j["bw_bytes"]/2**20))' "$1"
}
w=(); r=()
for i in $(seq "$runs"); do
  wr="$(fio --name=w --directory="$work/mnt" --filename=f --rw=write --bs=1M --size="$size" \
        --ioengine=psync --end_fsync=1 --output-format=json | rate write)"
  rd="$(fio --name=r --directory="$work/mnt" --filename=f --rw=read --bs=1M --size="$size" \
        --ioengine=psync --output-format=json | rate read)"
  rm -f "$work/mnt/f"
  echo "run $i: write $wr MiB/s, read $rd MiB/s"
  w+=("$wr"); r+=("$rd")
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (" a[1] "-" a[NR] ")"}'; }
echo "median of $runs, min-max: write $(med "${w[@]}") MiB/s, read $(med "${r[@]}") MiB/s"
