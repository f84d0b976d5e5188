//! What the mount answers, and logs, when a server cannot be reached.
//!
//! The client library says `ENOTCONN` for a server it lost or could not reach. Through a FUSE
//! mount that code means something else: it is what the kernel answers for every call on a
//! mount whose own process died ("Transport endpoint is not connected"), and users, tools and
//! scripts that test for a dead mount take it so, and unmount. The mount answers `EHOSTDOWN`
//! ("Host is down") instead, as the kernel's SMB client does on a soft mount for a server it
//! lost, and says in its log which server and why: the caller sees only the code.

use crate::Errno;
use crate::FsError;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};
use tracing::warn;

/// How often one server's failures are logged while they go on.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The servers this mount's failures were logged for (one mount per process).
static LOGGED: LazyLock<Outages> = LazyLock::new(Outages::default);

/// The code the mount answers for `e` (see [`code`]), after logging a server that could not
/// be reached (see [`Outages::note`]).
pub(super) fn answer(e: &FsError) -> i32 {
    LOGGED.note(e);
    code(e)
}

/// Logs `e` if it says a server could not be reached (see [`Outages::note`]), for a call that
/// goes on without that server.
pub(super) fn note(e: &FsError) {
    LOGGED.note(e);
}

/// The code the mount answers for `e`: the library's, but `EHOSTDOWN` for a server that could
/// not be reached.
fn code(e: &FsError) -> i32 {
    match e.errno() {
        Errno::ENOTCONN => libc::EHOSTDOWN,
        c => c.0,
    }
}

/// The server `e` says could not be reached or did not answer, and why, if it says so.
fn outage(e: &FsError) -> Option<(&str, String)> {
    match e {
        FsError::Server { server, .. } | FsError::Silent { server, .. }
            if matches!(e.errno(), Errno::ENOTCONN | Errno::ETIMEDOUT) =>
        {
            let cause = e.to_string();
            let cause = cause.strip_prefix(server.as_str()).unwrap_or(&cause).trim_start_matches(": ");
            Some((server, cause.to_string()))
        }
        _ => None,
    }
}

/// The servers whose failures were logged lately, and when: one line per server a minute, not
/// one per call (`ls -l` of a directory makes a call per entry).
#[derive(Debug, Default)]
struct Outages {
    logged: Mutex<HashMap<String, Instant>>,
}

impl Outages {
    /// Logs `e` if it says a server could not be reached and that server's failures were not
    /// logged within the last minute; whether it did.
    fn note(&self, e: &FsError) -> bool {
        let Some((server, cause)) = outage(e) else { return false };
        let now = Instant::now();
        let mut logged = crate::lock(&self.logged);
        // As many entries as the cluster has servers.
        if logged.get(server).is_some_and(|&at| now.duration_since(at) < LOG_EVERY) {
            return false;
        }
        logged.insert(server.to_string(), now);
        drop(logged);
        warn!(
            %server,
            %cause,
            "a server cannot be reached: calls that need it fail (EHOSTDOWN, or ETIMEDOUT when it \
             does not answer) until it is back; logged once a minute while it lasts"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(server: &str) -> FsError {
        FsError::Server { server: server.into(), error: ionet::Error::Closed }
    }

    #[test]
    fn a_lost_server_is_host_down_and_other_codes_pass() {
        assert_eq!(code(&lost("meta server (tcp://127.0.0.1:1)")), libc::EHOSTDOWN);
        let silent =
            FsError::Silent { server: "io server 1 (tcp://127.0.0.1:2)".into(), silent: Duration::ZERO };
        assert_eq!(code(&silent), libc::ETIMEDOUT);
        assert_eq!(code(&FsError::code(Errno::ENOENT, "")), libc::ENOENT);
        let meta = lost("meta server (tcp://127.0.0.1:1)");
        let (server, cause) = outage(&meta).unwrap();
        assert_eq!((server, cause), ("meta server (tcp://127.0.0.1:1)", ionet::Error::Closed.to_string()));
        assert!(outage(&FsError::code(Errno::ENOENT, "")).is_none());
    }

    #[test]
    fn each_server_is_logged_once_a_minute() {
        let o = Outages::default();
        let mut lines = 0;
        for _ in 0..100 {
            lines += usize::from(o.note(&lost("meta server (tcp://127.0.0.1:1)")));
            lines += usize::from(o.note(&lost("io server 0 (tcp://127.0.0.1:2)")));
            lines += usize::from(o.note(&FsError::code(Errno::ENOENT, "")));
        }
        assert_eq!(lines, 2, "one line for each server");
    }
}
