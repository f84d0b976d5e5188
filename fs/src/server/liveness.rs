//! What the meta server knows of its io servers' health, learnt from the requests it sends them.
//!
//! An io server is *down* when the request last sent to it by the meta server (of those that
//! have ended) failed in the transport (refused, lost, no reply before the deadline), *up* when
//! that request was answered, even with an error. Requests run at once, so their outcomes come
//! back out of order; one sent before the last counted is stale and changes nothing.
//! The meta server places new files on servers that are up while the stripe count leaves a
//! choice, leaves a removed file's objects on a down server to its janitor instead of waiting
//! for it, and pings each down server every janitor pass until it answers again (as Lustre's
//! MDS skips an unreachable OST for new objects). The knowledge only steers: a request that
//! cannot avoid a down server is still sent, so a server that came back is used at once.

use std::time::Instant;

/// Up or down, per io server (sans-IO: the caller sends the requests and reports them here).
#[derive(Debug)]
pub(crate) struct Liveness {
    /// Per server: whether it is down.
    down: Vec<bool>,
    /// Per server: when the request whose outcome set `down` was sent.
    as_of: Vec<Option<Instant>>,
}

/// A server's state changed with the outcome just recorded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// It was up (or unknown) and failed in the transport.
    Down,
    /// It was down and answered.
    Up,
}

impl Liveness {
    /// `n` servers, all taken to be up until a request says otherwise.
    pub(crate) fn new(n: usize) -> Self {
        Liveness { down: vec![false; n], as_of: vec![None; n] }
    }

    /// Records how a request to `server` sent at `sent` ended: `answered` (even with an error),
    /// or failed in the transport. Returns the change of state, if any (to log it once).
    pub(crate) fn record(&mut self, server: usize, answered: bool, sent: Instant) -> Option<Change> {
        let as_of = self.as_of.get_mut(server)?;
        if as_of.is_some_and(|t| sent < t) {
            return None;
        }
        *as_of = Some(sent);
        let down = self.down.get_mut(server)?;
        let change = match (*down, answered) {
            (false, false) => Some(Change::Down),
            (true, true) => Some(Change::Up),
            _ => None,
        };
        *down = !answered;
        change
    }

    /// Whether `server` is down.
    pub(crate) fn is_down(&self, server: usize) -> bool {
        self.down.get(server).copied().unwrap_or(false)
    }

    /// The servers that are down, in order.
    pub(crate) fn down(&self) -> Vec<u32> {
        (0..self.down.len()).filter(|&s| self.is_down(s)).map(|s| s as u32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_outcome_older_than_the_one_known_changes_nothing() {
        // Requests to one server run at once (several workers, the thread making objects
        // ahead) and their outcomes come back in any order.
        let t0 = Instant::now();
        let [t1, t2] = [1, 2].map(|ms| t0 + Duration::from_millis(ms));
        let mut l = Liveness::new(2);
        assert_eq!(l.record(0, false, t1), Some(Change::Down));
        // The answer to a request sent before the failure: still down.
        assert_eq!(l.record(0, true, t0), None);
        assert!(l.is_down(0));
        // The failure of a request sent before an answer: still up.
        assert_eq!(l.record(0, true, t2), Some(Change::Up));
        assert_eq!(l.record(0, false, t1), None);
        assert!(!l.is_down(0));
        // Outcomes of requests sent at the same time as the last apply.
        assert_eq!(l.record(0, false, t2), Some(Change::Down));
    }

    #[test]
    fn a_server_is_down_from_a_transport_failure_until_it_answers() {
        let mut l = Liveness::new(3);
        let now = Instant::now();
        assert!(l.down().is_empty(), "all up until a request says otherwise");
        assert_eq!(l.record(1, true, now), None);
        assert_eq!(l.record(2, false, now), Some(Change::Down));
        assert_eq!(l.record(2, false, now), None, "said once");
        assert!(l.is_down(2) && !l.is_down(1));
        assert_eq!(l.down(), [2]);
        assert_eq!(l.record(2, true, now), Some(Change::Up));
        assert_eq!(l.record(2, true, now), None);
        assert!(l.down().is_empty());
        // A server index outside the cluster is ignored, not a panic.
        assert_eq!(l.record(7, false, now), None);
        assert!(!l.is_down(7));
    }
}
