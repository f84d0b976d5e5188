//! Reliable-connected queue pairs: sizes and creation parameters, the typed state machine of
//! `ibv_modify_qp`, what a peer needs to connect to one ([`QpEndpointInfo`]), and
//! [`bring_up`], which drives a fresh queue pair to ready-to-send.

use std::fmt;

use super::{
    AccessFlags, FabricError, Gid, GidEntry, IpFamily, LinkLayer, PortAttr, QueuePair, Verbs, VerbsResult,
    choose_roce_gid,
};

/// Largest QP number or PSN: both are 24-bit quantities on the wire.
pub const MAX_24BIT: u32 = (1 << 24) - 1;

/// Queue-pair states (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset: nothing can be posted.
    Reset,
    /// Initialised: receives may be posted (they are not consumed yet).
    Init,
    /// Ready to receive: incoming SENDs consume receives.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained (not used by the engine).
    Sqd,
    /// Send queue error (not used on RC QPs).
    Sqe,
    /// Error: every outstanding and newly posted work request completes with `WrFlushErr`.
    Err,
}

/// IB path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[allow(missing_docs)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    #[default]
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        256 << (self as u32)
    }

    /// The `enum ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub fn as_raw(self) -> u32 {
        self as u32 + 1
    }

    /// From an `enum ibv_mtu` value.
    pub fn from_raw(v: u32) -> Option<Mtu> {
        [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096]
            .get((v as usize).checked_sub(1)?)
            .copied()
    }
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    /// BMI-IB-like sizes: 128 work requests each way, 16 SGEs, 64 B inline.
    fn default() -> Self {
        QpCap { max_send_wr: 128, max_recv_wr: 128, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 64 }
    }
}

/// Creation parameters of an RC queue pair.
pub struct QpInit<'a, V: Verbs> {
    /// CQ for send-queue completions.
    pub send_cq: &'a V::Cq,
    /// CQ for receive completions (may be the same CQ).
    pub recv_cq: &'a V::Cq,
    /// Take receives from this shared receive queue instead of a private one.
    pub srq: Option<&'a V::Srq>,
    /// Queue sizes (the provider may round up; see [`QueuePair::cap`]).
    pub cap: QpCap,
    /// Signal every send regardless of `SendFlags::SIGNALED`.
    pub sq_sig_all: bool,
}

impl<V: Verbs> fmt::Debug for QpInit<'_, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpInit")
            .field("cap", &self.cap)
            .field("srq", &self.srq.is_some())
            .field("sq_sig_all", &self.sq_sig_all)
            .finish()
    }
}

/// Shared receive queue sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Outstanding receives.
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
}

/// RESET → INIT attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitAttr {
    /// Physical port (from 1).
    pub port_num: u8,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Remote operations this QP accepts as a responder (`REMOTE_WRITE`, `REMOTE_READ`);
    /// combined with each registration's own rights.
    pub access: AccessFlags,
}

/// INIT → RTR attributes: who the peer is and how to receive from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// The peer QP (its QPN, its starting PSN = our expected receive PSN, its LID and GID).
    pub remote: QpEndpointInfo,
    /// Path MTU (at most both ports' active MTU).
    pub path_mtu: Mtu,
    /// RDMA_READs the peer may have outstanding against us.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer we advertise (IB encoding 0..=31; 1 = 0.01 ms, 14 = 1.28 ms,
    /// 31 = 491.52 ms, 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// Service level (0..=15): the priority class of this connection.
    pub sl: u8,
    /// Our port.
    pub port_num: u8,
    /// Route with a GRH using our GID at this index (required on RoCE); `None`: LID routing.
    pub gid_index: Option<u8>,
    /// Traffic class of the GRH (with `gid_index` only): on RoCE v2 its upper six bits are the
    /// packets' IP DSCP, the low two ECN.
    pub traffic_class: u8,
}

/// RTR → RTS attributes: how to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// Our starting send PSN (what we told the peer in our [`QpEndpointInfo`]).
    pub sq_psn: u32,
    /// Local ACK timeout, 4.096 µs · 2^timeout (0: infinite on hardware).
    pub timeout: u8,
    /// Transport retries before `RetryExcErr` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before `RnrRetryExcErr` (0..=6; 7 = retry forever).
    pub rnr_retry: u8,
    /// RDMA_READs we may have outstanding.
    pub max_rd_atomic: u8,
}

/// A QP state transition with its attributes (typed `ibv_modify_qp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET → INIT.
    Init(InitAttr),
    /// INIT → RTR.
    Rtr(RtrAttr),
    /// RTR → RTS.
    Rts(RtsAttr),
    /// Any state → ERR: outstanding work requests are flushed with `WrFlushErr`.
    Err,
    /// Any state → RESET: queues are emptied without completions.
    Reset,
}

impl QpTransition {
    /// The state this transition leads to.
    pub fn target(&self) -> QpState {
        match self {
            QpTransition::Init(_) => QpState::Init,
            QpTransition::Rtr(_) => QpState::Rtr,
            QpTransition::Rts(_) => QpState::Rts,
            QpTransition::Err => QpState::Err,
            QpTransition::Reset => QpState::Reset,
        }
    }

    /// Whether the RC state machine allows `from → self.target()`.
    pub fn allowed_from(&self, from: QpState) -> bool {
        matches!(
            (from, self),
            (QpState::Reset, QpTransition::Init(_))
                | (QpState::Init, QpTransition::Init(_))
                | (QpState::Init, QpTransition::Rtr(_))
                | (QpState::Rtr, QpTransition::Rts(_))
                | (_, QpTransition::Err)
                | (_, QpTransition::Reset)
        )
    }
}

/// Exactly what a peer needs to connect an RC QP to ours — what a real HCA needs, no more:
/// QP number, starting PSN, LID and GID. The engine sends it over its TCP side channel.
///
/// Wire form: 32 bytes, big-endian:
///
/// ```text
///  0 u16 magic 0x5150 ("QP")   4 u32 qpn (< 2^24)    12 u16 lid
///  2 u8  version (1)           8 u32 psn (< 2^24)    14 u16 reserved, 0
///  3 u8  reserved, 0                                 16 [u8; 16] gid
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpEndpointInfo {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Starting packet sequence number of the QP's send queue (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (required on RoCE; identifies the peer context on `softib`).
    pub gid: Gid,
}

/// Why a [`QpEndpointInfo`] failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointDecodeError {
    /// Not exactly [`QpEndpointInfo::WIRE_LEN`] bytes.
    #[error("endpoint info is {0} bytes, expected 32")]
    Length(usize),
    /// Wrong magic or version.
    #[error("endpoint info has bad magic or version")]
    Version,
    /// A reserved field is not zero.
    #[error("endpoint info has non-zero reserved bits")]
    Reserved,
    /// QPN or PSN does not fit in 24 bits.
    #[error("endpoint info QPN or PSN out of range")]
    Range,
}

impl QpEndpointInfo {
    /// Length of the wire form.
    pub const WIRE_LEN: usize = 32;
    const MAGIC: u16 = 0x5150;
    const VERSION: u8 = 1;

    /// Our side of a connection: `qp`'s number, the port's LID and GID, and `psn` (any
    /// 24-bit value; pick it at random, it is masked to 24 bits).
    pub fn local<Q: QueuePair + ?Sized>(qp: &Q, port: &PortAttr, psn: u32) -> Self {
        QpEndpointInfo { qpn: qp.qp_num(), psn: psn & MAX_24BIT, lid: port.lid, gid: port.gid }
    }

    /// The 32-byte wire form.
    pub fn encode(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[0..2].copy_from_slice(&Self::MAGIC.to_be_bytes());
        b[2] = Self::VERSION;
        b[4..8].copy_from_slice(&(self.qpn & MAX_24BIT).to_be_bytes());
        b[8..12].copy_from_slice(&(self.psn & MAX_24BIT).to_be_bytes());
        b[12..14].copy_from_slice(&self.lid.to_be_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b
    }

    /// Decodes the wire form. Total: any input gives a value or an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, EndpointDecodeError> {
        let b: &[u8; Self::WIRE_LEN] =
            bytes.try_into().map_err(|_| EndpointDecodeError::Length(bytes.len()))?;
        let be16 = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if be16(0) != Self::MAGIC || b[2] != Self::VERSION {
            return Err(EndpointDecodeError::Version);
        }
        if b[3] != 0 || be16(14) != 0 {
            return Err(EndpointDecodeError::Reserved);
        }
        let (qpn, psn) = (be32(4), be32(8));
        if qpn > MAX_24BIT || psn > MAX_24BIT {
            return Err(EndpointDecodeError::Range);
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(QpEndpointInfo { qpn, psn, lid: be16(12), gid: Gid(gid) })
    }
}

/// Connection parameters for [`bring_up`]. Defaults follow BMI-IB (`timeout` 14 ≈ 67 ms,
/// `retry_cnt` 7, `rnr_retry` 7 = forever, `min_rnr_timer` 12 = 0.64 ms, MTU 1024), with LID
/// routing (`gid_index: None`), which InfiniBand ports accept and Ethernet (RoCE) ports refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// Port (from 1).
    pub port_num: u8,
    /// Remote rights this QP accepts.
    pub access: AccessFlags,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Service level (0..=15).
    pub sl: u8,
    /// See [`RtsAttr::timeout`].
    pub timeout: u8,
    /// See [`RtsAttr::retry_cnt`].
    pub retry_cnt: u8,
    /// See [`RtsAttr::rnr_retry`].
    pub rnr_retry: u8,
    /// See [`RtrAttr::min_rnr_timer`].
    pub min_rnr_timer: u8,
    /// Outstanding RDMA_READs each way.
    pub max_rd_atomic: u8,
    /// GID index for GRH routing (required on RoCE; see [`crate::ib::verbs::choose_roce_gid`]).
    pub gid_index: Option<u8>,
    /// See [`RtrAttr::traffic_class`].
    pub traffic_class: u8,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            port_num: 1,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
            path_mtu: Mtu::Mtu1024,
            sl: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            gid_index: None,
            traffic_class: 0,
        }
    }
}

/// Drives a fresh QP through RESET → INIT → RTR → RTS towards `remote`, sending from
/// `local.psn`. Receives should be posted before the peer learns we are ready.
///
/// # Errors
/// Whatever [`QueuePair::modify`] reports; the QP is left in the state reached.
pub fn bring_up<Q: QueuePair + ?Sized>(
    qp: &Q,
    local: &QpEndpointInfo,
    remote: &QpEndpointInfo,
    p: &ConnParams,
) -> VerbsResult<()> {
    qp.modify(&QpTransition::Init(InitAttr { port_num: p.port_num, pkey_index: 0, access: p.access }))?;
    qp.modify(&QpTransition::Rtr(RtrAttr {
        remote: *remote,
        path_mtu: p.path_mtu,
        max_dest_rd_atomic: p.max_rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        sl: p.sl,
        port_num: p.port_num,
        gid_index: p.gid_index,
        traffic_class: p.traffic_class,
    }))?;
    qp.modify(&QpTransition::Rts(RtsAttr {
        sq_psn: local.psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: p.max_rd_atomic,
    }))
}

/// The source GID a connection through `port` routes with when none is configured: `None` on
/// an InfiniBand port (LID routing), the entry [`choose_roce_gid`] picks for `family` on an
/// Ethernet (RoCE) port. Put its GID in the [`QpEndpointInfo`] the peer gets and its index in
/// [`ConnParams::gid_index`].
///
/// # Errors
/// [`FabricError::NoRoceGid`] on an Ethernet port whose table has no usable RoCE entry, or
/// what [`Verbs::port_attr`] reports.
pub fn default_route<V: Verbs>(ctx: &V, port: u8, family: IpFamily) -> VerbsResult<Option<GidEntry>> {
    let attr = ctx.port_attr(port)?;
    if attr.link_layer != LinkLayer::Ethernet {
        return Ok(None);
    }
    let table: Vec<GidEntry> =
        (0..attr.gid_tbl_len.min(256)).filter_map(|i| ctx.gid_entry(port, i).ok()).collect();
    match choose_roce_gid(&table, family) {
        Some(e) => Ok(Some(e)),
        None => Err(FabricError::NoRoceGid { device: ctx.device().name.clone(), port }.into()),
    }
}

/// The checks every provider makes on the route of an INIT → RTR transition before the device
/// sees it, so that each provider refuses the same routes with the same typed errors (an HCA
/// says only `EINVAL`): the port exists, a GID index names a non-empty entry, an Ethernet
/// (RoCE) port gets a GRH, and the path MTU is at most the port's active MTU.
///
/// # Errors
/// [`FabricError::NoSuchPort`], [`FabricError::NoSuchGid`], [`FabricError::GrhRequired`],
/// [`FabricError::MtuAbovePort`], or the driver's error.
pub fn check_route<V: Verbs>(ctx: &V, a: &RtrAttr) -> VerbsResult<()> {
    let port = ctx.port_attr(a.port_num)?;
    let device = || ctx.device().name.clone();
    match a.gid_index {
        Some(i) => {
            ctx.gid_entry(a.port_num, u32::from(i))?;
        }
        None if port.link_layer == LinkLayer::Ethernet => {
            return Err(FabricError::GrhRequired { device: device(), port: a.port_num }.into());
        }
        None => {}
    }
    if a.path_mtu > port.active_mtu {
        return Err(FabricError::MtuAbovePort {
            device: device(),
            port: a.port_num,
            requested: a.path_mtu.bytes(),
            active: port.active_mtu.bytes(),
        }
        .into());
    }
    Ok(())
}
