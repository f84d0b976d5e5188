//! Names and attributes through the mount: files another client changed, listings, look-ups,
//! links, special files, permissions, extended attributes.

use super::*;

/// A file another client replaced (written beside it and renamed over it, as editors and
/// deployments save) is found again at once, as on NFS: the mount answers for a file that is
/// gone with `ESTALE`, on which the kernel looks its name up afresh, where `ENOENT` would be
/// passed on for as long as the kernel keeps the name; and so are a directory another client
/// replaced, listed, and a file in it. A descriptor open on a file another client removed
/// reads `ESTALE` too, through the direct mount: no name was looked up for it.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_file_another_client_replaced_is_found_again() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 2);
    for (mode, args) in [("direct", &[][..]), ("cached", &["--cache"][..])] {
        let (a, b) = (mount_at(&tc, &format!("{mode}-a"), args), mount_at(&tc, &format!("{mode}-b"), args));
        std::fs::write(a.dir.join("cfg"), b"v1").unwrap();
        assert_eq!(std::fs::read(b.dir.join("cfg")).unwrap(), b"v1", "{mode}");
        for v in [b"v2", b"v3"] {
            std::fs::write(a.dir.join("cfg.new"), v).unwrap();
            std::fs::rename(a.dir.join("cfg.new"), a.dir.join("cfg")).unwrap();
            let read = std::fs::read(b.dir.join("cfg")).map_err(|e| e.raw_os_error());
            assert_eq!(read, Ok(v.to_vec()), "{mode}: replaced by another client");
            let ino = |m: &Mount| std::fs::metadata(m.dir.join("cfg")).unwrap().ino();
            assert_eq!(ino(&b), ino(&a), "{mode}");
        }
        // A directory `name` that `b` has seen, replaced through `a` by one holding `file`
        // with `data`.
        let replace_dir = |name: &str, file: &str, data: &[u8]| {
            let new = format!("{name}.new");
            std::fs::create_dir(a.dir.join(name)).unwrap();
            assert!(b.dir.join(name).is_dir(), "{mode}");
            std::fs::create_dir(a.dir.join(&new)).unwrap();
            std::fs::write(a.dir.join(&new).join(file), data).unwrap();
            std::fs::remove_dir(a.dir.join(name)).unwrap();
            std::fs::rename(a.dir.join(&new), a.dir.join(name)).unwrap();
        };
        // So is a file in a directory another client replaced: its name is looked up in the
        // directory's old handle, which is stale.
        let d = format!("{mode}-d");
        replace_dir(&d, "g", b"new");
        let read = std::fs::read(b.dir.join(&d).join("g")).map_err(|e| e.raw_os_error());
        assert_eq!(read, Ok(b"new".to_vec()), "{mode}: in a directory replaced by another client");
        // And listing such a directory lists the new one.
        let e = format!("{mode}-e");
        replace_dir(&e, "h", b"");
        let names = std::fs::read_dir(b.dir.join(&e))
            .map(|rd| rd.map(|n| n.unwrap().file_name().into_string().unwrap()).collect::<Vec<_>>())
            .map_err(|e| e.raw_os_error());
        assert_eq!(
            names,
            Ok(vec!["h".to_string()]),
            "{mode}: a directory replaced by another client, listed"
        );

        let f = std::fs::File::open(b.dir.join("cfg")).unwrap();
        std::fs::remove_file(a.dir.join("cfg")).unwrap();
        let gone = std::fs::File::open(b.dir.join("cfg")).map(drop).map_err(|e| e.raw_os_error());
        assert_eq!(gone, Err(Some(libc::ENOENT)), "{mode}: removed by another client");
        // (The kernel-cached mount reads the kernel's pages of it.)
        if mode == "direct" {
            let read = f.read_at(&mut [0; 4], 0).map_err(|e| e.raw_os_error());
            assert_eq!(read, Err(Some(libc::ESTALE)), "{mode}: read through a descriptor");
        }
    }
}

/// Files have no extended attributes, and the mount tells the kernel so once: every ask after
/// that, such as each `chown`'s for `security.capability`, is answered without a request, with
/// `EOPNOTSUPP`, and so are settings and removals.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn extended_attributes_are_not_supported() {
    let tc = TestCluster::start("tcp", 1);
    let m = mount(&tc);
    let path = m.dir.join("f");
    std::fs::write(&path, b"data").unwrap();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let errno = |r: isize| {
        assert_eq!(r, -1);
        std::io::Error::last_os_error().raw_os_error()
    };
    for name in [c"security.capability", c"user.k", c"security.capability"] {
        let mut buf = [0u8; 64];
        // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
        let r = unsafe { libc::getxattr(c_path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(errno(r), Some(libc::EOPNOTSUPP), "getxattr {name:?}");
    }
    // SAFETY: NUL-terminated strings and a readable value of the length given.
    let r = unsafe { libc::setxattr(c_path.as_ptr(), c"user.k".as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(errno(r as isize), Some(libc::EOPNOTSUPP), "setxattr");
    // SAFETY: NUL-terminated strings.
    let r = unsafe { libc::removexattr(c_path.as_ptr(), c"user.k".as_ptr()) };
    assert_eq!(errno(r as isize), Some(libc::EOPNOTSUPP), "removexattr");
}

/// `ls -l` of a directory gets its entries' attributes with the listing: a meta request and a
/// request to each io server for a window of entries, not a look-up and a size round per entry
/// (which made 100 files over 100 meta requests and 400 io requests).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_long_listing_asks_for_attributes_in_batches() {
    let tc = TestCluster::start_with("tcp", 4, no_objects_ahead);
    let m = mount(&tc);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let files = 100;
    for i in 0..files {
        let f = c.create(&format!("/d/f{i:03}"), Default::default()).unwrap();
        f.write_all_at(0, &pattern(i * 7000, i as u64)).unwrap();
    }
    c.mkdir("/d/sub", 0o700).unwrap();
    let ((meta, io), out) = requests_during(&c, || run(Command::new("ls").arg("-ln").arg(m.dir.join("d"))));
    assert!(meta <= 10 && io <= 40, "{meta} meta and {io} io requests for {files} files");
    // Every entry with its size and mode: `-rw-r--r-- 1 uid gid size date name`.
    let listed: Vec<(String, u64)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (format!("{} {}", f[0], f[f.len() - 1]), f[4].parse().unwrap())
        })
        .collect();
    let mut want: Vec<(String, u64)> =
        (0..files).map(|i| (format!("-rw-r--r-- f{i:03}"), i as u64 * 7000)).collect();
    want.push(("drwx------ sub".into(), 0));
    let listed: Vec<_> =
        listed.into_iter().map(|(n, s)| if n.starts_with('d') { (n, 0) } else { (n, s) }).collect();
    assert_eq!(listed, want);
}

/// A directory larger than a meta server's page of entries lists whole, each entry once, on
/// both mounts; and what the mount holds for it while it is open does not grow with its size:
/// many descriptors open on a large directory, each read to its end (as a program walking it
/// in many threads, or one set on growing the mount, keeps them), hold a page each.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_large_directory_lists_whole_and_is_held_a_page_at_a_time() {
    let tc = TestCluster::start("tcp", 1);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let entries = 2000;
    // FIFOs: records on the meta server alone, quick to make.
    for i in 0..entries {
        c.mknod(&format!("/d/p{i:04}"), stripefs::proto::FileKind::Fifo, 0o644).unwrap();
    }
    let want: Vec<String> = (0..entries).map(|i| format!("p{i:04}")).collect();
    let rss = |m: &Mount| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", m.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    for (mode, args) in [("direct", &[][..]), ("cached", &["--cache"][..])] {
        let m = mount_at(&tc, mode, args);
        let dir = m.dir.join("d");
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, want, "{mode}: listed");
        let listed = run(Command::new("ls").arg("-ln").arg(&dir)).stdout;
        let long = String::from_utf8(listed).unwrap();
        assert_eq!(long.lines().filter(|l| l.starts_with("prw-r--r--")).count(), entries, "{mode}: ls -l");
        if mode == "cached" {
            // Plain listings (this mount does not send entries' attributes), 500 held open.
            let before = rss(&m);
            let open: Vec<std::fs::ReadDir> = (0..500)
                .map(|_| {
                    let mut rd = std::fs::read_dir(&dir).unwrap();
                    assert_eq!(rd.by_ref().count(), entries, "{mode}: read whole");
                    rd
                })
                .collect();
            let grown = rss(&m).saturating_sub(before);
            // A whole listing a descriptor came to about 170 bytes an entry: 170 MB here.
            assert!(grown < 48 << 20, "the mount grew by {grown} bytes for {} open listings", open.len());
        }
    }
}

#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn hard_links_and_special_files() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let tc = TestCluster::start("tcp", 2);
    let m = mount(&tc);
    let mnt = m.dir.clone();
    let a = mnt.join("a");
    std::fs::write(&a, pattern(200_000, 3)).unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    let b = mnt.join("d/b");
    run(Command::new("ln").arg(&a).arg(&b));
    let (ma, mb) = (std::fs::metadata(&a).unwrap(), std::fs::metadata(&b).unwrap());
    assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2));
    // Written through one name, read through the other.
    std::fs::write(&b, b"through b").unwrap();
    assert_eq!(std::fs::read(&a).unwrap(), b"through b");
    // Rename of one name over the other: both stay (POSIX: nothing happens).
    std::fs::rename(&a, &b).unwrap();
    assert!(a.exists() && b.exists());
    // Unlinking one name keeps the data under the other.
    std::fs::remove_file(&a).unwrap();
    assert_eq!(std::fs::metadata(&b).unwrap().nlink(), 1);
    assert_eq!(std::fs::read(&b).unwrap(), b"through b");
    let c = tc.client();
    assert_eq!(c.stat("/d/b").unwrap().attr.nlink, 1);
    // A directory cannot be linked.
    let dir_link = Command::new("ln").arg(mnt.join("d")).arg(mnt.join("e")).output().unwrap();
    assert!(!dir_link.status.success() && !mnt.join("e").exists());
    // Special files.
    run(Command::new("mkfifo").arg("-m").arg("0640").arg(mnt.join("fifo")));
    run(Command::new("mknod").arg(mnt.join("null2")).arg("c").arg("1").arg("3"));
    run(Command::new("mknod").arg(mnt.join("blk")).arg("b").arg("7").arg("200"));
    let sock = std::os::unix::net::UnixListener::bind(mnt.join("sock")).unwrap();
    drop(sock);
    let md = |n: &str| std::fs::symlink_metadata(mnt.join(n)).unwrap();
    assert!(md("fifo").file_type().is_fifo());
    assert_eq!(md("fifo").mode() & 0o7777, 0o640);
    assert!(md("null2").file_type().is_char_device());
    assert_eq!((libc::major(md("null2").rdev()), libc::minor(md("null2").rdev())), (1, 3));
    assert!(md("blk").file_type().is_block_device());
    assert_eq!((libc::major(md("blk").rdev()), libc::minor(md("blk").rdev())), (7, 200));
    assert!(md("sock").file_type().is_socket());
    // A FIFO works as one: the kernel of the machine that opens it provides the pipe.
    let fifo = mnt.join("fifo");
    let writer = std::thread::spawn(move || std::fs::write(fifo, b"piped").unwrap());
    assert_eq!(std::fs::read(mnt.join("fifo")).unwrap(), b"piped");
    writer.join().unwrap();
    // posix_fallocate: the file grows to the range's end; zeroing a range is not offered.
    run(Command::new("fallocate").arg("-o").arg("4096").arg("-l").arg("1M").arg(&b));
    assert_eq!(std::fs::metadata(&b).unwrap().len(), 4096 + 1024 * 1024);
    assert_eq!(&std::fs::read(&b).unwrap()[..9], b"through b");
    let zero = Command::new("fallocate")
        .arg("-z")
        .arg("-o")
        .arg("0")
        .arg("-l")
        .arg("4096")
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        !zero.status.success() && String::from_utf8_lossy(&zero.stderr).contains("not supported"),
        "{zero:?}"
    );
    assert_eq!(&std::fs::read(&b).unwrap()[..9], b"through b", "nothing zeroed");
    for n in ["fifo", "null2", "blk", "sock", "d/b"] {
        std::fs::remove_file(mnt.join(n)).unwrap();
    }
    // The last name gone, the file's objects go through the orphan table (no orphan left).
    let t = Instant::now();
    while c.statfs().unwrap().files != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "files left: {:?}", c.statfs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With `-o allow_other` other users reach the mount, each with their own permissions: what
/// they create is theirs, the mode bits and the sticky bit hold, only root gives files away.
#[test]
#[ignore = "needs root and /dev/fuse: mounts stripefs, runs commands as other users"]
fn permissions_apply_to_each_caller() {
    assert!(nix::unistd::geteuid().is_root(), "switching to another user needs root");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tc = TestCluster::start("tcp", 2);
    // Other users must be able to reach the mount point.
    std::fs::set_permissions(tc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = mount_with(&tc, &["-o", "allow_other"]);
    let mnt = m.dir.clone();
    let as_user = |uid: u32, script: &str| {
        Command::new("setpriv")
            .args([&format!("--reuid={uid}"), "--regid=5000", "--clear-groups", "sh", "-c", script])
            .current_dir(&mnt)
            .output()
            .unwrap()
    };
    let ok = |uid, script: &str| {
        let out = as_user(uid, script);
        assert!(out.status.success(), "{uid}: {script}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let refused = |uid, script: &str, why: &str| {
        let out = as_user(uid, script);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{uid}: {script}: {err}");
    };
    // The root directory is root's, 0755.
    refused(4001, "touch f", "Permission denied");
    std::fs::create_dir(mnt.join("tmp")).unwrap();
    std::fs::set_permissions(mnt.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    ok(4001, "echo mine > tmp/f && chmod 600 tmp/f && mkdir tmp/d");
    let f = std::fs::metadata(mnt.join("tmp/f")).unwrap();
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (4001, 5000, 0o600));
    refused(4002, "cat tmp/f", "Permission denied");
    refused(4002, "rm -f tmp/f", "Operation not permitted");
    refused(4002, "mv tmp/f tmp/g", "Operation not permitted");
    refused(4002, "chmod 666 tmp/f", "Operation not permitted");
    refused(4001, "chown 4002 tmp/f", "Operation not permitted");
    refused(4002, "touch tmp/d/x", "Permission denied");
    ok(4002, "ln -s f tmp/l && rm tmp/l");
    // The library sees the same rules: a client acting for another user.
    let other = tc.client().as_caller(stripefs::proto::Cred::new(4002, 5000, vec![]));
    assert_eq!(other.unlink("/tmp/f").unwrap_err().errno(), stripefs::Errno::EPERM);
    assert_eq!(
        other.open("/tmp/f", stripefs::capability::Rights::READ).unwrap_err().errno(),
        stripefs::Errno::EACCES
    );
    // A write by another user than root clears the set-user-ID bit, also when the writer sets
    // the file's time before closing it (as the servers have it, not as the kernel was told).
    ok(4001, "echo x > tmp/s && chmod 4755 tmp/s");
    let write_then_time = r#"open(my $f, "+<", "tmp/s") or die; syswrite($f, "y") or die;
        utime(981173106, 981173106, $f) or die "utime: $!"; close($f) or die"#;
    ok(4001, &format!("perl -e '{write_then_time}'"));
    let s = tc.client().stat("/tmp/s").unwrap().attr;
    assert_eq!((s.mode & 0o7777, s.mtime.secs), (0o755, 981_173_106));
    // Root may do all of it; the owner too.
    run(Command::new("chown").arg("4002").arg(mnt.join("tmp/f")));
    ok(4002, "cat tmp/f && rm tmp/f");
    ok(4001, "rmdir tmp/d");
    drop(m);
}

/// Look-ups of several names in one directory reach the mount together, not one after
/// another: the meta server is stopped meanwhile, so none can finish before the others arrive.
/// All find their files once it goes on.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn lookups_in_one_directory_are_served_several_at_once() {
    use nix::sys::signal::{Signal, kill};
    const N: usize = 4;
    let tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    for i in 0..N {
        c.create(&format!("/d/f{i}"), stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    }
    // fuser logs each request it dispatches at the debug level.
    let (m, log) = mount_logging(&tc, &[("RUST_LOG", "warn,fuser=debug")]);
    // The directory itself is looked up now, so that the look-ups below only want their names.
    assert!(m.dir.join("d").is_dir());
    let meta = nix::unistd::Pid::from_raw(tc.cluster.pid(stripefs::cluster::ServerId::Meta).unwrap() as i32);
    let lookups_seen = || {
        let logged = std::fs::read_to_string(&log).unwrap();
        (0..N).filter(|i| logged.contains(&format!("LOOKUP name \"f{i}\""))).count()
    };
    kill(meta, Signal::SIGSTOP).unwrap();
    let stats: Vec<_> = (0..N)
        .map(|i| {
            let p = m.dir.join("d").join(format!("f{i}"));
            std::thread::spawn(move || std::fs::metadata(p).map(|md| md.len()))
        })
        .collect();
    // Stopped for 2 s at most, well before the client gives a silent server up.
    let at_once = count_within(Duration::from_secs(2), N, lookups_seen);
    kill(meta, Signal::SIGCONT).unwrap();
    for s in stats {
        assert_eq!(s.join().unwrap().unwrap(), 0, "each file is found");
    }
    assert_eq!(at_once, N, "look-ups that reached the mount while none could finish");
    drop(m);
}
