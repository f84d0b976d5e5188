//! The FUSE mount, used through ordinary tools: `cp` a file in, `cmp` it back, `ls`, `ln -s`,
//! `rm`, unmount. Needs /dev/fuse (skipped with a printed reason where it is missing).
#![cfg(feature = "fuse")]

mod common;

use common::{TestCluster, pattern};
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

#[test]
fn mount_cp_cmp_ls_rm_umount() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return;
    }
    let tc = TestCluster::start("tcp", 3);
    let mnt = tc.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(tc.cluster.config_path())
        .arg("mount")
        .arg(&mnt)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut m = Mount { child, dir: mnt.clone() };
    let t = Instant::now();
    while !mounted(&mnt) {
        assert!(t.elapsed() < Duration::from_secs(20), "mount did not appear");
        if let Ok(Some(s)) = m.child.try_wait() {
            panic!("stripefs mount exited: {s}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A file of several stripes and a partial last stripe.
    let src = tc.dir.path().join("src.bin");
    std::fs::write(&src, pattern(3 * 1024 * 1024 + 4321, 9)).unwrap();
    let inside = mnt.join("copy.bin");
    run(Command::new("cp").arg(&src).arg(&inside));
    run(Command::new("cmp").arg(&src).arg(&inside));
    let ls = run(Command::new("ls").arg("-l").arg(&mnt));
    let listing = String::from_utf8_lossy(&ls.stdout);
    assert!(
        listing.contains("copy.bin") && listing.contains(&(3 * 1024 * 1024 + 4321).to_string()),
        "{listing}"
    );
    // The library sees what the mount wrote.
    let c = tc.client();
    // statfs (df) reports the io servers' file systems added up, the files and directories.
    let vfs = nix::sys::statvfs::statvfs(&mnt).unwrap();
    let space = c.disk_space().unwrap();
    assert_eq!(vfs.blocks() * vfs.fragment_size(), space.total / 4096 * 4096);
    assert!(vfs.blocks() > 0 && vfs.blocks_available() <= vfs.blocks_free(), "{vfs:?}");
    assert_eq!(vfs.files(), 2, "the root and copy.bin");
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
    assert_eq!(year(&mnt.join("kept.bin")), 2002);
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
    // cat (relative and through a linked directory), removed with rm; hard links refused.
    run(Command::new("ln").arg("-s").arg("moved.bin").arg(mnt.join("d/link")));
    run(Command::new("ln").arg("-s").arg("d").arg(mnt.join("dl")));
    assert_eq!(std::fs::read_link(mnt.join("d/link")).unwrap(), Path::new("moved.bin"));
    assert!(std::fs::symlink_metadata(mnt.join("dl")).unwrap().file_type().is_symlink());
    assert_eq!(c.readlink("/d/link").unwrap(), "moved.bin");
    let cat = run(Command::new("cat").arg(mnt.join("dl/link")));
    assert_eq!(cat.stdout, &pattern(3 * 1024 * 1024 + 4321, 9)[..1000]);
    let ls = run(Command::new("ls").arg("-l").arg(mnt.join("d")));
    assert!(String::from_utf8_lossy(&ls.stdout).contains("link -> moved.bin"), "{ls:?}");
    let hard = Command::new("ln").arg(mnt.join("d/moved.bin")).arg(mnt.join("hard")).output().unwrap();
    assert!(!hard.status.success() && !mnt.join("hard").exists());
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
