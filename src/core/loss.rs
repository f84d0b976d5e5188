//! Why a peer is lost, and the one error every operation on it then fails with.

use std::net::SocketAddr;

use crate::error::{Error, ProtocolError};
use crate::info::Counters;
use crate::types::PeerId;

/// Why a peer is being failed.
#[derive(Debug)]
pub(crate) enum Loss {
    /// Its connection broke, closed or timed out.
    Lost(String),
    /// It failed authentication.
    Auth(String),
    /// It broke the protocol.
    Protocol(ProtocolError),
    /// This endpoint shut down: not the peer's doing, so not counted as a loss.
    Closed,
}

impl Loss {
    /// The error the peer's operations fail with, naming its address (`addr`) unless the
    /// reason does already, and the reason as logged and kept for a peer that cannot be
    /// dialled again. Counts the loss by its cause.
    pub(crate) fn into_error(
        self,
        peer: PeerId,
        addr: Option<SocketAddr>,
        counters: &Counters,
    ) -> (Error, String) {
        if !matches!(self, Loss::Closed) {
            Counters::add(&counters.peers_lost, 1);
        }
        match self {
            Loss::Closed => (Error::Closed, "the endpoint shut down".into()),
            Loss::Lost(r) => {
                let r = addressed(addr, r);
                (Error::PeerLost { peer, reason: r.clone() }, r)
            }
            Loss::Auth(r) => {
                Counters::add(&counters.auth_failures, 1);
                let r = addressed(addr, r);
                (Error::Auth(r.clone()), format!("authentication failed: {r}"))
            }
            Loss::Protocol(p) => {
                Counters::add(&counters.protocol_errors, 1);
                let r = p.to_string();
                (Error::Protocol { peer: Some(peer), reason: p }, r)
            }
        }
    }
}

/// A lost peer's reason as the application sees it: the peer's address first, unless the
/// reason names it already.
pub(crate) fn addressed(addr: Option<SocketAddr>, reason: String) -> String {
    match addr.map(|a| a.to_string()) {
        Some(a) if !reason.contains(&a) => format!("{a}: {reason}"),
        _ => reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_names_the_peer_once() {
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert_eq!(addressed(Some(a), "closed".into()), "10.0.0.1:7000: closed");
        assert_eq!(
            addressed(Some(a), "connect to 10.0.0.1:7000: refused".into()),
            "connect to 10.0.0.1:7000: refused"
        );
        assert_eq!(addressed(None, "closed".into()), "closed");
    }
}
