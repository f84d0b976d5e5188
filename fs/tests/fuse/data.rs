//! Files' bytes through the mount: copies in and out, sparse files and holes, shared
//! mappings, files unlinked while open, asynchronous reads.

use super::*;

#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn mount_cp_cmp_ls_rm_umount() {
    cp_cmp_ls_rm_umount(&[]);
}

/// The same through the kernel-cached mode.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn cached_mount_cp_cmp_ls_rm_umount() {
    cp_cmp_ls_rm_umount(&["--cache"]);
}

fn cp_cmp_ls_rm_umount(args: &[&str]) {
    let tc = TestCluster::start("tcp", 3);
    let mut m = mount_with(&tc, args);
    let mnt = m.dir.clone();
    // A file of several stripes and a partial last stripe.
    let src = tc.dir.path().join("src.bin");
    std::fs::write(&src, pattern(3 * 1024 * 1024 + 4321, 9)).unwrap();
    let inside = mnt.join("copy.bin");
    let c = tc.client();
    let before = io_requests(&c);
    run(Command::new("cp").arg(&src).arg(&inside));
    let copied_in = io_requests(&c);
    run(Command::new("cmp").arg(&src).arg(&inside));
    // The mount names 1 MiB, the largest request the kernel sends by default, as the size to
    // do I/O in (st_blksize), and tools such as cp and cat size their buffers by it.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&inside).unwrap().blksize(), 1 << 20);
    // A small file names less: a tool reading it needs no large buffer.
    std::fs::write(mnt.join("small.bin"), b"small").unwrap();
    assert_eq!(std::fs::metadata(mnt.join("small.bin")).unwrap().blksize(), 64 << 10);
    std::fs::remove_file(mnt.join("small.bin")).unwrap();
    if args.is_empty() {
        // Direct mode: each read or write the tool makes is one request to each io server it
        // touches, 3 servers at most for 1 MiB, and 5 reads for 3 MiB and a bit (the last
        // finds the end); in 128 KiB pieces cp and cat send 2 each for 25.
        let before_cat = io_requests(&c);
        let cat = run(Command::new("cat").arg(&inside));
        assert_eq!(cat.stdout.len(), 3 * 1024 * 1024 + 4321);
        let after_cat = io_requests(&c);
        assert!(copied_in.1 - before.1 <= 4 * 3, "writes of cp: {before:?} -> {copied_in:?}");
        assert!(after_cat.0 - before_cat.0 <= 5 * 3, "reads of cat: {before_cat:?} -> {after_cat:?}");
    }
    // A copy within the mount (cp asks the kernel to copy_file_range) is one read and one
    // write for each server of the file, not the kernel's copy in 64 KiB pieces through a pipe
    // (50 reads and 50 writes here).
    let second = mnt.join("second.bin");
    let before = io_requests(&c);
    run(Command::new("cp").arg(&inside).arg(&second));
    let copied = io_requests(&c);
    run(Command::new("cmp").arg(&inside).arg(&second));
    if args.is_empty() {
        // The read that finds the end asks every server once more.
        assert!(copied.0 - before.0 <= 2 * 3, "reads of a copy within: {before:?} -> {copied:?}");
        assert!(copied.1 - before.1 <= 3, "writes of a copy within: {before:?} -> {copied:?}");
    }
    std::fs::remove_file(&second).unwrap();
    let ls = run(Command::new("ls").arg("-l").arg(&mnt));
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains("copy.bin") && listing.contains(&(3 * 1024 * 1024 + 4321).to_string()),
        "{listing}"
    );
    // A removal that came before the kernel's word that the copy had closed the file (it does
    // not wait for the mount to take that in) gave it a hidden name, which goes once the mount
    // has: only the directory of hidden names stays.
    let hidden = mnt.join(".stripefs-open");
    let t = Instant::now();
    while hidden.exists() && std::fs::read_dir(&hidden).unwrap().next().is_some() {
        assert!(t.elapsed() < Duration::from_secs(20), "a hidden name outlived the last close");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The library sees what the mount wrote.
    // statfs (df) reports the io servers' file systems added up, the files and directories.
    let vfs = nix::sys::statvfs::statvfs(&mnt).unwrap();
    let space = c.disk_space().unwrap().space;
    assert_eq!(vfs.blocks() * vfs.fragment_size(), space.total / 4096 * 4096);
    assert!(vfs.blocks() > 0 && vfs.blocks_available() <= vfs.blocks_free(), "{vfs:?}");
    assert!(vfs.files_free() > 1 << 32 && vfs.files() > vfs.files_free(), "{vfs:?}");
    assert_eq!(
        vfs.files() - vfs.files_free(),
        2 + hidden.exists() as u64,
        "in use: the root and copy.bin (and the hidden names' directory)"
    );
    assert_eq!(c.stat("/copy.bin").unwrap().attr.size, 3 * 1024 * 1024 + 4321);
    // Modification times: set by touch -d, kept by cp -p, and a write through the mount is
    // recorded when the file is closed.
    let year = |p: &Path| {
        let m = std::fs::metadata(p).unwrap().modified().unwrap();
        1970 + m.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 31_556_952
    };
    run(Command::new("touch").arg("-d").arg("2001-02-03 04:05:06").arg(&inside));
    assert_eq!(year(&inside), 2001);
    run(Command::new("sh").arg("-c").arg(format!("echo more >> '{}'", inside.display())));
    assert!(year(&inside) >= 2026, "an append is a modification");
    run(Command::new("touch").arg("-d").arg("2002-02-03 04:05:06").arg(&src));
    run(Command::new("cp").arg("-p").arg(&src).arg(mnt.join("kept.bin")));
    // As the servers have it: the kernel would show the time it was told for a second.
    let kept = c.stat("/kept.bin").unwrap().attr.mtime.secs as u64;
    assert_eq!(1970 + kept / 31_556_952, 2002);
    run(Command::new("rm").arg(mnt.join("kept.bin")));
    // A directory larger than a meta server page and a kernel readdir buffer lists whole.
    c.mkdir("/many", 0o755).unwrap();
    let want: Vec<String> = (0..600).map(|i| format!("entry-with-a-longer-name-{i:04}")).collect();
    for n in &want {
        c.mkdir(&format!("/many/{n}"), 0o755).unwrap();
    }
    let ls = run(Command::new("ls").arg("-f").arg(mnt.join("many")));
    let mut got: Vec<String> = String::from_utf8_lossy(&ls.stdout).lines().map(str::to_owned).collect();
    got.sort();
    assert_eq!(got[..2], [".", ".."]);
    assert_eq!(got[2..], want[..]);
    run(Command::new("rm").arg("-r").arg(mnt.join("many")));
    // Directories, rename and truncate through the kernel.
    run(Command::new("mkdir").arg(mnt.join("d")));
    run(Command::new("mv").arg(&inside).arg(mnt.join("d/moved.bin")));
    run(Command::new("truncate").arg("-s").arg("1000").arg(mnt.join("d/moved.bin")));
    assert_eq!(std::fs::metadata(mnt.join("d/moved.bin")).unwrap().len(), 1000);
    // Symbolic links: made with ln -s, read back by the kernel and the library, followed by
    // cat (relative and through a linked directory), removed with rm.
    run(Command::new("ln").arg("-s").arg("moved.bin").arg(mnt.join("d/link")));
    run(Command::new("ln").arg("-s").arg("d").arg(mnt.join("dl")));
    assert_eq!(std::fs::read_link(mnt.join("d/link")).unwrap(), Path::new("moved.bin"));
    assert!(std::fs::symlink_metadata(mnt.join("dl")).unwrap().file_type().is_symlink());
    assert_eq!(c.readlink("/d/link").unwrap(), "moved.bin");
    let cat = run(Command::new("cat").arg(mnt.join("dl/link")));
    assert_eq!(cat.stdout, &pattern(3 * 1024 * 1024 + 4321, 9)[..1000]);
    let ls = run(Command::new("ls").arg("-l").arg(mnt.join("d")));
    assert!(String::from_utf8_lossy(&ls.stdout).contains("link -> moved.bin"), "{ls:?}");
    run(Command::new("rm").arg(mnt.join("dl")).arg(mnt.join("d/link")));
    run(Command::new("rm").arg(mnt.join("d/moved.bin")));
    run(Command::new("rmdir").arg(mnt.join("d")));
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0);
    assert!(c.readdir("/").unwrap().is_empty());
    run(Command::new("umount").arg(&mnt));
    let t = Instant::now();
    loop {
        if let Ok(Some(s)) = m.child.try_wait() {
            assert!(s.success(), "stripefs mount exits cleanly after umount: {s}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "stripefs mount did not exit after umount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!mounted(&mnt));
}

/// A sparse file's blocks are the space of its data, as `du` shows and as `cp` and `tar` look
/// at to find holes worth looking for; a dense file's are its size. In the mount that wrote
/// it (which counts its own writes) and in another (which asks the io servers).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_sparse_file_holds_the_space_of_its_data() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 4);
    let (m, other) = (mount(&tc), mount_at(&tc, "other", &[]));
    let chunk = pattern(64 << 10, 5);
    let f = std::fs::File::create(m.dir.join("sparse")).unwrap();
    f.write_all_at(&chunk, 0).unwrap();
    f.write_all_at(&chunk, 200 << 20).unwrap();
    drop(f);
    std::fs::write(m.dir.join("dense"), pattern(1 << 20, 6)).unwrap();
    for dir in [&m.dir, &other.dir] {
        let sparse = std::fs::metadata(dir.join("sparse")).unwrap();
        assert_eq!(sparse.len(), (200 << 20) + (64 << 10));
        let space = sparse.blocks() * 512;
        assert!((128 << 10..=1 << 20).contains(&space), "{}: {space} bytes", dir.display());
        let dense = std::fs::metadata(dir.join("dense")).unwrap();
        assert!(dense.blocks() * 512 >= 1 << 20, "{}: {} blocks", dir.display(), dense.blocks());
        let du = run(Command::new("du").arg("-k").arg(dir.join("sparse")));
        let kib: u64 =
            String::from_utf8_lossy(&du.stdout).split_whitespace().next().unwrap().parse().unwrap();
        assert!(kib <= 1024, "du: {kib} KiB");
    }
}

/// `lseek`'s `SEEK_DATA` and `SEEK_HOLE` find a sparse file's data and holes through the
/// mount, so `cp` copies the data and leaves the holes out.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn seeks_find_a_sparse_file_s_holes_and_cp_keeps_them() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 4);
    let m = mount(&tc);
    let path = m.dir.join("sparse");
    let (head, tail) = (pattern(64 << 10, 7), pattern(100_000, 8));
    let far = 100u64 << 20;
    let f = std::fs::File::create(&path).unwrap();
    f.write_all_at(&head, 0).unwrap();
    f.write_all_at(&tail, far).unwrap();
    drop(f);
    let size = far + tail.len() as u64;
    let f = std::fs::File::open(&path).unwrap();
    let seek = |off: u64, whence: i32| {
        use std::os::fd::AsRawFd;
        // SAFETY: a descriptor this test owns; lseek touches no memory.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
        if r < 0 { Err(std::io::Error::last_os_error().raw_os_error()) } else { Ok(r as u64) }
    };
    assert_eq!(seek(0, libc::SEEK_DATA), Ok(0));
    assert_eq!(seek(0, libc::SEEK_HOLE), Ok(64 << 10));
    assert_eq!(seek(64 << 10, libc::SEEK_DATA), Ok(far));
    assert_eq!(seek(far, libc::SEEK_HOLE), Ok(size), "the end is a hole");
    assert_eq!(seek(size, libc::SEEK_DATA), Err(Some(libc::ENXIO)));
    // Copied out and back in: the data, and no more space than the data's.
    let out = tc.dir.path().join("copy");
    run(Command::new("cp").arg("--sparse=auto").arg(&path).arg(&out));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&path).unwrap());
    let held = std::fs::metadata(&out).unwrap().blocks() * 512;
    assert!(held <= 1 << 20, "the copy out holds {held} bytes");
    let back = m.dir.join("back");
    run(Command::new("cp").arg("--sparse=auto").arg(&out).arg(&back));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&out).unwrap());
    let held = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(held <= 1 << 20, "the copy back in holds {held} bytes");
}

/// `fallocate --punch-hole` through the mount frees a range's space, which then reads as
/// zeros, as `fallocate --dig-holes` does for runs of zeros; both mounts alike (the
/// kernel-cached one writes back and drops its pages of the range first).
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn holes_punched_through_the_mount_free_their_space() {
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 4);
    for args in [&[][..], &["--cache"][..]] {
        let name = if args.is_empty() { "direct" } else { "cached" };
        let m = mount_at(&tc, name, args);
        let path = m.dir.join("f");
        let mut data = pattern(8 << 20, 4).to_vec();
        std::fs::write(&path, &data).unwrap();
        let held = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let before = held();
        run(Command::new("fallocate")
            .args(["--punch-hole", "--offset", "1MiB", "--length", "3MiB"])
            .arg(&path));
        data[1 << 20..4 << 20].fill(0);
        assert!(
            std::fs::read(&path).unwrap() == data,
            "{name}: the hole reads as zeros, the rest as written"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20, "{name}: the size stays");
        // Another mount asks the servers.
        let other = tc.dir.path().join(name).join("f");
        // Less a few blocks: an object whose data ended up in pieces may need a block of
        // extents more on the io server's file system once a hole splits them.
        let bookkeeping = 64 << 10;
        assert!(held() + (3 << 20) <= before + bookkeeping, "{name}: {before} then {} bytes held", held());
        assert_eq!(std::fs::metadata(&other).unwrap().len(), 8 << 20);
        // Zeros written as data, dug out.
        let zeros = m.dir.join("zeros");
        std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
        run(Command::new("fallocate").arg("--dig-holes").arg(&zeros));
        let dug = std::fs::metadata(&zeros).unwrap().blocks() * 512;
        assert!(dug <= 1 << 20, "{name}: {dug} bytes held after digging");
        assert_eq!(std::fs::read(&zeros).unwrap(), vec![0u8; 4 << 20]);
    }
}

/// In the kernel-cached mode a file's data may still be only in the kernel's pages, which the
/// io servers cannot see: seeks for data and holes in a file still being written find all of
/// it, not the servers' idea of where its data is, and so does a copy.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn seeks_through_the_cached_mount_see_data_still_in_the_kernel() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let tc = TestCluster::start("tcp", 2);
    let m = mount_with(&tc, &["--cache"]);
    let path = m.dir.join("growing");
    let data = pattern(1 << 20, 9);
    let mut f =
        std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all(&data).unwrap();
    // Still open, its pages not written back: the servers hold nothing yet.
    // SAFETY: a descriptor this test owns; lseek touches no memory.
    let seek = |whence| unsafe { libc::lseek(f.as_raw_fd(), 0, whence) };
    assert_eq!((seek(libc::SEEK_DATA), seek(libc::SEEK_HOLE)), (0, 1 << 20));
    let out = tc.dir.path().join("copy");
    run(Command::new("cp").arg("--sparse=auto").arg(&path).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "the copy lost data still in the kernel's pages");
}

/// A file whose last name is removed while it is open keeps its data until the last close
/// (also when the name is replaced by a rename), then goes; its link count reads 0 meanwhile.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn an_unlinked_open_file_lives_until_its_last_close() {
    unlinked_open_file_lives_until_its_last_close(&[]);
}

/// The same through the kernel-cached mode, whose write-back may reach the file after its
/// name is gone.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_cached_unlinked_open_file_lives_until_its_last_close() {
    unlinked_open_file_lives_until_its_last_close(&["--cache"]);
}

fn unlinked_open_file_lives_until_its_last_close(args: &[&str]) {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 2);
    let m = mount_with(&tc, args);
    let c = tc.client();
    let path = m.dir.join("tmp.bin");
    let mut f = std::fs::OpenOptions::new().create_new(true).read(true).write(true).open(&path).unwrap();
    f.write_all(b"before").unwrap();
    let again = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all(b" and after").unwrap();
    let mut back = String::new();
    f.rewind().unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "before and after");
    drop(f);
    // Still open once: the data is still there.
    let mut back = String::new();
    (&again).read_to_string(&mut back).unwrap();
    assert_eq!(back, "before and after");
    drop(again);
    // Replaced by a rename while open: the same.
    let other = m.dir.join("other");
    std::fs::write(&other, b"new").unwrap();
    std::fs::write(&path, b"old").unwrap();
    let held = std::fs::File::open(&path).unwrap();
    std::fs::rename(&other, &path).unwrap();
    let mut back = String::new();
    (&held).read_to_string(&mut back).unwrap();
    assert_eq!((back.as_str(), std::fs::read(&path).unwrap()), ("old", b"new".to_vec()));
    drop(held);
    std::fs::remove_file(&path).unwrap();
    // After the last close nothing is left: no file, no hidden name.
    let t = Instant::now();
    while c.statfs().unwrap().files != 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "files left: {:?}", c.readdir("/.stripefs-open"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(c.readdir("/.stripefs-open").unwrap().is_empty());
    // The directory of hidden names removed behind the mount's back is made again.
    c.rmdir("/.stripefs-open").unwrap();
    std::fs::write(&path, b"again").unwrap();
    let held = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut back = String::new();
    (&held).read_to_string(&mut back).unwrap();
    assert_eq!(back, "again");
}

/// Asynchronous direct reads (one `io_submit` of eight 1 MiB reads) reach the mount together,
/// as many at once as it has threads to serve them, not one after another: the io servers are
/// stopped meanwhile, so no read can finish before the others arrive. All return their bytes
/// once the io servers go on.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn asynchronous_reads_are_served_several_at_once() {
    use nix::sys::signal::{Signal, kill};
    use std::os::unix::fs::OpenOptionsExt;
    const N: usize = 8;
    const LEN: usize = 1 << 20;
    let tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    let data = pattern(N * LEN, 11);
    let f = c.create("/f.bin", stripefs::CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_at(0, &data).unwrap();
    drop(f);
    // fuser logs each request it dispatches at the debug level.
    let (m, log) = mount_logging(&tc, &[("RUST_LOG", "warn,fuser=debug")]);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.dir.join("f.bin"))
        .unwrap();
    let io: Vec<_> = (0..2)
        .map(|i| {
            nix::unistd::Pid::from_raw(tc.cluster.pid(stripefs::cluster::ServerId::Io(i)).unwrap() as i32)
        })
        .collect();
    let reads_seen = || std::fs::read_to_string(&log).unwrap().matches(" READ fh ").count();
    let before = reads_seen();
    for &p in &io {
        kill(p, Signal::SIGSTOP).unwrap();
    }
    let reader = std::thread::spawn(move || aio_read_blocks(&file, N, LEN));
    // Stopped for 2 s at most, well before the client gives a silent server up (and the first
    // read fails, letting a serial submitter send the next).
    let at_once = count_within(Duration::from_secs(2), 4, || reads_seen() - before);
    for &p in &io {
        kill(p, Signal::SIGCONT).unwrap();
    }
    let got = reader.join().unwrap();
    assert!(at_once >= 4, "{at_once} of {N} reads reached the mount while none could finish");
    same_bytes(&got, &data, "asynchronous reads");
    drop(m);
}

/// Reads `n` blocks of `len` bytes from the start of `f` with one `io_submit` of asynchronous
/// reads, waits for every one, and returns the bytes in file order.
fn aio_read_blocks(f: &std::fs::File, n: usize, len: usize) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    /// The kernel's `struct io_event`.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct IoEvent {
        data: u64,
        obj: u64,
        res: i64,
        res2: i64,
    }
    let mut ctx: libc::c_ulong = 0;
    // SAFETY: io_setup writes the new context into `ctx`, which outlives the call.
    let r = unsafe { libc::syscall(libc::SYS_io_setup, n as libc::c_long, &mut ctx as *mut libc::c_ulong) };
    assert_eq!(r, 0, "io_setup: {}", std::io::Error::last_os_error());
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
    let mut cbs: Vec<libc::iocb> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| {
            // SAFETY: all zeroes is an iocb with no request in it; the fields below make a read.
            let mut cb: libc::iocb = unsafe { std::mem::zeroed() };
            cb.aio_lio_opcode = 0; // IOCB_CMD_PREAD
            cb.aio_fildes = f.as_raw_fd() as u32;
            cb.aio_buf = b.as_mut_ptr() as u64;
            cb.aio_nbytes = len as u64;
            cb.aio_offset = (i * len) as i64;
            cb.aio_data = i as u64;
            cb
        })
        .collect();
    let mut ptrs: Vec<*mut libc::iocb> = cbs.iter_mut().map(|c| c as *mut libc::iocb).collect();
    // SAFETY: the iocbs and the buffers they name are neither moved nor touched until every
    // one's event has been collected below.
    let r = unsafe { libc::syscall(libc::SYS_io_submit, ctx, n as libc::c_long, ptrs.as_mut_ptr()) };
    assert_eq!(r, n as libc::c_long, "io_submit: {}", std::io::Error::last_os_error());
    let mut done = 0;
    while done < n {
        let mut events = vec![IoEvent::default(); n];
        // SAFETY: `events` has room for the `n` events asked for at most.
        let got = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                ctx,
                1 as libc::c_long,
                n as libc::c_long,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        assert!(got > 0, "io_getevents: {}", std::io::Error::last_os_error());
        for e in &events[..got as usize] {
            assert_eq!(e.res, len as i64, "read {} returned {}", e.data, e.res);
        }
        done += got as usize;
    }
    // SAFETY: no request of the context is outstanding.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    drop(cbs);
    bufs.concat()
}

/// The direct mount maps files shared, as databases do (SQLite's write-ahead log maps its
/// `-shm` file): writes through the mapping reach the io servers by `msync`, and the mapping
/// shows what was written through a descriptor before.
#[test]
#[ignore = "needs /dev/fuse: mounts stripefs"]
fn a_direct_mount_maps_files_shared() {
    let tc = TestCluster::start("tcp", 3);
    let m = mount(&tc);
    shared_mapping_reaches_the_io_servers(&m, &tc.client());
}
