//! `ionet-perf qos`: round-trip latency of 64-byte `Control`-class messages while a `Bulk`-class
//! stream saturates the link — service levels on (pings and stream on their own classes, hence
//! their own connections / queue pairs and scheduler weights) against off (everything on one
//! class, sharing one connection FIFO), with the idle round trip as the baseline.
//!
//! One session: the client sends a hello (unexpected) naming the ping class and count; the
//! server then echoes that many pings and, on another thread, sinks the stream until a
//! one-byte stop message arrives.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use benchkit::plot::BarChart;
use benchkit::{Sample, Samples, Summary, Table, stats};
use bytes::{Bytes, BytesMut};
use ionet::{Endpoint, OpId, PeerId, RecvBuf, Result as NetResult, Scheme, ServiceLevel, WaitMode};

use crate::BoxErr;
use crate::procs::ServerProc;

const EXP: &str = "qos";
const TAG_HELLO: u64 = 0x51_01;
const TAG_PING: u64 = 0x51_02;
const TAG_PONG: u64 = 0x51_03;
const TAG_BULK: u64 = 0x51_04;
const TAG_DONE: u64 = 0x51_05;
/// Size of each ping.
pub const PING: usize = 64;
/// Size of each stream message.
pub const BULK: usize = 1 << 20;
/// Stream messages in flight.
const WINDOW: usize = 8;

/// The three set-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Pings alone (Control class): the baseline.
    Idle,
    /// Pings on Control, stream on Bulk.
    On,
    /// Pings and stream both on Normal.
    Off,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Idle, Mode::On, Mode::Off];

    fn name(self) -> &'static str {
        match self {
            Mode::Idle => "idle (no stream)",
            Mode::On => "service levels on",
            Mode::Off => "service levels off",
        }
    }

    fn classes(self) -> (ServiceLevel, Option<ServiceLevel>) {
        match self {
            Mode::Idle => (ServiceLevel::Control, None),
            Mode::On => (ServiceLevel::Control, Some(ServiceLevel::Bulk)),
            Mode::Off => (ServiceLevel::Normal, Some(ServiceLevel::Normal)),
        }
    }
}

fn hello(pings: u32, ping_sl: ServiceLevel, stream_sl: Option<ServiceLevel>) -> Bytes {
    let mut v = pings.to_le_bytes().to_vec();
    v.push(ping_sl as u8);
    v.push(stream_sl.map_or(0xff, |s| s as u8));
    Bytes::from(v)
}

fn parse_hello(b: &[u8]) -> Option<(u32, ServiceLevel, Option<ServiceLevel>)> {
    if b.len() != 6 {
        return None;
    }
    let pings = u32::from_le_bytes(b[..4].try_into().ok()?);
    if pings > 10_000_000 {
        return None;
    }
    let ping_sl = ServiceLevel::from_u8(b[4])?;
    let stream = if b[5] == 0xff { None } else { Some(ServiceLevel::from_u8(b[5])?) };
    Some((pings, ping_sl, stream))
}

fn take(c: ionet::Completion) -> BytesMut {
    match c.buf.into_recv() {
        Some(RecvBuf::Mut(b)) => b,
        _ => BytesMut::new(),
    }
}

/// Serves sessions until killed.
pub fn serve(ep: &Endpoint) -> NetResult<()> {
    let mut bulk_bufs: Vec<BytesMut> = (0..WINDOW).map(|_| prefaulted(BULK)).collect();
    loop {
        let Some(u) = ep.recv_unexpected(None)? else { continue };
        if u.tag != TAG_HELLO {
            continue;
        }
        let Some((pings, ping_sl, stream)) = parse_hello(&u.data) else {
            eprintln!("ionet-perf qos server: bad hello from {}", u.peer);
            continue;
        };
        if bulk_bufs.len() < WINDOW {
            bulk_bufs = (0..WINDOW).map(|_| prefaulted(BULK)).collect();
        }
        if let Err(e) = serve_session(ep, u.peer, pings, ping_sl, stream.is_some(), &mut bulk_bufs) {
            eprintln!("ionet-perf qos server: session failed: {e}");
        }
    }
}

/// Next completion of a session's loop, or an error after [`OP_TIMEOUT`].
fn next(ep: &Endpoint) -> NetResult<ionet::Completion> {
    ep.wait_any(Some(OP_TIMEOUT))?
        .ok_or_else(|| ionet::Error::misuse(format!("no completion within {OP_TIMEOUT:?}")))
}

/// One session on one thread: the pings' echoes and the stream's receives are driven by the
/// same `wait_any` loop (BMI's `testcontext` style), so the figures measure the transport's
/// service levels, not how soon the scheduler runs a second thread of a process pinned to one
/// CPU while the first copies bulk data.
fn serve_session(
    ep: &Endpoint,
    peer: PeerId,
    pings: u32,
    ping_sl: ServiceLevel,
    stream: bool,
    bulk_bufs: &mut Vec<BytesMut>,
) -> NetResult<()> {
    let mut bulk: HashSet<OpId> = HashSet::new();
    if stream {
        for b in bulk_bufs.drain(..) {
            bulk.insert(ep.recv(peer, TAG_BULK, b)?);
        }
    }
    let mut ping = Some(ep.recv(peer, TAG_PING, BytesMut::zeroed(PING))?);
    let mut pongs: HashSet<OpId> = HashSet::new();
    pongs.insert(ep.send(peer, TAG_DONE, Bytes::from_static(b"r"), ServiceLevel::Control)?);
    let echo = Bytes::from(vec![7u8; PING]);
    let (mut answered, mut streaming) = (0u32, stream);
    while answered < pings || streaming || !pongs.is_empty() || !bulk.is_empty() {
        let c = next(ep)?;
        if ping == Some(c.op) {
            let c = c.ok()?;
            answered += 1;
            ping = if answered < pings { Some(ep.recv(peer, TAG_PING, take(c))?) } else { None };
            pongs.insert(ep.send(peer, TAG_PONG, echo.clone(), ping_sl)?);
        } else if pongs.remove(&c.op) {
            c.ok()?;
        } else if bulk.remove(&c.op) {
            // While streaming every receive must succeed; after the stop, cancelled ones return.
            let c = if streaming { c.ok()? } else { c };
            let stop = matches!(c.result, Ok(1));
            let b = take(c);
            if b.len() == BULK {
                bulk_bufs.push(b);
            }
            if stop {
                // The stream is over: give back the receives still posted.
                streaming = false;
                for op in &bulk {
                    let _ = ep.cancel(*op);
                }
            } else if streaming {
                bulk.insert(ep.recv(peer, TAG_BULK, bulk_bufs.pop().expect("just returned"))?);
            }
        }
    }
    // Tell the client this side is done, so it does not close while the stop is still queued.
    wait(ep, ep.send(peer, TAG_DONE, Bytes::from_static(b"e"), ServiceLevel::Control)?)?;
    Ok(())
}

fn prefaulted(n: usize) -> BytesMut {
    let mut b = BytesMut::zeroed(n);
    benchkit::prefault(&mut b);
    b
}

/// One session's figures.
struct SessionResult {
    rtts: Vec<f64>,
    stream_gbps: Option<f64>,
}

/// Longest any single wait of a session may take before the session fails.
const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits for `op` at most [`OP_TIMEOUT`]: a stuck transport fails the run instead of hanging it.
fn wait(ep: &Endpoint, op: OpId) -> NetResult<ionet::Completion> {
    match ep.wait_timeout(op, OP_TIMEOUT)? {
        Some(c) => c.ok(),
        None => {
            let _ = ep.cancel(op);
            Err(ionet::Error::misuse(format!("no completion within {OP_TIMEOUT:?}")))
        }
    }
}

fn session(ep: &Endpoint, peer: PeerId, mode: Mode, pings: u32) -> NetResult<SessionResult> {
    let (ping_sl, stream_sl) = mode.classes();
    let ready = ep.recv(peer, TAG_DONE, BytesMut::zeroed(1))?;
    wait(ep, ep.send_unexpected(peer, TAG_HELLO, hello(pings, ping_sl, stream_sl), ServiceLevel::Control)?)?;
    wait(ep, ready)?;
    // One thread drives the stream and the pings (see `serve_session`): WINDOW bulk sends kept
    // in flight, each completion replaced at once, while pings go one at a time.
    let data = Bytes::from(prefaulted(BULK).freeze().to_vec());
    let mut bulk: HashSet<OpId> = HashSet::new();
    let refill = |bulk: &mut HashSet<OpId>, c: ionet::Completion| -> NetResult<u64> {
        c.ok()?;
        if let Some(sl) = stream_sl {
            bulk.insert(ep.send(peer, TAG_BULK, data.clone(), sl)?);
        }
        Ok(BULK as u64)
    };
    let t0 = Instant::now();
    let mut sent = 0u64;
    if let Some(sl) = stream_sl {
        for _ in 0..WINDOW {
            bulk.insert(ep.send(peer, TAG_BULK, data.clone(), sl)?);
        }
        // Let the stream fill the pipes before the first ping.
        while t0.elapsed() < Duration::from_millis(50) {
            let c = next(ep)?;
            if bulk.remove(&c.op) {
                sent += refill(&mut bulk, c)?;
            }
        }
    }
    let ping = Bytes::from(vec![1u8; PING]);
    let mut rbuf = BytesMut::zeroed(PING);
    let mut rtts = Vec::with_capacity(pings as usize);
    for _ in 0..pings {
        let t = Instant::now();
        let rop = ep.recv(peer, TAG_PONG, std::mem::take(&mut rbuf))?;
        let sop = ep.send(peer, TAG_PING, ping.clone(), ping_sl)?;
        let mut pending = 2;
        while pending > 0 {
            let c = next(ep)?;
            if bulk.remove(&c.op) {
                sent += refill(&mut bulk, c)?;
            } else if c.op == sop {
                c.ok()?;
                pending -= 1;
            } else if c.op == rop {
                rbuf = take(c.ok()?);
                pending -= 1;
                // The round trip ends when the pong is here, whatever the ping's own
                // send completion is doing.
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let stream_gbps = match stream_sl {
        Some(sl) => {
            let secs = t0.elapsed().as_secs_f64();
            while !bulk.is_empty() {
                let c = next(ep)?;
                if bulk.remove(&c.op) {
                    c.ok()?;
                    sent += BULK as u64;
                }
            }
            Some((sl, sent as f64 / secs / 1e9))
        }
        None => None,
    };
    // Posted only now: the `wait_any` loops above would have taken its completion.
    let fin = ep.recv(peer, TAG_DONE, BytesMut::zeroed(1))?;
    if let Some((sl, _)) = stream_gbps {
        wait(ep, ep.send(peer, TAG_BULK, Bytes::from_static(b"s"), sl)?)?;
    }
    // The server's word that the session is over on its side too.
    wait(ep, fin)?;
    Ok(SessionResult { rtts, stream_gbps: stream_gbps.map(|(_, g)| g) })
}

/// Runs every mode on every transport.
pub fn run(transports: &[Scheme], runs: usize, quick: bool, wait: WaitMode) -> Result<Samples, BoxErr> {
    let mut out = Samples::new();
    let pings: u32 = if quick { 300 } else { 3000 };
    for &scheme in transports {
        let listen = format!("{scheme}://127.0.0.1:0");
        let srv = ServerProc::spawn(&["qos-server", "--listen", &listen, "--wait", wait.name()])?;
        let ep = Endpoint::client(ionet::Config::default().wait_mode(wait))?;
        let peer = ep.connect(srv.addr.as_str())?;
        // Warm every class's connection.
        for mode in Mode::ALL {
            session(&ep, peer, mode, 20)?;
        }
        for r in 0..runs.max(1) {
            eprintln!("qos {scheme}: run {r}");
            for mode in Mode::ALL {
                let res = session(&ep, peer, mode, pings)?;
                let mut rtts = res.rtts;
                let t = scheme.as_str();
                let s = |metric: &str, unit: &str, v: f64| {
                    Sample::new(EXP, t, mode.name(), PING as f64)
                        .metric(metric, unit)
                        .run(r as u32, v)
                        .wait(wait.name())
                };
                out.push(s("rtt_p50", "µs", stats::percentile(&mut rtts, 50.0).unwrap_or(f64::NAN)));
                out.push(s("rtt_p99", "µs", stats::percentile(&mut rtts, 99.0).unwrap_or(f64::NAN)));
                if let Some(g) = res.stream_gbps {
                    out.push(s("stream_bandwidth", "GB/s", g));
                }
            }
        }
    }
    Ok(out)
}

/// Markdown table and plot.
pub fn render(s: &Samples, link_prefix: &str) -> Result<(String, Vec<(String, String)>), BoxErr> {
    let s = s.filter(|r| r.experiment == EXP);
    let ts = s.distinct(|r| r.transport.clone());
    let mut t = Table::new([
        "transport",
        "set-up",
        "ping class / stream class",
        "RTT p50 µs",
        "RTT p99 µs",
        "p99 / idle p99",
        "stream GB/s",
    ]);
    let x = PING as f64;
    let get = |tr: &str, m: Mode, metric: &str| s.get(EXP, tr, m.name(), metric, x);
    for tr in &ts {
        let idle99 = get(tr, Mode::Idle, "rtt_p99");
        for m in Mode::ALL {
            let (p, st) = m.classes();
            let p99 = get(tr, m, "rtt_p99");
            t.row([
                format!("{tr}://"),
                m.name().to_string(),
                format!("{} / {}", p.name(), st.map_or("–", |s| s.name())),
                get(tr, m, "rtt_p50").map_or("–".into(), |v| v.to_string()),
                p99.map_or("–".into(), |v| v.to_string()),
                match (p99, idle99) {
                    (Some(a), Some(b)) => format!("{:.1}×", a.ratio_to(&b)),
                    _ => "–".into(),
                },
                get(tr, m, "stream_bandwidth").map_or("–".into(), |v| v.to_string()),
            ]);
        }
    }
    let mut md = format!(
        "64 B ping-pong round trips while a stream of {} messages ({} in flight) runs on the same \
         connection set.\n\n",
        benchkit::units::size(BULK as f64),
        WINDOW
    );
    md.push_str(&t.render());
    let mut plots = Vec::new();
    if !ts.is_empty() {
        let groups: Vec<String> = ts.iter().map(|t| format!("{t}://")).collect();
        let series: Vec<(String, Vec<Option<Summary>>)> = Mode::ALL
            .iter()
            .map(|&m| (format!("p99, {}", m.name()), ts.iter().map(|tr| get(tr, m, "rtt_p99")).collect()))
            .collect();
        let c = BarChart {
            title: "Control-class 64 B RTT p99 under a bulk stream".into(),
            y_desc: "µs".into(),
            groups,
            series,
            log_y: true,
        };
        let name = "qos.svg".to_string();
        md.push_str(&format!("\n![{name}]({link_prefix}{name})\n"));
        plots.push((name, c.render_svg()?));
    }
    Ok((md, plots))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        let h = hello(42, ServiceLevel::Control, Some(ServiceLevel::Bulk));
        assert_eq!(parse_hello(&h), Some((42, ServiceLevel::Control, Some(ServiceLevel::Bulk))));
        assert_eq!(parse_hello(&hello(1, ServiceLevel::Normal, None)), Some((1, ServiceLevel::Normal, None)));
        assert_eq!(parse_hello(b"abc"), None);
        let mut bad = hello(1, ServiceLevel::Normal, None).to_vec();
        bad[4] = 9;
        assert_eq!(parse_hello(&bad), None);
    }

    #[test]
    fn render_reports_p99_against_idle() {
        let mut s = Samples::new();
        for (m, p99) in [(Mode::Idle, 20.0), (Mode::On, 40.0), (Mode::Off, 400.0)] {
            s.push(Sample::new(EXP, "tcp", m.name(), PING as f64).metric("rtt_p99", "µs").run(0, p99));
            s.push(Sample::new(EXP, "tcp", m.name(), PING as f64).metric("rtt_p50", "µs").run(0, p99 / 2.0));
        }
        let (md, plots) = render(&s, "").unwrap();
        assert!(
            md.contains("| tcp:// | service levels off | normal / normal | 200 | 400 | 20.0× | – |"),
            "{md}"
        );
        assert!(
            md.contains("| tcp:// | service levels on | control / bulk | 20.0 | 40.0 | 2.0× | – |"),
            "{md}"
        );
        assert_eq!(plots.len(), 1);
    }
}
