#!/usr/bin/env bash
# POSIX conformance of the FUSE mount: pjdfstest (the Rust rewrite, from crates.io) against a
# mount of a local cluster, as root.
#
#   fs/tests/posix/run.sh STRIPEFS PJDFSTEST [local|cache]
#
# STRIPEFS is a `stripefs` binary built with `--features fuse`, PJDFSTEST the `pjdfstest`
# binary (`cargo install pjdfstest --locked`). The script starts a local cluster (2 io servers)
# in a temporary directory, mounts it with `-o allow_other` (pjdfstest switches to other users),
# runs the whole suite in the mount and prints pjdfstest's summary. It fails if a test fails that
# is not listed in `expected-failures` (each is explained in fs/README.md), or if a listed one
# passes (the list must shrink with the fixes). With `local` as third argument it runs the suite
# on a directory of the local file system instead, for reference; with `cache`, on a mount in the
# kernel-cached mode (`stripefs mount --cache`), against the same list.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
stripefs="$(realpath "$1")"
pjdfstest="$(realpath "$2")"
mode="${3:-mount}"
[ "$(id -u)" = 0 ] || { echo "run.sh: pjdfstest needs root (it switches users)" >&2; exit 1; }
work="$(mktemp -d)"
# Other users must reach the test directory.
chmod 755 "$work"
. "$here/../local-mount.sh"
cleanup() { unmount_local_cluster "$work"; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/mnt"
dir="$work/mnt"
case "$mode" in
  local) ;;
  cache) mount_local_cluster "$stripefs" "$work" 2 --cache -o allow_other ;;
  *) mount_local_cluster "$stripefs" "$work" 2 -o allow_other ;;
esac
# In a subshell: a shell whose working directory is in the mount would keep it busy.
(cd "$dir" && "$pjdfstest" -c "$here/pjdfstest.toml" -p "$dir") >"$work/out.txt" 2>&1 || true
grep '^Summary' "$work/out.txt" || { tail -50 "$work/out.txt" >&2; exit 1; }
failed="$(grep -E '^[a-z_:0-9]+ +FAILED$' "$work/out.txt" | awk '{print $1}' | sort || true)"
expected=""
[ "$mode" = local ] || expected="$(grep -v '^#' "$here/expected-failures" | awk 'NF {print $1}' | sort || true)"
if [ "$failed" != "$expected" ]; then
  echo "pjdfstest failures differ from fs/tests/posix/expected-failures:" >&2
  diff <(printf '%s\n' "$expected") <(printf '%s\n' "$failed") >&2 || true
  grep -A3 -E ' FAILED$' "$work/out.txt" >&2 || true
  exit 1
fi
echo "pjdfstest: failures as expected (${failed:-none})"
