//! Mounting: the options, the FUSE session that serves the mount until it is unmounted, and
//! what the operator is told at mount time.

use super::{Ready, StripeFuse};
use crate::client::Client;
use fuser::{MountOption, SessionACL};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Mutex;

/// How to mount: start from [`MountOptions::default`] and set the fields wanted (more options
/// may come, so the struct cannot be built field by field outside this crate).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MountOptions {
    /// Threads serving requests.
    pub threads: usize,
    /// Let every user reach the mount (FUSE's `allow_other`), not only the one who mounted it;
    /// the kernel and the meta server check each one's permissions. A user other than root
    /// may mount so only if `/etc/fuse.conf` has `user_allow_other`.
    pub allow_other: bool,
    /// Mount read-only (FUSE's `ro`): the kernel refuses changes with `EROFS`, and so does the
    /// file system for anything that reaches it.
    pub read_only: bool,
    /// Serve regular files through the kernel's page cache with write-back caching, instead of
    /// the default direct I/O (PVFS semantics: no client cache). Reads of cached data and
    /// small writes stay in memory; a file's data reaches the io servers at the latest when it
    /// is closed or synced (`close`, `fsync`, `msync`), and an open sees what other clients
    /// closed before it (close-to-open consistency, as NFS). Other clients do not see writes
    /// still in this mount's cache, and concurrent writers on different clients to one file
    /// are not kept consistent: for single-writer files, build trees, files read again.
    pub kernel_cache: bool,
    /// With [`kernel_cache`](Self::kernel_cache): how far the kernel reads ahead of a reader
    /// going through a file in order, in bytes (default [`DEFAULT_READ_AHEAD`]; `None` keeps
    /// the kernel's window, 128 KiB). A FUSE mount's window is a setting of the kernel's
    /// (`/sys/class/bdi/<device>/read_ahead_kb`) that only root may change: a mount by another
    /// user keeps the kernel's and logs so at the `info` level. The direct mode has no page cache to
    /// read ahead into and leaves the setting alone.
    pub read_ahead: Option<u64>,
    /// Honour the set-user-ID and set-group-ID bits of programs on the mount (`suid`). Off by
    /// default (`nosuid`), as on every FUSE mount: any client of the cluster may set them.
    pub suid: bool,
    /// Let device nodes on the mount open their devices (`dev`). Off by default (`nodev`).
    pub dev: bool,
    /// Refuse to run programs from the mount (`noexec`).
    pub no_exec: bool,
    /// Leave access times alone on reads (`noatime`; the kernel's default is `relatime`).
    pub no_atime: bool,
    /// The name the kernel lists as the mount's source (`findmnt`, `df`, `/proc/mounts`;
    /// default `stripefs`). The CLI gives the cluster file's path: `mount -a` compares it
    /// with the source of an `/etc/fstab` entry to tell whether that entry is mounted.
    pub source: String,
}

/// How far the kernel-cached mount reads ahead by default: one request of the largest size the
/// kernel sends by default, as the direct mode's reads are. The kernel's own window, 128 KiB,
/// takes eight round trips to the io servers for each of those.
pub const DEFAULT_READ_AHEAD: u64 = 1 << 20;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: 4,
            allow_other: false,
            read_only: false,
            kernel_cache: false,
            read_ahead: Some(DEFAULT_READ_AHEAD),
            suid: false,
            dev: false,
            no_exec: false,
            no_atime: false,
            source: FS_NAME.into(),
        }
    }
}

/// Mounts `client`'s cluster at `mountpoint` and serves it until it is unmounted (or the
/// process gets Ctrl-C / SIGTERM, which unmounts it).
pub fn mount(client: Client, mountpoint: &Path, opts: MountOptions) -> std::io::Result<()> {
    mount_notify(client, mountpoint, opts, || {})
}

/// As [`mount`], running `ready` once the kernel has initialised the mount: from then on
/// requests to it are served (a launcher that puts the mount in the background returns then).
pub fn mount_notify(
    client: Client,
    mountpoint: &Path,
    opts: MountOptions,
    ready: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    make_way(mountpoint, &opts.source)?;
    // The kernel would mount the root directory over a file too, as a file that lists.
    if !std::fs::metadata(mountpoint)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{}: not a directory", mountpoint.display()),
        ));
    }
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(opts.source.clone()),
        // Given to the kernel itself: fuser passes a subtype only to `fusermount3`, and a
        // mount by root would be listed as plain `fuse`, like any other FUSE file system.
        MountOption::CUSTOM(format!("subtype={FS_NAME}")),
        // The kernel checks mode bits against the attributes it has, for every caller, before
        // a request gets here (and handles set-id bits on chown the way it does locally).
        MountOption::DefaultPermissions,
    ];
    let flags = [
        (opts.read_only, MountOption::RO),
        (opts.suid, MountOption::Suid),
        (opts.dev, MountOption::Dev),
        (opts.no_exec, MountOption::NoExec),
        (opts.no_atime, MountOption::NoAtime),
    ];
    cfg.mount_options.extend(flags.into_iter().filter_map(|(on, flag)| on.then_some(flag)));
    if opts.allow_other {
        // fuser otherwise refuses requests from anyone but the mounting user itself.
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    let mut fs = StripeFuse::new(client).read_only(opts.read_only).kernel_cache(opts.kernel_cache);
    fs.on_ready = Ready(Mutex::new(Some(Box::new(ready))));
    let notifier = fs.notifier.clone();
    if !opts.read_only {
        // Clean-up writes; a read-only mount leaves it to the next writable one.
        fs.drop_stale_hidden();
    }
    // Said before the mount is live (once it is sure to be tried): a launcher that backgrounds
    // the mount shows it then.
    let limit = std::fs::read_to_string(MAX_PAGES_LIMIT).ok().and_then(|s| s.trim().parse().ok());
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten();
    let page = page.and_then(|p| u64::try_from(p).ok()).unwrap_or(4096);
    if let Some(note) = request_pages_note(limit, page) {
        tracing::warn!("{note}");
    }
    let (events, stop) = std::sync::mpsc::channel();
    fs.on_end = OnEnd(Some(events.clone()));
    let session = fuser::Session::new(fs, mountpoint, &cfg).map_err(name_the_device)?;
    let _ = notifier.set(session.notifier());
    if let (true, Some(bytes)) = (opts.kernel_cache, opts.read_ahead) {
        set_read_ahead_once_live(mountpoint.to_path_buf(), bytes);
    }
    // The session's own end unmounts the mount point by its path, whatever is mounted there
    // by then, after an unmount by someone else too: fuser 0.18 takes a connection the kernel
    // has ended for a live one. Another mount on the same path meanwhile (a restart of the
    // mount) would be taken down, and the ordinary case logs a failed unmount. So the session
    // runs apart from its mount, and this function unmounts only a connection still alive.
    let device = session.as_fd().try_clone_to_owned()?;
    let _ = ctrlc::set_handler(move || {
        let _ = events.send(Stop::Interrupted);
    });
    let background = session.spawn()?;
    loop {
        match stop.recv() {
            // Unmounted already: the session is ending.
            Ok(Stop::Interrupted) if connection_ended(&device) => {}
            Ok(Stop::Interrupted) => {
                // The session ends once the kernel ends the connection; a mount in use stays.
                if let Err(e) = unmount(mountpoint, false) {
                    tracing::warn!(error = %e, "unmount failed");
                }
            }
            Ok(Stop::Ended) | Err(_) => break,
        }
    }
    if connection_ended(&device) {
        // The kernel ended the connection: nothing to unmount. Dropping the session's mount
        // would unmount the path all the same, so it is never dropped: its device descriptor
        // stays open until the process exits.
        std::mem::forget(background);
        Ok(())
    } else {
        // The session failed with the mount still there: its end unmounts it.
        background.join()
    }
}

/// What ends [`mount_notify`]'s wait.
pub(super) enum Stop {
    /// Ctrl-C or SIGTERM: unmount.
    Interrupted,
    /// The session let go of the file system.
    Ended,
}

/// Sends [`Stop::Ended`] when dropped, with the file system at the session's end.
#[derive(Debug, Default)]
pub(super) struct OnEnd(Option<std::sync::mpsc::Sender<Stop>>);

impl Drop for OnEnd {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.send(Stop::Ended);
        }
    }
}

/// Whether the kernel has ended the FUSE connection on `device` (unmounted or aborted): its
/// device then polls as an error, as libfuse checks before it unmounts.
fn connection_ended(device: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        let mut fds = [PollFd::new(device.as_fd(), PollFlags::empty())];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => return fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return true,
        }
    }
}

/// The FUSE device every mount is served through.
const FUSE_DEVICE: &str = "/dev/fuse";

/// A mount refused for want of permission, where the user may not open the FUSE device: said
/// so, as the refusal otherwise reads as if it were the mount point's. (The device is
/// readable and writable by all on most systems; some containers keep it to root.)
fn name_the_device(e: std::io::Error) -> std::io::Error {
    use nix::unistd::{AccessFlags, access};
    let refused = e.kind() == std::io::ErrorKind::PermissionDenied;
    if refused && access(FUSE_DEVICE, AccessFlags::R_OK | AccessFlags::W_OK).is_err() {
        return std::io::Error::new(
            e.kind(),
            format!(
                "{FUSE_DEVICE}: this user may not open it ({e}); it must be readable and writable by the user who mounts"
            ),
        );
    }
    e
}

/// The file system's name: its subtype, which makes the kernel list a stripefs mount as of
/// type [`FS_TYPE`] (what [`make_way`] knows it by), and its source by default.
const FS_NAME: &str = "stripefs";
const FS_TYPE: &str = "fuse.stripefs";

/// Makes way for a mount on `mountpoint` of the cluster named `source`, or says why not.
///
/// A stripefs mount that a mount process left there when it died (killed, crashed) instead of
/// unmounting is taken away: the kernel answers every look at such a mount with "transport
/// endpoint is not connected", so nothing could be mounted there again, and it serves nothing.
/// It goes lazily, as processes may still hold it open (they keep getting that error). Another
/// file system left so is named in the error instead.
///
/// A live mount of the same cluster there already refuses the mount, as the kernel refuses a
/// device mounted twice on one directory: FUSE would stack a second mount over the first,
/// which then serves only who holds it open, until the second is unmounted.
fn make_way(mountpoint: &Path, source: &str) -> std::io::Result<()> {
    // statfs always asks the file system's server, where a look at the directory may be
    // answered by attributes the kernel still holds.
    let dead = match nix::sys::statfs::statfs(mountpoint) {
        Err(nix::errno::Errno::ENOTCONN) => true,
        Ok(_) => false,
        Err(_) => return Ok(()),
    };
    // As the kernel lists it: the directory it is in resolved (links, `..`), which a look
    // through a dead mount itself could not be.
    let path = std::path::absolute(mountpoint)?;
    let path = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => dir.canonicalize()?.join(name),
        _ => path,
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let top = top_mount(&mountinfo, &path);
    let ours = top.as_ref().is_some_and(|(fs_type, _)| fs_type == FS_TYPE);
    if !dead {
        return match top {
            Some((_, listed)) if ours && unescape_octal(&listed) == source.as_bytes() => {
                Err(std::io::Error::new(
                    std::io::ErrorKind::ResourceBusy,
                    format!("{}: {source} is mounted there already", path.display()),
                ))
            }
            _ => Ok(()),
        };
    }
    if !ours {
        let what =
            top.map_or_else(|| "a file system".into(), |(fs_type, source)| format!("{source} ({fs_type})"));
        return Err(std::io::Error::other(format!(
            "{}: {what} whose server has exited is mounted there; unmount it first (`umount` or \
             `fusermount3 -u`)",
            path.display()
        )));
    }
    unmount(&path, true)?;
    tracing::warn!(
        "took away the stripefs mount left on {} by a mount process that exited without unmounting",
        path.display()
    );
    Ok(())
}

/// The type and source of the file system mounted last (the one on top) at `path` in
/// `mountinfo` (the format of `/proc/self/mountinfo`), if any is.
fn top_mount(mountinfo: &str, path: &Path) -> Option<(String, String)> {
    use std::os::unix::ffi::OsStrExt;
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            let mut fs = fs.split(' ').map(str::to_owned);
            (unescape_octal(point) == path.as_os_str().as_bytes()).then(|| Some((fs.next()?, fs.next()?)))?
        })
        .next_back()
}

/// A mountinfo field with its space, tab, newline and backslash written back (the kernel
/// writes them as `\040`, `\011`, `\012`, `\134`).
fn unescape_octal(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Unmounts `mountpoint`: directly as root, through `fusermount3 -u` (setuid root) for the user
/// who mounted it otherwise; `lazy` detaches the mount at once and lets it go when it is no
/// longer used.
fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    let flags = if lazy { nix::mount::MntFlags::MNT_DETACH } else { nix::mount::MntFlags::empty() };
    match nix::mount::umount2(mountpoint, flags) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            let mut last = std::io::Error::other("no fusermount3 or fusermount");
            let args: &[&str] = if lazy { &["-u", "-z", "--"] } else { &["-u", "--"] };
            for tool in ["fusermount3", "fusermount"] {
                match std::process::Command::new(tool).args(args).arg(mountpoint).status() {
                    Ok(s) if s.success() => return Ok(()),
                    Ok(s) => return Err(std::io::Error::other(format!("{tool} -u: {s}"))),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
        Err(e) => Err(e.into()),
    }
}

/// Sets the mount's read-ahead window to `bytes` from a thread of its own: the kernel sets the
/// window from the mount's answer to its first request, so it can be changed only after that.
/// A look at the mount point waits for it (the kernel holds every request until the mount has
/// answered the first), and names the device whose window it is.
fn set_read_ahead_once_live(mountpoint: std::path::PathBuf, bytes: u64) {
    let spawned = std::thread::Builder::new().name("fuse-read-ahead".into()).spawn(move || {
        use std::os::unix::fs::MetadataExt;
        let dev = match std::fs::metadata(&mountpoint) {
            Ok(m) => m.dev(),
            Err(e) => return tracing::debug!(error = %e, "no read-ahead set: the mount went away"),
        };
        let path = bdi_read_ahead_path(dev);
        let kib = bytes.div_ceil(1024);
        match std::fs::write(&path, kib.to_string()) {
            Ok(()) => tracing::debug!(kib, path = %path.display(), "read-ahead set"),
            Err(e) => {
                let kept = std::fs::read_to_string(&path).map(|s| s.trim().to_owned()).unwrap_or_default();
                tracing::info!(
                    error = %e,
                    path = %path.display(),
                    "keeping the kernel's read-ahead of {kept} KiB instead of {kib} KiB (root may set it)"
                );
            }
        }
    });
    if let Err(e) = spawned {
        tracing::info!(error = %e, "keeping the kernel's read-ahead: no thread to set it");
    }
}

/// The kernel's read-ahead setting of the file system on device `dev` (a FUSE mount's device
/// has no block device behind it; its backing device is named by the device number alone).
fn bdi_read_ahead_path(dev: u64) -> std::path::PathBuf {
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    std::path::PathBuf::from(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
}

/// The kernel's cap on the pages one FUSE request may carry, whatever the mount asks for.
const MAX_PAGES_LIMIT: &str = "/proc/sys/fs/fuse/max_pages_limit";

/// What to tell the operator at mount time about the kernel's cap on request pages (`limit`,
/// when the kernel lets it be set; pages of `page` bytes): below the pages a 1 MiB transfer
/// spans when its buffer does not start on a page boundary (most `malloc`ed buffers do not),
/// the kernel sends each such read or write as two requests, the second of a few bytes, and
/// that one costs a whole round trip to an io server.
fn request_pages_note(limit: Option<u64>, page: u64) -> Option<String> {
    let unaligned_mib = (1 << 20) / page.max(1) + 1;
    let limit = limit.filter(|&l| l < unaligned_mib)?;
    Some(format!(
        "the kernel caps a FUSE request at {limit} pages (fs.fuse.max_pages_limit): a 1 MiB read \
         or write from a buffer that does not start on a page boundary goes as two requests, the \
         second of a few bytes and a round trip of its own; `sysctl fs.fuse.max_pages_limit={}` \
         makes it one",
        unaligned_mib.next_power_of_two()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_on_top_of_a_path_is_found_by_its_escaped_name() {
        let info = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
95 30 0:44 / /tmp/a\\040b rw,nosuid - fuse.other other rw,user_id=0
96 95 0:45 / /tmp/a\\040b rw,nosuid - fuse stripefs rw,user_id=0
97 30 0:46 / /tmp/c rw - fuse.stripefs stripefs rw
98 30 0:47 / /tmp/c rw - fuse.sshfs host: rw
";
        let top = |p: &str| top_mount(info, Path::new(p));
        assert_eq!(top("/tmp/a b"), Some(("fuse".into(), "stripefs".into())));
        assert_eq!(top("/tmp/c"), Some(("fuse.sshfs".into(), "host:".into())));
        assert_eq!(top("/tmp/a"), None);
        assert_eq!(unescape_octal(r"x\011y\134z\0"), b"x\ty\\z\\0");
    }

    #[test]
    fn a_fuse_device_s_read_ahead_is_named_by_its_numbers() {
        let dev = nix::sys::stat::makedev(0, 39);
        assert_eq!(bdi_read_ahead_path(dev), Path::new("/sys/class/bdi/0:39/read_ahead_kb"));
        let dev = nix::sys::stat::makedev(0, 300);
        assert_eq!(bdi_read_ahead_path(dev), Path::new("/sys/class/bdi/0:300/read_ahead_kb"));
    }

    #[test]
    fn a_request_cap_below_an_unaligned_mib_is_pointed_out() {
        let note = request_pages_note(Some(256), 4096).expect("the kernel's default splits such transfers");
        assert!(note.contains("256 pages") && note.contains("fs.fuse.max_pages_limit=512"), "{note}");
        assert_eq!(request_pages_note(Some(257), 4096), None, "one page more is enough");
        assert_eq!(request_pages_note(Some(512), 4096), None);
        assert_eq!(request_pages_note(None, 4096), None, "a kernel without the setting: nothing to change");
        // 64 KiB pages: an unaligned MiB spans 17 of them.
        assert!(request_pages_note(Some(16), 65536).is_some_and(|n| n.contains("max_pages_limit=32")));
        assert_eq!(request_pages_note(Some(256), 65536), None);
    }
}
