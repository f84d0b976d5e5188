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
    /// (changes fail with EROFS); `noexec`, `noatime`; `suid` and `dev` honour set-id bits and
    /// device nodes (off by default: any client may make them); `rw`, `nosuid`, `nodev`,
    /// `exec`, `relatime` and `default_permissions` are the defaults; fstab's `defaults`,
    /// `auto`, `noauto`, `_netdev`, `nofail` and `x-…` are accepted and left to mount(8).
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
    suid: bool,
    dev: bool,
    no_exec: bool,
    no_atime: bool,
}

/// The options `-o` takes, for the error that names an unknown one.
const KNOWN_OPTIONS: &str = "allow_other, ro, rw, default_permissions, nosuid, suid, nodev, dev, \
                             noexec, exec, noatime, atime, relatime, and fstab's defaults, auto, \
                             noauto, _netdev, nofail, x-*";

fn mount_opts(opts: &[String]) -> Result<MountOpts> {
    let mut m = MountOpts::default();
    for o in opts {
        match o.as_str() {
            "allow_other" => m.allow_other = true,
            "ro" => m.read_only = true,
            "rw" => m.read_only = false,
            "suid" => m.suid = true,
            "nosuid" => m.suid = false,
            "dev" => m.dev = true,
            "nodev" => m.dev = false,
            "noexec" => m.no_exec = true,
            "exec" => m.no_exec = false,
            "noatime" => m.no_atime = true,
            // The kernel's default for a mount that does not say `noatime`.
            "atime" | "relatime" => m.no_atime = false,
            // Always on: accepted so that fstab-style option lists work.
            "default_permissions" => {}
            // For mount(8) and systemd, not the file system; `mount` passes some of them on.
            "defaults" | "auto" | "noauto" | "_netdev" | "nofail" => {}
            x if x.starts_with("x-") || x.starts_with("comment=") => {}
            other => bail!("unknown mount option {other:?} (known: {KNOWN_OPTIONS})"),
        }
    }
    Ok(m)
}

/// The name mount(8) runs a file system's helper by: `mount -t stripefs CLUSTER_FILE DIR`, and
/// `/etc/fstab` entries of type `stripefs`, run `/sbin/mount.stripefs`, a link to this binary.
pub const HELPER_NAME: &str = "mount.stripefs";

/// How mount(8) runs a helper: `mount.stripefs CLUSTER_FILE DIR [-sfnv] [-o OPTIONS] [-t TYPE]`.
#[derive(clap::Parser, Debug)]
#[command(name = HELPER_NAME, version, about = "Mount stripefs for mount(8) and /etc/fstab, in the background")]
pub struct HelperArgs {
    /// The cluster file (an fstab entry's first field).
    cluster: PathBuf,
    /// Where to mount.
    mountpoint: PathBuf,
    /// Mount options, comma-separated: those of `stripefs mount -o`, and its flags as `cache`,
    /// `read_ahead=SIZE`, `threads=N` and `log_file=PATH`.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
    /// Sloppy: leave out options it does not know, with a warning, instead of refusing them.
    #[arg(short = 's')]
    sloppy: bool,
    /// Fake: check the options, but do not mount.
    #[arg(short = 'f')]
    fake: bool,
    /// Write no mtab (there is none to write): accepted for mount(8).
    #[arg(short = 'n')]
    no_mtab: bool,
    /// Verbose: accepted for mount(8).
    #[arg(short = 'v')]
    verbose: bool,
    /// The type asked for: `stripefs`, or `fuse.stripefs` as the kernel lists it.
    #[arg(short = 't')]
    fs_type: Option<String>,
}

/// The `stripefs` command line that mounts what `h` asks for in the background (`None`: only
/// check it, for `-f`), so that the helper's mount is exactly `stripefs mount --background`'s.
pub fn helper_command_line(h: HelperArgs) -> Result<Option<Vec<std::ffi::OsString>>> {
    if let Some(t) = h.fs_type.as_deref().filter(|t| !["stripefs", "fuse.stripefs"].contains(t)) {
        bail!("{HELPER_NAME} mounts stripefs, not {t:?}");
    }
    let mut flags: Vec<std::ffi::OsString> = Vec::new();
    let mut options = Vec::new();
    for o in h.options {
        match o.split_once('=') {
            _ if o == "cache" => flags.push("--cache".into()),
            Some(("read_ahead", v)) => flags.extend(["--read-ahead".into(), v.into()]),
            Some(("threads", v)) => flags.extend(["--threads".into(), v.into()]),
            Some(("log_file", v)) => flags.extend(["--log-file".into(), v.into()]),
            _ if h.sloppy && mount_opts(std::slice::from_ref(&o)).is_err() => {
                eprintln!("{HELPER_NAME}: leaving out the unknown mount option {o:?}");
            }
            _ => options.push(o),
        }
    }
    mount_opts(&options)?;
    if h.fake {
        return Ok(None);
    }
    let mut line: Vec<std::ffi::OsString> = vec![
        HELPER_NAME.into(),
        "--cluster".into(),
        h.cluster.into(),
        "mount".into(),
        h.mountpoint.into(),
        "--background".into(),
    ];
    line.extend(flags);
    if !options.is_empty() {
        line.extend(["-o".into(), options.join(",").into()]);
    }
    Ok(Some(line))
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
    opts.suid = m.suid;
    opts.dev = m.dev;
    opts.no_exec = m.no_exec;
    opts.no_atime = m.no_atime;
    opts.kernel_cache = a.cache;
    opts.read_ahead = (a.read_ahead > 0).then_some(a.read_ahead);
    if a.daemon_child {
        // Out of the caller's session: its terminal closing or its Ctrl-C leave the mount be.
        let _ = nix::unistd::setsid();
        // Nor does it hold the caller's directory, which would keep that file system busy
        // (its paths arrive whole).
        let _ = std::env::set_current_dir("/");
    }
    // Listed as the mount's source, so `findmnt` says which cluster is mounted, and `mount -a`
    // finds an fstab entry's mount by it (as the path resolved, which mount(8) compares).
    let file = super::cluster_path(cluster.clone());
    opts.source = std::fs::canonicalize(&file).unwrap_or(file).display().to_string();
    let c = client(cluster)?;
    // A cluster whose meta server does not answer (down, a wrong address) or refuses this
    // client (another cluster's key) would be mounted with every call on it failing, as a
    // mount whose server died does: refused here instead, naming the server and why.
    c.getattr(stripefs::proto::Handle::ROOT).context("not mounting")?;
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
        let both = MountOpts { allow_other: true, read_only: true, ..Default::default() };
        assert_eq!(o(&["ro", "allow_other"]).unwrap(), both);
        assert_eq!(o(&["ro", "rw", "default_permissions"]).unwrap(), MountOpts::default(), "the last wins");
        let flags = MountOpts { suid: true, dev: true, no_exec: true, no_atime: true, ..Default::default() };
        assert_eq!(o(&["suid", "dev", "noexec", "noatime"]).unwrap(), flags);
        assert_eq!(
            o(&["noexec", "exec", "noatime", "relatime", "nosuid", "nodev"]).unwrap(),
            MountOpts::default()
        );
        // fstab's own options are for mount(8) and systemd.
        let fstab = ["defaults", "_netdev", "nofail", "noauto", "x-systemd.automount", "comment=x"];
        assert_eq!(o(&fstab).unwrap(), MountOpts::default());
        let e = o(&["ro", "sync"]).unwrap_err().to_string();
        assert!(e.contains("\"sync\"") && e.contains("known: allow_other, ro"), "{e}");
    }

    /// mount(8)'s arguments become `stripefs mount --background`'s.
    #[test]
    fn the_helper_mounts_as_stripefs_mount_in_the_background() {
        use clap::Parser;
        let line = |args: &[&str]| {
            let h = HelperArgs::try_parse_from([HELPER_NAME].iter().chain(args)).unwrap();
            helper_command_line(h)
                .map(|l| l.map(|l| l.join(std::ffi::OsStr::new(" ")).into_string().unwrap()))
        };
        assert_eq!(
            line(&["/etc/c.toml", "/mnt", "-o", "rw,cache,read_ahead=4M,threads=8,_netdev"])
                .unwrap()
                .unwrap(),
            "mount.stripefs --cluster /etc/c.toml mount /mnt --background --cache --read-ahead 4M --threads 8 \
             -o rw,_netdev"
        );
        assert_eq!(
            line(&["-n", "-v", "c.toml", "/mnt", "-t", "stripefs", "-o", "log_file=/var/log/sfs.log"])
                .unwrap()
                .unwrap(),
            "mount.stripefs --cluster c.toml mount /mnt --background --log-file /var/log/sfs.log"
        );
        assert_eq!(line(&["c", "/mnt", "-f", "-o", "ro"]).unwrap(), None, "fake: checked, not mounted");
        let e = line(&["c", "/mnt", "-o", "ro,bogus"]).unwrap_err().to_string();
        assert!(e.contains("\"bogus\""), "{e}");
        let sloppy = line(&["c", "/mnt", "-s", "-o", "ro,bogus"]).unwrap().unwrap();
        assert!(sloppy.ends_with("--background -o ro"), "{sloppy}");
        let e = line(&["c", "/mnt", "-t", "nfs"]).unwrap_err().to_string();
        assert!(e.contains("not \"nfs\""), "{e}");
    }
}
