# A FUSE mount of a local stripefs cluster, for scripts that run as root. Source it, then:
#
#   mount_local_cluster STRIPEFS WORK IO_SERVERS [MOUNT_ARGS...]   # data in WORK/data, mount at WORK/mnt
#   unmount_local_cluster WORK                                      # also when nothing was mounted
#
# STRIPEFS is a `stripefs` binary built with `--features fuse`. The caller removes WORK.
serve_pid=""; mount_pid=""

mount_local_cluster() {
  local stripefs="$1" work="$2" n="$3"; shift 3
  mkdir -p "$work/mnt"
  "$stripefs" serve --io-servers "$n" --data-dir "$work/data" >"$work/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 100); do [ -s "$work/data/cluster.toml" ] && grep -q running "$work/serve.log" && break; sleep 0.1; done
  "$stripefs" --cluster "$work/data/cluster.toml" mount "$@" "$work/mnt" >"$work/mount.log" 2>&1 &
  mount_pid=$!
  for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
  mountpoint -q "$work/mnt" || { cat "$work/serve.log" "$work/mount.log" >&2; return 1; }
}

unmount_local_cluster() {
  local work="$1"
  if mountpoint -q "$work/mnt" 2>/dev/null; then umount "$work/mnt" || umount -l "$work/mnt"; fi
  # `stripefs mount` exits once unmounted; a signal meanwhile would race its own unmount.
  if [ -n "$mount_pid" ]; then
    for _ in $(seq 100); do kill -0 "$mount_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$mount_pid" 2>/dev/null || true
    wait "$mount_pid" 2>/dev/null || true
  fi
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
}
