//! The kernel-cached mode: what the kernel keeps, and what it must see of other clients.

use super::*;

/// Through the kernel-cached mode: what is written in small pieces reads back, through the
/// mount and from the io servers once closed; sizes follow overwrites, truncation (down and
/// up), `O_APPEND` writes, a write far past the end (the hole reads as zeros) and shared
/// `mmap` writes.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_mount_keeps_data_and_sizes() {
    use std::io::Write;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let tc = TestCluster::start("tcp", 3);
    let m = mount_with(&tc, &["--cache"]);
    let c = tc.client();
    let p = m.dir.join("f.bin");
    let len = |p: &Path| std::fs::metadata(p).unwrap().len();
    // Several stripes and a partial last one, in writes smaller than a page.
    let mut want = pattern(3 * 1024 * 1024 + 4321, 5).to_vec();
    {
        let mut f = std::fs::File::create(&p).unwrap();
        for chunk in want.chunks(1000) {
            f.write_all(chunk).unwrap();
        }
        assert_eq!(f.metadata().unwrap().len(), want.len() as u64, "the size while pages are dirty");
    }
    same_bytes(&read_lib(&c, "/f.bin"), &want, "closed: on the io servers");
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    // An overwrite across a stripe boundary, not page-aligned.
    let patch = pattern(70_000, 6);
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(&patch, 60_001).unwrap();
    want[60_001..130_001].copy_from_slice(&patch);
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Truncate down (by path) and up again (through a descriptor): the end reads as zeros.
    run(Command::new("truncate").arg("-s").arg("100000").arg(&p));
    want.truncate(100_000);
    assert_eq!((len(&p), c.stat("/f.bin").unwrap().attr.size), (100_000, 100_000));
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.write_all_at(b"dirty", 99_000).unwrap();
    want[99_000..99_005].copy_from_slice(b"dirty");
    f.set_len(250_000).unwrap();
    want.resize(250_000, 0);
    drop(f);
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // O_APPEND: each write lands at the end, also after the size changed.
    for i in 0..3u64 {
        let mut f = std::fs::OpenOptions::new().append(true).custom_flags(libc::O_APPEND).open(&p).unwrap();
        let piece = pattern(5000 + i as usize, 10 + i);
        f.write_all(&piece).unwrap();
        want.extend_from_slice(&piece);
    }
    assert_eq!(len(&p), want.len() as u64);
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Sparse: one byte far past the end.
    let far = 40 * 1024 * 1024 + 7;
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().write_all_at(b"!", far).unwrap();
    want.resize(far as usize, 0);
    want.push(b'!');
    assert_eq!((len(&p), c.stat("/f.bin").unwrap().attr.size), (far + 1, far + 1));
    same_bytes(&std::fs::read(&p).unwrap(), &want, "through the mount");
    same_bytes(&read_lib(&c, "/f.bin"), &want, "from the io servers");
    // Shared mmap writes reach the io servers by msync.
    shared_mapping_reaches_the_io_servers(&m, &c);
}

/// Two kernel-cached mounts of one cluster (two clients): what one wrote and closed, the
/// other's next open reads, also after the other read and cached the file before; a file
/// that did not change is read again from the page cache, not the io servers.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_mounts_are_close_to_open_consistent() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let tc = TestCluster::start("tcp", 3);
    let a = mount_at(&tc, "a", &["--cache"]);
    let b = mount_at(&tc, "b", &["--cache"]);
    let c = tc.client();
    let (pa, pb) = (a.dir.join("f"), b.dir.join("f"));
    // Written and closed through A: B's open reads it.
    let v1 = pattern(300_000, 1);
    std::fs::write(&pa, &v1).unwrap();
    same_bytes(&std::fs::read(&pb).unwrap(), &v1, "B reads what A closed");
    // A reads it again: unchanged, so from A's page cache.
    let before = bytes_read(&c);
    same_bytes(&std::fs::read(&pa).unwrap(), &v1, "A again");
    assert_eq!(bytes_read(&c), before, "an unchanged file is read from the page cache");
    // Rewritten in place through B (same size) and closed: A's next open reads the new bytes,
    // well within the attribute time-to-live.
    let v2 = pattern(300_000, 2);
    std::fs::OpenOptions::new().write(true).open(&pb).unwrap().write_all_at(&v2, 0).unwrap();
    same_bytes(&std::fs::read(&pa).unwrap(), &v2, "A reads B's rewrite");
    // Made longer through B: A's next open reads all of it, and A's size is the new one.
    let tail = pattern(70_000, 3);
    std::fs::OpenOptions::new().append(true).open(&pb).unwrap().write_all(&tail).unwrap();
    let v3 = [&v2[..], &tail[..]].concat();
    same_bytes(&std::fs::read(&pa).unwrap(), &v3, "A reads B's appended bytes");
    assert_eq!(std::fs::metadata(&pa).unwrap().len(), v3.len() as u64);
    // And back: written through A while B has read it, B's next open reads A's bytes.
    same_bytes(&std::fs::read(&pb).unwrap(), &v3, "B reads its own file");
    let v4 = pattern(20_000, 4);
    std::fs::OpenOptions::new().write(true).open(&pa).unwrap().write_all_at(&v4, 100_000).unwrap();
    let mut v5 = v3.clone();
    v5[100_000..120_000].copy_from_slice(&v4);
    same_bytes(&std::fs::read(&pb).unwrap(), &v5, "B reads A's rewrite");
    same_bytes(&read_lib(&c, "/f"), &v5, "from the io servers");
}

/// Through the kernel-cached mode, a file read in order for the first time comes from the io
/// servers in requests of a MiB, as through the direct mode, not in the kernel's default
/// read-ahead of 128 KiB (eight times the round trips); `--read-ahead 0` keeps the kernel's.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_mount_reads_ahead_a_mib_at_a_time() {
    const LEN: usize = 8 << 20;
    let tc = TestCluster::start("tcp", 3);
    let c = tc.client();
    let data = pattern(LEN, 7);
    let f = c.create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    drop(f);
    // A read of a MiB asks each of the 3 io servers once at most; one more read finds the end,
    // and the window may start one MiB-request short of a boundary.
    let at_most = 3 * (LEN as u64 / (1 << 20) + 2);
    for (name, args, wide) in
        [("a", &["--cache"][..], true), ("b", &["--cache", "--read-ahead", "0"][..], false)]
    {
        let m = mount_at(&tc, name, args);
        let before = io_requests(&c).0;
        let cat = run(Command::new("cat").arg(m.dir.join("f.bin")));
        same_bytes(&cat.stdout, &data, "read through the cached mount");
        let reads = io_requests(&c).0 - before;
        if wide {
            assert!(reads <= at_most, "{reads} io server reads for 8 MiB read ahead a MiB at a time");
        } else {
            assert!(reads >= 64, "{reads} io server reads for 8 MiB in the kernel's 128 KiB windows");
        }
    }
}

/// Through the kernel-cached mode, for users other than root: a writer who does not own a file
/// may set its times to now and truncate it (the kernel sends explicit times for both), but
/// not set a time of its choosing; a file its owner may only write takes a write into part of
/// a page (the kernel reads the rest of the page first).
#[test]
#[ignore = "needs root and /dev/fuse: mounts stripefs, runs commands as other users"]
fn a_cached_mount_serves_writers_who_do_not_own_or_may_not_read() {
    assert!(nix::unistd::geteuid().is_root(), "switching to another user needs root");
    use std::os::unix::fs::PermissionsExt;
    let tc = TestCluster::start("tcp", 2);
    std::fs::set_permissions(tc.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = mount_with(&tc, &["--cache", "-o", "allow_other"]);
    let mnt = m.dir.clone();
    let as_user = |script: &str| {
        Command::new("setpriv")
            .args(["--reuid=4001", "--regid=5000", "--clear-groups", "sh", "-c", script])
            .current_dir(&mnt)
            .output()
            .unwrap()
    };
    let mode = |name: &str, m: u32| {
        std::fs::set_permissions(mnt.join(name), std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode(".", 0o1777);
    std::fs::write(mnt.join("shared"), b"root\n").unwrap();
    mode("shared", 0o666);
    let out = as_user("echo other >> shared && touch shared && truncate -s 2 shared");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = as_user("touch -d 2001-01-01 shared");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Operation not permitted"), "{err}");
    assert_eq!(std::fs::read(mnt.join("shared")).unwrap(), b"ro");
    // Written by another client, so the mount has none of its pages.
    let c = tc.client();
    let f = c.create("/wo", stripefs::CreateOptions { mode: 0o200, layout: None }).unwrap();
    f.write_at(0, &bytes::Bytes::from_static(b"root\n")).unwrap();
    let owner = stripefs::proto::SetAttr { uid: Some(4001), ..Default::default() };
    c.setattr(f.handle(), owner).unwrap();
    let out = as_user("printf ab | dd of=wo bs=1 seek=1 conv=notrunc");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mnt.join("wo")).unwrap(), b"rabt\n");
    assert_eq!(c.stat("/wo").unwrap().attr.size, 5);
}
