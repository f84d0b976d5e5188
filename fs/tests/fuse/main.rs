//! The FUSE mount, used through ordinary tools: `cp` a file in, `cmp` it back, `ls`, `ln -s`,
//! `rm`, unmount; hard links, FIFOs, sockets and device nodes; the permissions of users other
//! than root (through `setpriv`). Needs /dev/fuse, and root for the users, so the tests are
//! ignored unless asked for (`cargo test -- --ignored`, as CI does as root), and then fail
//! where they cannot mount.
#![cfg(feature = "fuse")]

#[path = "../common/mod.rs"]
mod common;

mod cached;
mod data;
mod faults;
mod lifecycle;
mod namespace;
mod sync;

use common::{TestCluster, no_flushes, no_objects_ahead, output_within, pattern, requests_during};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Mount {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.dir) {
            let _ = Command::new("umount").arg(&self.dir).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mount {
    /// The mount's server.
    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }
}

fn mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap_or("?"))))
        .unwrap_or(false)
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("command runs");
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `stripefs mount` of `tc`'s cluster on `<tc.dir>/mnt`, once the mount is there.
fn mount(tc: &TestCluster) -> Mount {
    mount_with(tc, &[])
}

/// As [`mount`], with extra arguments to `stripefs mount` (`-o allow_other`).
fn mount_with(tc: &TestCluster, args: &[&str]) -> Mount {
    mount_at(tc, "mnt", args)
}

/// As [`mount_with`], on `<tc.dir>/<name>` (another mount of the same cluster: another client).
fn mount_at(tc: &TestCluster, name: &str, args: &[&str]) -> Mount {
    start_mount(tc, name, args, &[], None)
}

/// `stripefs mount` of `tc`'s cluster on `<tc.dir>/mnt`, with `env` set for the mount's server
/// (`RUST_LOG`), its log in the file returned, once the mount is there.
fn mount_logging(tc: &TestCluster, env: &[(&str, &str)]) -> (Mount, std::path::PathBuf) {
    let log = tc.dir.path().join("mount.log");
    (start_mount(tc, "mnt", &[], env, Some(&log)), log)
}

/// `stripefs mount` with `args` on a new directory `<tc.dir>/<name>`, `env` set for its server
/// and its standard error in `log` if given, once the mount is there.
fn start_mount(
    tc: &TestCluster,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: Option<&Path>,
) -> Mount {
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing");
    let mnt = tc.dir.path().join(name);
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
    cmd.envs(env.iter().copied())
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .arg("mount")
        .args(args)
        .arg(&mnt)
        .stdin(Stdio::null());
    if let Some(log) = log {
        cmd.stderr(std::fs::File::create(log).unwrap());
    }
    let mut m = Mount { child: cmd.spawn().unwrap(), dir: mnt.clone() };
    let t = Instant::now();
    while !mounted(&mnt) {
        assert!(t.elapsed() < Duration::from_secs(20), "mount did not appear");
        if let Ok(Some(s)) = m.child.try_wait() {
            let logged = log.and_then(|l| std::fs::read_to_string(l).ok()).unwrap_or_default();
            panic!("stripefs mount exited: {s}: {logged}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    m
}

/// Read and write requests the io servers have served so far, all together.
fn io_requests(c: &stripefs::Client) -> (u64, u64) {
    c.server_stats()
        .into_iter()
        .map(|s| s.expect("io server answers"))
        .fold((0, 0), |(r, w), s| (r + s.reads, w + s.writes))
}

/// Syncs each io server has served so far (by absolute server number).
fn syncs(c: &stripefs::Client) -> Vec<u64> {
    c.server_stats().into_iter().map(|s| s.expect("io server answers").syncs).collect()
}

/// Unmounts `dir` when dropped if it is still mounted (a background mount has no child to
/// kill: its server exits on the unmount).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
}

/// A cluster of two io servers holding `/f.bin` (`len` bytes of pattern `seed`), and an empty
/// directory `mnt` to mount it on.
fn cluster_with_a_file(len: usize, seed: u64) -> (TestCluster, bytes::Bytes, std::path::PathBuf) {
    let tc = TestCluster::start("tcp", 2);
    let data = pattern(len, seed);
    let f = tc.client().create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    let mnt = tc.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    (tc, data, mnt)
}

/// How `child` exited, if it does within `limit`.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `seen` counts once it reaches `want`, or after `limit` at the latest.
fn count_within(limit: Duration, want: usize, seen: impl Fn() -> usize) -> usize {
    let t = Instant::now();
    let mut n = seen();
    while t.elapsed() < limit && n < want {
        std::thread::sleep(Duration::from_millis(20));
        n = seen();
    }
    n
}

/// Asserts `got` is `want`, saying where they part instead of printing megabytes.
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes, want {}; first difference at {at}", got.len(), want.len());
    }
}

/// The whole of `path` as the library reads it from the io servers.
fn read_lib(c: &stripefs::Client, path: &str) -> Vec<u8> {
    let f = c.open(path, stripefs::capability::Rights::READ).unwrap();
    let mut v = vec![0; f.size().unwrap() as usize];
    let n = f.read_into(0, &mut v).unwrap();
    assert_eq!(n, v.len());
    v
}

/// Bytes the io servers have read from their files so far, all servers together.
fn bytes_read(c: &stripefs::Client) -> u64 {
    c.server_stats().into_iter().map(|s| s.expect("io server answers").bytes_read).sum()
}

/// Maps a new file on `m` shared: the mapping shows what was written through a descriptor
/// before, and its own writes reach the io servers (read back by `c`) by `msync`.
fn shared_mapping_reaches_the_io_servers(m: &Mount, c: &stripefs::Client) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let q = m.dir.join("mapped.bin");
    let f = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&q).unwrap();
    f.set_len(3 * 65536).unwrap();
    f.write_all_at(b"written", 70_000).unwrap();
    // SAFETY: a fresh shared mapping of a file of that length, unmapped before `f` is closed.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            3 * 65536,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts_mut(at as *mut u8, 3 * 65536);
        assert_eq!(&bytes[70_000..70_007], b"written");
        bytes[65530..65540].copy_from_slice(b"0123456789");
        assert_eq!(libc::msync(at, 3 * 65536, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(at, 3 * 65536), 0);
    }
    let back = read_lib(c, "/mapped.bin");
    assert_eq!((back.len(), &back[65530..65540]), (3 * 65536, &b"0123456789"[..]));
    assert_eq!(&back[70_000..70_007], b"written");
}
