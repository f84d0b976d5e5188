//! The engine as a backend: opening an endpoint on a verbs device, the progress loop, and
//! the [`Backend`] methods the endpoint calls.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Waker};
use rustc_hash::FxHashMap;

use crate::addr::{Address, Scheme};
use crate::admission::{self, Admission};
use crate::backend::{Backend, Cmd};
use crate::buffers::buf::{BufPool, RegisteredBuf};
use crate::comm::{BulkScheduler, Origin, Policy};
use crate::completions::Completions;
use crate::config::Config;
use crate::core::loss::Loss;
use crate::core::ops::OpTable;
use crate::core::peers::Peers;
use crate::core::requests::Requests;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::ib::verbs::*;
use crate::info::{Counters, Info, RdmaInfo, RegcacheInfo};
use crate::matching::Matcher;
use crate::regcache::{RegCache, RegCacheConfig};
use crate::sockets;
use crate::types::{Access, OpId, PeerId, ServiceLevel};

use super::reg::{Cache, PoolReg, VerbsRegistrar};

use super::*;

impl<V: Verbs> IbBackend<V> {
    pub(crate) fn new(
        scheme: Scheme,
        ctx: V,
        sel: &super::route::Selection,
        bind: Option<&Address>,
        cfg: &Config,
        core: Arc<Completions>,
    ) -> Result<Self> {
        let port = super::route::PortRoute::open(&ctx, sel)?;
        let pd = ctx.alloc_pd()?;
        let ch = ctx.create_comp_channel()?;
        let attr = ctx.attr().clone();
        let cqe = attr.max_cqe.min(65536);
        let cq = ctx.create_cq(cqe, Some(&ch), 1)?;
        let max_inline_device = attr.max_inline_data;
        let max_sge = attr.max_sge.min(16);
        let dev = Arc::new(Dev { ctx, pd, ch, cq, port });
        let rc_cfg = RegCacheConfig::default()
            .max_entries(cfg.ib.regcache_entries)
            .max_pinned_bytes(cfg.ib.regcache_bytes)
            .cache_foreign(cfg.ib.cache_foreign == Some(true))
            .cache_foreign_watched(cfg.ib.cache_foreign.is_none())
            .access(Access::READ_WRITE);
        let cache: Cache<V> = Arc::new(Mutex::new(RegCache::new(VerbsRegistrar::new(dev.clone()), rc_cfg)?));
        let unmap_hook: crate::buffers::filemap::UnmapHook = {
            let weak = Arc::downgrade(&cache);
            Arc::new(move |addr, len| {
                if let Some(c) = weak.upgrade() {
                    c.lock().unwrap_or_else(|p| p.into_inner()).invalidate(addr, len);
                }
            })
        };
        crate::buffers::filemap::watch_unmaps(&unmap_hook);
        let pool = BufPool::with_registrar(
            cfg.pool_max_bytes,
            cfg.pool_cached_bytes,
            Arc::new(PoolReg::new(cache.clone())),
        );

        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(&registry, WAKER)?;
        let event_fd = crate::sockets::epoll_fd(&poll)?;
        registry.register(&mut SourceFd(&dev.ch.as_raw_fd()), CHANNEL, Interest::READABLE)?;

        let mut policy = cfg.policy.clone().unwrap_or_else(|| Policy::for_scheme(scheme));
        let recv_size = cfg.ib.recv_size;
        let n_recv = cfg.ib.recv_buffers;
        let n_ring = cfg.ib.ring_slots;
        // A slot holds the largest fast-RDMA payload plus room for headers.
        let fast_max = ServiceLevel::ALL.iter().map(|&sl| policy.thresholds(sl).fast_max).max().unwrap_or(0);
        let slot_size = (fast_max + 4096).next_multiple_of(4096).max(recv_size as usize) as u32;
        // Inline sends must fit a receive buffer.
        for sl in ServiceLevel::ALL {
            let mut t = policy.thresholds(sl);
            t.inline_max = t.inline_max.min(recv_size as usize - MSG_HDR);
            t.fast_max = t.fast_max.min(slot_size as usize - MSG_HDR);
            policy.cap(sl, t);
        }
        let mut listener = None;
        let mut local = None;
        if let Some(addr) = bind {
            let sa = *addr.resolve()?.first().ok_or_else(|| Error::misuse("no address to bind"))?;
            let mut l = TcpListener::from_std(crate::sockets::listener_socket(sa, cfg)?.into());
            registry.register(&mut l, LISTENER, Interest::READABLE)?;
            local = Some(Address::new(scheme, addr.host().clone(), l.local_addr()?.port()));
            listener = Some(l);
        }
        let endpoint_id = crate::util::random_u64();
        let s = Settings {
            cfg: cfg.clone(),
            policy,
            endpoint_id,
            listen_port: local.as_ref().map_or(0, |a| a.port()),
            eager_limit: slot_size as usize - MSG_HDR,
            max_message: cfg.max_message.min(u32::MAX as usize),
            slot_size,
            recv_size,
            n_recv,
            n_ring,
            max_inline_device,
            max_sge,
        };
        let ib = &cfg.ib;
        // Units of a transfer overlap on an adapter, which moves one while the engine sets up
        // the next. Where the host's CPU moves the data as each is posted, one after the other,
        // a unit more only adds a work request, a completion and a system call.
        let min_transfer_unit =
            if dev.ctx.attr().cpu_moves_data { ib.transfer_unit } else { ib.min_transfer_unit };
        let st = State {
            s,
            dev: dev.clone(),
            cache: cache.clone(),
            core: core.clone(),
            listener,
            sides: HashMap::new(),
            admission: Admission::new(admission::Limits {
                deadline: cfg.handshake_timeout,
                total: cfg.max_handshaking,
                per_source: cfg.handshakes_per_source,
            }),
            next_token: FIRST_SIDE,
            conns: Vec::new(),
            conn_gen: Vec::new(),
            free_conns: Vec::new(),
            peers: Peers::default(),
            matcher: Matcher::new(),
            ops: OpTable::default(),
            exposures: HashMap::new(),
            sreqs: Requests::default(),
            fin_wait: FxHashMap::default(),
            units: super::units::Units::new(BulkScheduler::new(
                ib.transfer_unit,
                min_transfer_unit,
                ib.peer_rdma_cap,
                ib.endpoint_rdma_cap,
            )),
            zones: None,
            pool: pool.clone(),
            next_msg: 1,
            events: 0,
            rounds: 0,
            idle_rounds: 0,
            last_timers: Instant::now(),
            closed: false,
            accept_more: false,
            registry: registry.try_clone()?,
            wcs: vec![WorkCompletion::default(); CQ_BATCH],
            _unmap_hook: unmap_hook,
            mapped_seen: stretches::SeenOnce::default(),
        };
        tracing::debug!(%scheme, endpoint_id, local = ?local, device = %dev.ctx.device().name, "ib endpoint up");
        Ok(IbBackend {
            scheme,
            core,
            dev,
            cache,
            poller: Mutex::new(Poller { poll, events: Events::with_capacity(256) }),
            waker,
            st: Mutex::new(st),
            pool,
            local,
            endpoint_id,
            blocked: AtomicBool::new(false),
            event_fd,
        })
    }

    /// Gives the CPU to any other runnable thread (the peer, when it shares this CPU), without
    /// sleeping: a busy-poll that never sleeps but never starves the process it waits for.
    fn yield_cpu(&self) {
        Counters::add(&self.core.counters.spin_yields, 1);
        std::thread::yield_now();
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State<V>> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, mut st: MutexGuard<'_, State<V>>) {
        st.ops.hand_over(&self.core, |x| x.retire(&self.cache));
    }

    /// One round of progress, blocking up to `timeout`. `events_only`: the round an armed
    /// caller runs when the event descriptor is readable, which must collect epoll's events
    /// (the completion channel, side channels) and must not give up the CPU.
    fn progress_round(&self, timeout: Duration, events_only: bool) -> Result<bool> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.rounds = st.rounds.wrapping_add(1);
        let progressed = self.round(st);
        let look_at_sides =
            events_only || !timeout.is_zero() || st.rounds.is_multiple_of(SPIN_SIDE_EVERY) || st.accept_more;
        if progressed || !look_at_sides {
            st.timers(timeout.is_zero(), Instant::now());
            let yield_cpu = st.idle_spin(timeout, progressed) && !events_only;
            self.deliver(guard);
            if yield_cpu {
                self.yield_cpu();
            }
            return Ok(progressed);
        }
        // Nothing on the CQ: arm it, look once more (a completion may have slipped in before
        // arming), then sleep in epoll on the channel and the side channels.
        let mut timeout = if st.accept_more { Duration::ZERO } else { timeout };
        if !timeout.is_zero() {
            self.dev.cq.req_notify(false)?;
            if self.round(st) {
                timeout = Duration::ZERO;
            }
        }
        self.deliver(guard);
        let mut pg = self.poller.lock().unwrap_or_else(|p| p.into_inner());
        let poller = &mut *pg;
        sockets::wait(&mut poller.poll, &mut poller.events, timeout, &self.blocked, || false)?;
        let mut guard = self.lock();
        let st = &mut *guard;
        for ev in poller.events.iter() {
            match ev.token() {
                LISTENER => st.accept(Instant::now()),
                WAKER => {}
                CHANNEL => while let Ok(Some(_)) = self.dev.ch.get_event() {},
                t => st.side_event(t, ev.is_writable(), Instant::now()),
            }
        }
        if st.accept_more {
            st.accept(Instant::now());
        }
        let had_events = !poller.events.is_empty();
        drop(pg);
        let progressed = self.round(st) || had_events;
        st.timers(false, Instant::now());
        let yield_cpu = st.idle_spin(timeout, progressed) && !events_only;
        self.deliver(guard);
        if yield_cpu {
            self.yield_cpu();
        }
        Ok(progressed)
    }

    /// One round: completions, then side channels when `side` is set.
    fn round(&self, st: &mut State<V>) -> bool {
        let before = (st.events, st.ops.done_len());
        st.poll_cq();
        st.pump_all();
        st.events != before.0 || st.ops.done_len() != before.1
    }
}

impl<V: Verbs> Backend for IbBackend<V> {
    fn scheme(&self) -> Scheme {
        self.scheme
    }

    fn local_addr(&self) -> Option<Address> {
        self.local.clone()
    }

    fn connect(&self, addr: &Address) -> Result<PeerId> {
        let sa = *addr.resolve()?.first().ok_or_else(|| Error::misuse("address resolves to nothing"))?;
        let mut st = self.lock();
        let max_peers = st.s.cfg.max_peers;
        st.peers.dialled(sa, max_peers, || ())
    }

    fn peer_addr(&self, peer: PeerId) -> Option<Address> {
        let st = self.lock();
        st.peers.get(peer)?.addr().map(|sa| Address::from_socket(self.scheme, sa))
    }

    fn post(&self, op: OpId, cmd: Cmd) -> Result<()> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::Closed);
        }
        let r = st.post(op, cmd, Instant::now());
        st.pump_all();
        self.deliver(st);
        if self.blocked.load(Ordering::Acquire) {
            let _ = self.waker.wake();
        }
        r
    }

    fn cancel(&self, op: OpId, why: Error) {
        let mut st = self.lock();
        st.cancel(op, why, Instant::now());
        st.pump_all();
        self.deliver(st);
    }

    fn request_cancelled(&self, peer: PeerId, req: u64) -> bool {
        self.lock().sreqs.is_cancelled(peer, req)
    }

    fn progress(&self, timeout: Duration) -> Result<bool> {
        self.progress_round(timeout, false)
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.event_fd.as_fd()
    }

    fn arm(&self) -> Result<bool> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.accept_more {
            return Ok(false);
        }
        // Set under the state lock: a post from now on wakes the descriptor.
        self.blocked.store(true, Ordering::Release);
        self.dev.cq.req_notify(false)?;
        // A completion that arrived before the request for notification raises no event.
        let due = self.round(st);
        self.deliver(guard);
        if due {
            self.blocked.store(false, Ordering::Release);
        }
        Ok(!due)
    }

    fn poll_events(&self) -> Result<bool> {
        self.blocked.store(false, Ordering::Release);
        self.progress_round(Duration::ZERO, true)
    }

    fn timers_pending(&self) -> bool {
        self.lock().timers_pending()
    }

    fn wake(&self) {
        let _ = self.waker.wake();
    }

    fn unexpected_taken(&self, peer: PeerId, bytes: usize) {
        let mut st = self.lock();
        st.peers.unexpected_taken(peer, bytes);
        st.forget_if_gone(peer);
        st.unstall(peer);
        st.pump_all();
        self.deliver(st);
    }

    fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        self.pool.alloc(len)
    }

    fn expose(&self, buf: RegisteredBuf, access: Access) -> Result<MemHandle> {
        let mut f = AccessFlags::LOCAL_WRITE;
        if access.contains(Access::READ) {
            f = f | AccessFlags::REMOTE_READ;
        }
        if access.contains(Access::WRITE) {
            f = f | AccessFlags::REMOTE_WRITE;
        }
        let mr = xfer::register_exposure(&self.dev, &buf, f)?;
        let mut st = self.lock();
        let key = loop {
            let k = crate::util::random_u64();
            if k != 0 && !st.exposures.contains_key(&k) {
                break k;
            }
        };
        let h = MemHandle { addr: buf.addr() as u64, len: buf.len() as u64, key, rkey: mr.rkey(), access };
        st.exposures.insert(key, Exposed { mr, buf });
        Ok(h)
    }

    fn revoke(&self, key: u64) -> Result<RegisteredBuf> {
        let e = self
            .lock()
            .exposures
            .remove(&key)
            .ok_or_else(|| Error::misuse("unknown or already revoked exposure"))?;
        // Deregistering invalidates the rkey: the peer's later accesses fail.
        drop(e.mr);
        Ok(e.buf)
    }

    fn with_exposed(&self, key: u64, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let st = self.lock();
        let e = st.exposures.get(&key).ok_or_else(|| Error::misuse("unknown or revoked exposure"))?;
        // Peers may write the exposure at any moment: work on a copy, then write it back.
        let mut snapshot = reg::read_registered(&e.buf);
        f(&mut snapshot);
        reg::write_registered(&e.buf, &snapshot);
        Ok(())
    }

    fn invalidate(&self, addr: usize, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).invalidate(addr, len)
    }

    fn info(&self, info: &mut Info) {
        let st = self.lock();
        info.scheme = self.scheme;
        info.local_addr = self.local.clone();
        info.endpoint_id = self.endpoint_id;
        info.eager_limit = st.s.eager_limit;
        info.eager_origin = Origin::ReceiveBudget;
        info.max_message = st.s.max_message;
        info.policy = st.s.policy.clone();
        info.credits = Some(u32::from(st.s.n_recv));
        info.fast_slots = Some((u32::from(st.s.n_ring), st.s.slot_size as usize));
        info.pool = self.pool.stats();
        info.exposures = st.exposures.len();
        info.peers_connected = st.peers.iter().filter(|(_, p)| p.conns.iter().any(Option::is_some)).count();
        info.gauges.peers = st.peers.len();
        info.gauges.handshakes = st.admission.len();
        info.gauges.buffered_bytes = st.peers.buffered();
        let (max_entries, max_bytes) = (st.s.cfg.ib.regcache_entries, st.s.cfg.ib.regcache_bytes as u64);
        let provider = self.dev.ctx.counters();
        let zones = st.zones.as_ref().map(|z| (z.zones.stats().held_bytes, z.zones.waiting()));
        let live = st.conns.iter().flatten();
        info.rdma = Some(RdmaInfo {
            queue_pairs: live.clone().count(),
            queued_msgs: live.clone().map(|c| c.out.len() + c.waiting_posts.len()).sum(),
            sends_outstanding: live.map(|c| c.link.outstanding().count()).sum(),
            transfers: st.units.xfers.len(),
            rdma_bytes_in_flight: st.units.bulk.in_flight_total(),
            zone_bytes_held: zones.map_or(0, |z| z.0),
            zone_waiting: zones.map_or(0, |z| z.1),
            fin_waits: st.fin_wait.len(),
            open_requests: st.sreqs.len(),
            provider,
            port: self.dev.ctx.port_counters(self.dev.port.num).unwrap_or_default(),
        });
        drop(st);
        let rs = self.cache.lock().unwrap_or_else(|p| p.into_inner()).stats();
        info.regcache = Some(RegcacheInfo {
            max_entries,
            max_bytes,
            entries: rs.entries as usize,
            pinned_bytes: rs.bytes_pinned,
            hits: rs.hits + rs.probe_hits,
            misses: rs.misses,
            in_use: rs.in_use,
        });
    }

    fn shutdown(&self) {
        let mut st = self.lock();
        st.closed = true;
        let peers = st.peers.ids();
        for p in peers {
            st.fail_peer(p, Loss::Closed);
        }
        st.sides.clear();
        st.listener = None;
        self.deliver(st);
    }
}
