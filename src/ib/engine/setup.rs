//! Connection set-up: side-channel handshakes, queue-pair creation and bring-up.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use mio::Interest;
use mio::Token;
use socket2::SockRef;

use crate::sockets;

use crate::error::{Error, ProtocolError, Result};
use crate::flowctl::{CreditConfig, Credits, RingConfig, RingReceiver, RingSender};
use crate::handshake::{self, ClientHandshake, HelloInfo, Hs, HsStep, ServerHandshake};
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::types::{PeerId, ServiceLevel};
use crate::wire::Header;

use super::exchange::{self, SidePhase, Step};
use super::link::{Layout, Link};
use super::plan::HeldPosts;
use super::reg::{DmaRegion, register_region};
use super::side::{Framed, IbInfo};
use super::{Conn, LastCommand, Loss, Side, State, WR_RECV, wr_id};

/// No connection: connection ids are 20 bits (see `wr_id`).
const NO_CONN: u32 = u32::MAX;

impl<V: Verbs> State<V> {
    /// The connection for (peer, class): existing (ready or being set up), newly dialled, or for
    /// a peer we cannot dial, any of its connections.
    pub(crate) fn conn_for(&mut self, peer: PeerId, sl: ServiceLevel, now: Instant) -> Result<u32> {
        let p = self.peers.require(peer)?;
        if let Some(reason) = &p.lost {
            return Err(Error::PeerLost { peer, reason: reason.clone() });
        }
        if let Some(c) = p.conns[sl.index()] {
            return Ok(c);
        }
        match p.dial {
            Some(sa) => self.dial(peer, sa, sl, now),
            None => p.conns.iter().flatten().next().copied().ok_or_else(|| Error::PeerLost {
                peer,
                reason: "no connection to this peer and it cannot be dialled".into(),
            }),
        }
    }

    fn dial(&mut self, peer: PeerId, sa: SocketAddr, sl: ServiceLevel, now: Instant) -> Result<u32> {
        let mut stream = sockets::dial(sa, |s| {
            let _ = s.set_tcp_nodelay(true);
        })
        .map_err(|e| Error::PeerLost { peer, reason: format!("connect to {sa}: {e}") })?;
        let t = Token(self.next_token);
        self.next_token += 1;
        self.registry.register(&mut stream, t, Interest::READABLE | Interest::WRITABLE)?;
        // The queue pair and its memory exist from now on, so messages can queue on it while
        // the side channel sets it up.
        let cid = self.create_conn(peer, sl)?;
        self.sides.insert(
            t,
            Side {
                framed: Framed::new(stream),
                phase: SidePhase::Connecting,
                peer: Some(peer),
                sl,
                conn: Some(cid),
                remote: sa,
                since: now,
            },
        );
        self.peers[peer].conns[sl.index()] = Some(cid);
        tracing::debug!(%peer, %sa, %sl, "dialling");
        Ok(cid)
    }

    /// Creates a queue pair (in INIT, receives posted) and its registered memory.
    pub(crate) fn create_conn(&mut self, peer: PeerId, sl: ServiceLevel) -> Result<u32> {
        let s = &self.s;
        let layout = Layout {
            rs: s.recv_size as usize,
            slot: s.slot_size as usize,
            n_recv: usize::from(s.n_recv) + usize::from(s.n_ring),
            n_small: 2 * usize::from(s.n_recv),
            n_large: usize::from(s.n_ring),
            n_ring: usize::from(s.n_ring),
        };
        let mem = DmaRegion::new(layout.total())?;
        let mr = register_region(&self.dev, &mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
        let cap = QpCap {
            max_send_wr: s.cfg.ib.max_send_wr,
            max_recv_wr: layout.n_recv as u32,
            max_send_sge: s.max_sge,
            max_recv_sge: 1,
            max_inline_data: s.max_inline_device.min(256),
        };
        let qp = self.dev.ctx.create_qp(
            &self.dev.pd,
            &QpInit { send_cq: &self.dev.cq, recv_cq: &self.dev.cq, srq: None, cap, sq_sig_all: false },
        )?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        qp.modify(&QpTransition::Init(InitAttr { port_num: self.dev.port.num, pkey_index: 0, access }))?;
        let ring_cfg = RingConfig::default().slots(s.n_ring).slot_size(s.slot_size);
        let ring_rx = RingReceiver::new(&ring_cfg).map_err(Error::from)?;
        let id = match self.free_conns.pop() {
            Some(id) => id,
            None => {
                self.conns.push(None);
                self.conn_gen.push(0);
                (self.conns.len() - 1) as u32
            }
        };
        if id > 0xF_FFFF {
            return Err(Error::Exhausted("too many queue pairs".into()));
        }
        let gen_ = self.conn_gen[id as usize].wrapping_add(1);
        self.conn_gen[id as usize] = gen_;
        let mut c = Conn {
            qp,
            mr,
            mem,
            id,
            gen_,
            peer,
            sl,
            ready: false,
            psn: (crate::util::random_u64() as u32) & MAX_24BIT,
            remote: None,
            link: Link::new(layout, ring_rx, s.cfg.ib.max_send_wr),
            out: VecDeque::new(),
            waiting_posts: HeldPosts::default(),
            last_command: LastCommand::new(Instant::now()),
        };
        // Receives go up before the peer learns our queue pair, so nothing ever meets RNR.
        for i in 0..layout.n_recv as u32 {
            post_recv(&mut c, i)?;
        }
        self.conns[id as usize] = Some(c);
        Ok(id)
    }

    /// Destroys connection `cid` that no peer record holds (its queue pair first, so no DMA
    /// reaches its memory afterwards).
    fn discard_conn(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(cid as usize).and_then(Option::take) {
            drop(c);
            self.free_conns.push(cid);
        }
    }

    /// Our side of connection `cid`, whose side channel connects to `peer` (its IP family
    /// picks the RoCE GID).
    pub(super) fn local_info(&self, cid: u32, peer: SocketAddr) -> Option<IbInfo> {
        let c = self.conn(cid)?;
        let port = &self.dev.port;
        let route = port.route(peer);
        Some(IbInfo {
            qp: QpEndpointInfo { qpn: c.qp.qp_num(), psn: c.psn, lid: port.attr.lid, gid: route.gid },
            link_layer: port.attr.link_layer,
            mtu: port.attr.active_mtu,
            recv_buffers: self.s.n_recv,
            recv_size: self.s.recv_size,
            ring_addr: c.mem.addr() + c.link.layout().ring_off(0) as u64,
            ring_rkey: c.mr.rkey(),
            ring_slots: self.s.n_ring,
            slot_size: self.s.slot_size,
        })
    }

    /// Takes the peer's info: queue pair to RTS, credits and ring sender set up. `peer` is
    /// the side channel's remote address (its IP family picks the RoCE GID, as in
    /// [`Self::local_info`]).
    pub(super) fn bring_up(&mut self, cid: u32, remote: IbInfo, peer: SocketAddr) -> Result<()> {
        let sl = self.conn(cid).map(|c| c.sl).ok_or_else(|| Error::misuse("no connection"))?;
        let ib = &self.s.cfg.ib;
        let port = &self.dev.port;
        let route = port.route(peer);
        let path_mtu = port.agree(&route, remote.link_layer, remote.mtu, &remote.qp.gid)?;
        let p = ConnParams {
            port_num: port.num,
            sl: ib.sl[sl.index()],
            path_mtu,
            gid_index: route.gid_index,
            // The GRH traffic class carries the class's DSCP in its upper six bits, so RoCE
            // packets are marked as the TCP transport marks its sockets.
            traffic_class: self.s.cfg.dscp[sl.index()] << 2,
            timeout: ib.ack_timeout,
            retry_cnt: ib.retry_count,
            rnr_retry: ib.rnr_retry,
            min_rnr_timer: ib.min_rnr_timer,
            ..ConnParams::default()
        };
        let credit_cfg = CreditConfig::default().recv_buffers(self.s.n_recv);
        let c = self.conn_mut(cid).ok_or_else(|| Error::misuse("no connection"))?;
        let local = QpEndpointInfo { qpn: c.qp.qp_num(), psn: c.psn, lid: 0, gid: Gid([0; 16]) };
        // INIT was done at creation; RTR and RTS now.
        c.qp.modify(&QpTransition::Rtr(RtrAttr {
            remote: remote.qp,
            path_mtu: p.path_mtu,
            max_dest_rd_atomic: p.max_rd_atomic,
            min_rnr_timer: p.min_rnr_timer,
            sl: p.sl,
            port_num: p.port_num,
            gid_index: p.gid_index,
            traffic_class: p.traffic_class,
        }))?;
        c.qp.modify(&QpTransition::Rts(RtsAttr {
            sq_psn: local.psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: p.max_rd_atomic,
        }))?;
        let credits = Credits::new(&credit_cfg, remote.recv_buffers).map_err(Error::from)?;
        let ring_tx = RingSender::new(remote.ring_slots, remote.slot_size).map_err(Error::from)?;
        c.link.connect(credits, ring_tx);
        c.remote = Some(remote);
        Ok(())
    }

    pub(crate) fn accept(&mut self, now: Instant) {
        let Some(l) = &self.listener else { return };
        let (accepted, more) = sockets::accept_round(l);
        self.accept_more = more;
        for (mut sock, remote) in accepted {
            if self.closed {
                continue;
            }
            let t = Token(self.next_token);
            self.next_token += 1;
            if self.registry.register(&mut sock, t, Interest::READABLE | Interest::WRITABLE).is_err() {
                continue;
            }
            let hs = ServerHandshake::new(
                self.s.endpoint_id,
                self.s.listen_port,
                self.s.eager_limit as u32,
                self.s.max_message as u64,
                self.s.cfg.cluster_key.clone(),
            );
            self.sides.insert(
                t,
                Side {
                    framed: Framed::new(sock),
                    phase: SidePhase::Handshake(Hs::ServerWaitHello(Box::new(hs))),
                    peer: None,
                    sl: ServiceLevel::Normal,
                    conn: None,
                    remote,
                    since: now,
                },
            );
            for v in self.admission.admit(now, t, remote.ip()) {
                self.shed(v);
            }
            // A client sends its hello as soon as it is connected: reading it now tells this
            // channel from silent ones if a later accept has to shed.
            self.side_event(t, false, now);
        }
    }

    /// Drops an accepted side channel to make room for newer ones, telling the client why when
    /// nothing else of ours is half written on it.
    fn shed(&mut self, t: Token) {
        self.admission.finished(t);
        let Some(mut s) = self.sides.remove(&t) else { return };
        tracing::debug!(remote = %s.remote, "shedding a side channel in its handshake: handshake limits reached");
        if s.framed.flushed() {
            let _ = s.framed.send(&handshake::busy_frame(s.sl), &[]);
        }
        let _ = self.registry.deregister(&mut s.framed.sock);
    }

    pub(crate) fn side_failed(&mut self, t: Token, why: Loss) {
        self.admission.finished(t);
        let Some(s) = self.sides.get(&t) else { return };
        let peer = s.peer;
        let dialling = !matches!(s.phase, SidePhase::Connecting) && s.phase.dialled().is_some();
        let why = handshake::lost_in_handshake(why, dialling);
        match peer {
            Some(p) => self.fail_peer(p, why),
            None => {
                if let Some(mut s) = self.sides.remove(&t) {
                    let _ = self.registry.deregister(&mut s.framed.sock);
                    if let Loss::Protocol(_) = why {
                        Counters::add(&self.core.counters.protocol_errors, 1);
                    }
                }
            }
        }
    }

    /// The peer closed the side channel `t` of an established connection, as it does when
    /// its endpoint closes. What it sent before is in the completion queue already (its sends
    /// completed only once delivered), and its close may be seen in the same round as their
    /// completions or before them: take those first, so that a reply sent just before the
    /// close is delivered rather than failed with the rest.
    pub(crate) fn side_closed(&mut self, t: Token) {
        self.poll_cq();
        self.side_failed(t, Loss::Lost("side channel closed".into()));
    }

    /// Drives one side channel after an event.
    pub(crate) fn side_event(&mut self, t: Token, writable: bool, now: Instant) {
        let Some(s) = self.sides.get_mut(&t) else { return };
        if matches!(s.phase, SidePhase::Connecting) {
            if !writable {
                return;
            }
            match s.framed.sock.take_error() {
                Ok(None) if s.framed.sock.peer_addr().is_ok() => {}
                Ok(None) => return,
                Ok(Some(e)) | Err(e) => {
                    let reason = format!("connect to {}: {e}", s.remote);
                    self.side_failed(t, Loss::Lost(reason));
                    return;
                }
            }
            let _ = SockRef::from(&s.framed.sock).set_tcp_nodelay(true);
            let key = self.s.cfg.cluster_key.clone();
            let mine = HelloInfo::new(
                self.s.endpoint_id,
                self.s.listen_port,
                self.s.eager_limit as u32,
                self.s.max_message as u64,
                key.is_some(),
            );
            let (hs, (h, body)) = ClientHandshake::start(s.sl, mine, key);
            s.phase = SidePhase::Handshake(Hs::ClientWaitAck(Box::new(hs)));
            // From here the handshake deadline applies.
            s.since = now;
            if let Err(e) = s.framed.send(&h, &body) {
                self.side_failed(t, Loss::Lost(format!("side channel: {e}")));
                return;
            }
        }
        loop {
            let Some(s) = self.sides.get_mut(&t) else { return };
            if let Err(e) = s.framed.flush() {
                self.side_failed(t, Loss::Lost(format!("side channel: {e}")));
                return;
            }
            if matches!(s.phase, SidePhase::Closing) {
                if s.framed.flushed() {
                    self.side_failed(t, Loss::Lost("refused".into()));
                }
                return;
            }
            if matches!(s.phase, SidePhase::Established) {
                if !s.framed.still_open() {
                    self.side_closed(t);
                }
                return;
            }
            match s.framed.recv() {
                Ok(Some((h, body))) => {
                    self.admission.heard(t);
                    if !self.side_frame(t, h, body, now) {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.side_failed(t, Loss::Protocol(ProtocolError::Handshake(e.to_string())));
                    return;
                }
                Err(e) => {
                    self.side_failed(t, Loss::Lost(format!("side channel: {e}")));
                    return;
                }
            }
        }
    }

    /// Handles one side-channel frame; false when the side channel is gone.
    fn side_frame(&mut self, t: Token, h: Header, body: Vec<u8>, now: Instant) -> bool {
        let Some(s) = self.sides.get_mut(&t) else { return false };
        // Closing until the step is carried out: what fails on the way ends the channel.
        let phase = std::mem::replace(&mut s.phase, SidePhase::Closing);
        match exchange::on_frame(phase, h.kind, &body) {
            Step::Handshake(hs) => self.handshake_frame(t, hs, &h, &body),
            Step::CreateAndBringUp { client, remote_info } => self.serve_client(t, client, remote_info),
            Step::BringUp { remote_info } => self.server_answered(t, remote_info, now),
            Step::Established => {
                s.phase = SidePhase::Established;
                let cid = s.conn;
                self.admission.finished(t);
                if let Some(c) = cid.and_then(|cid| self.conn_mut(cid)) {
                    c.ready = true;
                    tracing::debug!(peer = %c.peer, sl = %c.sl, "queue pair ready (server)");
                }
                Counters::add(&self.core.counters.connections, 1);
                true
            }
            Step::Fail(why) => {
                self.side_failed(t, why);
                false
            }
        }
    }

    /// Hands a frame of side channel `t` to its handshake, in state `hs`.
    fn handshake_frame(&mut self, t: Token, hs: Hs, h: &Header, body: &[u8]) -> bool {
        let Some(s) = self.sides.get_mut(&t) else { return false };
        let (peers, max) = (&self.peers, self.s.cfg.max_peers);
        match hs.on_frame(h, body, |eid| peers.admits(eid, max), s.remote, &self.core.counters) {
            HsStep::Send { frame: (fh, fb), next, class } => {
                if let Some(sl) = class {
                    s.sl = sl;
                }
                s.phase = SidePhase::Handshake(next);
                self.side_send(t, &fh, &fb)
            }
            HsStep::Refused { frame: (rh, rb) } => {
                let _ = s.framed.send(&rh, &rb);
                // Back to the loop, which closes the channel once the refusal is
                // written: waiting for another event instead left a refused peer that
                // had already sent everything connected until the handshake timeout.
                true
            }
            HsStep::Accepted { frame: (rh, rb), client } => {
                s.phase = SidePhase::ServerWaitInfo { client };
                self.side_send(t, &rh, &rb)
            }
            HsStep::Ready { .. } => self.side_ready(t),
            HsStep::Failed(why) => {
                self.side_failed(t, why);
                false
            }
        }
    }

    /// The client of side channel `t` sent its queue pair's details (`remote_info`): its queue
    /// pair is made and brought up here, and ours goes back.
    fn serve_client(&mut self, t: Token, client: HelloInfo, remote_info: IbInfo) -> bool {
        let Some(s) = self.sides.get(&t) else { return false };
        let (remote_addr, sl) = (s.remote, s.sl);
        // A newer connection for the same class replaces a stale one (and may take the
        // stale peer's record with it: it is then made anew below). The new queue pair
        // does not exist yet, so any connection of the class is the stale one.
        if let Some(old) = self.peers.superseded(client.endpoint_id, sl, NO_CONN) {
            self.fail_peer(old, Loss::Lost("superseded by a new connection".into()));
        }
        let peer = self.peers.accepted(client.endpoint_id, remote_addr, client.listen_port, || ());
        let up = self.create_conn(peer, sl).and_then(|cid| {
            // Not yet the peer's connection: a refused one is destroyed here, or its
            // queue pair and registered memory would outlive the refusal.
            self.bring_up(cid, remote_info, remote_addr).map(|_| cid).inspect_err(|_| self.discard_conn(cid))
        });
        let cid = match up {
            Ok(cid) => cid,
            Err(e) => {
                tracing::warn!(error = %e, "cannot set up a queue pair for a client");
                self.side_failed(t, bring_up_loss("queue pair set-up", e));
                self.forget_if_gone(peer);
                return false;
            }
        };
        self.peers[peer].conns[sl.index()] = Some(cid);
        let info = self.local_info(cid, remote_addr).expect("just created");
        let Some(s) = self.sides.get_mut(&t) else { return false };
        s.peer = Some(peer);
        s.conn = Some(cid);
        s.phase = SidePhase::ServerWaitReady;
        let (ih, ib) = exchange::info_frame(sl, &info);
        self.side_send(t, &ih, &ib)
    }

    /// The server answered side channel `t` with its queue pair's details (`remote_info`):
    /// ours comes up and the server hears that it has.
    fn server_answered(&mut self, t: Token, remote_info: IbInfo, now: Instant) -> bool {
        let Some(s) = self.sides.get(&t) else { return false };
        let (sl, remote_addr) = (s.sl, s.remote);
        let Some(cid) = s.conn else { return false };
        if let Err(e) = self.bring_up(cid, remote_info, remote_addr) {
            self.side_failed(t, bring_up_loss("queue pair bring-up", e));
            return false;
        }
        let Some(s) = self.sides.get_mut(&t) else { return false };
        s.phase = SidePhase::Established;
        let (rh, rb) = exchange::ready_frame(sl);
        let ok = self.side_send(t, &rh, &rb);
        if let Some(c) = self.conn_mut(cid) {
            c.ready = true;
            tracing::debug!(peer = %c.peer, sl = %c.sl, "queue pair ready (client)");
        }
        Counters::add(&self.core.counters.connections, 1);
        // The peer's limits are known now: what was posted meanwhile can be placed.
        self.place_waiting_posts(cid, now);
        ok
    }

    /// The server accepted us on side channel `t`: our queue pair's details go to it.
    fn side_ready(&mut self, t: Token) -> bool {
        let Some(s) = self.sides.get(&t) else { return false };
        let (sl, remote_addr) = (s.sl, s.remote);
        let Some(info) = s.conn.and_then(|cid| self.local_info(cid, remote_addr)) else {
            self.side_failed(t, Loss::Lost("queue pair vanished".into()));
            return false;
        };
        let Some(s) = self.sides.get_mut(&t) else { return false };
        s.phase = SidePhase::ClientWaitInfo;
        let (ih, ib) = exchange::info_frame(sl, &info);
        self.side_send(t, &ih, &ib)
    }

    fn side_send(&mut self, t: Token, h: &Header, body: &[u8]) -> bool {
        let Some(s) = self.sides.get_mut(&t) else { return false };
        match s.framed.send(h, body) {
            Ok(()) => true,
            Err(e) => {
                self.side_failed(t, Loss::Lost(format!("side channel: {e}")));
                false
            }
        }
    }
}

/// How a failed bring-up ends the connection: a peer whose port description cannot route is a
/// protocol error; anything else (our device refusing the route) loses the peer with the
/// reason.
fn bring_up_loss(what: &str, e: Error) -> Loss {
    match e {
        Error::Protocol { reason, .. } => Loss::Protocol(reason),
        e => Loss::Lost(format!("{what}: {e}")),
    }
}

/// Posts receive buffer `i` of a connection.
pub(crate) fn post_recv<V: Verbs>(c: &mut Conn<V>, i: u32) -> Result<()> {
    let layout = c.link.layout();
    let sge = [Sge::new(c.mem.addr() + layout.recv_off(i) as u64, layout.rs as u32, c.mr.lkey())];
    c.qp.post_recv(&[RecvWr { wr_id: wr_id(WR_RECV, c.id, c.gen_, i), sges: &sge }])
        .map_err(|e| Error::from(e.error))
}
