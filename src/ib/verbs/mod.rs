//! The `Verbs` trait: the one seam between the IB engine and a provider.
//!
//! The engine is generic over a provider (`IbEngine<V: Verbs>`) and speaks InfiniBand verbs
//! through the traits in this module only. Two providers implement them:
//!
//! - `crate::ib::soft` (`softib://`): a software provider that runs on any Linux host (and
//!   only there), within one process and across processes, with real memory pinning and fault
//!   injection;
//! - `crate::ib::hw` (cargo feature `verbs`): real HCAs through `libibverbs` (`ibverbs-sys`).
//!
//! The vocabulary is that of `libibverbs` (`ibv_*`), typed: access and send flags are newtypes,
//! opcodes are enums that carry their operands, QP transitions are one enum with one attribute
//! struct per target state, and every work completion status of `enum ibv_wc_status` exists.
//!
//! # Bring-up
//!
//! ```text
//!  provider.open(dev) ─► ctx ─► ctx.alloc_pd()                     ─► pd
//!                           ├─► ctx.create_comp_channel()          ─► ch   (ch.as_raw_fd() → mio)
//!                           ├─► ctx.create_cq(n, Some(&ch), cookie) ─► cq
//!                           ├─► unsafe ctx.reg_mr(&pd, addr, len, access) ─► mr (lkey,rkey)
//!                           └─► ctx.create_qp(&pd, &QpInit{..})     ─► qp   (state RESET)
//!  route = default_route(&ctx, 1, IpFamily::V4)?                   // RoCE: a GID entry; IB: None
//!  local = QpEndpointInfo::local(&qp, &ctx.port_attr(1)?, psn)      // QPN, PSN, LID, GID
//!          (with route: local.gid = route.gid)
//!  ── exchange local.encode() over the TCP side channel; QpEndpointInfo::decode(peer bytes) ──
//!  bring_up(&qp, &local, &remote, &ConnParams { gid_index: route.map(|e| e.index), .. })
//!                                                                   // INIT → RTR → RTS
//!  qp.post_recv(..) first, then the peer may SEND; qp.post_send(..); cq.poll(&mut wcs)
//! ```
//!
//! Exactly the information a real HCA needs crosses the side channel ([`QpEndpointInfo`]:
//! QP number, starting PSN, LID and GID), so an engine cannot tell the software provider from
//! hardware. On an Ethernet (RoCE) port there are no LIDs: the route needs a GRH from a source
//! GID index ([`default_route`] picks one as `rdma_cm` does) to the peer's GID, and both
//! providers refuse a route without one ([`check_route`]). The path MTU must not exceed either
//! port's active MTU: exchange them too and take the smaller. Post receives *before* telling the peer the QP is ready: a SEND that finds no
//! receive posted is an RNR (receiver-not-ready) condition, retried `rnr_retry` times.
//! Receives can be posted from INIT on; to have them in place before RTR, move the QP to INIT
//! yourself, post, then call [`bring_up`] (which re-applies INIT, an allowed INIT → INIT).
//!
//! # Completions and blocking
//!
//! Every signaled work request, every unsignaled one that fails, and every work request flushed
//! when a QP enters the error state produces exactly one [`WorkCompletion`]. To block:
//! `cq.req_notify(false)`, poll the CQ once more (a completion may have landed before the arm),
//! then wait for the channel's file descriptor to become readable (`poll(2)` or mio
//! `SourceFd`), call [`CompletionChannel::get_event`] until it returns `None`, re-arm and poll.
//! A channel only becomes readable when an *armed* CQ receives a completion; each arm produces
//! at most one event.
//!
//! # Memory
//!
//! Registration ([`Verbs::reg_mr`]) hands raw memory the caller keeps alive to the device; it is
//! the only `unsafe` call of the seam (see its `# Safety`). Posting is safe: every local
//! scatter/gather entry is checked against the registration its `lkey` names (by the provider,
//! or by the HCA), and every remote address against the target's registration for the `rkey`.
//! A failed check completes the work request with an error status; it never touches memory
//! outside a registration.

mod device;
mod error;
mod provider;
mod qp;
mod work;

pub use device::*;
pub use error::*;
pub use provider::*;
pub use qp::*;
pub use work::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_info_round_trips() {
        let info = QpEndpointInfo { qpn: 0xabcdef, psn: 0x123456, lid: 7, gid: Gid([9; 16]) };
        assert_eq!(QpEndpointInfo::decode(&info.encode()), Ok(info));
    }

    #[test]
    fn endpoint_info_rejects_bad_input() {
        let good = QpEndpointInfo { qpn: 1, psn: 2, lid: 3, gid: Gid::default() }.encode();
        assert_eq!(QpEndpointInfo::decode(&good[..31]), Err(EndpointDecodeError::Length(31)));
        let mut b = good;
        b[2] = 2;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Version));
        let mut b = good;
        b[15] = 1;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Reserved));
        let mut b = good;
        b[4] = 1;
        assert_eq!(QpEndpointInfo::decode(&b), Err(EndpointDecodeError::Range));
    }

    proptest::proptest! {
        #[test]
        fn endpoint_decode_is_total(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Ok(info) = QpEndpointInfo::decode(&bytes) {
                proptest::prop_assert_eq!(&info.encode()[..], &bytes[..]);
            }
        }
    }

    #[test]
    fn transitions_follow_the_rc_state_machine() {
        let init = QpTransition::Init(InitAttr { port_num: 1, pkey_index: 0, access: AccessFlags::NONE });
        let rts = QpTransition::Rts(RtsAttr {
            sq_psn: 0,
            timeout: 1,
            retry_cnt: 1,
            rnr_retry: 1,
            max_rd_atomic: 1,
        });
        assert!(init.allowed_from(QpState::Reset));
        assert!(!rts.allowed_from(QpState::Reset));
        assert!(!rts.allowed_from(QpState::Init));
        assert!(QpTransition::Err.allowed_from(QpState::Rts));
        assert!(!init.allowed_from(QpState::Err));
    }

    #[test]
    fn status_numbering_matches_verbs() {
        assert_eq!(WcStatus::RnrRetryExcErr.as_raw(), 13);
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlushErr);
        assert_eq!(WcStatus::from_raw(99), WcStatus::GeneralErr);
        for v in 0..22 {
            assert_eq!(WcStatus::from_raw(v).as_raw(), v);
        }
    }

    #[test]
    fn sge_and_inline_limits_are_checked() {
        let cap = QpCap { max_send_sge: 2, max_inline_data: 8, ..QpCap::default() };
        let sges = [Sge::new(0, 4, 1); 3];
        let wr = SendWr { wr_id: 0, op: SendOp::Send, sges: &sges[..2], flags: SendFlags::INLINE };
        assert!(check_send_wr(&wr, &cap).is_ok());
        let wr = SendWr { sges: &sges, ..wr };
        assert!(matches!(check_send_wr(&wr, &cap), Err(VerbsError::TooManySge { given: 3, max: 2 })));
        let big = [Sge::new(0, 9, 1)];
        let wr = SendWr { sges: &big, ..wr };
        assert!(matches!(check_send_wr(&wr, &cap), Err(VerbsError::InlineTooLarge { len: 9, max: 8 })));
    }

    #[test]
    fn timer_encodings() {
        assert_eq!(rnr_timer_delay(1), std::time::Duration::from_micros(10));
        assert_eq!(rnr_timer_delay(31), std::time::Duration::from_micros(491_520));
        assert_eq!(rnr_timer_delay(0), std::time::Duration::from_micros(655_360));
        assert_eq!(ack_timeout(0), std::time::Duration::from_nanos(4096));
    }
}
