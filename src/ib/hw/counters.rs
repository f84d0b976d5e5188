//! The hardware provider's counters: what this process counts itself around each verbs call,
//! and what the device counts per port, read from the kernel.
//!
//! A counter is either measured or absent. Verbs gives a process no per-context count of RNR
//! retries and the HCA's time is not host time, so [`VerbsCounters::rnr_retries`] and
//! [`VerbsCounters::device_ns`] are `None` here; the port's retry and error counts come from
//! the kernel's sysfs files of the device (`hw_counters/` — driver counters such as mlx5's —
//! and `counters/`, the IB port counters), each `None` when the driver does not provide it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

use super::CtxInner;
use crate::ib::verbs::{PortCounters, VerbsCounters};

/// The context's own counts.
pub(super) fn snapshot(c: &CtxInner) -> VerbsCounters {
    VerbsCounters {
        registrations: c.registrations.load(Relaxed),
        deregistrations: c.deregistrations.load(Relaxed),
        registered_bytes: c.registered_bytes.load(Relaxed),
        pinned_bytes: c.pinned_bytes.load(Relaxed),
        reg_ns: c.reg_ns.load(Relaxed),
        dereg_ns: c.dereg_ns.load(Relaxed),
        device_ns: None,
        send_wrs_posted: c.send_wrs.load(Relaxed),
        recv_wrs_posted: c.recv_wrs.load(Relaxed),
        completions: c.completions.load(Relaxed),
        rdma_write_bytes: c.write_bytes.load(Relaxed),
        rdma_read_bytes: c.read_bytes.load(Relaxed),
        send_bytes: c.send_bytes.load(Relaxed),
        rnr_retries: None,
    }
}

/// The sysfs directory of a port: `<ibdev_path>/ports/<port>`.
pub(super) fn port_dir(ibdev_path: &Path, port: u8) -> PathBuf {
    ibdev_path.join("ports").join(port.to_string())
}

/// Reads a port's counters from its sysfs directory. A file that is missing or does not hold
/// a number gives `None`.
pub(super) fn read_port(dir: &Path) -> PortCounters {
    let read = |sub: &str, name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(sub).join(name)).ok()?.trim().parse().ok()
    };
    PortCounters {
        rnr_nak_retries: read("hw_counters", "rnr_nak_retry_err"),
        ack_timeouts: read("hw_counters", "local_ack_timeout_err"),
        out_of_sequence: read("hw_counters", "out_of_sequence"),
        rcv_errors: read("counters", "port_rcv_errors"),
        xmit_discards: read("counters", "port_xmit_discards"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// Every counter of the context follows what was counted — none is a constant — and the
    /// ones hardware cannot measure say so.
    #[test]
    fn no_counter_is_a_constant() {
        let c = CtxInner::empty();
        let atomics: [&AtomicU64; 12] = [
            &c.registrations,
            &c.deregistrations,
            &c.registered_bytes,
            &c.pinned_bytes,
            &c.reg_ns,
            &c.dereg_ns,
            &c.send_wrs,
            &c.recv_wrs,
            &c.completions,
            &c.write_bytes,
            &c.read_bytes,
            &c.send_bytes,
        ];
        let read = |c: &CtxInner| {
            // Naming every field (no `..`): a counter added later must be classified here.
            let VerbsCounters {
                registrations,
                deregistrations,
                registered_bytes,
                pinned_bytes,
                reg_ns,
                dereg_ns,
                device_ns,
                send_wrs_posted,
                recv_wrs_posted,
                completions,
                rdma_write_bytes,
                rdma_read_bytes,
                send_bytes,
                rnr_retries,
            } = snapshot(c);
            let measured = [
                registrations,
                deregistrations,
                registered_bytes,
                pinned_bytes,
                reg_ns,
                dereg_ns,
                send_wrs_posted,
                recv_wrs_posted,
                completions,
                rdma_write_bytes,
                rdma_read_bytes,
                send_bytes,
            ];
            (measured, [device_ns, rnr_retries])
        };
        for round in 1..=3u64 {
            for (i, a) in atomics.iter().enumerate() {
                a.store(round * 100 + i as u64, Relaxed);
            }
            let (measured, unmeasured) = read(&c);
            for (i, v) in measured.iter().enumerate() {
                assert_eq!(*v, round * 100 + i as u64, "counter {i} does not report what was counted");
            }
            assert_eq!(unmeasured, [None, None], "a figure hardware cannot measure is None, not 0");
        }
    }

    #[test]
    fn port_counters_come_from_sysfs_or_are_none() {
        let dir = std::env::temp_dir().join(format!("ionet-hwctr-{}", std::process::id()));
        let port = port_dir(&dir, 1);
        std::fs::create_dir_all(port.join("hw_counters")).unwrap();
        std::fs::create_dir_all(port.join("counters")).unwrap();
        assert_eq!(read_port(&port), PortCounters::default(), "nothing exposed: all None");
        std::fs::write(port.join("hw_counters/rnr_nak_retry_err"), "17\n").unwrap();
        std::fs::write(port.join("hw_counters/local_ack_timeout_err"), "3\n").unwrap();
        std::fs::write(port.join("hw_counters/out_of_sequence"), "garbage\n").unwrap();
        std::fs::write(port.join("counters/port_rcv_errors"), "0\n").unwrap();
        let p = read_port(&port);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(p.rnr_nak_retries, Some(17));
        assert_eq!(p.ack_timeouts, Some(3));
        assert_eq!(p.out_of_sequence, None, "not a number");
        assert_eq!(p.rcv_errors, Some(0), "a real zero is reported");
        assert_eq!(p.xmit_discards, None, "missing");
    }
}
