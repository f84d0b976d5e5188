//! The queue-pair exchange on a side channel, decided without sockets or verbs: which phase a
//! side channel is in, and what a frame arriving in that phase asks of the engine.
//!
//! After the authenticated handshake ([`Hs`]) the client sends `IB_INFO` with its queue
//! pair's details; the server sets up its own queue pair from them and answers with its
//! `IB_INFO`; the client brings its queue pair up from that and confirms with `IB_READY`. A
//! frame of the wrong kind, info that does not decode, or a frame in a phase that expects
//! none ends the channel with a named cause, so the peer's failure says what went wrong. The
//! engine carries each step out and moves the channel to the phase the step names once it
//! has.

use crate::admission::Dialled;
use crate::core::loss::Loss;
use crate::error::ProtocolError;
use crate::handshake::{HelloInfo, Hs};
use crate::types::ServiceLevel;
use crate::wire::{Header, Kind};

use super::side::{IB_INFO_LEN, IbInfo};

/// Where a side channel is.
pub(crate) enum SidePhase {
    /// We dialled; the kernel's connect has not finished.
    Connecting,
    /// In the handshake both transports share.
    Handshake(Hs),
    /// Client: our `IB_INFO` went; the server's comes next.
    ClientWaitInfo,
    /// Server: `client` passed the handshake; its `IB_INFO` comes next.
    ServerWaitInfo { client: HelloInfo },
    /// Server: our `IB_INFO` went; the client's `IB_READY` comes next.
    ServerWaitReady,
    /// The queue pair is up; the channel only tells when the peer goes.
    Established,
    /// A refusal (or the failure of a step) is being written; the channel then closes.
    Closing,
}

impl SidePhase {
    /// How far a connection this end dialled has got, while it is still dialling.
    pub(crate) fn dialled(&self) -> Option<Dialled> {
        match self {
            SidePhase::Connecting => Some(Dialled::Connecting),
            SidePhase::ClientWaitInfo => Some(Dialled::Handshaking),
            SidePhase::Handshake(hs) if hs.is_client() => Some(Dialled::Handshaking),
            _ => None,
        }
    }
}

/// What a side-channel frame asks of the engine.
#[derive(Debug)]
pub(crate) enum Step {
    /// The channel is in its handshake: the [`Hs`] machine, given back here, takes the frame
    /// (it needs the peer table and the counters, which this decision does without).
    Handshake(Hs),
    /// Server: `client` sent its queue pair's details. A stale connection of the same class
    /// for the same endpoint goes first; then a queue pair is created and brought up with
    /// `remote_info`, our [`info_frame`] answers, and the channel waits in
    /// [`SidePhase::ServerWaitReady`].
    CreateAndBringUp { client: HelloInfo, remote_info: IbInfo },
    /// Client: the server answered with its details. Our queue pair comes up with
    /// `remote_info`; then the channel is [`SidePhase::Established`], [`ready_frame`] tells the
    /// server, and what was posted meanwhile can be placed.
    BringUp { remote_info: IbInfo },
    /// Server: the client's queue pair is ready: so is the connection
    /// ([`SidePhase::Established`]).
    Established,
    /// The channel goes, for this reason.
    Fail(Loss),
}

fn refused(what: impl Into<String>) -> Step {
    Step::Fail(Loss::Protocol(ProtocolError::Handshake(what.into())))
}

/// The peer's `IB_INFO` body, or the refusal it earns.
fn info(kind: Kind, body: &[u8]) -> Result<IbInfo, Step> {
    if kind != Kind::IbInfo {
        return Err(refused("expected IB_INFO"));
    }
    IbInfo::decode(body).map_err(refused)
}

/// A frame of `kind` with `body` arrived on a channel in `phase`. The phase is consumed: the
/// engine holds the channel in [`SidePhase::Closing`] while it carries the step out, so a
/// failure on the way ends the channel rather than leaving it half-set-up.
pub(crate) fn on_frame(phase: SidePhase, kind: Kind, body: &[u8]) -> Step {
    match phase {
        SidePhase::Handshake(hs) => Step::Handshake(hs),
        SidePhase::ServerWaitInfo { client } => match info(kind, body) {
            Ok(remote_info) => Step::CreateAndBringUp { client, remote_info },
            Err(refusal) => refusal,
        },
        SidePhase::ClientWaitInfo => match info(kind, body) {
            Ok(remote_info) => Step::BringUp { remote_info },
            Err(refusal) => refusal,
        },
        SidePhase::ServerWaitReady if kind == Kind::IbReady => Step::Established,
        SidePhase::ServerWaitReady => refused("expected IB_READY"),
        // Nothing is expected before the connect finishes, after set-up, or while closing.
        SidePhase::Connecting | SidePhase::Established | SidePhase::Closing => {
            refused("unexpected side-channel frame")
        }
    }
}

/// The `IB_INFO` frame that tells the peer about our queue pair `info`, on a channel serving
/// class `sl`.
pub(crate) fn info_frame(sl: ServiceLevel, info: &IbInfo) -> (Header, Vec<u8>) {
    let mut h = Header::new(Kind::IbInfo, sl);
    h.len = IB_INFO_LEN as u32;
    (h, info.encode())
}

/// The `IB_READY` frame: the client's queue pair can receive.
pub(crate) fn ready_frame(sl: ServiceLevel) -> (Header, Vec<u8>) {
    (Header::new(Kind::IbReady, sl), Vec::new())
}

#[cfg(test)]
mod tests {
    use super::super::side::sample_info;
    use super::*;
    use crate::handshake::{ClientHandshake, ServerHandshake};

    const SL: ServiceLevel = ServiceLevel::Bulk;

    /// A client's hello, the same every time (a fresh one has a random nonce).
    fn client() -> HelloInfo {
        HelloInfo { nonce: [7; 32], ..HelloInfo::new(0x5eed, 7000, 16384, 1 << 20, false) }
    }

    /// Makes a phase afresh for each frame (a phase is consumed by the frame).
    type MakePhase = fn() -> SidePhase;

    /// Every phase, by name.
    fn phases() -> Vec<(&'static str, MakePhase)> {
        vec![
            ("connecting", || SidePhase::Connecting),
            ("client handshake", || {
                let (hs, _hello) = ClientHandshake::start(SL, client(), None);
                SidePhase::Handshake(Hs::ClientWaitAck(Box::new(hs)))
            }),
            ("server handshake", || {
                SidePhase::Handshake(Hs::ServerWaitHello(Box::new(ServerHandshake::new(1, 2, 3, 4, None))))
            }),
            ("client wait info", || SidePhase::ClientWaitInfo),
            ("server wait info", || SidePhase::ServerWaitInfo { client: client() }),
            ("server wait ready", || SidePhase::ServerWaitReady),
            ("established", || SidePhase::Established),
            ("closing", || SidePhase::Closing),
        ]
    }

    fn all_kinds() -> impl Iterator<Item = Kind> {
        (0..=u8::MAX).filter_map(Kind::from_u8)
    }

    /// The cause of a refusal, None for any other step.
    fn refusal(step: &Step) -> Option<&str> {
        match step {
            Step::Fail(Loss::Protocol(ProtocolError::Handshake(why))) => Some(why),
            _ => None,
        }
    }

    #[test]
    fn every_phase_answers_every_frame_kind() {
        let good = sample_info(77).encode();
        for (name, phase) in phases() {
            for kind in all_kinds() {
                // The right body for an info frame, none for the others (as sent).
                let body: &[u8] = if kind == Kind::IbInfo { &good } else { &[] };
                let step = on_frame(phase(), kind, body);
                let at = format!("{name}, {kind:?}: {step:?}");
                match (name, kind) {
                    // The handshake machine takes every frame, in the state it was in.
                    ("client handshake", _) => {
                        assert!(matches!(&step, Step::Handshake(Hs::ClientWaitAck(_))), "{at}")
                    }
                    ("server handshake", _) => {
                        assert!(matches!(&step, Step::Handshake(Hs::ServerWaitHello(_))), "{at}")
                    }
                    ("server wait info", Kind::IbInfo) => assert!(
                        matches!(&step, Step::CreateAndBringUp { client: c, remote_info: i }
                            if *c == client() && *i == sample_info(77)),
                        "{at}"
                    ),
                    ("client wait info", Kind::IbInfo) => assert!(
                        matches!(&step, Step::BringUp { remote_info: i } if *i == sample_info(77)),
                        "{at}"
                    ),
                    ("server wait ready", Kind::IbReady) => {
                        assert!(matches!(step, Step::Established), "{at}")
                    }
                    ("server wait info" | "client wait info", _) => {
                        assert_eq!(refusal(&step), Some("expected IB_INFO"), "{at}")
                    }
                    ("server wait ready", _) => assert_eq!(refusal(&step), Some("expected IB_READY"), "{at}"),
                    _ => assert_eq!(refusal(&step), Some("unexpected side-channel frame"), "{at}"),
                }
            }
        }
    }

    #[test]
    fn undecodable_info_is_refused_with_its_cause() {
        let good = sample_info(77).encode();
        let mut bad_version = good.clone();
        bad_version[60] = 3;
        let bad_geometry = IbInfo { recv_buffers: 0, ..sample_info(77) }.encode();
        for (body, why) in [
            (&good[..0], "IB info of 0 bytes"),
            (&good[..59], "IB info of 59 bytes"),
            (&good[..60], "version 1"),
            (&bad_version[..], "version 3"),
            (&bad_geometry[..], "receive geometry"),
        ] {
            for phase in [SidePhase::ClientWaitInfo, SidePhase::ServerWaitInfo { client: client() }] {
                let step = on_frame(phase, Kind::IbInfo, body);
                let cause = refusal(&step).unwrap_or_else(|| panic!("{why}: not refused: {step:?}"));
                assert!(cause.contains(why), "{why}: {cause}");
            }
        }
    }

    /// Both roles' frames, each fed to the other's phase machine as the wire would.
    #[test]
    fn the_exchange_runs_from_either_side() {
        // Client → server: the client's info.
        let (h, body) = info_frame(SL, &sample_info(10));
        let h = Header::decode(&h.encode()).expect("an info header decodes");
        assert_eq!((h.kind, h.sl, h.len as usize), (Kind::IbInfo, SL, body.len()));
        let step = on_frame(SidePhase::ServerWaitInfo { client: client() }, h.kind, &body);
        assert!(
            matches!(&step, Step::CreateAndBringUp { client: c, remote_info: i } if *c == client() && *i == sample_info(10)),
            "{step:?}"
        );
        // Server → client: the server's info.
        let (h, body) = info_frame(SL, &sample_info(20));
        let step = on_frame(SidePhase::ClientWaitInfo, h.kind, &body);
        assert!(matches!(&step, Step::BringUp { remote_info: i } if *i == sample_info(20)), "{step:?}");
        // Client → server: ready.
        let (h, body) = ready_frame(SL);
        let h = Header::decode(&h.encode()).expect("a ready header decodes");
        assert_eq!((h.kind, h.sl, h.len as usize, body.len()), (Kind::IbReady, SL, 0, 0));
        assert!(matches!(on_frame(SidePhase::ServerWaitReady, h.kind, &body), Step::Established));
        // A repeated ready after set-up is a protocol error.
        assert_eq!(
            refusal(&on_frame(SidePhase::Established, h.kind, &body)),
            Some("unexpected side-channel frame")
        );
    }

    #[test]
    fn only_a_dialled_channel_still_setting_up_counts_as_dialling() {
        let dialled: Vec<_> = phases().into_iter().map(|(name, phase)| (name, phase().dialled())).collect();
        assert_eq!(
            dialled,
            [
                ("connecting", Some(Dialled::Connecting)),
                ("client handshake", Some(Dialled::Handshaking)),
                ("server handshake", None),
                ("client wait info", Some(Dialled::Handshaking)),
                ("server wait info", None),
                ("server wait ready", None),
                ("established", None),
                ("closing", None),
            ]
        );
    }
}
