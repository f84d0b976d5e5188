//! Endpoints in another process.
//!
//! The test binary re-executes itself as its ignored `conformance_agent` test (see
//! [`crate::agent_entry`]); the agent connects back over a Unix socket and hosts any number of
//! endpoints, running each command it receives in its own thread (so a blocking `wait` does not
//! hold up the others) and answering with the command's id. Frames are a `u32` length and a
//! postcard-encoded value. [`Agent`] is the test-process side; [`Remote`] is an [`Ep`] whose
//! endpoint lives in the agent. Killing the agent ([`Agent::kill`], SIGKILL) is how tests
//! make a peer die mid-transfer.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::{
    Address, CounterSnapshot, Direction, Info, OpBuf, OpKind, RecvBuf, RegcacheInfo, SendBuf, ServiceLevel,
    Tag,
};
use serde::{Deserialize, Serialize};

use super::harness::*;

/// The environment variable that turns the ignored test into an agent: the socket to dial.
pub const AGENT_ENV: &str = "IONET_CONFORMANCE_AGENT";
/// The name of the agent's test entry point in every binary that uses agents.
pub const AGENT_TEST: &str = "conformance_agent";
/// Longest any agent command may take before the test gives up on the agent.
const CALL_BOUND: Duration = Duration::from_secs(120);

/// Defines the agent's entry point in a test binary (an ignored test that does nothing unless
/// started by [`Agent::spawn`]).
#[macro_export]
macro_rules! agent_entry {
    () => {
        #[test]
        #[ignore = "helper: re-executed by the cross-process tests as the agent process"]
        fn conformance_agent() {
            conformance::agent::main()
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Wire types

#[derive(Debug, Serialize, Deserialize)]
enum Call {
    Bind { addr: String, cfg: Config },
    Client { scheme: String, cfg: Config },
    Drop { ep: u32 },
    Connect { ep: u32, addr: String },
    Post { ep: u32, p: Post },
    SetDeadline { ep: u32, op: OpId, after: Duration },
    Cancel { ep: u32, op: OpId },
    Test { ep: u32, op: OpId },
    Wait { ep: u32, op: OpId, timeout: Option<Duration> },
    WaitAny { ep: u32, timeout: Option<Duration> },
    RecvUnexpected { ep: u32, timeout: Option<Duration> },
    NextRequest { ep: u32, timeout: Option<Duration> },
    Pull { req: u64, buf: RBuf, offset: u64 },
    Push { req: u64, buf: SBuf, offset: u64 },
    IsCancelled { req: u64 },
    Reply { req: u64, header: Bytes, error: bool },
    DropRequest { req: u64 },
    Expose { ep: u32, data: Bytes, access: u8 },
    ReadExposed { x: u64 },
    WriteExposed { x: u64, data: Bytes },
    Revoke { x: u64 },
    DropExposure { x: u64 },
    Info { ep: u32 },
}

#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Unit,
    Ep { id: u32, addr: Option<String> },
    Peer(PeerId),
    Op(OpId),
    Done(Option<WCompletion>),
    Unexpected(Option<(PeerId, Tag, u8, Bytes)>),
    Request(Option<(u64, WMeta)>),
    Exposure { id: u64, handle: Vec<u8> },
    Bytes(Bytes),
    Len(usize),
    Flag(bool),
    Info(Box<WInfo>),
}

#[derive(Debug, Serialize, Deserialize)]
enum WBuf {
    None,
    Send(SBuf),
    Recv(RBuf),
}

#[derive(Debug, Serialize, Deserialize)]
struct WCompletion {
    op: OpId,
    kind: u8,
    peer: PeerId,
    tag: Tag,
    result: Result<usize>,
    buf: WBuf,
    reply: Option<Bytes>,
    mechanism: Option<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WMeta {
    peer: PeerId,
    tag: Tag,
    sl: u8,
    header: Bytes,
    dir: u8,
    len: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct WInfo {
    scheme: String,
    local_addr: Option<String>,
    endpoint_id: u64,
    wait_mode: u8,
    eager_limit: usize,
    max_message: usize,
    max_header: usize,
    policy: PolicySpec,
    credits: Option<u32>,
    fast_slots: Option<(u32, usize)>,
    regcache: Option<[u64; 7]>,
    pool: [u64; 5],
    peers_connected: usize,
    exposures: usize,
    pending_ops: usize,
    gauges: [usize; 5],
    counters: Vec<(String, u64)>,
    rdma: Option<([usize; 9], [u64; 14])>,
}

const KINDS: [OpKind; 9] = [
    OpKind::Send,
    OpKind::SendUnexpected,
    OpKind::Recv,
    OpKind::Put,
    OpKind::Get,
    OpKind::Request,
    OpKind::Pull,
    OpKind::Push,
    OpKind::Reply,
];

const DIRS: [Direction; 3] = [Direction::None, Direction::Out, Direction::In];

fn kind_code(k: OpKind) -> u8 {
    KINDS.iter().position(|&x| x == k).expect("known kind") as u8
}

fn dir_code(d: Direction) -> u8 {
    DIRS.iter().position(|&x| x == d).expect("known direction") as u8
}

fn wire_buf(b: OpBuf) -> WBuf {
    match b {
        OpBuf::None => WBuf::None,
        OpBuf::Send(SendBuf::Bytes(b)) => WBuf::Send(SBuf::Bytes(b)),
        OpBuf::Send(SendBuf::List(l)) => WBuf::Send(SBuf::List(l)),
        OpBuf::Send(SendBuf::Registered(r)) => WBuf::Send(SBuf::Pool(Bytes::copy_from_slice(&r))),
        OpBuf::Recv(RecvBuf::Mut(b)) => WBuf::Recv(RBuf::Mut(b)),
        OpBuf::Recv(RecvBuf::List(l)) => WBuf::Recv(RBuf::List(l)),
        OpBuf::Recv(RecvBuf::Registered(r)) => WBuf::Recv(RBuf::Pool(BytesMut::from(&r[..]))),
        // Mapped regions cannot cross processes: their bytes travel as a scatter list.
        OpBuf::Recv(RecvBuf::Mapped(l)) => {
            WBuf::Recv(RBuf::List(l.iter().map(|r| BytesMut::from(&r[..])).collect()))
        }
    }
}

fn ionet_buf(b: WBuf) -> OpBuf {
    match b {
        WBuf::None => OpBuf::None,
        WBuf::Send(SBuf::Bytes(b)) => OpBuf::Send(SendBuf::Bytes(b)),
        WBuf::Send(SBuf::List(l)) => OpBuf::Send(SendBuf::List(l)),
        WBuf::Send(SBuf::Pool(b)) => OpBuf::Send(SendBuf::Registered(unpooled(&b))),
        WBuf::Recv(RBuf::Mut(b)) => OpBuf::Recv(RecvBuf::Mut(b)),
        WBuf::Recv(RBuf::List(l)) => OpBuf::Recv(RecvBuf::List(l)),
        WBuf::Recv(RBuf::Pool(b)) => OpBuf::Recv(RecvBuf::Registered(unpooled(&b))),
    }
}

fn wire_completion(c: ionet::Completion) -> WCompletion {
    WCompletion {
        op: ids::op(c.op),
        kind: kind_code(c.kind),
        peer: ids::peer(c.peer),
        tag: c.tag,
        result: c.result.map_err(Error::from),
        buf: wire_buf(c.buf),
        reply: c.reply,
        mechanism: c.mechanism.map(mech_code),
    }
}

fn from_wire_completion(c: WCompletion) -> Completion {
    Completion {
        op: c.op,
        kind: KINDS[usize::from(c.kind)],
        peer: c.peer,
        tag: c.tag,
        result: c.result,
        buf: ionet_buf(c.buf),
        reply: c.reply,
        mechanism: c.mechanism.map(mech_from),
    }
}

fn wire_info(i: &Info) -> WInfo {
    let mut policy = PolicySpec { forced: i.policy.forced().map(mech_code), ..Default::default() };
    for sl in ServiceLevel::ALL {
        let t = i.policy.thresholds(sl);
        policy.thresholds[sl.index()] = Some((t.inline_max, t.fast_max));
    }
    WInfo {
        scheme: i.scheme.as_str().to_string(),
        local_addr: i.local_addr.as_ref().map(ToString::to_string),
        endpoint_id: i.endpoint_id,
        wait_mode: match i.wait_mode {
            ionet::WaitMode::Spin => 0,
            ionet::WaitMode::Block => 1,
            ionet::WaitMode::Adaptive => 2,
        },
        eager_limit: i.eager_limit,
        max_message: i.max_message,
        max_header: i.max_header,
        policy,
        credits: i.credits,
        fast_slots: i.fast_slots,
        regcache: i.regcache.map(|r| {
            [r.max_entries as u64, r.max_bytes, r.entries as u64, r.pinned_bytes, r.hits, r.misses, r.in_use]
        }),
        pool: [i.pool.in_use_bytes, i.pool.cached_bytes, i.pool.reused, i.pool.created, i.pool.chunks],
        peers_connected: i.peers_connected,
        exposures: i.exposures,
        pending_ops: i.pending_ops,
        gauges: {
            let g = i.gauges;
            [g.peers, g.handshakes, g.transmit_bytes, g.buffered_bytes, g.peers_paused]
        },
        counters: i.counters.fields().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        rdma: i.rdma.map(|r| {
            let p = r.provider;
            (
                [
                    r.queue_pairs,
                    r.queued_msgs,
                    r.sends_outstanding,
                    r.transfers,
                    r.rdma_bytes_in_flight,
                    r.zone_bytes_held as usize,
                    r.zone_waiting,
                    r.fin_waits,
                    r.open_requests,
                ],
                [
                    p.registrations,
                    p.deregistrations,
                    p.registered_bytes,
                    p.pinned_bytes,
                    p.reg_ns,
                    p.dereg_ns,
                    p.send_wrs_posted,
                    p.recv_wrs_posted,
                    p.completions,
                    p.rdma_write_bytes,
                    p.rdma_read_bytes,
                    p.send_bytes,
                    // None travels as u64::MAX, which no counter reaches.
                    p.rnr_retries.unwrap_or(u64::MAX),
                    p.device_ns.unwrap_or(u64::MAX),
                ],
            )
        }),
    }
}

fn from_wire_info(w: WInfo) -> Info {
    let scheme = format!("{}://127.0.0.1:0", w.scheme).parse::<Address>().expect("scheme").scheme();
    let mut policy = ionet::Policy::for_scheme(scheme);
    for sl in ServiceLevel::ALL {
        if let Some((inline_max, fast_max)) = w.policy.thresholds[sl.index()] {
            policy.set(sl, ionet::Thresholds { inline_max, fast_max });
        }
    }
    policy.force(w.policy.forced.map(mech_from));
    let mut counters = CounterSnapshot::default();
    for (k, v) in &w.counters {
        assert!(counters.set(k, *v), "the agent reports a counter this binary does not know: {k}");
    }
    let mut info = Info::unreported(scheme, wait_mode_from(w.wait_mode), policy);
    info.local_addr = w.local_addr.map(|a| a.parse().expect("address"));
    info.endpoint_id = w.endpoint_id;
    info.eager_limit = w.eager_limit;
    info.max_message = w.max_message;
    info.max_header = w.max_header;
    info.credits = w.credits;
    info.fast_slots = w.fast_slots;
    info.regcache = w.regcache.map(|r| {
        let mut c = RegcacheInfo::default();
        [c.max_entries, c.entries] = [r[0] as usize, r[2] as usize];
        [c.max_bytes, c.pinned_bytes, c.hits, c.misses, c.in_use] = [r[1], r[3], r[4], r[5], r[6]];
        c
    });
    info.pool = {
        let mut p = ionet::buf::PoolStats::default();
        [p.in_use_bytes, p.cached_bytes, p.reused, p.created, p.chunks] = w.pool;
        p
    };
    info.peers_connected = w.peers_connected;
    info.exposures = w.exposures;
    info.pending_ops = w.pending_ops;
    info.gauges = {
        let mut g = ionet::Gauges::default();
        [g.peers, g.handshakes, g.transmit_bytes, g.buffered_bytes, g.peers_paused] = w.gauges;
        g
    };
    info.counters = counters;
    info.rdma = w.rdma.map(|(g, p)| {
        let mut r = ionet::info::RdmaInfo::default();
        [
            r.queue_pairs,
            r.queued_msgs,
            r.sends_outstanding,
            r.transfers,
            r.rdma_bytes_in_flight,
            r.zone_waiting,
            r.fin_waits,
            r.open_requests,
        ] = [g[0], g[1], g[2], g[3], g[4], g[6], g[7], g[8]];
        r.zone_bytes_held = g[5] as u64;
        r.provider = ionet::internals::ib::verbs::VerbsCounters {
            registrations: p[0],
            deregistrations: p[1],
            registered_bytes: p[2],
            pinned_bytes: p[3],
            reg_ns: p[4],
            dereg_ns: p[5],
            send_wrs_posted: p[6],
            recv_wrs_posted: p[7],
            completions: p[8],
            rdma_write_bytes: p[9],
            rdma_read_bytes: p[10],
            send_bytes: p[11],
            rnr_retries: (p[12] != u64::MAX).then_some(p[12]),
            device_ns: (p[13] != u64::MAX).then_some(p[13]),
        };
        // The port's counters stay in the agent's process.
        r
    });
    info
}

fn write_frame<T: Serialize>(w: &mut impl Write, v: &T) -> std::io::Result<()> {
    let body = postcard::to_allocvec(v).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

fn read_frame(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    r.read_exact(&mut body).ok()?;
    Some(body)
}

// ---------------------------------------------------------------------------------------------
// The test-process side

type Waiters = Arc<Mutex<HashMap<u64, mpsc::Sender<Result<Answer>>>>>;

/// An agent process and the connection to it.
pub struct Agent {
    child: Mutex<Child>,
    tx: Mutex<UnixStream>,
    waiters: Waiters,
    next: AtomicU64,
    gone: Arc<AtomicBool>,
    path: PathBuf,
}

impl Agent {
    /// Starts an agent (this test binary, running its `conformance_agent` test).
    pub fn spawn() -> Agent {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ionet-agent-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("agent socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let mut child = Command::new(std::env::current_exe().expect("current_exe"))
            .args([AGENT_TEST, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(AGENT_ENV, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn agent");
        let deadline = Instant::now() + Duration::from_secs(60);
        let sock = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Ok(Some(st)) = child.try_wait() {
                        panic!("agent exited before connecting: {st}");
                    }
                    assert!(Instant::now() < deadline, "agent did not connect");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("accepting the agent: {e}"),
            }
        };
        sock.set_nonblocking(false).expect("blocking");
        let waiters: Waiters = Arc::default();
        let gone = Arc::new(AtomicBool::new(false));
        let (w, g) = (waiters.clone(), gone.clone());
        let mut rx = BufReader::new(sock.try_clone().expect("clone socket"));
        std::thread::Builder::new()
            .name("agent-replies".into())
            .spawn(move || {
                while let Some(f) = read_frame(&mut rx) {
                    let (id, a): (u64, Result<Answer>) = postcard::from_bytes(&f).expect("agent frame");
                    if let Some(tx) = w.lock().unwrap().remove(&id) {
                        let _ = tx.send(a);
                    }
                }
                g.store(true, Ordering::SeqCst);
                // Dropping the senders wakes every caller still waiting.
                w.lock().unwrap().clear();
            })
            .expect("reader thread");
        Agent { child: Mutex::new(child), tx: Mutex::new(sock), waiters, next: AtomicU64::new(1), gone, path }
    }

    fn call(&self, c: Call) -> Result<Answer> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(Error::Other("the agent process is gone".into()));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        self.waiters.lock().unwrap().insert(id, tx);
        // The reader may have seen the agent die between the check above and the insert.
        if self.gone.load(Ordering::SeqCst) || write_frame(&mut *self.tx.lock().unwrap(), &(id, c)).is_err() {
            self.waiters.lock().unwrap().remove(&id);
            return Err(Error::Other("the agent process is gone".into()));
        }
        match rx.recv_timeout(CALL_BOUND) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(Error::Other("the agent process is gone".into()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("the agent did not answer in {CALL_BOUND:?}"),
        }
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    /// Kills the agent with SIGKILL and reaps it: its endpoints vanish mid-whatever.
    pub fn kill(&self) {
        let mut c = self.child.lock().unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }

    /// A server endpoint in the agent.
    pub fn bind(self: &Arc<Self>, addr: &Address, cfg: Config) -> Result<Ep> {
        match self.call(Call::Bind { addr: addr.to_string(), cfg })? {
            Answer::Ep { id, addr } => Ok(Ep(Arc::new(Remote {
                agent: self.clone(),
                id,
                addr: addr.map(|a| a.parse().expect("address")),
            }))),
            other => panic!("unexpected answer {other:?}"),
        }
    }

    /// A client endpoint in the agent.
    pub fn client(self: &Arc<Self>, scheme: &str, cfg: Config) -> Result<Ep> {
        match self.call(Call::Client { scheme: scheme.into(), cfg })? {
            Answer::Ep { id, .. } => Ok(Ep(Arc::new(Remote { agent: self.clone(), id, addr: None }))),
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An endpoint living in an agent.
pub struct Remote {
    agent: Arc<Agent>,
    id: u32,
    addr: Option<Address>,
}

fn unexpected_answer<T>(a: Answer) -> Result<T> {
    panic!("unexpected answer from the agent: {a:?}")
}

impl Api for Remote {
    fn connect(&self, addr: &Address) -> Result<PeerId> {
        match self.agent.call(Call::Connect { ep: self.id, addr: addr.to_string() })? {
            Answer::Peer(p) => Ok(p),
            a => unexpected_answer(a),
        }
    }
    fn local_addr(&self) -> Option<Address> {
        self.addr.clone()
    }
    fn post(&self, p: Post) -> Result<OpId> {
        match self.agent.call(Call::Post { ep: self.id, p })? {
            Answer::Op(o) => Ok(o),
            a => unexpected_answer(a),
        }
    }
    fn set_deadline(&self, op: OpId, after: Duration) -> Result<()> {
        self.agent.call(Call::SetDeadline { ep: self.id, op, after }).map(drop)
    }
    fn cancel(&self, op: OpId) -> Result<()> {
        self.agent.call(Call::Cancel { ep: self.id, op }).map(drop)
    }
    fn test(&self, op: OpId) -> Result<Option<Completion>> {
        done(self.agent.call(Call::Test { ep: self.id, op })?)
    }
    fn wait(&self, op: OpId, timeout: Option<Duration>) -> Result<Option<Completion>> {
        done(self.agent.call(Call::Wait { ep: self.id, op, timeout })?)
    }
    fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        done(self.agent.call(Call::WaitAny { ep: self.id, timeout })?)
    }
    fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>> {
        match self.agent.call(Call::RecvUnexpected { ep: self.id, timeout })? {
            Answer::Unexpected(u) => {
                Ok(u.map(|(peer, tag, sl, data)| Unexpected { peer, tag, sl: sl_from(sl), data }))
            }
            a => unexpected_answer(a),
        }
    }
    fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>> {
        match self.agent.call(Call::NextRequest { ep: self.id, timeout })? {
            Answer::Request(r) => Ok(r.map(|(id, m)| {
                let meta = ReqMeta {
                    peer: m.peer,
                    tag: m.tag,
                    sl: sl_from(m.sl),
                    header: m.header,
                    dir: DIRS[usize::from(m.dir)],
                    len: m.len,
                };
                Request::new(meta, Box::new(RemoteReq { agent: self.agent.clone(), id, answered: false }))
            })),
            a => unexpected_answer(a),
        }
    }
    fn expose(&self, data: Bytes, access: ionet::Access) -> Result<Exposure> {
        match self.agent.call(Call::Expose { ep: self.id, data, access: access.bits() })? {
            Answer::Exposure { id, handle } => Ok(Exposure::new(
                ionet::MemHandle::from_bytes(&handle).expect("handle"),
                Box::new(RemoteXpo { agent: self.agent.clone(), id, revoked: false }),
            )),
            a => unexpected_answer(a),
        }
    }
    fn info(&self) -> Info {
        match self.agent.call(Call::Info { ep: self.id }) {
            Ok(Answer::Info(i)) => from_wire_info(*i),
            other => panic!("info from the agent: {other:?}"),
        }
    }
    fn remote(&self) -> bool {
        true
    }
}

fn done(a: Answer) -> Result<Option<Completion>> {
    match a {
        Answer::Done(c) => Ok(c.map(from_wire_completion)),
        a => unexpected_answer(a),
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.agent.call(Call::Drop { ep: self.id });
    }
}

struct RemoteReq {
    agent: Arc<Agent>,
    id: u64,
    answered: bool,
}

impl ReqApi for RemoteReq {
    fn pull(&self, buf: RBuf, offset: u64) -> Result<OpId> {
        match self.agent.call(Call::Pull { req: self.id, buf, offset })? {
            Answer::Op(o) => Ok(o),
            a => unexpected_answer(a),
        }
    }
    fn push(&self, buf: SBuf, offset: u64) -> Result<OpId> {
        match self.agent.call(Call::Push { req: self.id, buf, offset })? {
            Answer::Op(o) => Ok(o),
            a => unexpected_answer(a),
        }
    }
    fn is_cancelled(&self) -> Result<bool> {
        match self.agent.call(Call::IsCancelled { req: self.id })? {
            Answer::Flag(f) => Ok(f),
            a => unexpected_answer(a),
        }
    }
    fn reply(mut self: Box<Self>, header: Bytes, error: bool) -> Result<OpId> {
        self.answered = true;
        match self.agent.call(Call::Reply { req: self.id, header, error })? {
            Answer::Op(o) => Ok(o),
            a => unexpected_answer(a),
        }
    }
}

impl Drop for RemoteReq {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.agent.call(Call::DropRequest { req: self.id });
        }
    }
}

struct RemoteXpo {
    agent: Arc<Agent>,
    id: u64,
    revoked: bool,
}

impl XpoApi for RemoteXpo {
    fn with(&self, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let mut data = match self.agent.call(Call::ReadExposed { x: self.id })? {
            Answer::Bytes(b) => b.to_vec(),
            a => return unexpected_answer(a),
        };
        f(&mut data);
        self.agent.call(Call::WriteExposed { x: self.id, data: data.into() }).map(drop)
    }
    fn revoke(mut self: Box<Self>) -> Result<usize> {
        self.revoked = true;
        match self.agent.call(Call::Revoke { x: self.id })? {
            Answer::Len(n) => Ok(n),
            a => unexpected_answer(a),
        }
    }
}

impl Drop for RemoteXpo {
    fn drop(&mut self) {
        if !self.revoked {
            let _ = self.agent.call(Call::DropExposure { x: self.id });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The agent process

#[derive(Default)]
struct Host {
    eps: Mutex<HashMap<u32, ionet::Endpoint>>,
    reqs: Mutex<HashMap<u64, ionet::Request>>,
    xpos: Mutex<HashMap<u64, (u32, ionet::Exposure)>>,
    next: AtomicU64,
}

impl Host {
    fn ep(&self, id: u32) -> Result<ionet::Endpoint> {
        self.eps.lock().unwrap().get(&id).cloned().ok_or_else(|| Error::Misuse(format!("no endpoint {id}")))
    }

    fn add(&self, ep: ionet::Endpoint) -> u32 {
        let id = self.next.fetch_add(1, Ordering::Relaxed) as u32;
        self.eps.lock().unwrap().insert(id, ep);
        id
    }

    fn exec(&self, c: Call) -> Result<Answer> {
        let some = |c: Option<ionet::Completion>| Answer::Done(c.map(wire_completion));
        Ok(match c {
            Call::Bind { addr, cfg } => {
                let addr: Address = addr.parse()?;
                let ep = ionet::Endpoint::bind(addr.clone(), cfg.to_ionet(addr.scheme()))?;
                let local = ep.local_addr().map(|a| a.to_string());
                Answer::Ep { id: self.add(ep), addr: local }
            }
            Call::Client { scheme, cfg } => {
                let s = format!("{scheme}://127.0.0.1:0").parse::<Address>()?.scheme();
                Answer::Ep { id: self.add(ionet::Endpoint::client(cfg.to_ionet(s))?), addr: None }
            }
            Call::Drop { ep } => {
                self.eps.lock().unwrap().remove(&ep);
                Answer::Unit
            }
            Call::Connect { ep, addr } => Answer::Peer(ids::peer(self.ep(ep)?.connect(addr.as_str())?)),
            Call::Post { ep, p } => Answer::Op(local_post(&self.ep(ep)?, p)?),
            Call::SetDeadline { ep, op, after } => {
                self.ep(ep)?.set_deadline(ids::ionet_op(op)?, Instant::now() + after)?;
                Answer::Unit
            }
            Call::Cancel { ep, op } => {
                self.ep(ep)?.cancel(ids::ionet_op(op)?)?;
                Answer::Unit
            }
            Call::Test { ep, op } => some(self.ep(ep)?.test(ids::ionet_op(op)?)?),
            Call::Wait { ep, op, timeout } => {
                let e = self.ep(ep)?;
                let op = ids::ionet_op(op)?;
                some(match timeout {
                    Some(t) => e.wait_timeout(op, t)?,
                    None => Some(e.wait(op)?),
                })
            }
            Call::WaitAny { ep, timeout } => some(self.ep(ep)?.wait_any(timeout)?),
            Call::RecvUnexpected { ep, timeout } => {
                let e = self.ep(ep)?;
                Answer::Unexpected(e.recv_unexpected(timeout)?.map(|u| {
                    let u = local_unexpected(u);
                    (u.peer, u.tag, u.sl.index() as u8, u.data)
                }))
            }
            Call::NextRequest { ep, timeout } => {
                let e = self.ep(ep)?;
                Answer::Request(e.next_request(timeout)?.map(|r| {
                    let m = local_meta(&r);
                    let id = self.next.fetch_add(1, Ordering::Relaxed);
                    self.reqs.lock().unwrap().insert(id, r);
                    let meta = WMeta {
                        peer: m.peer,
                        tag: m.tag,
                        sl: m.sl.index() as u8,
                        header: m.header,
                        dir: dir_code(m.dir),
                        len: m.len,
                    };
                    (id, meta)
                }))
            }
            Call::Pull { req, buf, offset } => {
                let reqs = self.reqs.lock().unwrap();
                let r = reqs.get(&req).ok_or_else(|| Error::Misuse("no such request".into()))?;
                Answer::Op(ids::op(r.pull_into(to_recv_buf(r.endpoint(), buf)?, offset)?))
            }
            Call::Push { req, buf, offset } => {
                let reqs = self.reqs.lock().unwrap();
                let r = reqs.get(&req).ok_or_else(|| Error::Misuse("no such request".into()))?;
                Answer::Op(ids::op(r.push_from(to_send_buf(r.endpoint(), buf)?, offset)?))
            }
            Call::IsCancelled { req } => {
                let reqs = self.reqs.lock().unwrap();
                let r = reqs.get(&req).ok_or_else(|| Error::Misuse("no such request".into()))?;
                Answer::Flag(r.is_cancelled())
            }
            Call::Reply { req, header, error } => {
                let r = self
                    .reqs
                    .lock()
                    .unwrap()
                    .remove(&req)
                    .ok_or_else(|| Error::Misuse("no such request".into()))?;
                let op =
                    if error { r.reply_error(&String::from_utf8_lossy(&header))? } else { r.reply(header)? };
                Answer::Op(ids::op(op))
            }
            Call::DropRequest { req } => {
                let r = self.reqs.lock().unwrap().remove(&req);
                drop(r);
                Answer::Unit
            }
            Call::Expose { ep, data, access } => {
                let e = self.ep(ep)?;
                let mut b = e.alloc(data.len())?;
                b.copy_from_slice(&data);
                let access =
                    ionet::Access::from_bits(access).ok_or_else(|| Error::Misuse("access".into()))?;
                let x = e.expose(b, access)?;
                let handle = x.handle().to_bytes().to_vec();
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                self.xpos.lock().unwrap().insert(id, (ep, x));
                Answer::Exposure { id, handle }
            }
            Call::ReadExposed { x } => {
                let xpos = self.xpos.lock().unwrap();
                let (ep, xp) = xpos.get(&x).ok_or_else(|| Error::Misuse("no such exposure".into()))?;
                Answer::Bytes(self.ep(*ep)?.with_exposed(xp, |b| Bytes::copy_from_slice(b))?)
            }
            Call::WriteExposed { x, data } => {
                let xpos = self.xpos.lock().unwrap();
                let (ep, xp) = xpos.get(&x).ok_or_else(|| Error::Misuse("no such exposure".into()))?;
                self.ep(*ep)?.with_exposed(xp, |b| b.copy_from_slice(&data))?;
                Answer::Unit
            }
            Call::Revoke { x } => {
                let (ep, xp) = self
                    .xpos
                    .lock()
                    .unwrap()
                    .remove(&x)
                    .ok_or_else(|| Error::Misuse("no such exposure".into()))?;
                Answer::Len(self.ep(ep)?.revoke(xp)?.len())
            }
            Call::DropExposure { x } => {
                let x = self.xpos.lock().unwrap().remove(&x);
                drop(x);
                Answer::Unit
            }
            Call::Info { ep } => Answer::Info(Box::new(wire_info(&self.ep(ep)?.info()))),
        })
    }
}

impl From<ionet::addr::AddrError> for Error {
    fn from(e: ionet::addr::AddrError) -> Self {
        Error::Addr(e.to_string())
    }
}

/// The agent: serves commands until the test process closes the socket. Returns at once when
/// not started by [`Agent::spawn`].
pub fn main() {
    let Ok(path) = std::env::var(AGENT_ENV) else { return };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let sock = UnixStream::connect(&path).expect("dial the test process");
    let out = Arc::new(Mutex::new(sock.try_clone().expect("clone socket")));
    let host = Arc::new(Host::default());
    let mut rx = BufReader::new(sock);
    while let Some(f) = read_frame(&mut rx) {
        let (id, call): (u64, Call) = postcard::from_bytes(&f).expect("command frame");
        let (host, out) = (host.clone(), out.clone());
        std::thread::spawn(move || {
            let a = host.exec(call);
            let _ = write_frame(&mut *out.lock().unwrap(), &(id, a));
        });
    }
    // The test is over (or gave up on us): leave without running endpoint destructors that
    // might wait on peers that are already gone.
    std::process::exit(0);
}
