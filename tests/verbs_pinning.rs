//! Registration with the software provider really pins memory (`mlock`), counted per page so
//! overlapping registrations do not unpin each other, and a real `RLIMIT_MEMLOCK` refusal
//! surfaces as `VerbsError::PinLimit`.
//!
//! One test per binary on purpose: it reads the process-wide `VmLck`, which concurrent tests
//! would disturb.

use std::process::Command;

use ionet::ib::soft::{SoftConfig, SoftProvider};
use ionet::ib::verbs::*;

mod common;
use common::vm_locked_kib;

#[test]
fn registration_pins_and_rlimit_refusals_are_typed() {
    let ctx = SoftProvider::new(SoftConfig::default()).open(None).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![1u8; 8 << 20];
    let base = vm_locked_kib();
    let (p, n) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: `buf` outlives both registrations (dropped explicitly below, before `buf`).
    let whole = unsafe { ctx.reg_mr(&pd, p, n, AccessFlags::LOCAL_WRITE) }.unwrap();
    let after = vm_locked_kib();
    assert!(after >= base + 8 * 1024, "8 MiB pinned: VmLck {base} -> {after} kB");
    // SAFETY: as above; the second half of the same buffer.
    let half = unsafe { ctx.reg_mr(&pd, p.wrapping_add(n / 2), n / 2, AccessFlags::LOCAL_WRITE) }.unwrap();
    drop(whole);
    let still = vm_locked_kib();
    assert!(still >= base + 4 * 1024, "the overlapping registration keeps its pages: {still} kB");
    assert!(still < after, "pages only the first registration covered were unpinned");
    drop(half);
    assert_eq!(vm_locked_kib(), base, "everything unpinned");
    drop(buf);

    // A process without CAP_IPC_LOCK under a small RLIMIT_MEMLOCK.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["pin_limit_child", "--exact", "--ignored", "--nocapture"])
        .env("IONET_PIN_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("@@ pinlimit"), "child said: {text}\n{}", String::from_utf8_lossy(&out.stderr));
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
        Ok(_) => println!("@@ registered"),
    }
}
