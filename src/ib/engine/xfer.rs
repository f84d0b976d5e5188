//! Server-based RDMA carried out: the units [`super::units`] hands out are posted as
//! RDMA_READ / RDMA_WRITE work requests, straight to or from registered buffers or through
//! zone buffers (with the staging copies), and a finished transfer completes what it was for.
//! Which memory a unit may use directly (a pool buffer, a registered file-mapping stretch) is
//! found here, where the registrations are.

use bytes::Bytes;

use crate::buffers::buf::{OpBuf, RecvBuf, RegisteredBuf, SendBuf};
use crate::error::{Error, Result};
use crate::flowctl::{BufferZones, Grant, ZoneBuf, ZoneConfig};
use crate::ib::verbs::*;
use crate::types::{OpId, PeerId};

use super::msg::Segment;
use super::reg::{DmaRegion, register_region};
use super::stretches::{self, Stretch, Stretches};
use super::units::{Finished, Outcome, Rest, Room, Step, Unit, ZoneToken};
use super::{Dev, Local, SqDone, State, WR_SEND, Xfer, XferThen, wr_id};

/// Zone classes: 64 KiB … 2 MiB (as in PVFS over InfiniBand).
const ZONE_SIZES: [usize; 6] = [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20];

/// The server's zone buffers: one registered region carved into size classes.
pub(crate) struct Zones<V: Verbs> {
    pub zones: BufferZones<(u64, usize, usize)>,
    // Drop order: the registration before the memory.
    pub mr: V::Mr,
    pub mem: DmaRegion,
}

/// An address-contiguous stretch of an op's buffer inside a [`crate::FileMap`], registered
/// through the pin-down cache as crate-owned memory (it stays cached after the op until the
/// mapping goes away), so units that fall inside it move with no copy.
pub(crate) struct DirectRun {
    /// Offset in the op's buffer.
    off: usize,
    addr: u64,
    len: usize,
    lkey: u32,
    pub(crate) reg: crate::regcache::RegRef,
}

/// Registers an exposed buffer with its own registration (revoked by dropping it).
pub(crate) fn register_exposure<V: Verbs>(
    dev: &Dev<V>,
    buf: &RegisteredBuf,
    access: AccessFlags,
) -> Result<V::Mr> {
    super::reg::register_buf(dev, buf, access)
}

/// The zones in `slot`, made on first need: a server whose units all move straight from
/// registered memory never allocates or registers them.
fn zones_in<'a, V: Verbs>(
    slot: &'a mut Option<Zones<V>>,
    dev: &Dev<V>,
    per_class: usize,
) -> Result<&'a mut BufferZones<ZoneToken>> {
    if slot.is_none() {
        let classes: Vec<(usize, u32)> =
            ZONE_SIZES.iter().map(|&s| (s, (per_class / s).max(1) as u32)).collect();
        let cfg = ZoneConfig::default().classes(&classes);
        let zones = BufferZones::new(&cfg)?;
        let mem = DmaRegion::new(zones.total_bytes())?;
        let mr = register_region(dev, &mem, AccessFlags::LOCAL_WRITE)?;
        *slot = Some(Zones { zones, mr, mem });
    }
    Ok(&mut slot.as_mut().expect("just made").zones)
}

impl<V: Verbs> State<V> {
    /// Starts a transfer and counts it as a reference to its op's buffer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_xfer(
        &mut self,
        peer: PeerId,
        cid: u32,
        read: bool,
        remote: Vec<Segment>,
        remote_off: u64,
        local: Local,
        total: usize,
        then: XferThen,
    ) {
        if let Local::Op { op, .. } = &local
            && let Some(o) = self.ops.get_mut(op)
        {
            o.refs += 1;
            if o.x.direct.is_empty() {
                self.register_mapped(*op);
            }
        }
        let xf = Xfer {
            peer,
            conn: cid,
            read,
            remote,
            remote_off,
            local,
            total,
            done_bytes: 0,
            units_out: 0,
            failed: None,
            then,
        };
        match self.units.start(xf) {
            (id, true) => self.finish_xfer(id),
            (_, false) => self.pump_units(),
        }
    }

    /// Posts whatever units the scheduler, the zones and the send queues allow.
    pub(crate) fn pump_units(&mut self) {
        // Units that waited for send-queue room, once each (one without room waits again).
        let n = self.units.deferred.len();
        for _ in 0..n {
            let Some(d) = self.units.deferred.pop_front() else { break };
            self.post_unit(d);
        }
        // Zone buffers granted to parked units.
        while let Some(g) = self.zones.as_mut().and_then(|z| z.zones.poll_grant()) {
            self.zone_granted(g);
        }
        while let Some((x, off, len)) = self.units.next_unit() {
            self.stage_unit(x, off, len);
        }
    }

    /// Carries out what became of a unit.
    fn step(&mut self, s: Step) {
        match s {
            Step::Post(u) => self.post_unit(u),
            Step::Idle => {}
            Step::Finish(x) => self.finish_xfer(x),
        }
    }

    /// The registered address and key of `[base + off, +len)` of an op's buffer, when it is a
    /// pool buffer or lies in one registered stretch of a file mapping (no staging needed).
    fn direct_local(&self, x: u64, off: usize, len: usize) -> Option<(u64, u32)> {
        let Local::Op { op, base } = &self.units.xfers.get(&x)?.local else { return None };
        let o = self.ops.get(op)?;
        let at = base + off;
        match &o.buf {
            OpBuf::Recv(RecvBuf::Registered(b)) | OpBuf::Send(SendBuf::Registered(b)) => {
                (at + len <= b.len() && b.is_registered()).then(|| ((b.addr() + at) as u64, b.keys().lkey))
            }
            _ => {
                o.x.direct
                    .iter()
                    .find(|r| r.off <= at && at + len <= r.off + r.len)
                    .map(|r| (r.addr + (at - r.off) as u64, r.lkey))
            }
        }
    }

    /// Registers the stretches of an op's buffer that lie in file mappings, or in any lent
    /// memory the cache keeps registered (see [`DirectRun`], [`stretches::origin`]), once
    /// they are moved a second time (see [`stretches::SeenOnce`]). Registration failures only mean those
    /// units are staged.
    fn register_mapped(&mut self, op: OpId) {
        let Some(o) = self.ops.get(&op) else { return };
        let mut stretches = Stretches::default();
        let mut add = |p: &[u8]| stretches.add(p.as_ptr() as usize, p.len());
        match &o.buf {
            OpBuf::Send(SendBuf::Registered(_)) | OpBuf::Recv(RecvBuf::Registered(_)) | OpBuf::None => return,
            OpBuf::Send(s) => s.for_each_slice(0, s.len(), &mut add),
            OpBuf::Recv(r) => r.for_each_slice(0, r.capacity(), &mut add),
        }
        let stretches = stretches.into_vec();
        let mut direct = Vec::with_capacity(stretches.len());
        {
            let State { cache, mapped_seen, .. } = self;
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            let keeps_foreign = c.keeps_foreign();
            let rw = crate::types::Access::READ_WRITE;
            for st in stretches {
                let Some(origin) = stretches::origin(st, keeps_foreign, crate::buffers::filemap::is_mapped)
                else {
                    continue;
                };
                let Stretch { off, addr, len } = st;
                // Registered already: direct. Seen once before: register, then direct. New:
                // staged this time (see `SeenOnce`).
                let reg = match c.acquire_if_registered(addr, len, rw) {
                    Some(r) => Some(r),
                    None if mapped_seen.seen_before((addr, len)) => match c.acquire(addr, len, rw, origin) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            tracing::debug!(error = %e, "registering a lent buffer failed; staging it");
                            None
                        }
                    },
                    None => None,
                };
                if let Some(reg) = reg {
                    let lkey = reg.keys().lkey;
                    direct.push(DirectRun { off, addr: addr as u64, len, lkey, reg });
                }
            }
        }
        if let Some(o) = self.ops.get_mut(&op) {
            o.x.direct = direct;
        }
    }

    /// A unit the scheduler handed out: straight from the op's registered memory, or
    /// through a zone buffer.
    fn stage_unit(&mut self, x: u64, off: usize, len: usize) {
        self.stage_range(x, off, len, None);
    }

    /// Stages `[off, off + len)` of `x`: a unit, or (`rest`) what a zone buffer smaller than
    /// a unit left of it; the rest of this one in turn, if a zone buffer chops it again.
    fn stage_range(&mut self, x: u64, off: usize, len: usize, rest: Option<Rest>) {
        // A unit of a transfer gone or failed is dropped by `stage`: no zones are made for it.
        let direct = !self.units.wants_room(x) || self.direct_local(x, off, len).is_some();
        let State { units, zones, dev, s, .. } = self;
        let room = if direct {
            Room::Direct
        } else {
            match zones_in(zones, dev, s.cfg.ib.zone_bytes_per_class) {
                Ok(z) => Room::Zones(z),
                Err(e) => Room::NoZones(e),
            }
        };
        let (s, more) = match rest {
            Some(r) => units.stage_rest(x, r, room),
            None => units.stage(x, off, len, room),
        };
        self.step(s);
        if let Some(r) = more {
            self.stage_range(x, r.off, r.len, Some(r));
        }
    }

    /// A zone buffer granted for a unit of a transfer: move what it carries through it and
    /// ask again for the rest (a chopped unit).
    pub(crate) fn zone_granted(&mut self, g: Grant<ZoneToken>) {
        let Some(z) = self.zones.as_mut() else { return };
        let x = g.token.0;
        let (s, rest) = self.units.granted(g, &mut z.zones);
        self.step(s);
        if let Some(r) = rest {
            self.stage_range(x, r.off, r.len, Some(r));
        }
    }

    /// Posts the RDMA work requests of one unit; only the last is signaled.
    fn post_unit(&mut self, u: Unit) {
        let State { units, conns, zones, .. } = self;
        let link = |cid: u32, n: u32| {
            let c = conns.get(cid as usize).and_then(Option::as_ref)?;
            Some(c.ready && c.link.has_room(n))
        };
        let (u, cid, read) = match units.ready_to_post(u, link, zones.as_mut().map(|z| &mut z.zones)) {
            Ok(go) => go,
            Err(s) => return self.step(s),
        };
        let (x, off, len, zone) = (u.xfer, u.off, u.len, u.zone);
        // Local memory: the op's own registered buffer, or the zone buffer.
        let (laddr, lkey) = match zone {
            Some(zb) => {
                let z = self.zones.as_ref().expect("zone granted");
                let zoff = z.zones.offset(zb);
                if !read {
                    // Outgoing data goes into the zone buffer first.
                    let local = &self.units.xfers[&x].local;
                    stage_out(local, &self.ops, off, len, &z.mem, zoff);
                    if matches!(local, Local::Op { .. }) {
                        self.core.counters.copied(len);
                    }
                }
                (z.mem.addr() + zoff as u64, z.mr.lkey())
            }
            None => match self.direct_local(x, off, len) {
                Some(l) => l,
                None => {
                    let e = Error::misuse("transfer buffer is not registered");
                    let s = self.units.post_failed(u, e, None);
                    return self.step(s);
                }
            },
        };
        let State { units, conns, .. } = self;
        let Some(c) = conns.get_mut(cid as usize).and_then(Option::as_mut) else { return };
        let pieces = units.xfers[&x].pieces(off, len);
        let n = pieces.clone().count();
        let sges: Vec<[Sge; 1]> = pieces
            .clone()
            .scan(0u64, |at, (_, plen, _)| {
                let sge = [Sge::new(laddr + *at, plen, lkey)];
                *at += u64::from(plen);
                Some(sge)
            })
            .collect();
        let first = c.link.unit(n, read, SqDone::Unit { xfer: x, offset: off, len, zone, read });
        let wrs: Vec<SendWr<'_>> = pieces
            .enumerate()
            .map(|(i, (raddr, _, rkey))| {
                let op = if read {
                    SendOp::RdmaRead { remote_addr: raddr, rkey }
                } else {
                    SendOp::RdmaWrite { remote_addr: raddr, rkey }
                };
                let flags = if i + 1 == n { SendFlags::SIGNALED } else { SendFlags::NONE };
                let seq = first.wrapping_add(i as u32);
                SendWr { wr_id: wr_id(WR_SEND, c.id, c.gen_, seq), op, sges: &sges[i], flags }
            })
            .collect();
        let posted = c.qp.post_send(&wrs);
        units.posted(x);
        if let Err(e) = posted {
            let peer = u.peer;
            self.fail_peer(peer, super::Loss::Lost(format!("post_send: {}", e.error)));
        }
    }

    /// A unit's last work request completed (its RDMA_READs no longer hold back fenced sends).
    pub(crate) fn unit_done(&mut self, x: u64, off: usize, len: usize, zone: Option<ZoneBuf>, read: bool) {
        let r = self.units.unit_done(x, len, zone.is_some(), read);
        if let Some(zb) = zone {
            if r.copy_in {
                let State { zones, units, ops, .. } = self;
                let z = zones.as_ref().expect("zone in use");
                if let Some(xf) = units.xfers.get_mut(&x) {
                    stage_in(&mut xf.local, ops, off, len, &z.mem, z.zones.offset(zb));
                    // Payload, not a fetched header.
                    if matches!(xf.local, Local::Op { .. }) {
                        self.core.counters.copied(len);
                    }
                }
            }
            if let Some(z) = self.zones.as_mut() {
                let _ = z.zones.free(zb);
            }
        }
        if r.finish {
            self.finish_xfer(x);
        }
    }

    /// Stops the transfers into or out of an op's buffer (cancel): units in flight finish,
    /// nothing new is posted.
    pub(crate) fn abort_xfers_of(&mut self, op: OpId) {
        for x in self.units.abort_op(op) {
            self.finish_xfer(x);
        }
    }

    fn finish_xfer(&mut self, x: u64) {
        let Some(xf) = self.units.finish(x) else { return };
        let Finished { release, fin, then } = xf.finished();
        if let Some(op) = release {
            self.ops.release_ref(op);
        }
        if let Some((conn, msg, st)) = fin {
            self.send_fin(conn, msg, st, 0);
        }
        match then {
            Outcome::Complete(op, result) => self.ops.complete(op, result),
            Outcome::ReqOp { op, result, peer, req, pushed } => {
                if let Some(end) = pushed
                    && let Some(r) = self.sreqs.get_mut(peer, req)
                {
                    r.x.pushed_to(end);
                }
                self.ops.complete(op, result);
                self.xfer_finished_for_req(peer, req);
            }
            Outcome::Deliver { pending, header } => self.deliver_request(*pending, Bytes::from(header)),
            Outcome::Reply { op, status, header, pushed } => {
                self.complete_request(op, status, Bytes::from(header), pushed)
            }
            Outcome::Nothing => {}
        }
    }
}

/// Copies `len` bytes at `off` of a transfer's local side into zone memory at `zoff`, piece by
/// piece straight from the caller's buffer (no intermediate copy).
fn stage_out(local: &Local, ops: &super::Ops, off: usize, len: usize, mem: &DmaRegion, zoff: usize) {
    let mut at = zoff;
    let mut put = |piece: &[u8]| {
        mem.write_at(at, piece);
        at += piece.len();
    };
    match local {
        Local::Op { op, base } => match ops.get(op).map(|o| &o.buf) {
            Some(OpBuf::Send(s)) => s.for_each_slice(base + off, len, put),
            Some(OpBuf::Recv(r)) => r.for_each_slice(base + off, len, put),
            _ => {}
        },
        Local::Vec(v) => {
            let end = (off + len).min(v.len());
            if off < end {
                put(&v[off..end]);
            }
        }
    }
}

/// Copies `len` bytes of zone memory at `zoff` to `off` of a transfer's local side, straight
/// into the caller's buffer.
fn stage_in(local: &mut Local, ops: &mut super::Ops, off: usize, len: usize, mem: &DmaRegion, zoff: usize) {
    match local {
        Local::Op { op, base } => {
            if let Some(OpBuf::Recv(r)) = ops.get_mut(op).map(|o| &mut o.buf) {
                let mut done = 0;
                while done < len {
                    let Some(dst) = r.slice_at_mut(*base + off + done) else { break };
                    let n = dst.len().min(len - done);
                    mem.read_at(zoff + done, &mut dst[..n]);
                    done += n;
                }
            }
        }
        Local::Vec(v) => {
            let end = (off + len).min(v.len());
            if off < end {
                mem.read_at(zoff, &mut v[off..end]);
            }
        }
    }
}
