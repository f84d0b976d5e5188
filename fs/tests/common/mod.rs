//! Shared by the integration tests: a local cluster of `stripefs serve` child processes in a
//! temporary directory, killed and removed when dropped.
#![allow(dead_code)]

pub mod netns;

use bytes::Bytes;
use ionet::Scheme;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::{Client, ClientOptions};

pub struct TestCluster {
    // Field order: the cluster (processes) goes before its directory.
    pub cluster: LocalCluster,
    pub dir: tempfile::TempDir,
}

pub fn scheme(s: &str) -> Scheme {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

pub fn options(scheme_name: &str, n: u32, dir: &std::path::Path) -> LocalClusterOptions {
    let mut o = LocalClusterOptions::new(env!("CARGO_BIN_EXE_stripefs"), scheme(scheme_name), n, dir);
    // Small transfer units so even test-sized transfers are pipelined over several units.
    o.transfer_unit = Some(64 * 1024);
    o
}

impl TestCluster {
    pub fn start(scheme_name: &str, n: u32) -> TestCluster {
        Self::start_with(scheme_name, n, |_| {})
    }

    pub fn start_with(scheme_name: &str, n: u32, f: impl FnOnce(&mut LocalClusterOptions)) -> TestCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut o = options(scheme_name, n, dir.path());
        f(&mut o);
        let cluster = LocalCluster::start(o).expect("cluster starts");
        TestCluster { cluster, dir }
    }

    pub fn client(&self) -> Client {
        let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
        Client::connect_with(self.cluster.config(), opts).expect("client connects")
    }

    /// Writes into `dir` a copy of this one-io-server cluster's file and key, the key as
    /// `key_name`, and returns the cluster file's path.
    pub fn copy_cluster_file(&self, dir: &Path, key_name: &str) -> std::path::PathBuf {
        let cfg = self.cluster.config();
        let cluster = dir.join("cluster.toml");
        let text = format!(
            "transport = \"tcp\"\nmeta = \"{}\"\nio_servers = [\"{}\"]\ncluster_key_file = \"{key_name}\"\n",
            cfg.meta, cfg.io_servers[0]
        );
        std::fs::write(&cluster, text).unwrap();
        std::fs::copy(self.dir.path().join("cluster.key"), dir.join(key_name)).unwrap();
        cluster
    }

    pub fn key(&self) -> Vec<u8> {
        self.cluster.config().cluster_key().expect("key")
    }
}

/// For tests that count the servers' requests or objects: the meta server makes no files'
/// objects ahead of their creates, whose requests and objects would be counted too.
pub fn no_objects_ahead(o: &mut LocalClusterOptions) {
    o.meta_args.extend(["--precreate".into(), "0".into()]);
}

/// For tests of what a crash of the meta server keeps: no files' objects made ahead, and no
/// flush of changes of times unless a sync asks (the flushes an hour apart), so what survives
/// is what the meta server made durable itself.
pub fn no_flushes(o: &mut LocalClusterOptions) {
    no_objects_ahead(o);
    o.meta_args.extend(["--flush-interval".into(), "1h".into()]);
}

/// Requests the meta server and the io servers (all together) received while `f` ran, less
/// the status requests that count them.
/// (Start the cluster with [`no_objects_ahead`].)
pub fn requests_during<T>(c: &Client, f: impl FnOnce() -> T) -> ((u64, u64), T) {
    let requests = || {
        let up = |s: &stripefs::ServerState| match s {
            stripefs::ServerState::Up(st) => st.requests,
            s => panic!("{s:?}"),
        };
        let st = c.status();
        (up(&st.meta), st.io.iter().map(up).sum::<u64>())
    };
    let before = requests();
    let out = f();
    let after = requests();
    // The later status requests counted themselves, one at each server.
    ((after.0 - before.0 - 1, after.1 - before.1 - u64::from(c.io_servers())), out)
}

/// Runs `cmd` (its output captured) and kills it if it has not ended within `limit`; its
/// output, and whether it ended by itself.
pub fn output_within(cmd: &mut Command, limit: Duration) -> (std::process::Output, bool) {
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t = std::time::Instant::now();
    let mut ended = true;
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            child.kill().unwrap();
            ended = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (child.wait_with_output().unwrap(), ended)
}

/// Stops process `pid` with `SIGSTOP`, as a host cut off hangs it, and returns once every
/// thread of it has stopped. The signal stops a multithreaded process one thread at a time
/// (the first to take it stops the others), so a thread still running could otherwise answer
/// a request sent right after `kill`, most likely on a loaded machine.
pub fn stop_process(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP).unwrap();
    let stopped =
        |stat: &str| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
        let all = tasks
            .flatten()
            .all(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| stopped(&s)));
        assert!(all || std::time::Instant::now() < deadline, "process {pid} did not stop");
        if all {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// The command prefix that runs a server with `source` (a device name, or an image file with
/// `options` containing `loop`) mounted as `fstype` on `dir`: `unshare` execs `sh` in a new mount
/// namespace, which mounts and execs the server, so the server is the very process the launcher
/// watches and the mount (and a loop device) goes with it, even if the test dies.
pub fn on_private_mount(fstype: &str, options: &str, source: &str, dir: &Path) -> Vec<String> {
    let script = r#"mkdir -p "$0" && mount -t "$1" -o "$2" "$3" "$0" && shift 3 && exec "$@""#;
    ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        .into_iter()
        .map(String::from)
        .chain([dir.display().to_string(), fstype.into(), options.into(), source.into()])
        .collect()
}

/// Makes a `size`-byte `fstype` image file at `image` with `mkfs.<fstype>` and `mkfs_args`;
/// why not, if it cannot (no such mkfs here).
pub fn make_image(fstype: &str, image: &Path, size: u64, mkfs_args: &[&str]) -> Result<(), String> {
    std::fs::File::create(image).and_then(|f| f.set_len(size)).map_err(|e| format!("image file: {e}"))?;
    let mkfs = format!("mkfs.{fstype}");
    match Command::new(&mkfs).args(mkfs_args).arg(image).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{mkfs} failed: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("cannot run {mkfs}: {e}")),
    }
}

/// Runs `sh -c script` with the image `image` (an `fstype`) mounted (loop) at `$0` in a
/// private mount namespace, `args` following as `$1`…; its output, or why it failed (mounting
/// not permitted, no loop devices, no such file system in the kernel).
pub fn with_image_mounted(
    fstype: &str,
    image: &Path,
    script: &str,
    args: &[&str],
) -> Result<Vec<u8>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let full = format!(r#"mount -t "{fstype}" -o loop "{}" "$0" || exit 97; {script}"#, image.display());
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &full])
        .arg(dir.path())
        .args(args)
        .output()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else if out.status.code() == Some(97) {
        Err(format!("cannot mount a {fstype} image: {}", String::from_utf8_lossy(&out.stderr).trim()))
    } else {
        Err(format!(
            "{script:?} on the {fstype} image failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
