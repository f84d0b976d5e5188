//! Registration with the software provider really pins memory, and a real `RLIMIT_MEMLOCK`
//! refusal surfaces as `VerbsError::PinLimit`. Both pinning methods are checked: long-term pins
//! through io_uring (as `ibv_reg_mr` pins; nested by the kernel, shown in `VmPin`, refused for a
//! disk file's writable shared mapping, which then falls back to `mlock`) and `mlock` (counted
//! per page so overlapping registrations do not unpin each other, shown in `VmLck`).
//!
//! One test per binary on purpose: it reads the process-wide `VmLck` and `VmPin`, which
//! concurrent tests would disturb.

use std::process::Command;

use ionet::internals::ib::soft::{PinMethod, SoftConfig, SoftProvider};
use ionet::internals::ib::verbs::*;

mod common;
use common::{vm_locked_kib, vm_pin_kib};

/// Registers 8 MiB and its second half, drops the first: the overlap stays pinned.
fn overlapping_registrations(method: PinMethod, held: fn() -> u64) {
    let ctx = SoftProvider::new(SoftConfig { pin: method, ..SoftConfig::default() }).open(None).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![1u8; 8 << 20];
    let base = held();
    let (p, n) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: `buf` outlives both registrations (dropped explicitly below, before `buf`).
    let whole = unsafe { ctx.reg_mr(&pd, p, n, AccessFlags::LOCAL_WRITE) }.unwrap();
    let after = held();
    assert!(after >= base + 8 * 1024, "{method:?}: 8 MiB pinned: {base} -> {after} kB");
    // SAFETY: as above; the second half of the same buffer.
    let half = unsafe { ctx.reg_mr(&pd, p.wrapping_add(n / 2), n / 2, AccessFlags::LOCAL_WRITE) }.unwrap();
    drop(whole);
    let still = held();
    assert!(still >= base + 4 * 1024, "{method:?}: the overlapping registration keeps its pages: {still} kB");
    assert!(still < after, "{method:?}: pages only the first registration covered were unpinned");
    drop(half);
    assert_eq!(held(), base, "{method:?}: everything unpinned");
    drop(buf);
}

#[test]
fn registration_pins_and_rlimit_refusals_are_typed() {
    overlapping_registrations(PinMethod::Mlock, vm_locked_kib);
    if PinMethod::Auto.resolved() == PinMethod::IoUring {
        let locked = vm_locked_kib();
        overlapping_registrations(PinMethod::IoUring, vm_pin_kib);
        assert_eq!(vm_locked_kib(), locked, "io_uring pins lock nothing");
        disk_file_mappings_fall_back_to_mlock();
    } else {
        println!("io_uring pinning unavailable here: only the mlock method was checked");
    }

    // A process without CAP_IPC_LOCK under a small RLIMIT_MEMLOCK, with each method.
    for method in ["mlock", "io_uring"] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["pin_limit_child", "--exact", "--ignored", "--nocapture"])
            .env("IONET_PIN_CHILD", "1")
            .env("IONET_SOFTIB_PIN", method)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("@@ pinlimit"),
            "{method}: child said: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The kernel will not pin a disk file's writable shared pages long-term (they need dirty
/// tracking), as it refuses an HCA; the provider then `mlock`s them.
fn disk_file_mappings_fall_back_to_mlock() {
    let dir = std::env::temp_dir();
    let is_tmpfs = Command::new("stat").args(["-f", "-c", "%T"]).arg(&dir).output();
    if is_tmpfs.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("tmpfs")) {
        println!("{} is tmpfs: the disk-file fallback was not checked", dir.display());
        return;
    }
    let path = dir.join(format!("ionet-pin-{}", std::process::id()));
    let f = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let len = 1usize << 20;
    f.set_len(len as u64).unwrap();
    // SAFETY: a fresh shared mapping of our own file; unmapped below after the MR is gone.
    let p = unsafe {
        use std::os::fd::AsRawFd;
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is live and writable; this touches every page.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 5, len) };
    let ctx = SoftProvider::new(SoftConfig { pin: PinMethod::IoUring, ..SoftConfig::default() })
        .open(None)
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (locked, pinned) = (vm_locked_kib(), vm_pin_kib());
    // SAFETY: the mapping outlives the registration (dropped before munmap).
    let mr = unsafe { ctx.reg_mr(&pd, p.cast(), len, AccessFlags::LOCAL_WRITE) }.unwrap();
    assert_eq!(vm_pin_kib(), pinned, "no long-term pin of a disk file's shared pages");
    assert!(vm_locked_kib() >= locked + 1024, "mlocked instead");
    drop(mr);
    assert_eq!(vm_locked_kib(), locked);
    // SAFETY: the mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(p, len) };
}

/// Drops root (if we are root) and lowers `RLIMIT_MEMLOCK`, then registers more than it allows.
#[test]
#[ignore = "helper: run by registration_pins_and_rlimit_refusals_are_typed in a child process"]
fn pin_limit_child() {
    if std::env::var_os("IONET_PIN_CHILD").is_none() {
        return;
    }
    let lim = libc::rlimit { rlim_cur: 256 << 10, rlim_max: 256 << 10 };
    // SAFETY: plain system calls on our own process with valid arguments; the child exits
    // right after this test.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim), 0);
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
    }
    let ctx = SoftProvider::new(SoftConfig::default()).open(None).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![1u8; 1 << 20];
    // SAFETY: `buf` outlives the registration attempt.
    let r = unsafe { ctx.reg_mr(&pd, buf.as_mut_ptr(), buf.len(), AccessFlags::LOCAL_WRITE) };
    match r {
        Err(VerbsError::PinLimit { reason, .. }) => println!("@@ pinlimit {reason}"),
        Err(e) => println!("@@ other {e}"),
        Ok(_) => println!("@@ registered ({:?})", PinMethod::from_env().resolved()),
    }
}
