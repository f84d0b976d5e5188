//! Admission of accepted connections until their handshake completes (sans-IO).
//!
//! A listener must not let idle or slow sockets lock out real clients. Every accepted connection
//! is tracked here until it completes its handshake or closes, and three rules bound what
//! unauthenticated sockets can hold:
//!
//! * **One deadline.** A connection still in its handshake `handshake_timeout` after it was
//!   accepted is dropped.
//! * **A cap per source address.** When `per_source` connections from one IP address are in
//!   their handshake, a new one from there sheds that address's oldest connection that has not
//!   sent a byte, so one host's silent sockets cannot take every slot. An address whose
//!   connections all talk is a busy client host, not a flood: it is held to the total only.
//! * **Shedding, not refusing.** At the total, the new connection is admitted and an older one
//!   is shed: first the connections that have not sent a byte, oldest first, then the others,
//!   oldest first. A client sends its hello as soon as its connection is up, so under a flood of
//!   silent sockets the ones shed are the flood's, and a refusal never reaches a client that is
//!   talking while silent ones remain.
//!
//! Time is passed in; the driver owns the sockets and closes what it is told to. The listening
//! socket they arrive on is set up with `TCP_DEFER_ACCEPT` so that silent connections reach
//! admission last (see `sockets::listener_socket`).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::config::Config;

/// Connections accepted per progress round. Under a flood of connections the listener never
/// runs dry; the bound lets every round serve the connections already accepted.
pub(crate) const ACCEPTS_PER_ROUND: usize = 32;

/// Where a connection we dialled is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialled {
    /// Waiting for the kernel's connect.
    Connecting,
    /// Connected, in our handshake.
    Handshaking,
}

/// Why a dialled connection at `stage` since `since` has run out of time, if it has: the
/// kernel's connect has `connect_timeout`, the handshake after it `handshake_timeout`.
fn dialled_overdue(stage: Dialled, since: Instant, now: Instant, cfg: &Config) -> Option<&'static str> {
    match stage {
        Dialled::Connecting if now.duration_since(since) > cfg.connect_timeout => Some("connect timed out"),
        Dialled::Handshaking if now.duration_since(since) > cfg.handshake_timeout => {
            Some("the server did not complete the handshake in time")
        }
        _ => None,
    }
}

/// The connections this end dialled that have run out of time, with why: `dials` gives each
/// connection's key, its stage (`None` once it is no longer dialling) and when it began.
pub(crate) fn overdue_dials<K>(
    dials: impl IntoIterator<Item = (K, Option<Dialled>, Option<Instant>)>,
    now: Instant,
    cfg: &Config,
) -> Vec<(K, &'static str)> {
    dials
        .into_iter()
        .filter_map(|(key, stage, since)| dialled_overdue(stage?, since?, now, cfg).map(|why| (key, why)))
        .collect()
}

/// How far a connection got: shedding takes the least advanced first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Nothing received yet.
    Silent,
    /// Bytes received, handshake not complete.
    Talking,
}

#[derive(Debug)]
struct Pending {
    source: IpAddr,
    since: Instant,
    stage: Stage,
}

/// The limits admission enforces.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Time from accept to a completed handshake.
    pub deadline: Duration,
    /// Connections in their handshake, in all.
    pub total: usize,
    /// Connections in their handshake from one IP address.
    pub per_source: usize,
}

/// Connections accepted and not yet through their handshake, keyed by the driver's handle.
#[derive(Debug)]
pub(crate) struct Admission<K> {
    limits: Limits,
    pending: HashMap<K, Pending>,
    per_source: HashMap<IpAddr, usize>,
}

impl<K: Copy + Eq + Hash + Ord> Admission<K> {
    pub(crate) fn new(limits: Limits) -> Self {
        let limits = Limits { total: limits.total.max(1), per_source: limits.per_source.max(1), ..limits };
        Admission { limits, pending: HashMap::new(), per_source: HashMap::new() }
    }

    /// Connections in their handshake.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// A connection from `source` was accepted. Returns the connections to shed to make room
    /// for it (at most two: one for the per-source cap, one for the total); the driver closes
    /// them and must not report them back through [`Admission::finished`].
    pub(crate) fn admit(&mut self, now: Instant, key: K, source: IpAddr) -> Vec<K> {
        let mut shed = Vec::new();
        if self.per_source.get(&source).copied().unwrap_or(0) >= self.limits.per_source
            && let Some(v) = self.victim(|p| p.source == source && p.stage == Stage::Silent)
        {
            self.remove(v);
            shed.push(v);
        }
        if self.pending.len() >= self.limits.total
            && let Some(v) = self.victim(|_| true)
        {
            self.remove(v);
            shed.push(v);
        }
        self.pending.insert(key, Pending { source, since: now, stage: Stage::Silent });
        *self.per_source.entry(source).or_insert(0) += 1;
        shed
    }

    /// The connection received its first bytes.
    pub(crate) fn heard(&mut self, key: K) {
        if let Some(p) = self.pending.get_mut(&key) {
            p.stage = Stage::Talking;
        }
    }

    /// The connection completed its handshake or closed: it no longer holds a slot.
    pub(crate) fn finished(&mut self, key: K) {
        self.remove(key);
    }

    /// Connections whose deadline has passed, removed from the table; the driver closes them.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<K> {
        let deadline = self.limits.deadline;
        let mut late: Vec<K> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.since) >= deadline)
            .map(|(k, _)| *k)
            .collect();
        late.sort_unstable();
        for &k in &late {
            self.remove(k);
        }
        late
    }

    /// The least advanced, then oldest, connection among those `which` selects.
    fn victim(&self, which: impl Fn(&Pending) -> bool) -> Option<K> {
        self.pending
            .iter()
            .filter(|(_, p)| which(p))
            .min_by_key(|(k, p)| (p.stage, p.since, **k))
            .map(|(k, _)| *k)
    }

    fn remove(&mut self, key: K) {
        let Some(p) = self.pending.remove(&key) else { return };
        if let Some(n) = self.per_source.get_mut(&p.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&p.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    fn adm(total: usize, per_source: usize) -> Admission<u32> {
        Admission::new(Limits { deadline: Duration::from_secs(5), total, per_source })
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn the_per_source_cap_sheds_that_sources_oldest_silent_connection() {
        let t0 = Instant::now();
        let mut a = adm(100, 3);
        assert!(a.admit(at(t0, 0), 1, A).is_empty());
        assert!(a.admit(at(t0, 1), 2, A).is_empty());
        assert!(a.admit(at(t0, 2), 3, B).is_empty());
        assert!(a.admit(at(t0, 3), 4, A).is_empty());
        a.heard(1);
        // A is at its cap: its oldest silent connection goes, not the older talking one, and
        // nothing of B's.
        assert_eq!(a.admit(at(t0, 4), 5, A), vec![2]);
        assert_eq!(a.admit(at(t0, 5), 6, A), vec![4]);
        assert_eq!(a.admit(at(t0, 6), 7, A), vec![5]);
        a.heard(6);
        a.heard(7);
        // Only talking connections left: a busy client host, held to the total only.
        assert!(a.admit(at(t0, 7), 8, A).is_empty());
        assert_eq!(a.len(), 5);
    }

    #[test]
    fn the_total_cap_sheds_the_oldest_silent_connection_of_any_source() {
        let t0 = Instant::now();
        let mut a = adm(3, 3);
        a.admit(at(t0, 0), 1, A);
        a.admit(at(t0, 1), 2, B);
        a.admit(at(t0, 2), 3, B);
        a.heard(1);
        assert_eq!(a.admit(at(t0, 3), 4, A), vec![2]);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn a_new_connection_is_never_refused_and_counts_stay_exact() {
        let t0 = Instant::now();
        let mut a = adm(3, 1);
        for k in 0..1000u32 {
            let shed = a.admit(at(t0, u64::from(k)), k, if k % 2 == 0 { A } else { B });
            assert!(!shed.contains(&k));
            assert!(a.len() <= 3);
            if k % 3 == 0 {
                a.heard(k);
            }
        }
        for k in 990..1000 {
            a.finished(k);
        }
        assert_eq!(a.len(), 0);
        assert!(a.per_source.is_empty(), "per-source counts leak: {:?}", a.per_source);
    }

    #[test]
    fn connections_past_the_deadline_expire_and_free_their_slots() {
        let t0 = Instant::now();
        let mut a = adm(10, 10);
        a.admit(t0, 1, A);
        a.admit(at(t0, 4000), 2, A);
        assert!(a.expired(at(t0, 4999)).is_empty());
        assert_eq!(a.expired(at(t0, 5000)), vec![1]);
        assert_eq!(a.expired(at(t0, 9000)), vec![2]);
        assert_eq!(a.len(), 0);
        assert!(a.per_source.is_empty());
        // Finished connections are forgotten: neither shed nor expired later.
        a.admit(t0, 3, A);
        a.finished(3);
        assert!(a.expired(at(t0, 60_000)).is_empty());
    }
}
