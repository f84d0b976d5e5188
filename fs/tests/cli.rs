//! The `stripefs` command line: client commands against a running cluster, `serve` starting a
//! whole local cluster from flags, and a small `demo`.

mod common;

use common::{TestCluster, no_objects_ahead, output_within, pattern, requests_during};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use stripefs::proto::SetAttr;

fn sfs(cluster: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripefs")).arg("--cluster").arg(cluster).args(args).output().unwrap()
}

fn ok(cluster: &Path, args: &[&str]) -> String {
    let out = sfs(cluster, args);
    assert!(out.status.success(), "stripefs {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn client_commands() {
    let tc = TestCluster::start("tcp", 3);
    let cl = tc.cluster.config_path().to_owned();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(5_000_000, 1)).unwrap();
    ok(&cl, &["mkdir", "-p", "sfs:/a/b"]);
    ok(&cl, &["setstripe", "-c", "2", "-S", "128k", "sfs:/a/b"]);
    assert!(ok(&cl, &["getstripe", "sfs:/a/b"]).contains("pcount 2 ssize 128 KiB"));
    assert!(ok(&cl, &["getstripe", "--bytes", "sfs:/a/b"]).contains("pcount 2 ssize 131072"));
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/a/b/f.bin"]);
    // df: a row per io server, their sum (the servers share the test's file system, so it is
    // counted once), the meta server's counts (root, a, b; one file).
    let df = ok(&cl, &["df", "--bytes"]);
    let rows: Vec<&str> = df.lines().collect();
    assert_eq!(rows.len(), 7, "{df}");
    assert!(rows[0].starts_with("io server") && rows[4].starts_with("total"), "{df}");
    assert!((1..4).all(|i| rows[i].starts_with(&(i - 1).to_string())), "{df}");
    let size = |row: &str| row.split_whitespace().nth(1).unwrap().to_owned();
    assert_eq!(size(rows[4]), size(rows[1]), "{df}");
    assert_eq!(rows[5], "io servers 0, 1, 2 share a file system: the total counts it once");
    assert_eq!(rows[6], "files: 1, directories: 3, io servers: 3");
    let stat = ok(&cl, &["stat", "--bytes", "sfs:/a/b/f.bin"]);
    assert!(stat.contains("size: 5000000") && stat.contains("pcount 2 ssize 131072"), "{stat}");
    let stat = ok(&cl, &["stat", "sfs:/a/b/f.bin"]);
    assert!(stat.contains("size: 4.8 MiB") && stat.contains("pcount 2 ssize 128 KiB"), "{stat}");
    assert_eq!(ok(&cl, &["ls", "sfs:/a/b"]), "f.bin\n");
    let long = ok(&cl, &["ls", "-l", "--bytes", "sfs:/a/b"]);
    assert!(long.starts_with("-rw-r--r-- ") && long.contains(" 5000000 f.bin  [2x131072@"), "{long}");
    let long = ok(&cl, &["ls", "-l", "sfs:/a/b"]);
    assert!(long.contains(" 4.8 MiB f.bin  [2x128KiB@"), "{long}");
    assert!(ok(&cl, &["ls", "-l", "sfs:/a"]).starts_with("drwxr-xr-x "));
    // The 5 MB copy-in went to two of the three io servers (stripe count 2), all of it over
    // one path: mapped into memory, copied to a disk.
    let servers = ok(&cl, &["servers"]);
    let written: Vec<u64> = servers
        .lines()
        .filter_map(|l| l.trim().strip_prefix("bytes: "))
        .map(|l| l.split(" read, ").nth(1).and_then(|w| w.split(' ').next()).unwrap().parse().unwrap())
        .collect();
    assert_eq!(written.len(), 3, "one block per io server: {servers}");
    assert_eq!(written.iter().sum::<u64>(), 5_000_000, "{servers}");
    assert_eq!(written.iter().filter(|&&w| w == 0).count(), 1, "{servers}");
    let idle =
        if stripefs::store::FileSystem::of(tc.dir.path()).unwrap().in_memory() { "copied" } else { "mapped" };
    assert_eq!(servers.matches(&format!("{idle}: 0 reads, 0 writes, 0 bytes")).count(), 3, "{servers}");
    let back = tc.dir.path().join("out.bin");
    ok(&cl, &["cp", "sfs:/a/b/f.bin", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap());
    // Copying onto an existing file replaces its contents.
    std::fs::write(&src, b"short").unwrap();
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/a/b/f.bin"]);
    ok(&cl, &["cp", "sfs:/a/b/f.bin", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), b"short");
    // Within stripefs: cp makes an independent copy (default layout), a file is never copied
    // onto itself, and mv renames, into a directory keeping the name.
    std::fs::write(&src, pattern(3_000_000, 7)).unwrap();
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/a/b/f.bin"]);
    ok(&cl, &["cp", "sfs:/a/b/f.bin", "sfs:/a/g.bin"]);
    assert!(ok(&cl, &["stat", "--bytes", "sfs:/a/g.bin"]).contains("size: 3000000"));
    assert!(ok(&cl, &["getstripe", "sfs:/a/g.bin"]).contains("pcount 3"), "a new file's own layout");
    let same = sfs(&cl, &["cp", "sfs:/a/g.bin", "sfs:/a"]);
    assert!(!same.status.success());
    assert!(String::from_utf8_lossy(&same.stderr).contains("/a/g.bin and /a/g.bin are the same file"));
    ok(&cl, &["mv", "sfs:/a/g.bin", "sfs:/a/b"]);
    ok(&cl, &["mv", "sfs:/a/b/g.bin", "sfs:/a/b/h.bin"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/a/b"]), "f.bin\nh.bin\n");
    ok(&cl, &["cp", "sfs:/a/b/h.bin", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap(), "the copy has the bytes");
    let cycle = sfs(&cl, &["mv", "sfs:/a", "sfs:/a/b"]);
    assert!(!cycle.status.success());
    let cycle = String::from_utf8_lossy(&cycle.stderr).into_owned();
    assert!(
        cycle.starts_with("stripefs: /a → /a/b/a: EINVAL") && cycle.matches("invalid argument").count() == 1,
        "{cycle}"
    );
    ok(&cl, &["rm", "sfs:/a/b/h.bin"]);
    // setstripe on a missing path creates an empty file with that layout.
    ok(&cl, &["setstripe", "-c", "1", "-i", "2", "sfs:/one"]);
    assert!(ok(&cl, &["getstripe", "sfs:/one"]).contains("base 2 pcount 1"));
    let rm = sfs(&cl, &["rm", "sfs:/a"]);
    assert!(!rm.status.success(), "a non-empty directory is not removed");
    assert!(String::from_utf8_lossy(&rm.stderr).contains("ENOTEMPTY"));
    ok(&cl, &["rm", "sfs:/a/b/f.bin", "sfs:/a/b", "sfs:/a", "sfs:/one"]);
    // rm -r: a tree of directories and files goes; the root stays.
    ok(&cl, &["mkdir", "-p", "sfs:/t/u/v", "sfs:/t/w"]);
    for f in ["sfs:/t/x", "sfs:/t/u/y", "sfs:/t/u/v/z", "sfs:/t/w/q"] {
        ok(&cl, &["cp", src.to_str().unwrap(), f]);
    }
    ok(&cl, &["rm", "-r", "sfs:/t"]);
    assert!(ok(&cl, &["df"]).ends_with("files: 0, directories: 1, io servers: 3\n"));
    let root = sfs(&cl, &["rm", "-r", "sfs:/"]);
    assert!(
        !root.status.success()
            && String::from_utf8_lossy(&root.stderr).contains("refusing to remove the root")
    );
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "");
    // Failures name the path, and say each cause once.
    for cmd in
        [&["stat", "sfs:/nope"][..], &["ls", "sfs:/nope"], &["rm", "sfs:/nope"], &["getstripe", "sfs:/nope"]]
    {
        let out = sfs(&cl, cmd);
        assert!(!out.status.success(), "{cmd:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "stripefs: /nope: ENOENT (no such file or directory)\n"
        );
    }
    let back_str = back.to_str().unwrap();
    let err = |args: &[&str]| {
        let out = sfs(&cl, args);
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(err(&["cp", "sfs:/nope", back_str]), "stripefs: /nope: ENOENT (no such file or directory)\n");
    let bad = err(&["setstripe", "-S", "0", "sfs:/z"]);
    assert!(bad.starts_with("stripefs: /z: ") && bad.matches("stripe size 0").count() == 1, "{bad}");
    let dir = tc.dir.path().to_str().unwrap().to_owned();
    assert!(err(&["cp", &dir, "sfs:/z"]).contains("is a directory"));
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "", "no failed command left anything behind");
}

/// `ls -l` asks for a directory's attributes and sizes in batches: a listing of 300 files is
/// a few requests to the meta server and to each io server, not a round per file.
#[test]
fn a_long_listing_asks_in_batches() {
    let tc = TestCluster::start_with("tcp", 2, no_objects_ahead);
    let cl = tc.cluster.config_path().to_owned();
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    for i in 0..300u64 {
        c.create(&format!("/d/f{i:03}"), Default::default())
            .unwrap()
            .write_all_at(0, &pattern(i as usize, i))
            .unwrap();
    }
    let ((meta, io), long) = requests_during(&c, || ok(&cl, &["ls", "-l", "--bytes", "sfs:/d"]));
    assert!(meta <= 10 && io <= 10, "{meta} meta and {io} io requests for 300 files");
    let sizes: Vec<u64> =
        long.lines().map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap()).collect();
    assert_eq!(sizes, (0..300).collect::<Vec<u64>>());
}

#[test]
fn symbolic_link_commands() {
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(300_000, 2)).unwrap();
    ok(&cl, &["mkdir", "-p", "sfs:/d/e"]);
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/d/e/f"]);
    ok(&cl, &["ln", "-s", "e/f", "sfs:/d/lf"]);
    ok(&cl, &["ln", "-s", "/d/e", "sfs:/le"]);
    assert_eq!(ok(&cl, &["readlink", "sfs:/d/lf"]), "e/f\n");
    // ls -l shows a link as a link, with its target; ls of a link to a directory lists it.
    let long = ok(&cl, &["ls", "-l", "--bytes", "sfs:/d"]);
    let row = long.lines().find(|l| l.contains("lf")).unwrap();
    assert!(row.starts_with("lrwxrwxrwx ") && row.ends_with(" 3 lf -> e/f"), "{long}");
    assert!(ok(&cl, &["ls", "-l", "sfs:/d/lf"]).starts_with("lrwxrwxrwx "));
    assert_eq!(ok(&cl, &["ls", "sfs:/le"]), "f\n");
    // stat shows the link and its target; -L what it points at.
    let st = ok(&cl, &["stat", "sfs:/d/lf"]);
    assert!(st.contains("kind: Symlink") && st.contains("target: e/f") && st.contains("size: 3"), "{st}");
    assert!(ok(&cl, &["stat", "-L", "--bytes", "sfs:/d/lf"]).contains("size: 300000"));
    // cp reads through a link and writes through a link to a directory.
    let back = tc.dir.path().join("out.bin");
    ok(&cl, &["cp", "sfs:/d/lf", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&src).unwrap());
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/le/g"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/d/e"]), "f\ng\n");
    // Hard links: a further name of one file; a failure names the path.
    let err = |args: &[&str]| {
        let out = sfs(&cl, args);
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    ok(&cl, &["ln", "sfs:/d/e/f", "sfs:/hard"]);
    let nlink = |p: &str| {
        serde_json::from_str::<serde_json::Value>(&ok(&cl, &["stat", "--json", p])).unwrap()["nlink"].as_u64()
    };
    assert_eq!((nlink("sfs:/hard"), nlink("sfs:/d/e/f")), (Some(2), Some(2)));
    ok(&cl, &["rm", "sfs:/hard"]);
    assert_eq!(nlink("sfs:/d/e/f"), Some(1));
    assert!(err(&["ln", "sfs:/d", "sfs:/hard"]).starts_with("stripefs: /hard: EPERM"));
    assert!(err(&["ln", "-s", "x", "sfs:/d/lf"]).starts_with("stripefs: /d/lf: EEXIST"));
    assert!(err(&["readlink", "sfs:/d/e/f"]).starts_with("stripefs: /d/e/f: EINVAL"));
    // rm and rm -r remove a link, never what it points at.
    ok(&cl, &["rm", "-r", "sfs:/le"]);
    ok(&cl, &["rm", "sfs:/d/lf"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "d\n");
    assert_eq!(ok(&cl, &["ls", "sfs:/d/e"]), "f\ng\n");
}

#[test]
fn cp_r_copies_a_tree_both_ways_and_within() {
    use std::os::unix::fs::symlink;
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    // A local tree: files (one of several chunks), an empty directory, links to a file and a
    // directory, and a dangling link.
    let top = tc.dir.path().join("tree");
    std::fs::create_dir_all(top.join("sub/empty")).unwrap();
    std::fs::write(top.join("a.bin"), pattern(20_000_000, 5)).unwrap();
    std::fs::write(top.join("sub/b.txt"), b"bee").unwrap();
    symlink("a.bin", top.join("la")).unwrap();
    symlink("sub", top.join("ls")).unwrap();
    symlink("nowhere", top.join("dangling")).unwrap();
    let t = top.to_str().unwrap();
    let plain = sfs(&cl, &["cp", t, "sfs:/"]);
    assert!(!plain.status.success() && String::from_utf8_lossy(&plain.stderr).contains("cp -r"));
    // In, into an existing directory (keeping the name).
    ok(&cl, &["cp", "-r", t, "sfs:/"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/tree"]), "a.bin\ndangling\nla\nls\nsub\n");
    assert_eq!(ok(&cl, &["readlink", "sfs:/tree/la"]), "a.bin\n");
    assert_eq!(ok(&cl, &["readlink", "sfs:/tree/dangling"]), "nowhere\n");
    assert_eq!(ok(&cl, &["ls", "sfs:/tree/sub"]), "b.txt\nempty\n");
    assert!(ok(&cl, &["stat", "sfs:/tree/la"]).contains("kind: Symlink"), "a link stays a link");
    // Within stripefs, to a new name, then out again.
    ok(&cl, &["cp", "-r", "sfs:/tree", "sfs:/copy"]);
    let back = tc.dir.path().join("back");
    ok(&cl, &["cp", "-r", "sfs:/copy", back.to_str().unwrap()]);
    let same = |rel: &str| {
        let (a, b) = (top.join(rel), back.join(rel));
        let (ma, mb) = (std::fs::symlink_metadata(&a).unwrap(), std::fs::symlink_metadata(&b).unwrap());
        assert_eq!(ma.file_type(), mb.file_type(), "{rel}");
        if ma.file_type().is_symlink() {
            assert_eq!(std::fs::read_link(&a).unwrap(), std::fs::read_link(&b).unwrap(), "{rel}");
        } else if ma.is_file() {
            assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{rel}");
        }
    };
    for rel in ["a.bin", "sub", "sub/b.txt", "sub/empty", "la", "ls", "dangling"] {
        same(rel);
    }
    assert_eq!(std::fs::read_dir(&back).unwrap().count(), 5);
    // Copying again into the same tree replaces the files' contents.
    std::fs::write(top.join("sub/b.txt"), b"wasp").unwrap();
    std::fs::remove_file(top.join("la")).unwrap();
    std::fs::remove_file(top.join("ls")).unwrap();
    std::fs::remove_file(top.join("dangling")).unwrap();
    ok(&cl, &["cp", "-r", t, "sfs:/"]);
    ok(&cl, &["cp", "sfs:/tree/sub/b.txt", back.join("b2").to_str().unwrap()]);
    assert_eq!(std::fs::read(back.join("b2")).unwrap(), b"wasp");
}

/// FIFOs, sockets and device nodes inside a tree are made again on the other side, never
/// opened: a FIFO's open would wait for a writer that never comes.
#[test]
fn cp_r_makes_special_files_again_both_ways() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    let top = tc.dir.path().join("tree");
    std::fs::create_dir(&top).unwrap();
    std::fs::write(top.join("file"), b"data").unwrap();
    nix::unistd::mkfifo(&top.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
    std::fs::set_permissions(top.join("fifo"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(top.join("socket")).unwrap();
    let root = nix::unistd::geteuid().is_root();
    if root {
        let null = nix::sys::stat::makedev(1, 3);
        let (chr, mode) = (nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::from_bits_truncate(0o666));
        nix::sys::stat::mknod(&top.join("null"), chr, mode, null).unwrap();
    }
    let copy = |from: &str, to: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(&cl).args(["cp", "-r", from, to]);
        let (out, ended) = output_within(&mut cmd, Duration::from_secs(60));
        assert!(ended, "cp -r {from} {to} did not finish");
        assert!(out.status.success(), "cp -r {from} {to}: {}", String::from_utf8_lossy(&out.stderr));
    };
    copy(top.to_str().unwrap(), "sfs:/tree");
    let kind = |p: &str| tc.client().lstat(p).unwrap().attr;
    assert_eq!(
        (kind("/tree/fifo").kind, kind("/tree/fifo").mode & 0o7777),
        (stripefs::proto::FileKind::Fifo, 0o640)
    );
    assert_eq!(kind("/tree/socket").kind, stripefs::proto::FileKind::Socket);
    if root {
        assert_eq!(kind("/tree/null").kind, stripefs::proto::FileKind::CharDev(0x103));
    }
    let back = tc.dir.path().join("back");
    copy("sfs:/tree", back.to_str().unwrap());
    let meta = |n: &str| std::fs::symlink_metadata(back.join(n)).unwrap();
    assert!(meta("fifo").file_type().is_fifo() && meta("fifo").mode() & 0o7777 == 0o640);
    assert!(meta("socket").file_type().is_socket());
    assert_eq!(std::fs::read(back.join("file")).unwrap(), b"data");
    if root {
        assert!(meta("null").file_type().is_char_device());
        assert_eq!(meta("null").rdev(), nix::sys::stat::makedev(1, 3));
    }
}

/// A local name that is not UTF-8, which stripefs names must be, stops a copy before anything
/// is made, and the error names it: it is neither taken for a file removed meanwhile nor
/// copied under a name changed on the way.
#[test]
fn cp_names_a_local_name_stripefs_cannot_hold() {
    use std::os::unix::ffi::OsStrExt;
    let tc = TestCluster::start("tcp", 1);
    let cl = tc.cluster.config_path().to_owned();
    let dir = tc.dir.path().join("tree");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/ok"), b"ok").unwrap();
    let bad = dir.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::write(&bad, b"latin-1").unwrap();
    for (src, dst) in [(dir.as_os_str(), "sfs:/tree"), (bad.as_os_str(), "sfs:/")] {
        let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .arg("--cluster")
            .arg(&cl)
            .args(["cp", "-r"])
            .arg(src)
            .arg(dst)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("caf") && err.contains("not UTF-8"), "{src:?}: {err}");
    }
    assert_eq!(json(&cl, &["ls", "--json", "sfs:/"])["entries"], serde_json::json!([]), "something was made");
    // Given a name that is, the file is copied.
    let mut cp = Command::new(env!("CARGO_BIN_EXE_stripefs"));
    assert!(cp.arg("--cluster").arg(&cl).arg("cp").arg(&bad).arg("sfs:/cafe").status().unwrap().success());
    let back = tc.dir.path().join("back");
    ok(&cl, &["cp", "sfs:/cafe", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), b"latin-1");
}

/// A tree of many files, copied several at a time, arrives whole both ways; a file that cannot
/// be made stops the copy with an error naming it.
/// `cp` leaves a sparse file's holes out of the copy, both ways and in a tree, where copying
/// them wrote every hole as data: the copy holds about the space of the data. Into a stream
/// (a pipe) the holes come out as the zeros they read as.
#[test]
fn cp_keeps_a_sparse_file_s_holes_both_ways() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let tc = TestCluster::start("tcp", 3);
    let cl = tc.cluster.config_path().to_owned();
    let dir = tc.dir.path().join("tree");
    std::fs::create_dir(&dir).unwrap();
    // 1 MiB at the start, 1 MiB at 40 MiB, a hole to 64 MiB.
    let src = dir.join("sparse");
    let f = std::fs::File::create(&src).unwrap();
    f.write_all_at(&pattern(1 << 20, 1), 0).unwrap();
    f.write_all_at(&pattern(1 << 20, 2), 40 << 20).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    // And one whose last run of data ends in zeros written as data, which the copy leaves out.
    let tail = dir.join("tail");
    let f = std::fs::File::create(&tail).unwrap();
    let mut last = pattern(1 << 20, 3).to_vec();
    last[(768 << 10)..].fill(0);
    f.write_all_at(&last, 8 << 20).unwrap();
    drop(f);
    let want = std::fs::read(&src).unwrap();
    let held = |p: &Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(held(&src) <= 4 << 20, "the test's file system keeps holes");
    let allocated = |path: &str| json(&cl, &["stat", "--json", path])["allocated"].as_u64().unwrap();
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/sparse"]);
    ok(&cl, &["cp", "-r", dir.to_str().unwrap(), "sfs:/tree"]);
    for path in ["sfs:/sparse", "sfs:/tree/sparse"] {
        let st = json(&cl, &["stat", "--json", path]);
        assert_eq!(st["size"], 64 << 20, "{path}");
        assert!(allocated(path) <= 4 << 20, "{path} holds {} bytes", allocated(path));
    }
    let out = tc.dir.path().join("out");
    ok(&cl, &["cp", "sfs:/sparse", out.to_str().unwrap()]);
    let back = tc.dir.path().join("back");
    ok(&cl, &["cp", "-r", "sfs:/tree", back.to_str().unwrap()]);
    for p in [out.clone(), back.join("sparse")] {
        assert!(std::fs::read(&p).unwrap() == want, "{}: not the same bytes", p.display());
        assert!(held(&p) <= 4 << 20, "{} holds {} bytes", p.display(), held(&p));
    }
    let tail_want = std::fs::read(&tail).unwrap();
    assert_eq!(tail_want.len(), 9 << 20);
    assert_eq!(json(&cl, &["stat", "--json", "sfs:/tree/tail"])["size"], 9 << 20, "copied in");
    assert!(std::fs::read(back.join("tail")).unwrap() == tail_want, "copied in and out again");
    let piped = sfs(&cl, &["cp", "sfs:/sparse", "/dev/stdout"]);
    assert!(piped.status.success() && piped.stdout == want, "through a pipe");
}

#[test]
fn cp_r_of_many_files_copies_each_whole() {
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    let top = tc.dir.path().join("many");
    for d in 0..4u64 {
        std::fs::create_dir_all(top.join(format!("d{d}"))).unwrap();
        for f in 0..15u64 {
            let len = (f * 7919 + d * 104_729) as usize % 150_000;
            std::fs::write(top.join(format!("d{d}/f{f}")), pattern(len, d * 100 + f)).unwrap();
        }
    }
    ok(&cl, &["cp", "-r", top.to_str().unwrap(), "sfs:/many"]);
    let back = tc.dir.path().join("back");
    ok(&cl, &["cp", "-r", "sfs:/many", back.to_str().unwrap()]);
    for d in 0..4 {
        for f in 0..15 {
            let rel = format!("d{d}/f{f}");
            assert!(
                std::fs::read(top.join(&rel)).unwrap() == std::fs::read(back.join(&rel)).unwrap(),
                "{rel}"
            );
        }
    }
    // Again into a tree where one file's name is a directory's.
    let again = tc.dir.path().join("again");
    std::fs::create_dir_all(again.join("many/d2/f7")).unwrap();
    let out = sfs(&cl, &["cp", "-r", "sfs:/many", again.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("d2/f7"), "{err}");
}

/// What a user creates is theirs: the client records its effective uid and gid.
#[test]
#[ignore = "needs root: runs commands as other users"]
fn new_entries_belong_to_the_user_who_made_them() {
    assert!(nix::unistd::geteuid().is_root(), "switching to another user needs root");
    let tc = TestCluster::start("tcp", 1);
    let cl = tc.cluster.config_path().to_owned();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, b"mine").unwrap();
    // The cluster file and the source must be readable by the other user.
    for p in [tc.dir.path(), cl.parent().unwrap()] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    for p in [&cl, &src] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    }
    // The cluster key stays private (0600), handed to that user.
    let key = cl.parent().unwrap().join("cluster.key");
    std::os::unix::fs::chown(&key, Some(4321), Some(8765)).unwrap();
    let run_as = |uid: u32, args: &[&str]| {
        Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                "--regid=8765",
                "--clear-groups",
                env!("CARGO_BIN_EXE_stripefs"),
            ])
            .arg("--cluster")
            .arg(&cl)
            .args(args)
            .output()
            .unwrap()
    };
    let as_user = |args: &[&str]| {
        let out = run_as(4321, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // The root directory is root's (0755): the user may not make names there until it is
    // opened to everyone.
    let refused = run_as(4321, &["mkdir", "sfs:/d"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("EACCES"), "{refused:?}");
    tc.client()
        .setattr(stripefs::proto::Handle::ROOT, SetAttr { mode: Some(0o777), ..Default::default() })
        .unwrap();
    as_user(&["mkdir", "sfs:/d"]);
    as_user(&["cp", src.to_str().unwrap(), "sfs:/d/f"]);
    as_user(&["ln", "-s", "f", "sfs:/d/l"]);
    let c = tc.client();
    for p in ["/d", "/d/f", "/d/l"] {
        let a = c.lstat(p).unwrap().attr;
        assert_eq!((a.uid, a.gid), (4321, 8765), "{p}");
    }
    // Another user (now holding the key) may not remove or move them: the directory is
    // 0755, the first user's.
    std::os::unix::fs::chown(&key, Some(4322), Some(8765)).unwrap();
    for args in [&["rm", "sfs:/d/f"][..], &["rm", "-r", "sfs:/d"], &["mv", "sfs:/d/f", "sfs:/g"]] {
        let out = run_as(4322, args);
        assert!(String::from_utf8_lossy(&out.stderr).contains("EACCES"), "{args:?}: {out:?}");
    }
    assert_eq!(c.lstat("/d/f").unwrap().attr.uid, 4321, "still there");
}

/// Waits until `serve` (a `stripefs serve` of a local cluster) has written its whole cluster
/// file `cl`: complete once the meta server's real address is in it.
fn wait_for_cluster_file(cl: &Path, serve: &mut std::process::Child) {
    let t = Instant::now();
    while !std::fs::read_to_string(cl).is_ok_and(|s| s.contains("meta") && !s.contains(":0\"")) {
        assert!(t.elapsed() < Duration::from_secs(20), "no cluster file");
        assert!(serve.try_wait().unwrap().is_none(), "serve exited");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `stripefs serve` with a data directory relative to where it runs (as its default is): the
/// cluster file it writes works from anywhere else.
#[test]
fn serve_runs_a_local_cluster_from_flags() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut serve = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .current_dir(dir.path())
        .args(["serve", "--io-servers", "2", "--data-dir", "data"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let cl = data.join("cluster.toml");
    wait_for_cluster_file(&cl, &mut serve);
    ok(&cl, &["mkdir", "sfs:/x"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "x\n");
    let pid = serve.id().to_string();
    let stat = |p: &Path| std::fs::read_to_string(p.join("stat")).ok();
    // Fields after the command name: state, ppid, …
    let fields = |s: &str| -> Vec<String> {
        s.rsplit(')').next().unwrap_or("").split_whitespace().map(str::to_owned).collect()
    };
    let children: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| stat(p).is_some_and(|s| fields(&s).get(1) == Some(&pid)))
        .collect();
    assert_eq!(children.len(), 3, "serve runs 1 meta + 2 io servers as children");
    // Their command lines, read before they stop, so a failed check below leaves nothing running.
    let cmdlines: Vec<Vec<u8>> = children.iter().map(|c| std::fs::read(c.join("cmdline")).unwrap()).collect();
    serve.kill().unwrap();
    serve.wait().unwrap();
    // The servers it started exit with it (their stdin pipe closes).
    let t = Instant::now();
    while children
        .iter()
        .any(|p| stat(p).is_some_and(|s| fields(&s).first().map(String::as_str) != Some("Z")))
    {
        assert!(t.elapsed() < Duration::from_secs(10), "servers outlived serve");
        std::thread::sleep(Duration::from_millis(50));
    }
    // They poll only with a CPU each and one for a client to spare; else they block.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let want = if 2 + 2 <= cpus { "adaptive" } else { "block" };
    for cmdline in &cmdlines {
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let wait = args.iter().position(|a| *a == b"--wait").map(|i| args[i + 1]);
        assert_eq!(wait, Some(want.as_bytes()), "{} CPUs: {:?}", cpus, String::from_utf8_lossy(cmdline));
    }
}

/// A second `stripefs serve` on a data directory a running cluster uses fails at once, naming
/// the directory, and leaves the running cluster (its cluster file, its servers) as it was; so
/// does a second io server or meta server on another's directory.
#[test]
fn a_second_server_on_a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = || {
        Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .args(["serve", "--io-servers", "2", "--data-dir"])
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = serve();
    let cl = data.join("cluster.toml");
    wait_for_cluster_file(&cl, &mut first);
    ok(&cl, &["mkdir", "sfs:/x"]);
    let file = std::fs::read(&cl).unwrap();
    let second = serve().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{err}");
    assert!(err.contains("in use") && err.contains(data.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read(&cl).unwrap(), file, "the running cluster's file is untouched");
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "x\n");
    // The servers themselves, started by hand on a running one's directory.
    let key = data.join("cluster.key");
    let io = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["serve", "--io", "0", "--listen", "tcp://127.0.0.1:0", "--data-dir"])
        .arg(data.join("io0"))
        .arg("--key-file")
        .arg(&key)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&io.stderr);
    assert!(!io.status.success() && err.contains("in use by another io server"), "{err}");
    let meta = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["serve", "--meta", "--listen", "tcp://127.0.0.1:0", "--cluster"])
        .arg(&cl)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&meta.stderr);
    assert!(!meta.status.success() && err.contains("in use by another meta server"), "{err}");
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "x\n");
    first.kill().unwrap();
    first.wait().unwrap();
}

/// A destination the user names that is a device or a FIFO (`/dev/null` to time a read, a
/// pipe to another program) is written as a stream, as `cp` does; inside a tree copy, where
/// the names come from the server, anything but a regular file is still refused.
#[test]
fn cp_out_writes_into_a_named_device_or_fifo() {
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    let src = tc.dir.path().join("in.bin");
    let data = pattern(3_000_000, 5);
    std::fs::write(&src, &data).unwrap();
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/f"]);
    ok(&cl, &["cp", "sfs:/f", "/dev/null"]);
    let fifo = tc.dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    ok(&cl, &["cp", "sfs:/f", fifo.to_str().unwrap()]);
    assert!(reader.join().unwrap() == data, "the bytes through the FIFO");
    // In a tree, a FIFO where the server's tree puts a file is refused, not written into.
    ok(&cl, &["mkdir", "sfs:/t"]);
    ok(&cl, &["cp", "sfs:/f", "sfs:/t/g"]);
    let out = tc.dir.path().join("out");
    std::fs::create_dir_all(out.join("t")).unwrap();
    nix::unistd::mkfifo(&out.join("t/g"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let out_s = out.to_str().unwrap().to_owned() + "/";
    let tree = sfs(&cl, &["cp", "-r", "sfs:/t", &out_s]);
    let err = String::from_utf8_lossy(&tree.stderr);
    assert!(!tree.status.success() && err.contains("t/g"), "{err}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(out.join("t/g")).unwrap().file_type().is_fifo());
}

/// A local cluster's server count outside what a cluster file allows is refused by the flag,
/// before anything is started or written.
#[test]
fn serve_refuses_a_server_count_no_cluster_file_allows() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["0", "4097"] {
        let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .args(["serve", "--io-servers", n, "--data-dir"])
            .arg(dir.path().join("data"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--io-servers"), "{n}: {err}");
        assert!(!dir.path().join("data").exists(), "{n}: nothing is made");
    }
}

#[test]
fn demo_runs_and_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["demo", "--size-mib", "8", "--runs", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let checksum = text.lines().find(|l| l.starts_with("checksum")).expect("checksum row");
    assert!(checksum.contains("ok"), "{text}");
    assert!(text.contains("tcp://") && text.contains("softib://"), "{text}");
    let dir = text.split("data in ").nth(1).and_then(|s| s.lines().next()).expect("data dir named");
    assert!(!Path::new(dir.trim()).exists(), "the demo removes its data directory");
}

/// `df` and `servers` with an io server down: the others are shown, the dead one is named as
/// unreachable, and the command fails instead of reporting a smaller file system.
#[test]
fn df_and_servers_name_an_unreachable_io_server() {
    let mut tc = TestCluster::start("tcp", 3);
    tc.cluster.kill_io(1);
    let cl = tc.cluster.config_path().to_owned();
    for cmd in ["df", "servers"] {
        let out = sfs(&cl, &[cmd]);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{cmd}: {stdout}");
        assert!(stderr.contains("1 io server(s) did not answer"), "{cmd}: {stderr}");
        let unreachable: Vec<&str> = stdout.lines().filter(|l| l.contains("unreachable")).collect();
        assert_eq!(unreachable.len(), 1, "{cmd}: {stdout}");
        assert!(
            unreachable[0].starts_with('1') || unreachable[0].starts_with("io server 1"),
            "{cmd}: {stdout}"
        );
        assert!(!stdout.contains("total"), "no sum without every server: {stdout}");
    }
}

fn json(cluster: &Path, args: &[&str]) -> serde_json::Value {
    let out = ok(cluster, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("stripefs {args:?}: not JSON ({e}): {out}"))
}

/// `status`: with every server up it lists each and exits 0, its JSON saying the same figures;
/// with an io server killed it still lists all, says which is down (role and address) and
/// exits 1, in text and in JSON.
#[test]
fn status_reports_every_server_and_names_a_dead_one() {
    let mut tc = TestCluster::start("tcp", 3);
    let cl = tc.cluster.config_path().to_owned();
    let text = ok(&cl, &["status", "--bytes"]);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 5, "a header, the meta server, 3 io servers: {text}");
    let j = json(&cl, &["status", "--json"]);
    assert_eq!(j["healthy"], true, "{j}");
    let servers = j["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 4, "{j}");
    for (s, row) in servers.iter().zip(&rows[1..]) {
        assert_eq!(s["state"], "up", "{j}");
        assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
        assert!(s["requests"].as_u64().unwrap() >= 1 && s["uptime_ns"].as_u64().unwrap() > 0, "{j}");
        let (total, avail) = (s["disk"]["total"].as_u64().unwrap(), s["disk"]["avail"].as_u64().unwrap());
        assert!(total > 0 && avail <= total, "{j}");
        // The same server, the same version and size in the table (free space moves).
        let f: Vec<&str> = row.split_whitespace().collect();
        let label = match s["index"].as_u64() {
            Some(i) => format!("io {i}"),
            None => "meta".to_string(),
        };
        assert!(row.starts_with(&label) && row.contains(s["address"].as_str().unwrap()), "{row}");
        assert_eq!(f.last().unwrap().parse::<u64>().unwrap(), total, "{row}");
        assert!(row.contains(" up ") && row.contains(env!("CARGO_PKG_VERSION")), "{row}");
    }
    let human = ok(&cl, &["status"]);
    assert!(human.lines().nth(1).unwrap().ends_with("iB"), "sizes in binary units: {human}");

    tc.cluster.kill_io(1);
    let dead = tc.cluster.config().io_servers[1].to_string();
    let out = sfs(&cl, &["status"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains(&format!("1 of 4 servers down: io server 1 ({dead})")), "{stderr}");
    let down: Vec<&str> = stdout.lines().filter(|l| l.contains(" down ")).collect();
    assert_eq!(down.len(), 1, "{stdout}");
    assert!(down[0].starts_with("io 1") && down[0].contains(&dead), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.contains(" up ")).count(), 3, "the others: {stdout}");
    let out = sfs(&cl, &["status", "--json"]);
    assert!(!out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON document even then");
    assert_eq!(j["healthy"], false);
    let s = &j["servers"][2];
    assert_eq!(
        (s["role"].as_str(), s["index"].as_u64(), s["state"].as_str()),
        (Some("io"), Some(1), Some("down"))
    );
    assert!(s["error"].as_str().unwrap().contains(&dead) && s["disk"].is_null(), "{j}");
}

/// Whitespace-separated fields of the line of `text` that contains `key`.
fn fields_of<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    let line = text.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key:?} in {text}"));
    line.split_whitespace().collect()
}

/// `--json` of ls, stat, getstripe, servers and df: each prints one JSON document whose
/// figures are the text's (`--bytes`); sizes given with units arrive as bytes; junk sizes are
/// refused.
#[test]
fn json_output_parses_and_matches_the_text() {
    let tc = TestCluster::start("tcp", 2);
    let cl = tc.cluster.config_path().to_owned();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(1_500_000, 3)).unwrap();
    ok(&cl, &["mkdir", "sfs:/d"]);
    ok(&cl, &["setstripe", "-S", "64k", "sfs:/d"]);
    ok(&cl, &["setstripe", "-S", "1M", "-c", "2", "sfs:/d/f"]);
    ok(&cl, &["cp", src.to_str().unwrap(), "sfs:/d/g"]);
    ok(&cl, &["ln", "-s", "g", "sfs:/d/l"]);

    // getstripe: a file's layout, a directory's default.
    let j = json(&cl, &["getstripe", "--json", "sfs:/d/f"]);
    assert_eq!(j["layout"]["stripe_size"], 1_048_576, "{j}");
    assert_eq!((j["layout"]["pcount"].as_u64(), j["default"].is_null()), (Some(2), true), "{j}");
    let text = ok(&cl, &["getstripe", "--bytes", "sfs:/d/f"]);
    let servers = j["layout"]["servers"].as_array().unwrap();
    let want = format!(
        "base {} pcount 2 ssize 1048576 servers [{}, {}]",
        j["layout"]["base"], servers[0], servers[1]
    );
    assert_eq!(text.trim(), want);
    assert!(ok(&cl, &["getstripe", "sfs:/d/f"]).contains("ssize 1.0 MiB"));
    let j = json(&cl, &["getstripe", "--json", "sfs:/d"]);
    assert!(j["layout"].is_null() && j["default"]["base"].is_null(), "{j}");
    assert_eq!(j["default"]["stripe_size"], 65536, "{j}");

    // ls: every entry with its attributes, as -l shows them.
    let j = json(&cl, &["ls", "--json", "sfs:/d"]);
    let text = ok(&cl, &["ls", "-l", "--bytes", "sfs:/d"]);
    let entries = j["entries"].as_array().unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["f", "g", "l"], "{j}");
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let f = fields_of(&text, &format!(" {name}"));
        assert_eq!(f[4], name, "{text}");
        assert_eq!(
            (f[1], f[2], f[3]),
            (&*e["uid"].to_string(), &*e["gid"].to_string(), &*e["size"].to_string())
        );
        if let Some(l) = e["layout"].as_object() {
            let shown = format!("[{}x{}@{}]", l["pcount"], l["stripe_size"], l["base"]);
            assert_eq!(f.last().copied(), Some(shown.as_str()), "{text}");
        }
    }
    assert_eq!((entries[1]["kind"].as_str(), entries[1]["size"].as_u64()), (Some("file"), Some(1_500_000)));
    assert_eq!(entries[1]["layout"]["stripe_size"], 65536, "the directory's default: {j}");
    assert_eq!((entries[2]["kind"].as_str(), entries[2]["target"].as_str()), (Some("symlink"), Some("g")));
    assert_eq!(entries[0]["mode"], 0o644);
    assert!(ok(&cl, &["ls", "-l", "sfs:/d"]).contains(" 1.4 MiB g  [2x64KiB@"));

    // stat: the same figures and times as the text.
    let j = json(&cl, &["stat", "--json", "sfs:/d/g"]);
    let text = ok(&cl, &["stat", "--bytes", "sfs:/d/g"]);
    assert_eq!(j["path"], "/d/g");
    assert!(text.contains(&format!("size: {}", j["size"])) && j["size"] == 1_500_000, "{text}{j}");
    assert!(text.contains(&format!("handle: {:#x}", j["handle"].as_u64().unwrap())), "{text}{j}");
    for t in ["atime", "mtime", "ctime"] {
        let date = j[t].as_str().unwrap();
        assert!(date.ends_with('Z') && text.contains(&format!("{t}: {date}")), "{text}{j}");
    }
    assert!(text.contains("ssize 65536") && j["layout"]["stripe_size"] == 65536, "{text}");
    let j = json(&cl, &["stat", "--json", "-L", "sfs:/d/l"]);
    assert_eq!((j["kind"].as_str(), j["size"].as_u64()), (Some("file"), Some(1_500_000)));

    // servers: the counters the text shows.
    let j = json(&cl, &["servers", "--json"]);
    let text = ok(&cl, &["servers"]);
    let io = j["io_servers"].as_array().unwrap();
    assert_eq!(io.len(), 2);
    let written: u64 = io.iter().map(|s| s["bytes_written"].as_u64().unwrap()).sum();
    assert_eq!(written, 1_500_000, "{j}");
    for (i, s) in io.iter().enumerate() {
        assert_eq!((s["index"].as_u64(), s["state"].as_str()), (Some(i as u64), Some("up")));
        assert_eq!(s["address"], tc.cluster.config().io_servers[i].to_string());
        let block = text.split(&format!("io server {i}:")).nth(1).unwrap();
        let line = format!(
            "bytes: {} read, {} written ({} written behind);",
            s["bytes_read"], s["bytes_written"], s["written_behind"]
        );
        assert!(block.lines().any(|l| l.trim().starts_with(&line)), "{line} in {text}");
    }

    // df: per server and in total, the sizes of the text.
    let j = json(&cl, &["df", "--json"]);
    let text = ok(&cl, &["df", "--bytes"]);
    assert_eq!((j["files"].as_u64(), j["directories"].as_u64()), (Some(3), Some(2)), "{j}");
    for (i, s) in j["io_servers"].as_array().unwrap().iter().enumerate() {
        let f: Vec<&str> = text.lines().nth(i + 1).unwrap().split_whitespace().collect();
        assert_eq!(f[1], s["total"].to_string(), "{text}{j}");
    }
    let f = fields_of(&text, "total");
    assert_eq!(f[1], j["total"]["total"].to_string(), "{text}{j}");
    assert!(j["total"]["use_percent"].as_u64().unwrap() <= 100);
    assert!(ok(&cl, &["df"]).lines().nth(1).unwrap().contains("iB"), "binary units by default");

    // Junk sizes are refused before anything is done.
    for args in [
        &["setstripe", "-S", "12q", "sfs:/x"][..],
        &["setstripe", "-S", "", "sfs:/x"],
        &["cp", "--stripe-size", "1 ton", src.to_str().unwrap(), "sfs:/x"],
    ] {
        let out = sfs(&cl, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("invalid size"), "{args:?}: {err}");
        assert!(err.contains(&format!("{:?}", args[2])), "the input is quoted: {err}");
    }
    let out = sfs(&cl, &["setstripe", "-S", "99999999999999999999", "sfs:/x"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("too large"));
    // `1` meant as a MiB is a byte: refused, naming the least stripe size.
    let out = sfs(&cl, &["cp", "--stripe-size", "1", src.to_str().unwrap(), "sfs:/x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("4096"), "{err}");
    assert!(!ok(&cl, &["ls", "sfs:/"]).contains('x'), "nothing was made");
}

/// `stripefs init ARGS…` in `dir`.
fn init(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripefs")).current_dir(dir).arg("init").args(args).output().unwrap()
}

/// `init` fails, its error naming `arg` and `what`, and writes nothing.
fn init_refused(args: &[&str], arg: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = init(dir.path(), args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.starts_with(&format!("stripefs: {arg}")) && err.contains(what), "{args:?}: {err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{args:?} left files behind");
}

/// `init` writes a cluster file `load` accepts and an owner-only key beside it, named
/// relative to it; says which command each host runs; keeps an existing key; and replaces an
/// existing cluster file only with `--force`.
#[test]
fn init_writes_a_cluster_file_and_key_for_several_hosts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--meta", "10.0.0.1:3000", "--io", "10.0.0.2:7000,10.0.0.3:7000,10.0.0.3:7001"];
    let out = init(dir.path(), &[&args[..], &["--stripe-size", "1M"]].concat());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = dir.path().join("cluster.toml");
    let key = dir.path().join("cluster.key");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&file), mode(&key)), (0o600, 0o600));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("cluster_key_file = \"cluster.key\""), "{text}");
    let cfg = stripefs::config::ClusterConfig::load(&file).unwrap();
    assert_eq!(cfg.meta.to_string(), "tcp://10.0.0.1:3000");
    let io: Vec<String> = cfg.io_servers.iter().map(ToString::to_string).collect();
    assert_eq!(io, ["tcp://10.0.0.2:7000", "tcp://10.0.0.3:7000", "tcp://10.0.0.3:7001"]);
    assert_eq!(cfg.data_dir.as_deref(), Some(Path::new("/var/lib/stripefs")));
    assert_eq!(cfg.layout.ssize, 1 << 20);
    let key_bytes = cfg.cluster_key().unwrap();
    assert_eq!(key_bytes.len(), 32);
    let f = file.display();
    for line in [
        format!("on 10.0.0.1: stripefs serve --meta --cluster {f}"),
        format!("on 10.0.0.2: stripefs serve --io 0 --cluster {f}"),
        format!("on 10.0.0.3: stripefs serve --io 1 --cluster {f}"),
        format!("on 10.0.0.3: stripefs serve --io 2 --cluster {f}"),
        "10.0.0.3: 7000 (io server 1), 7001 (io server 2)".into(),
        format!("stripefs --cluster {f} status"),
    ] {
        assert!(said.contains(&line), "{line:?} missing from:\n{said}");
    }
    assert!(said.contains("created the cluster key"), "{said}");

    // An existing cluster file is kept without --force.
    let out = init(dir.path(), &[&args[..], &["--transport", "softib"]].concat());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-o: ") && err.contains("exists; pass --force"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // With --force it is replaced; the key stays, so servers already running keep theirs.
    let out = init(dir.path(), &[&args[..], &["--transport", "softib", "--force"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept the existing cluster key"));
    let cfg = stripefs::config::ClusterConfig::load(&file).unwrap();
    assert_eq!(cfg.meta.to_string(), "softib://10.0.0.1:3000");
    assert_eq!(cfg.cluster_key().unwrap(), key_bytes);

    // A key file elsewhere is named by its absolute path.
    let keys = tempfile::tempdir().unwrap();
    let elsewhere = keys.path().join("k");
    let out = init(
        dir.path(),
        &[&args[..], &["--key-file", elsewhere.to_str().unwrap(), "-o", "other.toml"]].concat(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&elsewhere), 0o600);
    let other = std::fs::read_to_string(dir.path().join("other.toml")).unwrap();
    assert!(other.contains(&format!("cluster_key_file = \"{}\"", elsewhere.display())), "{other}");
}

#[test]
fn init_refuses_bad_arguments_naming_them() {
    let io = ["--io", "10.0.0.2:7000"];
    init_refused(&["--meta", "10.0.0.1", "--io", "10.0.0.2:7000"], "--meta (meta server)", "has no port");
    init_refused(&["--meta", "10.0.0.1:3000", "--io", "10.0.0.2:7000,h:x"], "--io (io server 1)", "port");
    init_refused(&["--meta", "10.0.0.1:3000", "--io", "10.0.0.2:0"], "--io (io server 0)", "port 0");
    init_refused(&["--meta", "0.0.0.0:3000", "--io", "10.0.0.2:7000"], "--meta (meta server)", "0.0.0.0");
    init_refused(&["--meta", "ib://10.0.0.1:3000", "--io", "10.0.0.2:7000"], "--meta", "transport tcp");
    init_refused(
        &["--meta", "10.0.0.1:3000", "--io", "10.0.0.2:7000,10.0.0.3:7000,10.0.0.2:7000"],
        "--io",
        "io server 0 and io server 2 both have address tcp://10.0.0.2:7000",
    );
    init_refused(
        &["--meta", "10.0.0.2:7000", "--io", "10.0.0.2:7000"],
        "--meta and --io",
        "meta server and io server 0 both have address tcp://10.0.0.2:7000",
    );
    init_refused(
        &[&["--meta", "10.0.0.1:3000"][..], &io, &["--stripe-count", "2"]].concat(),
        "--stripe-count",
        "1..=1",
    );
    init_refused(
        &[&["--meta", "10.0.0.1:3000"][..], &io, &["--transfer-unit", "1"]].concat(),
        "--transfer-unit",
        "",
    );
    init_refused(
        &[&["--meta", "10.0.0.1:3000"][..], &io, &["-o", "no/such/dir/c.toml"]].concat(),
        "-o",
        "no such directory",
    );
    // A key file that is not a key is refused before the cluster file names it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.key"), "not a key\n").unwrap();
    let out = init(dir.path(), &[&["--meta", "10.0.0.1:3000"][..], &io].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("stripefs: --key-file: "), "{err}");
    assert!(!dir.path().join("cluster.toml").exists());
}
