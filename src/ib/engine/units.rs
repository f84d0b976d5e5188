//! Server-based RDMA transfers as decisions, without the device: a transfer is cut into units
//! by the bulk scheduler; each unit moves straight from or into the op's registered memory
//! when it has some for that stretch, else through a zone buffer (waiting for one, and chopped
//! when the buffer granted is smaller); it waits for send-queue room; its remote side is a walk
//! over the peer's segment list. A transfer keeps its first failure, posts nothing after it,
//! and finishes once, when its bytes are all moved or, failed, when its last unit is back.
//! [`super::xfer`] carries the answers out with verbs: the work requests, the staging copies,
//! the completion of the op.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::comm::BulkScheduler;
use crate::error::{Error, Result};
use crate::flowctl::{Alloc, BufferZones, Grant, ZoneBuf};
use crate::types::{OpId, PeerId};

use super::msg::Segment;

/// A transfer moved by RDMA in units.
pub(crate) struct Xfer {
    pub peer: PeerId,
    pub conn: u32,
    /// true: RDMA_READ remote → local; false: RDMA_WRITE local → remote.
    pub read: bool,
    pub remote: Vec<Segment>,
    /// Offset into the remote segments' logical range where this transfer starts.
    pub remote_off: u64,
    pub local: Local,
    pub total: usize,
    pub done_bytes: usize,
    pub units_out: u32,
    pub failed: Option<Error>,
    pub then: XferThen,
}

/// Local side of a transfer.
pub(crate) enum Local {
    /// An operation's buffer from `base`.
    Op { op: OpId, base: usize },
    /// A header being fetched.
    Vec(Vec<u8>),
}

/// What a finished transfer leads to.
pub(crate) enum XferThen {
    /// Complete the op with the bytes moved.
    CompleteOp(OpId),
    /// A pull or push of a request: complete the op; the request's reply may then go. `end`:
    /// where a push's bytes end in the client's buffer (0 for a pull).
    ReqOp { op: OpId, peer: PeerId, req: u64, end: u64 },
    /// A rendezvous receive: send FIN for `msg`, complete the op.
    RecvDone { op: OpId, msg: u64 },
    /// A fetched request header: deliver the request (then FIN).
    RequestHeader { pending: Box<super::request_in::PendingRequest> },
    /// A fetched reply header: complete the request op (then FIN); `pushed` as the reply said.
    ReplyHeader { op: OpId, status: u32, msg: u64, pushed: u64 },
}

/// What a finished transfer leads to, for the driver to carry out: first the op reference
/// and the FIN, then `then`.
#[must_use]
pub(crate) struct Finished {
    /// The op whose buffer the transfer moved: its reference goes.
    pub release: Option<OpId>,
    /// A FIN to send on the transfer's connection: (connection, message, status).
    pub fin: Option<(u32, u64, u32)>,
    pub then: Outcome,
}

/// The end of a finished transfer.
pub(crate) enum Outcome {
    /// Complete the op.
    Complete(OpId, Result<usize>),
    /// A request's pull or push: the client's buffer holds pushed bytes up to `pushed` (when
    /// it succeeded), the op completes, and the request's reply may then go.
    ReqOp { op: OpId, result: Result<usize>, peer: PeerId, req: u64, pushed: Option<u64> },
    /// A fetched request header, whole: deliver the request.
    Deliver { pending: Box<super::request_in::PendingRequest>, header: Vec<u8> },
    /// A fetched reply header, whole: complete the request op with it.
    Reply { op: OpId, status: u32, header: Vec<u8>, pushed: u64 },
    /// Nothing more (a request header that could not be fetched).
    Nothing,
}

impl Xfer {
    /// What the finished transfer leads to.
    pub fn finished(mut self) -> Finished {
        let result = self.outcome();
        let ok = result.is_ok();
        let release = match self.local {
            Local::Op { op, .. } => Some(op),
            Local::Vec(_) => None,
        };
        let header = match self.local {
            Local::Vec(v) if ok => Some(v),
            _ => None,
        };
        let (fin, then) = match self.then {
            XferThen::CompleteOp(op) => (None, Outcome::Complete(op, result)),
            XferThen::ReqOp { op, peer, req, end } => {
                (None, Outcome::ReqOp { op, result, peer, req, pushed: ok.then_some(end) })
            }
            XferThen::RecvDone { op, msg } => {
                // The sender learns whether its data landed; it releases its buffer either way.
                let st = if ok { super::FIN_OK } else { super::FIN_CANCELLED };
                (Some((self.conn, msg, st)), Outcome::Complete(op, result))
            }
            XferThen::RequestHeader { pending } => match header {
                Some(header) => (None, Outcome::Deliver { pending, header }),
                None => (None, Outcome::Nothing),
            },
            XferThen::ReplyHeader { op, status, msg, pushed } => {
                // The client's header buffer is released whatever came of reading it.
                let fin = Some((self.conn, msg, super::FIN_OK));
                match header {
                    Some(header) => (fin, Outcome::Reply { op, status, header, pushed }),
                    None => {
                        let e = Error::Remote("could not read the reply header".into());
                        (fin, Outcome::Complete(op, Err(e)))
                    }
                }
            }
        };
        Finished { release, fin, then }
    }

    /// Still moving: not failed, so its units may be posted.
    pub fn live(&self) -> bool {
        self.failed.is_none()
    }

    /// What the transfer comes to: the bytes it moved, or its first failure.
    pub fn outcome(&mut self) -> Result<usize> {
        self.failed.take().map_or(Ok(self.total), Err)
    }

    /// The remote pieces of `[off, off + len)` of the transfer, in order.
    pub fn pieces(&self, off: usize, len: usize) -> Pieces<'_> {
        Pieces { segs: &self.remote, skip: self.remote_off + off as u64, left: len as u64 }
    }
}

/// The walk over a remote segment list: (remote address, length, rkey) of each piece of a
/// logical range. No allocation: a unit's pieces are read twice (counted, then posted).
#[derive(Clone)]
pub(crate) struct Pieces<'a> {
    segs: &'a [Segment],
    /// Logical bytes still to skip before the range.
    skip: u64,
    /// Bytes of the range not yet returned.
    left: u64,
}

impl Iterator for Pieces<'_> {
    type Item = (u64, u32, u32);

    fn next(&mut self) -> Option<(u64, u32, u32)> {
        while self.left > 0 {
            let (s, rest) = self.segs.split_first()?;
            self.segs = rest;
            let sl = u64::from(s.len);
            if self.skip >= sl {
                self.skip -= sl;
                continue;
            }
            let n = (sl - self.skip).min(self.left);
            let piece = (s.addr + self.skip, n as u32, s.rkey);
            self.left -= n;
            self.skip = 0;
            return Some(piece);
        }
        None
    }
}

/// What a zone request names: (transfer, offset, length) of the unit it is for.
pub(crate) type ZoneToken = (u64, usize, usize);

/// What is left of a unit a zone buffer smaller than it chopped, to be staged again. Its bytes
/// were counted by the scheduler when the unit was handed out, for `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rest {
    pub peer: PeerId,
    pub off: usize,
    pub len: usize,
}

/// One unit of a transfer, handed out and not yet posted: `[off, off + len)` of transfer
/// `xfer`, through `zone` or (None) straight from the op's registered memory.
#[derive(Debug)]
pub(crate) struct Unit {
    pub xfer: u64,
    pub peer: PeerId,
    pub off: usize,
    pub len: usize,
    pub zone: Option<ZoneBuf>,
}

/// A unit waiting for send-queue room.
pub(crate) type Deferred = Unit;

/// Where a unit's local bytes can be, as the driver found it.
pub(crate) enum Room<'a> {
    /// The op's registered memory covers the unit.
    Direct,
    /// It needs a zone buffer from these zones.
    Zones(&'a mut BufferZones<ZoneToken>),
    /// It needs a zone buffer, and the zones could not be made.
    NoZones(Error),
}

/// What became of a unit the driver asked about.
#[derive(Debug)]
#[must_use]
pub(crate) enum Step {
    /// Post it (see [`Units::ready_to_post`]).
    Post(Unit),
    /// Nothing to do now: it waits for a zone buffer or send-queue room, or was dropped.
    Idle,
    /// The unit was dropped and its transfer is over: finish it ([`Units::finish`]).
    Finish(u64),
}

/// What the driver does when a unit returned.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(crate) struct Returned {
    /// Copy the zone buffer's bytes into the transfer's local side (a read, still live),
    /// before the buffer goes back.
    pub copy_in: bool,
    /// The transfer is over: finish it.
    pub finish: bool,
}

/// The engine's transfers and their units.
pub(crate) struct Units {
    pub xfers: FxHashMap<u64, Xfer>,
    pub bulk: BulkScheduler<u64>,
    /// Units waiting for send-queue room, in the order they were ready.
    pub deferred: VecDeque<Deferred>,
    next: u64,
}

impl Units {
    pub fn new(bulk: BulkScheduler<u64>) -> Units {
        Units { xfers: FxHashMap::default(), bulk, deferred: VecDeque::new(), next: 1 }
    }

    /// Enters a transfer. Returns its id, and true when it is finished already (nothing to
    /// move).
    pub fn start(&mut self, xf: Xfer) -> (u64, bool) {
        let id = self.next;
        self.next += 1;
        let (peer, total) = (xf.peer, xf.total);
        self.xfers.insert(id, xf);
        if total == 0 {
            return (id, true);
        }
        self.bulk.add(id, peer, total);
        (id, false)
    }

    /// The next unit the scheduler lets out: (transfer, offset, length).
    pub fn next_unit(&mut self) -> Option<(u64, usize, usize)> {
        self.bulk.next_unit().map(|u| (u.key, u.offset, u.len))
    }

    /// Whether a unit of `x` needs local memory found: false for a transfer gone or failed,
    /// whose units [`Units::stage`] drops whatever room it is given.
    pub fn wants_room(&self, x: u64) -> bool {
        self.xfers.get(&x).is_some_and(Xfer::live)
    }

    /// A unit the scheduler handed out, with the local memory the driver found for it: post it
    /// directly, or take a zone buffer (now, or later from the zones' grants). Also returns
    /// the rest of the range when the zone buffer granted is smaller (see [`Units::granted`]).
    pub fn stage(&mut self, x: u64, off: usize, len: usize, room: Room<'_>) -> (Step, Option<Rest>) {
        // A unit of a transfer gone is not counted by the scheduler any more (its peer was
        // settled, or the transfer removed with its units).
        let Some(xf) = self.xfers.get(&x) else { return (Step::Idle, None) };
        let peer = xf.peer;
        if !xf.live() {
            self.bulk.unit_done(peer, len);
            return (Step::Idle, None);
        }
        let e = match room {
            Room::Direct => return (Step::Post(Unit { xfer: x, peer, off, len, zone: None }), None),
            Room::Zones(z) => match z.alloc(peer, len, (x, off, len)) {
                Ok(Alloc::Granted(g)) => return self.granted(g, z),
                Ok(Alloc::Wait) => return (Step::Idle, None),
                Err(e) => e,
            },
            Room::NoZones(e) => e,
        };
        self.bulk.unit_done(peer, len);
        (self.fail(x, e), None)
    }

    /// A zone buffer granted for a unit (its token: the transfer, offset and length wanted),
    /// carrying `g.len` bytes: the unit to post, and the rest of the range (a chopped unit)
    /// for the driver to stage again.
    pub fn granted(
        &mut self,
        g: Grant<ZoneToken>,
        zones: &mut BufferZones<ZoneToken>,
    ) -> (Step, Option<Rest>) {
        let Grant { client: peer, token: (x, off, want), buf: zb, len: got } = g;
        let got = got.min(want);
        if !self.wants_room(x) {
            let _ = zones.free(zb);
            self.bulk.unit_done(peer, want);
            return (Step::Idle, None);
        }
        let rest = (got < want).then_some(Rest { peer, off: off + got, len: want - got });
        (Step::Post(Unit { xfer: x, peer, off, len: got, zone: Some(zb) }), rest)
    }

    /// The rest of a chopped unit of `x`, staged as [`Units::stage`] stages a unit. Unlike a
    /// unit the scheduler hands out, a rest outlives its transfer when posting the first part
    /// ended it (its connection was gone): the scheduler still counts the rest's bytes, so they
    /// go back here, or they would hold the peer's and the endpoint's RDMA caps for good.
    pub fn stage_rest(&mut self, x: u64, r: Rest, room: Room<'_>) -> (Step, Option<Rest>) {
        if !self.xfers.contains_key(&x) {
            self.bulk.unit_done(r.peer, r.len);
            return (Step::Idle, None);
        }
        self.stage(x, r.off, r.len, room)
    }

    /// A unit about to be posted, with the state of its connection (None: gone; else whether
    /// it is ready and has room for `n` work requests). Returns the unit to post now, with its
    /// connection and direction; otherwise it was deferred, or dropped (and maybe its transfer
    /// is over).
    pub fn ready_to_post(
        &mut self,
        u: Unit,
        link: impl FnOnce(u32, u32) -> Option<bool>,
        zones: Option<&mut BufferZones<ZoneToken>>,
    ) -> std::result::Result<(Unit, u32, bool), Step> {
        let Some(xf) = self.xfers.get(&u.xfer).filter(|xf| xf.live()) else {
            // Cancelled or failed meanwhile: nothing more moves for it.
            self.drop_unit(u, zones);
            return Err(Step::Idle);
        };
        let (cid, read) = (xf.conn, xf.read);
        let n = xf.pieces(u.off, u.len).count() as u32;
        match link(cid, n) {
            None => {
                let (x, peer) = (u.xfer, u.peer);
                self.drop_unit(u, zones);
                Err(self.fail(x, Error::PeerLost { peer, reason: "connection gone".into() }))
            }
            Some(false) => {
                self.deferred.push_back(u);
                Err(Step::Idle)
            }
            Some(true) => Ok((u, cid, read)),
        }
    }

    /// A unit that could not be posted for `e` (its local memory is not registered): dropped,
    /// and its transfer failed.
    pub fn post_failed(&mut self, u: Unit, e: Error, zones: Option<&mut BufferZones<ZoneToken>>) -> Step {
        let x = u.xfer;
        self.drop_unit(u, zones);
        self.fail(x, e)
    }

    /// A unit's work requests went to the send queue.
    pub fn posted(&mut self, x: u64) {
        if let Some(xf) = self.xfers.get_mut(&x) {
            xf.units_out += 1;
        }
    }

    /// A unit's last work request completed. The driver copies in if told, gives the unit's
    /// zone buffer back, and finishes the transfer if told.
    pub fn unit_done(&mut self, x: u64, len: usize, zoned: bool, read: bool) -> Returned {
        let Some(xf) = self.xfers.get_mut(&x) else {
            // Settled with its peer already.
            return Returned { copy_in: false, finish: false };
        };
        self.bulk.unit_done(xf.peer, len);
        let copy_in = zoned && read && xf.live();
        xf.units_out = xf.units_out.saturating_sub(1);
        xf.done_bytes += len;
        let finish = xf.done_bytes >= xf.total || (!xf.live() && xf.units_out == 0);
        Returned { copy_in, finish }
    }

    /// `x` fails with `e` (the first failure is kept): its units not handed out yet are
    /// dropped; it finishes once its units out are back.
    pub fn fail(&mut self, x: u64, e: Error) -> Step {
        let Some(xf) = self.xfers.get_mut(&x) else { return Step::Idle };
        if xf.failed.is_none() {
            xf.failed = Some(e);
        }
        self.bulk.remove(&x);
        if xf.units_out == 0 { Step::Finish(x) } else { Step::Idle }
    }

    /// Stops the transfers into or out of an op's buffer (cancel): units in flight finish,
    /// nothing new is posted. Returns the transfers over at once.
    pub fn abort_op(&mut self, op: OpId) -> Vec<u64> {
        let xs: Vec<u64> = self
            .xfers
            .iter()
            .filter(|(_, x)| matches!(x.local, Local::Op { op: o, .. } if o == op))
            .map(|(k, _)| *k)
            .collect();
        xs.into_iter()
            .filter_map(|x| match self.fail(x, Error::Cancelled) {
                Step::Finish(x) => Some(x),
                _ => None,
            })
            .collect()
    }

    /// Takes a finished transfer out, with its units not handed out yet.
    pub fn finish(&mut self, x: u64) -> Option<Xfer> {
        let xf = self.xfers.remove(&x)?;
        self.bulk.remove(&x);
        Some(xf)
    }

    /// A unit that will not be posted: its zone buffer goes back and the scheduler stops
    /// counting its bytes as in flight.
    fn drop_unit(&mut self, u: Unit, zones: Option<&mut BufferZones<ZoneToken>>) {
        if let (Some(z), Some(zb)) = (zones, u.zone) {
            let _ = z.free(zb);
        }
        self.bulk.unit_done(u.peer, u.len);
    }
}

#[cfg(test)]
#[path = "units_tests.rs"]
mod tests;
