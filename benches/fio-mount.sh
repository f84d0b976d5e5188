#!/usr/bin/env bash
# What a user of the FUSE mount sees, beside what the disk and the CLI do in the same sitting.
#
#   sudo benches/fio-mount.sh STRIPEFS [RUNS] [SIZE] [MODES]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse`. Starts a local cluster of 4 io
# servers over tcp:// with its data on the disk file system (under /var/tmp, not tmpfs), mounts
# it with the default options, and runs RUNS times (default 5), each run in this order:
#   dd     `dd bs=1M conv=fsync` of SIZE (default 1G) to a file beside the servers' data: the disk
#   write  fio through the mount: sequential 1 MiB psync writes of SIZE ending with an fsync
#   read   fio through the mount: sequential 1 MiB reads of that file
#   cp-in  `stripefs cp` of a SIZE file from /dev/shm into the cluster (it fsyncs at the end)
#   cp-out `stripefs cp` of it to /dev/null: fio's reads discard what they read, and a copy into
#          a file would time that file system's page cache as well (checked once, into /dev/shm)
# and once, after the runs, 4 KiB random reads and writes at queue depth 1 through the mount
# (fio, 20 s each, on a 256 MiB file): p50 and p99 completion latency.
# MODES (default `direct`) is a comma-separated list of mount modes: `direct` (the default
# mount) and `cache` (`mount --cache`, the kernel-cached mode, a second mount of the same
# cluster). With both, each run does the write and the read through each mount in turn, so
# the modes are measured interleaved in one sitting. fio invalidates the file's page cache
# before each job (its default), so a cached mount's read starts cold. The random-I/O latency
# is measured through the direct mount only.
# Prints each run's rates in MiB/s (fio's, or SIZE over the command's wall time), then the
# medians with min-max and the ratios the mount is judged by.
set -euo pipefail
stripefs="$(realpath "$1")"
runs="${2:-5}"
size="${3:-1G}"
modes="${4:-direct}"
IFS=, read -r -a modes <<<"$modes"
for m in "${modes[@]}"; do
  case "$m" in direct | cache) ;; *) echo "fio-mount.sh: unknown mount mode $m (direct, cache)" >&2; exit 1 ;; esac
done
command -v fio >/dev/null || { echo "fio-mount.sh: needs fio (apt-get install fio)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "fio-mount.sh: mounting needs root" >&2; exit 1; }
work="$(mktemp -d -p /var/tmp)"
shm="$(mktemp -d -p /dev/shm)"
. "$(dirname "$0")/../fs/tests/local-mount.sh"
cache_pid=""
cleanup() {
  if mountpoint -q "$work/mnt-cache" 2>/dev/null; then umount "$work/mnt-cache" || umount -l "$work/mnt-cache"; fi
  if [ -n "$cache_pid" ]; then wait "$cache_pid" 2>/dev/null || true; fi
  unmount_local_cluster "$work"; rm -rf "$work" "$shm"
}
trap cleanup EXIT
mount_local_cluster "$stripefs" "$work" 4
if [[ " ${modes[*]} " == *" cache "* ]]; then
  mkdir -p "$work/mnt-cache"
  "$stripefs" --cluster "$work/data/cluster.toml" mount --cache "$work/mnt-cache" >"$work/mount-cache.log" 2>&1 &
  cache_pid=$!
  for _ in $(seq 100); do mountpoint -q "$work/mnt-cache" && break; sleep 0.1; done
  mountpoint -q "$work/mnt-cache" || { cat "$work/mount-cache.log" >&2; exit 1; }
fi
dir_of() { if [ "$1" = cache ]; then echo "$work/mnt-cache"; else echo "$work/mnt"; fi; }
bytes="$(numfmt --from=iec "$size")"
mib=$((bytes >> 20))
head -c "$bytes" /dev/urandom >"$shm/src"
export STRIPEFS_CLUSTER="$work/data/cluster.toml"

rate() { # fio's JSON -> MiB/s of the job's reads or writes
  python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0][sys.argv[1]]; print("%.0f" % (j["bw_bytes"]/2**20))' "$1"
}
timed() { # MiB/s of SIZE moved by the command
  local t0 t1; t0="$(date +%s.%N)"; "$@" >/dev/null 2>&1; t1="$(date +%s.%N)"
  python3 -c "print('%.0f' % ($mib / ($t1 - $t0)))"
}
d=(); ci=(); co=()
declare -A w r
for i in $(seq "$runs"); do
  dd_rate="$(timed dd if="$shm/src" of="$work/dd" bs=1M conv=fsync)"
  rm -f "$work/dd"
  said=""
  for m in "${modes[@]}"; do
    dir="$(dir_of "$m")"
    wr="$(fio --name=w --directory="$dir" --filename=f --rw=write --bs=1M --size="$size" \
          --ioengine=psync --end_fsync=1 --output-format=json | rate write)"
    rd="$(fio --name=r --directory="$dir" --filename=f --rw=read --bs=1M --size="$size" \
          --ioengine=psync --output-format=json | rate read)"
    rm -f "$dir/f"
    w[$m]+="$wr "; r[$m]+="$rd "
    said+="$m mount write $wr, $m mount read $rd, "
  done
  cin="$(timed "$stripefs" cp "$shm/src" sfs:/cp)"
  cout="$(timed "$stripefs" cp sfs:/cp /dev/null)"
  if [ "$i" = 1 ]; then
    "$stripefs" cp sfs:/cp "$shm/back"
    cmp -s "$shm/src" "$shm/back" || { echo "fio-mount.sh: stripefs cp read back other bytes" >&2; exit 1; }
    rm -f "$shm/back"
  fi
  "$stripefs" rm sfs:/cp
  echo "run $i: dd $dd_rate, ${said}cp in $cin, cp out $cout MiB/s"
  d+=("$dd_rate"); ci+=("$cin"); co+=("$cout")
done
lat() { # fio's JSON -> "p50 p99" completion latency in µs of the job's reads or writes
  python3 -c 'import json,sys; p=json.load(sys.stdin)["jobs"][0][sys.argv[1]]["clat_ns"]["percentile"]; print("%.0f / %.0f" % (p["50.000000"]/1e3, p["99.000000"]/1e3))' "$1"
}
fio --name=prep --directory="$work/mnt" --filename=rnd --rw=write --bs=1M --size=256M --ioengine=psync \
  --output-format=json >/dev/null
rr="$(fio --name=rr --directory="$work/mnt" --filename=rnd --rw=randread --bs=4k --size=256M \
      --ioengine=psync --time_based --runtime=20 --output-format=json | lat read)"
rw="$(fio --name=rw --directory="$work/mnt" --filename=rnd --rw=randwrite --bs=4k --size=256M \
      --ioengine=psync --time_based --runtime=20 --output-format=json | lat write)"
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (" a[1] "-" a[NR] ")"}'; }
mid() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for m in "${modes[@]}"; do
  # shellcheck disable=SC2086 # the runs' rates, one word each
  echo "median of $runs, min-max, MiB/s: dd $(med "${d[@]}"), $m mount write $(med ${w[$m]}), $m mount read $(med ${r[$m]}), cp in $(med "${ci[@]}"), cp out $(med "${co[@]}")"
  # shellcheck disable=SC2086
  python3 -c "print('$m mount write / dd %.2fx, cp in / dd %.2fx, $m mount read / cp out %.2fx' % ($(mid ${w[$m]})/$(mid "${d[@]}"), $(mid "${ci[@]}")/$(mid "${d[@]}"), $(mid ${r[$m]})/$(mid "${co[@]}")))"
done
echo "4 KiB at queue depth 1 through the mount, p50 / p99 µs: random read $rr, random write $rw"
