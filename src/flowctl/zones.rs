//! Server buffer zones: the registered buffers server-based RDMA moves data through.
//!
//! All RDMA buffers of a server are allocated and registered once, at start-up, and organised
//! in zones of equal-size buffers: 64 KiB, 128 KiB, … 2 MiB. A transfer takes a buffer from
//! the zone of its size, else from a bigger zone, else the biggest smaller buffer free — and
//! then moves in pieces ("chopping"). There is no dynamic fragmentation and memory is bounded
//! by construction.
//!
//! On top of the paper's scheme: a per-client **fair share**. A client already holding at
//! least `budget / active clients` bytes cannot take more while another client waits, and
//! waiting clients are served round-robin, so one greedy client cannot starve the others.
//!
//! [`BufferZones`] hands out identifiers ([`ZoneBuf`]) of buffers the engine owns; it never
//! touches memory and does not allocate per buffer.

use std::collections::{HashMap, VecDeque};

use crate::error::{Error, Result};
use crate::types::PeerId;

/// Default zones: (buffer size, count). Six classes from 64 KiB to 2 MiB as in PVFS over InfiniBand,
/// 8 MiB each (48 MiB in all): any class alone can hold two double-buffered 2 MiB transfer
/// units, and small transfers get many buffers.
pub const DEFAULT_ZONE_CLASSES: [(usize, u32); 6] =
    [(64 << 10, 128), (128 << 10, 64), (256 << 10, 32), (512 << 10, 16), (1 << 20, 8), (2 << 20, 4)];
/// Largest total zone memory accepted (64 GiB): a typo in a count must not pin the machine.
pub const MAX_ZONE_BYTES: usize = 64 << 30;
/// Most classes (class ids are a `u8`).
const MAX_CLASSES: usize = 32;
/// Default bound on waiting allocation requests across all clients: beyond it `alloc` refuses
/// with [`Error::Exhausted`], so the wait queues cannot grow without limit. Zones take no peer
/// input directly (the engine decides transfer sizes), so their errors are all local.
pub const DEFAULT_MAX_WAITING: usize = 4096;

/// Zone geometry and limits.
///
/// ```
/// use ionet::internals::flowctl::ZoneConfig;
/// let cfg = ZoneConfig::default().classes(&[(64 << 10, 16), (2 << 20, 2)]);
/// assert!(cfg.validate().is_ok());
/// assert_eq!(cfg.total_bytes(), 16 * (64 << 10) + 2 * (2 << 20));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    pub(crate) classes: Vec<(usize, u32)>,
    pub(crate) max_waiting: usize,
}

impl Default for ZoneConfig {
    fn default() -> Self {
        ZoneConfig { classes: DEFAULT_ZONE_CLASSES.to_vec(), max_waiting: DEFAULT_MAX_WAITING }
    }
}

impl ZoneConfig {
    /// The zones as (buffer size, buffer count), sizes strictly increasing (default
    /// [`DEFAULT_ZONE_CLASSES`]).
    pub fn classes(mut self, classes: &[(usize, u32)]) -> Self {
        self.classes = classes.to_vec();
        self
    }

    /// Most waiting requests across all clients (default [`DEFAULT_MAX_WAITING`]).
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n;
        self
    }

    /// Total bytes of all zones (saturating; `validate` rejects totals over the limit).
    pub fn total_bytes(&self) -> usize {
        self.classes
            .iter()
            .fold(0usize, |acc, &(size, n)| acc.saturating_add(size.saturating_mul(n as usize)))
    }

    /// Checks the rules.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] naming the first rule broken.
    pub fn validate(&self) -> Result<()> {
        if self.classes.is_empty() || self.classes.len() > MAX_CLASSES {
            return Err(Error::misuse(format!("zones need 1..={MAX_CLASSES} classes")));
        }
        if self.classes.iter().any(|&(size, n)| size == 0 || n == 0) {
            return Err(Error::misuse("zone buffer sizes and counts must be at least 1"));
        }
        if self.classes.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(Error::misuse("zone buffer sizes must be strictly increasing"));
        }
        if self.total_bytes() > MAX_ZONE_BYTES {
            return Err(Error::misuse(format!("zones total more than {MAX_ZONE_BYTES} bytes")));
        }
        if self.max_waiting == 0 {
            return Err(Error::misuse("max_waiting must be at least 1"));
        }
        Ok(())
    }
}

/// Identifies one zone buffer: its class and index within the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZoneBuf {
    class: u8,
    index: u32,
}

impl ZoneBuf {
    /// Class (zone) index, smallest buffers first.
    pub fn class(self) -> u8 {
        self.class
    }

    /// Index within the class.
    pub fn index(self) -> u32 {
        self.index
    }
}

/// A buffer given to a client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant<T> {
    /// The client.
    pub client: PeerId,
    /// The caller's token for the request.
    pub token: T,
    /// The buffer.
    pub buf: ZoneBuf,
    /// Bytes of the request this buffer carries: `min(buffer size, wanted)`. Less than wanted
    /// means the transfer is chopped: ask again for the rest.
    pub len: usize,
}

/// Result of [`BufferZones::alloc`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Alloc<T> {
    /// A buffer now.
    Granted(Grant<T>),
    /// Queued; the grant will come out of [`BufferZones::poll_grant`].
    Wait,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZoneStats {
    /// Buffers granted (at once or after waiting).
    pub grants: u64,
    /// Requests that had to wait.
    pub waits: u64,
    /// Grants from a bigger zone than the exact one.
    pub bigger: u64,
    /// Grants smaller than the request (chopped transfers).
    pub chopped: u64,
    /// Bytes currently held by clients.
    pub held_bytes: u64,
}

#[derive(Debug)]
struct Class {
    size: usize,
    /// Byte offset of the class's first buffer in the engine's zone memory.
    base: usize,
    /// Free buffer indices (a stack, pre-allocated to the class size).
    free: Vec<u32>,
    owner: Vec<Option<PeerId>>,
}

#[derive(Debug)]
struct Client<T> {
    held: usize,
    waiting: VecDeque<(usize, T)>,
    in_rr: bool,
}

/// The server's buffer zones.
///
/// # Driving it (the IB engine, server side)
///
/// - Allocate [`ZoneConfig::total_bytes`] of memory once and register it; buffer `b` lives at
///   [`BufferZones::offset`]`(b)` and is [`BufferZones::size`]`(b)` bytes long.
/// - To move a transfer unit: [`BufferZones::alloc`]. On `Granted`, post the RDMA for
///   `grant.len` bytes; if `len` is less than wanted, ask again for the rest. On `Wait`, park
///   the transfer.
/// - When a buffer's data has gone to disk (writes) or to the client (reads):
///   [`BufferZones::free`], then deliver every [`BufferZones::poll_grant`] to its parked
///   transfer.
/// - When a client is lost: [`BufferZones::release_client`] (after its RDMA has been flushed)
///   and fail the returned waiting tokens; then drain `poll_grant`.
#[derive(Debug)]
pub struct BufferZones<T> {
    classes: Vec<Class>,
    total: usize,
    free_bufs: usize,
    clients: HashMap<PeerId, Client<T>>,
    /// Clients with waiting requests, in service order.
    rr: VecDeque<PeerId>,
    waiting: usize,
    max_waiting: usize,
    ready: VecDeque<Grant<T>>,
    stats: ZoneStats,
}

impl<T> BufferZones<T> {
    /// Zones with the geometry of `cfg`, all free.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when `cfg` fails [`ZoneConfig::validate`].
    pub fn new(cfg: &ZoneConfig) -> Result<Self> {
        cfg.validate()?;
        let mut base = 0;
        let mut classes = Vec::with_capacity(cfg.classes.len());
        for &(size, n) in &cfg.classes {
            // Pop order 0, 1, 2, … (cosmetic: low offsets first).
            classes.push(Class { size, base, free: (0..n).rev().collect(), owner: vec![None; n as usize] });
            base += size * n as usize;
        }
        let free_bufs = cfg.classes.iter().map(|&(_, n)| n as usize).sum();
        Ok(BufferZones {
            classes,
            total: base,
            free_bufs,
            clients: HashMap::new(),
            rr: VecDeque::new(),
            waiting: 0,
            max_waiting: cfg.max_waiting,
            ready: VecDeque::new(),
            stats: ZoneStats::default(),
        })
    }

    /// Asks for a buffer for up to `want` bytes of `client`'s transfer.
    ///
    /// Granted at once when the client has nothing waiting already, is within its fair share
    /// (or nobody else waits), and any buffer is free; otherwise queued behind the client's
    /// earlier requests.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] for `want == 0`; [`Error::Exhausted`] when the request would have to
    /// wait and [`ZoneConfig::max_waiting`] requests already do.
    pub fn alloc(&mut self, client: PeerId, want: usize, token: T) -> Result<Alloc<T>> {
        if want == 0 {
            return Err(Error::misuse("zone allocation of zero bytes"));
        }
        let idle = self.clients.get(&client).is_none_or(|c| c.waiting.is_empty());
        if idle && self.free_bufs > 0 && self.eligible(client, self.rr.len()) {
            let (buf, len) = self.take(client, want);
            return Ok(Alloc::Granted(Grant { client, token, buf, len }));
        }
        if self.waiting >= self.max_waiting {
            return Err(Error::Exhausted(format!("{} zone requests already waiting", self.waiting)));
        }
        let c = self.clients.entry(client).or_insert_with(|| Client {
            held: 0,
            waiting: VecDeque::new(),
            in_rr: false,
        });
        c.waiting.push_back((want, token));
        if !c.in_rr {
            c.in_rr = true;
            self.rr.push_back(client);
        }
        self.waiting += 1;
        self.stats.waits += 1;
        // Its arrival changed the fair share; nothing else to do (a waiter only shrinks others'
        // eligibility).
        Ok(Alloc::Wait)
    }

    /// Gives a buffer back and serves waiting requests with it.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] when the buffer is not currently granted.
    pub fn free(&mut self, buf: ZoneBuf) -> Result<()> {
        let class = self
            .classes
            .get_mut(usize::from(buf.class))
            .ok_or_else(|| Error::misuse("no such zone class"))?;
        let owner =
            class.owner.get_mut(buf.index as usize).ok_or_else(|| Error::misuse("no such zone buffer"))?;
        let Some(client) = owner.take() else { return Err(Error::misuse("zone buffer freed twice")) };
        class.free.push(buf.index);
        let size = class.size;
        self.free_bufs += 1;
        self.stats.held_bytes -= size as u64;
        let c = self.clients.get_mut(&client).expect("owner of a held buffer has a client record");
        c.held -= size;
        self.forget_if_idle(client);
        self.dispatch();
        Ok(())
    }

    /// Frees everything `client` holds and drops its waiting requests (a lost client: call it
    /// once the client's RDMA operations have been flushed). Returns the tokens of the dropped
    /// requests, in order, so the engine can fail them.
    pub fn release_client(&mut self, client: PeerId) -> Vec<T> {
        let Some(c) = self.clients.remove(&client) else { return Vec::new() };
        let mut freed = 0;
        for class in &mut self.classes {
            for (i, o) in class.owner.iter_mut().enumerate() {
                if *o == Some(client) {
                    *o = None;
                    class.free.push(i as u32);
                    freed += 1;
                    self.stats.held_bytes -= class.size as u64;
                }
            }
        }
        self.free_bufs += freed;
        if c.in_rr {
            self.rr.retain(|&p| p != client);
        }
        self.waiting -= c.waiting.len();
        tracing::debug!(client = %client, freed, dropped = c.waiting.len(), "zones released a client");
        let tokens = c.waiting.into_iter().map(|(_, t)| t).collect();
        self.dispatch();
        tokens
    }

    /// The next grant for a request that waited, if any. Drain after `free` and
    /// `release_client`.
    pub fn poll_grant(&mut self) -> Option<Grant<T>> {
        self.ready.pop_front()
    }

    /// Byte size of `buf`.
    pub fn size(&self, buf: ZoneBuf) -> usize {
        self.classes[usize::from(buf.class)].size
    }

    /// Byte offset of `buf` in the zone memory ([`ZoneConfig::total_bytes`] long).
    pub fn offset(&self, buf: ZoneBuf) -> usize {
        let c = &self.classes[usize::from(buf.class)];
        c.base + c.size * buf.index as usize
    }

    /// Total zone memory.
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Bytes `client` holds.
    pub fn held_by(&self, client: PeerId) -> usize {
        self.clients.get(&client).map_or(0, |c| c.held)
    }

    /// Requests waiting, across clients.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Counters.
    pub fn stats(&self) -> ZoneStats {
        self.stats
    }

    /// The fair share of each active client, given one more client if `client` is not yet
    /// active.
    fn fair_share(&self, client: PeerId) -> usize {
        let active = self.clients.len() + usize::from(!self.clients.contains_key(&client));
        self.total / active.max(1)
    }

    /// May `client` take a buffer now? `others_waiting` counts waiting clients other than it.
    fn eligible(&self, client: PeerId, others_waiting: usize) -> bool {
        others_waiting == 0 || self.held_by(client) < self.fair_share(client)
    }

    /// Takes a buffer for `want` bytes (a buffer must be free): exact zone, else bigger, else
    /// the biggest smaller one.
    fn take(&mut self, client: PeerId, want: usize) -> (ZoneBuf, usize) {
        let exact = self.classes.iter().position(|c| c.size >= want).unwrap_or(self.classes.len());
        let pick = (exact..self.classes.len())
            .find(|&i| !self.classes[i].free.is_empty())
            .or_else(|| (0..exact).rev().find(|&i| !self.classes[i].free.is_empty()))
            .expect("take() is only called with a free buffer");
        let class = &mut self.classes[pick];
        let index = class.free.pop().expect("picked class has a free buffer");
        class.owner[index as usize] = Some(client);
        let size = class.size;
        let len = size.min(want);
        self.free_bufs -= 1;
        self.stats.grants += 1;
        self.stats.held_bytes += size as u64;
        if pick > exact {
            self.stats.bigger += 1;
        }
        if len < want {
            self.stats.chopped += 1;
        }
        self.clients
            .entry(client)
            .or_insert_with(|| Client { held: 0, waiting: VecDeque::new(), in_rr: false })
            .held += size;
        // `pick` < MAX_CLASSES (32) fits a u8.
        (ZoneBuf { class: pick as u8, index }, len)
    }

    /// Serves waiting clients round-robin while buffers are free and someone eligible waits.
    fn dispatch(&mut self) {
        let mut skipped = 0;
        while self.free_bufs > 0 && skipped < self.rr.len() {
            let Some(client) = self.rr.pop_front() else { break };
            if !self.eligible(client, self.rr.len()) {
                self.rr.push_back(client);
                skipped += 1;
                continue;
            }
            skipped = 0;
            let c = self.clients.get_mut(&client).expect("waiting client has a record");
            let (want, token) = c.waiting.pop_front().expect("client in rr has a waiting request");
            let more = !c.waiting.is_empty();
            c.in_rr = more;
            self.waiting -= 1;
            if more {
                self.rr.push_back(client);
            }
            let (buf, len) = self.take(client, want);
            self.ready.push_back(Grant { client, token, buf, len });
        }
    }

    fn forget_if_idle(&mut self, client: PeerId) {
        if self.clients.get(&client).is_some_and(|c| c.held == 0 && c.waiting.is_empty()) {
            self.clients.remove(&client);
        }
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let mut held: HashMap<PeerId, usize> = HashMap::new();
        let mut free = 0;
        for class in &self.classes {
            assert_eq!(class.free.len(), class.owner.iter().filter(|o| o.is_none()).count());
            for &i in &class.free {
                assert!(class.owner[i as usize].is_none());
            }
            for o in class.owner.iter().flatten() {
                *held.entry(*o).or_default() += class.size;
            }
            free += class.free.len();
        }
        assert_eq!(free, self.free_bufs);
        let held_total: usize = held.values().sum();
        assert!(held_total <= self.total, "zones over budget");
        assert_eq!(held_total as u64, self.stats.held_bytes);
        for (p, c) in &self.clients {
            assert_eq!(c.held, held.get(p).copied().unwrap_or(0));
            assert!(c.held > 0 || !c.waiting.is_empty(), "idle client kept");
            assert_eq!(c.in_rr, !c.waiting.is_empty());
            assert_eq!(c.in_rr, self.rr.contains(p));
        }
        assert_eq!(self.waiting, self.clients.values().map(|c| c.waiting.len()).sum::<usize>());
        // No eligible waiter is left with a buffer free.
        if free > 0 {
            for &p in &self.rr {
                assert!(
                    !self.eligible(p, self.rr.len() - 1),
                    "eligible waiter {p} left waiting with free buffers"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const K: usize = 1 << 10;
    const M: usize = 1 << 20;

    fn p(n: u32) -> PeerId {
        PeerId(u64::from(n))
    }

    fn granted<T: std::fmt::Debug>(a: Alloc<T>) -> Grant<T> {
        match a {
            Alloc::Granted(g) => g,
            Alloc::Wait => panic!("expected a grant"),
        }
    }

    #[test]
    fn exact_zone_then_bigger_then_chop() {
        let cfg = ZoneConfig::default().classes(&[(64 * K, 1), (128 * K, 1), (256 * K, 1)]);
        let mut z: BufferZones<u32> = BufferZones::new(&cfg).unwrap();
        let a = granted(z.alloc(p(1), 100 * K, 0).unwrap());
        assert_eq!((z.size(a.buf), a.len), (128 * K, 100 * K), "exact zone");
        let b = granted(z.alloc(p(1), 100 * K, 1).unwrap());
        assert_eq!((z.size(b.buf), b.len), (256 * K, 100 * K), "bigger zone");
        let c = granted(z.alloc(p(1), 100 * K, 2).unwrap());
        assert_eq!((z.size(c.buf), c.len), (64 * K, 64 * K), "chopped into the biggest smaller buffer");
        assert_eq!(z.alloc(p(1), 1, 3).unwrap(), Alloc::Wait, "nothing left");
        let s = z.stats();
        assert_eq!((s.grants, s.bigger, s.chopped, s.waits), (3, 1, 1, 1));
        assert_eq!(z.offset(a.buf), 64 * K);
        assert_eq!(z.offset(b.buf), 192 * K);
        z.check_invariants();
        z.free(a.buf).unwrap();
        let g = z.poll_grant().unwrap();
        assert_eq!((g.token, g.len), (3, 1));
        assert_eq!(g.buf, a.buf, "the freed buffer went straight to the waiter");
        z.check_invariants();
    }

    #[test]
    fn chopping_yields_pieces_that_exactly_cover_the_request() {
        let cfg = ZoneConfig::default().classes(&[(64 * K, 4), (128 * K, 2), (2 * M, 1)]);
        let mut z: BufferZones<()> = BufferZones::new(&cfg).unwrap();
        let want = 5 * M + 12345;
        let mut left = want;
        let mut pieces = Vec::new();
        while left > 0 {
            match z.alloc(p(1), left, ()).unwrap() {
                Alloc::Granted(g) => {
                    assert!(g.len <= z.size(g.buf) && g.len <= left && g.len > 0);
                    left -= g.len;
                    pieces.push(g);
                }
                Alloc::Wait => {
                    // Out of buffers: the earliest piece has been transferred; free it.
                    let first = pieces.remove(0);
                    z.free(first.buf).unwrap();
                    let g = z.poll_grant().unwrap();
                    left -= g.len;
                    pieces.push(g);
                }
            }
            z.check_invariants();
        }
        assert_eq!(left, 0);
        assert!(z.stats().chopped > 0);
        let total: usize = z.stats().grants as usize;
        assert!(total >= 3);
    }

    #[test]
    fn client_over_its_fair_share_waits_while_others_wait() {
        // 4 × 1 MiB: with two active clients the fair share is 2 MiB.
        let cfg = ZoneConfig::default().classes(&[(M, 4)]);
        let mut z: BufferZones<&str> = BufferZones::new(&cfg).unwrap();
        let greedy: Vec<_> = (0..4).map(|_| granted(z.alloc(p(1), M, "g").unwrap())).collect();
        // Alone, the greedy client may take everything (work-conserving).
        assert_eq!(z.held_by(p(1)), 4 * M);
        assert_eq!(z.alloc(p(2), M, "other").unwrap(), Alloc::Wait);
        assert_eq!(z.alloc(p(1), M, "g-more").unwrap(), Alloc::Wait);
        // The greedy client frees one: it goes to the other client, not back to the greedy one.
        z.free(greedy[0].buf).unwrap();
        assert_eq!(z.poll_grant().map(|g| g.token), Some("other"));
        assert_eq!(z.poll_grant(), None);
        // Greedy holds 3 MiB > 2 MiB fair share; the other client waits again: greedy cannot get
        // the next free buffer either.
        assert_eq!(z.alloc(p(2), M, "other-2").unwrap(), Alloc::Wait);
        z.free(greedy[1].buf).unwrap();
        assert_eq!(z.poll_grant().map(|g| g.token), Some("other-2"));
        // Now the other client holds 2 MiB = its share, greedy 2 MiB: nobody else waits for
        // greedy's request, so once a buffer frees it is served.
        z.free(greedy[2].buf).unwrap();
        assert_eq!(z.poll_grant().map(|g| g.token), Some("g-more"));
        z.check_invariants();
    }

    #[test]
    fn waiting_clients_are_served_round_robin() {
        let cfg = ZoneConfig::default().classes(&[(64 * K, 1)]);
        let mut z: BufferZones<(u32, u32)> = BufferZones::new(&cfg).unwrap();
        let first = granted(z.alloc(p(0), 1, (0, 0)).unwrap());
        for i in 0..3 {
            for c in 1..=3 {
                assert_eq!(z.alloc(p(c), 1, (c, i)).unwrap(), Alloc::Wait);
            }
        }
        let mut order = Vec::new();
        let mut buf = first.buf;
        for _ in 0..9 {
            z.free(buf).unwrap();
            let g = z.poll_grant().unwrap();
            order.push(g.token);
            buf = g.buf;
            z.check_invariants();
        }
        let clients: Vec<u32> = order.iter().map(|t| t.0).collect();
        assert_eq!(clients, [1, 2, 3, 1, 2, 3, 1, 2, 3]);
        let per_client: Vec<u32> = order.iter().filter(|t| t.0 == 2).map(|t| t.1).collect();
        assert_eq!(per_client, [0, 1, 2], "each client's requests in order");
    }

    #[test]
    fn release_client_frees_everything_it_held_and_drops_its_waits() {
        let cfg = ZoneConfig::default().classes(&[(64 * K, 2), (M, 1)]);
        let mut z: BufferZones<u32> = BufferZones::new(&cfg).unwrap();
        let _a = granted(z.alloc(p(1), M, 1).unwrap());
        let _b = granted(z.alloc(p(1), 10, 2).unwrap());
        let _c = granted(z.alloc(p(1), 10, 3).unwrap());
        assert_eq!(z.alloc(p(1), 10, 4).unwrap(), Alloc::Wait);
        assert_eq!(z.alloc(p(2), 10, 5).unwrap(), Alloc::Wait);
        assert_eq!(z.release_client(p(1)), vec![4]);
        assert_eq!(z.held_by(p(1)), 0);
        assert_eq!(z.poll_grant().map(|g| (g.client, g.token)), Some((p(2), 5)));
        assert_eq!(z.stats().held_bytes, 64 * K as u64);
        assert_eq!(z.waiting(), 0);
        assert!(z.release_client(p(9)).is_empty());
        z.check_invariants();
    }

    #[test]
    fn misuse_and_limits() {
        let cfg = ZoneConfig::default().classes(&[(64 * K, 1)]).max_waiting(1);
        let mut z: BufferZones<()> = BufferZones::new(&cfg).unwrap();
        assert!(z.alloc(p(1), 0, ()).is_err());
        let g = granted(z.alloc(p(1), 1, ()).unwrap());
        assert_eq!(z.alloc(p(2), 1, ()).unwrap(), Alloc::Wait);
        assert!(matches!(z.alloc(p(3), 1, ()), Err(Error::Exhausted(_))), "waiting queue bounded");
        z.free(g.buf).unwrap();
        let g2 = z.poll_grant().unwrap();
        z.free(g2.buf).unwrap();
        assert!(z.free(g2.buf).is_err(), "double free");
        assert!(z.free(ZoneBuf { class: 7, index: 0 }).is_err());
        assert!(z.free(ZoneBuf { class: 0, index: 7 }).is_err());
        assert!(ZoneConfig::default().classes(&[]).validate().is_err());
        assert!(ZoneConfig::default().classes(&[(2 * M, 1), (M, 1)]).validate().is_err());
        assert!(ZoneConfig::default().classes(&[(M, 0)]).validate().is_err());
        assert!(ZoneConfig::default().classes(&[(1 << 30, 1 << 20)]).validate().is_err());
        assert_eq!(ZoneConfig::default().total_bytes(), 48 * M);
    }

    #[derive(Debug, Clone)]
    enum Ev {
        /// Client (0 = the greedy one) asks for a size class index.
        Ask(u32, usize),
        /// Free the n-th held buffer.
        Free(usize),
        /// The client dies.
        Kill(u32),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => (0..4u32, 0..4usize).prop_map(|(c, s)| Ev::Ask(c, s)),
            4 => any::<usize>().prop_map(Ev::Free),
            1 => (1..4u32).prop_map(Ev::Kill),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Random asks, frees and client deaths. Invariants after every event: held bytes
        /// within budget, free lists consistent, no eligible waiter left beside a free buffer.
        /// Fairness: a well-behaved client (1..4, at most one request at a time, holding
        /// nothing while it waits) is served before any other client gets two grants; the
        /// greedy client 0 asks without limit.
        #[test]
        fn zones_stay_in_budget_and_never_starve_a_client(
            events in proptest::collection::vec(ev(), 1..300),
        ) {
            let sizes = [30 * K, 64 * K, 200 * K, 3 * M];
            let cfg = ZoneConfig::default().classes(&[(64 * K, 4), (256 * K, 2), (M, 2)]);
            let mut z: BufferZones<u32> = BufferZones::new(&cfg).unwrap();
            let mut held: Vec<Grant<u32>> = Vec::new();
            // Per well-behaved client: grants others got since its request began waiting.
            let mut waiting_since: [Option<Vec<u32>>; 4] = Default::default();
            let deliver = |g: Grant<u32>, held: &mut Vec<Grant<u32>>, waiting_since: &mut [Option<Vec<u32>>; 4]| {
                let c = g.client.as_u64() as u32;
                if c != 0 {
                    waiting_since[c as usize] = None;
                }
                for (w, slot) in waiting_since.iter_mut().enumerate() {
                    if let Some(others) = slot && w as u32 != c {
                        others.push(c);
                    }
                }
                held.push(g);
            };
            for e in events {
                match e {
                    Ev::Ask(c, s) => {
                        let busy = c != 0
                            && (waiting_since[c as usize].is_some() || held.iter().any(|g| g.client.as_u64() as u32 == c));
                        if !busy {
                            match z.alloc(p(c), sizes[s], c).unwrap() {
                                Alloc::Granted(g) => deliver(g, &mut held, &mut waiting_since),
                                Alloc::Wait => {
                                    if c != 0 {
                                        waiting_since[c as usize] = Some(Vec::new());
                                    }
                                }
                            }
                        }
                    }
                    Ev::Free(i) => {
                        if !held.is_empty() {
                            let g = held.swap_remove(i % held.len());
                            z.free(g.buf).unwrap();
                        }
                    }
                    Ev::Kill(c) => {
                        held.retain(|g| g.client.as_u64() as u32 != c);
                        z.release_client(p(c));
                        waiting_since[c as usize] = None;
                        prop_assert_eq!(z.held_by(p(c)), 0);
                    }
                }
                while let Some(g) = z.poll_grant() {
                    deliver(g, &mut held, &mut waiting_since);
                }
                z.check_invariants();
                for others in waiting_since.iter().flatten() {
                    for c in 0..4u32 {
                        let n = others.iter().filter(|&&o| o == c).count();
                        prop_assert!(n <= 1, "client {} got {} grants while another waited", c, n);
                    }
                }
            }
        }
    }
}
