#!/usr/bin/env bash
# How fast the mount could read on this host, beside how fast it does.
#
#   sudo benches/mount-read-ceiling.sh STRIPEFS FUSE_CEILING [RUNS]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse`, FUSE_CEILING the `fuse_ceiling`
# example (`cargo build --release -p stripefs --example fuse_ceiling`): a FUSE file system that
# answers reads from memory. Starts a local cluster of 4 io servers over tcp:// (data on the disk
# file system, under /var/tmp), mounts it with the default options, writes a 1 GiB file, and runs
# RUNS rounds (default 5) of, in this order:
#   cp-out   `stripefs cp` of the file to /dev/null (several MiB in flight)
#   mount    `dd bs=1M` of the file through the mount to /dev/null (one MiB at a time)
#   ceiling  `dd bs=1M` of 1 GiB through the in-memory FUSE file system
# Each is timed by the wall clock and by the CPU time of the whole machine (/proc/stat: user,
# nice, system, irq, softirq). The mount's read does the work of `cp` out and then the kernel's
# copy into the reader's pages, which the ceiling's read is alone; with that work spread over
# every CPU without a gap, it would take (CPU of cp-out + CPU of ceiling) / CPUs: the bound
# printed last, as a fraction of cp-out's rate.
set -euo pipefail
stripefs="$(realpath "$1")"
ceiling="$(realpath "$2")"
runs="${3:-5}"
[ "$(id -u)" = 0 ] || { echo "mount-read-ceiling.sh: mounting needs root" >&2; exit 1; }
work="$(mktemp -d -p /var/tmp)"
. "$(dirname "$0")/../fs/tests/local-mount.sh"
ceiling_pid=""
cleanup() {
  if mountpoint -q "$work/ceiling" 2>/dev/null; then umount "$work/ceiling" || umount -l "$work/ceiling"; fi
  if [ -n "$ceiling_pid" ]; then wait "$ceiling_pid" 2>/dev/null || true; fi
  unmount_local_cluster "$work"; rm -rf "$work"
}
trap cleanup EXIT
mount_local_cluster "$stripefs" "$work" 4
mkdir -p "$work/ceiling"
"$ceiling" "$work/ceiling" 1024 >"$work/ceiling.log" 2>&1 &
ceiling_pid=$!
for _ in $(seq 100); do mountpoint -q "$work/ceiling" && break; sleep 0.1; done
mountpoint -q "$work/ceiling" || { cat "$work/ceiling.log" >&2; exit 1; }
export STRIPEFS_CLUSTER="$work/data/cluster.toml"
head -c 1G /dev/urandom >"$work/mnt/f"
"$stripefs" cp sfs:/f /dev/null # the io servers' page cache holds the file for every reader
hz="$(getconf CLK_TCK)"
cpus="$(nproc)"
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
declare -A rate cpu
measure() { # NAME COMMAND... -> appends MiB/s and CPU seconds to the NAME's lists
  local name="$1" b0 b1 t0 t1; shift
  b0="$(busy)"; t0="$(date +%s.%N)"; "$@" >/dev/null 2>&1; t1="$(date +%s.%N)"; b1="$(busy)"
  rate[$name]+="$(python3 -c "print('%.0f' % (1024 / ($t1 - $t0)))") "
  cpu[$name]+="$(python3 -c "print('%.3f' % (($b1 - $b0) / $hz))") "
}
for i in $(seq "$runs"); do
  measure cp-out "$stripefs" cp sfs:/f /dev/null
  measure mount dd if="$work/mnt/f" of=/dev/null bs=1M
  measure ceiling dd if="$work/ceiling/f" of=/dev/null bs=1M
  echo "run $i: $(for n in cp-out mount ceiling; do printf '%s %s MiB/s, ' "$n" "$(echo ${rate[$n]} | awk '{print $NF}')"; done)"
done
med() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)] " (" a[1] "-" a[NR] ")"}'; }
mid() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for n in cp-out mount ceiling; do
  echo "$n: median of $runs, min-max: $(med "${rate[$n]}") MiB/s, CPU $(med "${cpu[$n]}") s per GiB"
done
python3 -c "
cp, mount, ceil = $(mid "${rate[cp-out]}"), $(mid "${rate[mount]}"), $(mid "${rate[ceiling]}")
work = $(mid "${cpu[cp-out]}") + $(mid "${cpu[ceiling]}")
bound = 1024 / (work / $cpus)
print('mount read / cp out %.2fx; ceiling / cp out %.2fx' % (mount / cp, ceil / cp))
print('bound on $cpus CPUs: cp out and the kernel copy, %.3f CPU-s per GiB: %.0f MiB/s, %.2fx of cp out' % (work, bound, bound / cp))
"
