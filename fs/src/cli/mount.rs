//! `stripefs mount`: its options, the FUSE mount in the foreground, and `--background`.

#[cfg(feature = "fuse")]
use super::client;
#[cfg(feature = "fuse")]
use anyhow::Context;
use anyhow::{Result, bail};
use clap::Args;
#[cfg(feature = "fuse")]
use std::io::Write;
use std::path::PathBuf;

/// `mount` options.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// Where to mount.
    mountpoint: PathBuf,
    /// FUSE worker threads (requests served at once).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Mount options, comma-separated: `allow_other` lets every user reach the mount (each
    /// with their own permissions), not only the one who mounted it; `ro` mounts read-only
    /// (changes fail with EROFS); `rw` and `default_permissions` are the defaults.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
    /// Kernel-cached mode: serve files through the kernel's page cache with write-back instead
    /// of direct I/O to the io servers (the default, PVFS semantics). Data written reaches the
    /// io servers at close, fsync or msync at the latest; an open sees what other clients
    /// closed before it (close-to-open, as NFS), but not writes they still cache. For
    /// single-writer files, build trees and files read again; not for files written by
    /// several clients at once.
    #[arg(long)]
    cache: bool,
    /// With `--cache`: how far the kernel reads ahead of a reader going through a file in
    /// order (`1M`, `4M`; `0` keeps the kernel's 128 KiB). Only root may set it; a mount by
    /// another user keeps the kernel's.
    #[arg(long, default_value = "1M", value_parser = stripefs::units::parse_size, requires = "cache")]
    read_ahead: u64,
    /// Return once the mount is live, leaving it served by a process in the background
    /// (default: serve in the foreground until unmounted or Ctrl-C). Unmount with `umount` or
    /// `fusermount3 -u`.
    #[arg(short, long)]
    background: bool,
    /// With `--background`: the file the mount's server appends its log to once it is live
    /// (default: none; warnings it prints before it is live are shown by this command).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Internal: the process `--background` starts; says `MOUNTED` on stdout once live.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

/// What mount options `opts` ask for; anything unknown is refused by name.
#[derive(Debug, Default, PartialEq, Eq)]
struct MountOpts {
    allow_other: bool,
    read_only: bool,
}

fn mount_opts(opts: &[String]) -> Result<MountOpts> {
    let mut m = MountOpts::default();
    for o in opts {
        match o.as_str() {
            "allow_other" => m.allow_other = true,
            "ro" => m.read_only = true,
            "rw" => m.read_only = false,
            // Always on: accepted so that fstab-style option lists work.
            "default_permissions" => {}
            other => {
                bail!("unknown mount option {other:?} (known: allow_other, ro, rw, default_permissions)")
            }
        }
    }
    Ok(m)
}

/// `stripefs mount`: serves the mount until it is unmounted (or Ctrl-C), or with
/// `--background` returns once it is live.
#[cfg(feature = "fuse")]
pub fn mount(cluster: Option<PathBuf>, a: MountArgs) -> Result<()> {
    let m = mount_opts(&a.options)?;
    if a.log_file.is_some() && !a.background && !a.daemon_child {
        bail!("--log-file is for --background; in the foreground the log goes to stderr");
    }
    if a.background {
        return mount_in_background(cluster, &a);
    }
    let mut opts = stripefs::fuse::MountOptions::default();
    opts.threads = a.threads;
    opts.allow_other = m.allow_other;
    opts.read_only = m.read_only;
    opts.kernel_cache = a.cache;
    opts.read_ahead = (a.read_ahead > 0).then_some(a.read_ahead);
    if a.daemon_child {
        // Out of the caller's session: its terminal closing or its Ctrl-C leave the mount be.
        let _ = nix::unistd::setsid();
        // Nor does it hold the caller's directory, which would keep that file system busy
        // (its paths arrive whole).
        let _ = std::env::set_current_dir("/");
    }
    let c = client(cluster)?;
    let detach = if a.daemon_child { Some(Detach::open(a.log_file.as_deref())?) } else { None };
    let mountpoint = a.mountpoint.display().to_string();
    stripefs::fuse::mount_notify(c, &a.mountpoint, opts, move || {
        tracing::info!(mountpoint, "mounted");
        if let Some(d) = detach {
            d.say_mounted();
        }
    })
    .with_context(|| format!("mounting on {}", a.mountpoint.display()))?;
    Ok(())
}

/// Where the server of a background mount writes once it is live. Until then its output goes
/// to the command that started it, through pipes that close when that command exits: a write
/// to them after that fails, and a log line must not cost the mount.
#[cfg(feature = "fuse")]
struct Detach {
    log: std::fs::File,
    null: std::fs::File,
}

#[cfg(feature = "fuse")]
impl Detach {
    /// Opens the log (`None`: nowhere) before mounting, so a log file that cannot be written
    /// fails the mount with its reason.
    fn open(log_file: Option<&std::path::Path>) -> Result<Self> {
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").context("opening /dev/null")?;
        let log = match log_file {
            // Owner-only, as everything stripefs writes: the log names files and users.
            Some(p) => stripefs::private::options()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("log file {}", p.display()))?,
            None => null.try_clone().context("opening /dev/null")?,
        };
        Ok(Detach { log, null })
    }

    /// Moves the log off the pipe, then tells the waiting command the mount is live (which
    /// closes the last pipe).
    fn say_mounted(self) {
        let _ = nix::unistd::dup2_stderr(&self.log);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "MOUNTED");
        let _ = out.flush();
        let _ = nix::unistd::dup2_stdout(&self.null);
    }
}

/// `mount --background`: starts this binary again as the mount's server (in a session of its
/// own) and returns once it says the mount is live, so the next command of a script finds it;
/// if it fails first, its error is this command's.
#[cfg(feature = "fuse")]
fn mount_in_background(cluster: Option<PathBuf>, a: &MountArgs) -> Result<()> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().context("finding the stripefs binary")?;
    let cluster = super::cluster_path(cluster);
    let cluster = std::fs::canonicalize(&cluster).unwrap_or(cluster);
    let mountpoint = std::fs::canonicalize(&a.mountpoint)
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--cluster").arg(&cluster).arg("mount").arg(&mountpoint).arg("--daemon-child");
    cmd.arg("--threads").arg(a.threads.to_string());
    if a.cache {
        cmd.arg("--cache").arg("--read-ahead").arg(a.read_ahead.to_string());
    }
    if !a.options.is_empty() {
        cmd.arg("-o").arg(a.options.join(","));
    }
    if let Some(log) = &a.log_file {
        // The server's working directory is this command's, but say it whole in its arguments.
        cmd.arg("--log-file").arg(std::path::absolute(log).unwrap_or_else(|_| log.clone()));
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting the background mount")?;
    // Drained meanwhile, so a chatty log cannot fill the pipe and stall the child before it
    // mounts; only the end is kept: shown once it is live (its warnings), or as the reason it
    // failed. The child moves its log off the pipe before it says it is live, so the pipe
    // ends then.
    let (said_tx, said_rx) = std::sync::mpsc::channel();
    if let Some(e) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut tail = std::collections::VecDeque::new();
            for line in std::io::BufReader::new(e).lines().map_while(Result::ok) {
                tail.push_back(line);
                if tail.len() > 20 {
                    tail.pop_front();
                }
            }
            let _ = said_tx.send(tail.into_iter().collect::<Vec<_>>().join("\n"));
        });
    }
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "MOUNTED" {
        let said = said_rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap_or_default();
        // The mount is live whatever happens to these lines (a closed stderr must not fail it).
        if !said.trim().is_empty() {
            let _ = writeln!(std::io::stderr(), "{}", said.trim_end());
        }
        let _ = writeln!(std::io::stdout(), "mounted on {} (pid {})", mountpoint.display(), child.id());
        return Ok(());
    }
    let status = child.wait()?;
    let said = said_rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap_or_default();
    let said = said.trim().trim_start_matches("stripefs: ");
    bail!("the background mount exited ({status}) before it was live: {said}")
}

/// `stripefs mount` without the `fuse` feature.
#[cfg(not(feature = "fuse"))]
pub fn mount(_cluster: Option<PathBuf>, a: MountArgs) -> Result<()> {
    let _ =
        (a.mountpoint, a.threads, a.background, a.daemon_child, a.cache, a.log_file, mount_opts(&a.options)?);
    bail!("this stripefs was built without FUSE support; rebuild with `--features fuse`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_are_read_and_unknown_ones_refused() {
        let o = |v: &[&str]| mount_opts(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(o(&[]).unwrap(), MountOpts::default());
        assert_eq!(o(&["ro", "allow_other"]).unwrap(), MountOpts { allow_other: true, read_only: true });
        assert_eq!(o(&["ro", "rw", "default_permissions"]).unwrap(), MountOpts::default(), "the last wins");
        let e = o(&["ro", "noexec"]).unwrap_err().to_string();
        assert!(e.contains("\"noexec\"") && e.contains("known: allow_other, ro"), "{e}");
    }
}
