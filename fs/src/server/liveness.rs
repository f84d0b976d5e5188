//! What the meta server knows of its io servers' health, learnt from the requests it sends them.
//!
//! An io server whose last request from the meta server failed in the transport (refused, lost,
//! no reply before the deadline) is *down*; one that answered, even with an error, is *up*.
//! The meta server places new files on servers that are up while the stripe count leaves a
//! choice, leaves a removed file's objects on a down server to its janitor instead of waiting
//! for it, and pings each down server every janitor pass until it answers again (as Lustre's
//! MDS skips an unreachable OST for new objects). The knowledge only steers: a request that
//! cannot avoid a down server is still sent, so a server that came back is used at once.

/// Up or down, per io server (sans-IO: the caller sends the requests and reports them here).
#[derive(Debug)]
pub(crate) struct Liveness {
    /// Per server: whether it is down.
    down: Vec<bool>,
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
        Liveness { down: vec![false; n] }
    }

    /// Records how a request to `server` ended: `answered` (even with an error), or failed in
    /// the transport. Returns the change of state, if any (to log it once).
    pub(crate) fn record(&mut self, server: usize, answered: bool) -> Option<Change> {
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

    #[test]
    fn a_server_is_down_from_a_transport_failure_until_it_answers() {
        let mut l = Liveness::new(3);
        assert!(l.down().is_empty(), "all up until a request says otherwise");
        assert_eq!(l.record(1, true), None);
        assert_eq!(l.record(2, false), Some(Change::Down));
        assert_eq!(l.record(2, false), None, "said once");
        assert!(l.is_down(2) && !l.is_down(1));
        assert_eq!(l.down(), [2]);
        assert_eq!(l.record(2, true), Some(Change::Up));
        assert_eq!(l.record(2, true), None);
        assert!(l.down().is_empty());
        // A server index outside the cluster is ignored, not a panic.
        assert_eq!(l.record(7, false), None);
        assert!(!l.is_down(7));
    }
}
