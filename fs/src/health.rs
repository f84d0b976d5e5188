//! Which servers are answering, as one process sees those it sends requests to (a client its
//! servers, the meta server its io servers), so a server that stopped answering costs a caller
//! one deadline, not one per request.
//!
//! A server that is gone (its process dead, its port closed) fails a request at once. One that
//! hangs, or whose host is cut off, answers nothing, and every request to it waits out its whole
//! deadline: a directory listing that needs the size of ten files on it waited ten deadlines.
//! After a request to a server ends that way the server is *silent*: requests to it fail at once
//! (naming it and how long it has been silent) until a hold-off passes; then one caller checks
//! it before the others (a client with a short ping, the meta server with its own small
//! request), while the others still fail at once. An answer makes it answering again; no
//! answer doubles the hold-off, up to [`MAX_HOLD`]. Any answer to any request (even an error
//! reply) counts: the server is alive.
//!
//! Sans-IO: the caller asks [`Health::admit`] before it sends, and reports how each request
//! ended with [`Health::finish`].

use crate::net::FsError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// First hold-off after a server falls silent.
pub(crate) const MIN_HOLD: Duration = Duration::from_secs(1);

/// Longest hold-off: a server that comes back is used again within this (and one ping).
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(10);

/// A transport failure that took at least this long after the request was sent was a wait
/// for a server that did not answer; a quicker one (refused, reset) needs no hold-off.
pub(crate) const SLOW_FAILURE: Duration = Duration::from_secs(1);

/// How a request sent at `sent` ended, from how it failed (`None`: it did not): any reply is
/// an answer; a deadline, or a transport failure only after a long wait, is no answer.
fn ended(err: Option<&FsError>, sent: Instant) -> Ended {
    match err {
        None | Some(FsError::Remote { .. } | FsError::Proto(_) | FsError::UnexpectedReply(_)) => {
            Ended::Answered
        }
        Some(FsError::Net(ionet::Error::Timeout) | FsError::Server { error: ionet::Error::Timeout, .. }) => {
            Ended::Unanswered
        }
        Some(FsError::Net(_) | FsError::Server { .. }) if sent.elapsed() >= SLOW_FAILURE => Ended::Unanswered,
        Some(_) => Ended::Failed,
    }
}

/// How a request to the server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The server answered (with a result or an error of its own).
    Answered,
    /// No answer before the deadline, or a transport failure only after a long wait.
    Unanswered,
    /// Failed at once in the transport (refused, reset): nothing to hold off.
    Failed,
}

/// What the caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Send as usual.
    Send,
    /// The server has been silent and its hold-off is over: this caller checks it (and
    /// reports that as a probe: [`Sent::probe`]).
    Probe,
    /// Fail at once: silent for `silent` so far.
    Refuse {
        /// Time since the request that went unanswered was sent.
        silent: Duration,
    },
}

/// A request that went to the server: when, and whether it is the check an [`Admit::Probe`]
/// asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    pub(crate) at: Instant,
    pub(crate) probe: bool,
}

#[derive(Debug)]
enum State {
    Answering,
    Silent {
        /// When the unanswered request was sent.
        since: Instant,
        /// When a caller may check it again.
        retry_at: Instant,
        hold: Duration,
        /// A caller is checking it now.
        probing: bool,
    },
}

/// One server's health, shared by every thread of a client.
#[derive(Debug)]
pub(crate) struct Health {
    state: Mutex<State>,
}

impl Default for Health {
    fn default() -> Self {
        Health { state: Mutex::new(State::Answering) }
    }
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every transition is one assignment: a poisoned lock still holds a valid state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a request may go to the server now.
    pub(crate) fn admit(&self, now: Instant) -> Admit {
        let mut s = self.state();
        match &mut *s {
            State::Answering => Admit::Send,
            State::Silent { retry_at, probing, .. } if !*probing && now >= *retry_at => {
                *probing = true;
                Admit::Probe
            }
            State::Silent { since, .. } => Admit::Refuse { silent: now.saturating_duration_since(*since) },
        }
    }

    /// Records how the request `sent` ended (`err`: how it failed, if it did), as the check of
    /// a silent server or as an ordinary request; returns how it counted.
    pub(crate) fn finish(&self, sent: Sent, err: Option<&FsError>) -> Ended {
        let ended = ended(err, sent.at);
        let now = Instant::now();
        if sent.probe {
            self.probed(ended, now);
        } else {
            self.record(ended, sent.at, now);
        }
        ended
    }

    /// Records how a request sent at `sent` ended at `now`.
    pub(crate) fn record(&self, ended: Ended, sent: Instant, now: Instant) {
        let mut s = self.state();
        match (ended, &*s) {
            (Ended::Answered, _) => *s = State::Answering,
            (Ended::Unanswered, State::Answering) => {
                *s = State::Silent { since: sent, retry_at: now + MIN_HOLD, hold: MIN_HOLD, probing: false };
            }
            // Sent before the server fell silent and only now timed out: nothing new.
            (Ended::Unanswered, State::Silent { .. }) | (Ended::Failed, _) => {}
        }
    }

    /// Records how the ping of an [`Admit::Probe`] ended at `now`.
    pub(crate) fn probed(&self, ended: Ended, now: Instant) {
        let mut s = self.state();
        match (ended, &mut *s) {
            (Ended::Unanswered, State::Silent { retry_at, hold, probing, .. }) => {
                *hold = (*hold * 2).min(MAX_HOLD);
                *retry_at = now + *hold;
                *probing = false;
            }
            // Answered; or refused or reset at once, so the server's process is gone, not hung,
            // and callers find that out as quickly by sending.
            _ => *s = State::Answering,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silent(a: Admit) -> bool {
        matches!(a, Admit::Refuse { .. })
    }

    #[test]
    fn an_unanswered_request_holds_the_server_off_until_one_probe_answers() {
        let h = Health::default();
        let t0 = Instant::now();
        assert_eq!(h.admit(t0), Admit::Send);
        let timeout = Duration::from_secs(30);
        h.record(Ended::Unanswered, t0, t0 + timeout);
        let t = t0 + timeout;
        // Everyone else fails at once, told how long it has been silent.
        assert_eq!(h.admit(t), Admit::Refuse { silent: timeout });
        assert!(silent(h.admit(t + MIN_HOLD / 2)));
        // After the hold-off one caller probes; the others still fail at once meanwhile.
        assert_eq!(h.admit(t + MIN_HOLD), Admit::Probe);
        assert!(silent(h.admit(t + MIN_HOLD)));
        h.probed(Ended::Answered, t + MIN_HOLD);
        assert_eq!(h.admit(t + MIN_HOLD), Admit::Send, "answering again");
    }

    #[test]
    fn unanswered_probes_double_the_hold_off_up_to_its_cap() {
        let h = Health::default();
        let mut t = Instant::now();
        h.record(Ended::Unanswered, t, t);
        let mut holds = Vec::new();
        let mut hold = MIN_HOLD;
        for _ in 0..8 {
            // Not before the hold-off…
            assert!(silent(h.admit(t + hold - Duration::from_millis(1))));
            t += hold;
            assert_eq!(h.admit(t), Admit::Probe);
            h.probed(Ended::Unanswered, t);
            holds.push(hold);
            hold = (hold * 2).min(MAX_HOLD);
        }
        assert_eq!(holds.iter().max(), Some(&MAX_HOLD));
        assert_eq!(holds[..4], [1, 2, 4, 8].map(Duration::from_secs));
    }

    #[test]
    fn any_answer_even_a_late_one_makes_it_answering() {
        let h = Health::default();
        let t = Instant::now();
        h.record(Ended::Unanswered, t, t);
        // A request sent earlier that the server answered late: it is alive after all.
        h.record(Ended::Answered, t, t);
        assert_eq!(h.admit(t), Admit::Send);
    }

    #[test]
    fn quick_failures_never_hold_off_and_a_refused_probe_ends_the_hold() {
        let h = Health::default();
        let t = Instant::now();
        h.record(Ended::Failed, t, t);
        assert_eq!(h.admit(t), Admit::Send, "a refused connection fails fast by itself");
        h.record(Ended::Unanswered, t, t);
        // A request from before the silence timing out late moves nothing.
        h.record(Ended::Unanswered, t, t + MIN_HOLD / 2);
        assert_eq!(h.admit(t + MIN_HOLD / 2), Admit::Refuse { silent: MIN_HOLD / 2 });
        assert_eq!(h.admit(t + MIN_HOLD), Admit::Probe);
        // The probe is refused at once: the server's process is gone, not hung.
        h.probed(Ended::Failed, t + MIN_HOLD);
        assert_eq!(h.admit(t + MIN_HOLD), Admit::Send);
    }
}
