//! `stripefs serve --metrics HOST:PORT`: the server's counters in the Prometheus text
//! exposition format (version 0.0.4) on `GET /metrics`, over plain HTTP/1.x.
//!
//! The format is a handful of lines per metric, so it is written here rather than through a
//! metrics crate: the values already live in the server (its endpoint's `info()` and its own
//! report) and are read once per scrape, so no registry is needed either.
//!
//! The responder is one thread serving one connection at a time: a scraper that sends too
//! much, too slowly or nothing at all is cut off by the request size limit and one deadline
//! for the whole request head, so it holds at most [`MAX_REQUEST`] bytes (plus one read) and
//! delays the next scrape by at most [`IO_TIMEOUT`] to send its request and as long again to
//! take the reply; it never grows memory or reaches the server's request path.

use anyhow::{Context, Result};
use ionet::Endpoint;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use stripefs::config::ServerId;
use stripefs::server::ServerReport;

/// Largest request head accepted (request line and headers); a scrape needs a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a connection may take to send its request, and to take the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The labels naming the server a process exports: its role and, for an io server, its index.
fn labels(server: ServerId) -> String {
    match server {
        ServerId::Meta => r#"role="meta",index="0""#.into(),
        ServerId::Io(i) => format!(r#"role="io",index="{i}""#),
    }
}

/// Binds `addr` and serves `/metrics` for the server on `ep` (reporting through `report`) in a
/// thread of its own, for the life of the process; returns the bound address (port 0 = any).
pub fn start(
    addr: SocketAddr,
    server: ServerId,
    ep: Endpoint,
    upstream: Option<Endpoint>,
    report: impl Fn() -> Option<ServerReport> + Send + 'static,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("binding the metrics address {addr}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    let peer = s.peer_addr().ok();
                    if let Err(e) = answer(s, || render(server, &ep, upstream.as_ref(), report().as_ref())) {
                        tracing::debug!(?peer, error = %e, "metrics request not answered");
                    }
                }
                Err(e) => {
                    tracing::warn!(addr = %bound, error = %e, "accepting a metrics connection failed");
                    // Out of descriptors, say: do not spin on it.
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    })?;
    Ok(bound)
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics,
    NotFound,
    BadMethod,
    Malformed,
}

/// Parses the request line of a complete head.
fn parse(head: &[u8]) -> Asked {
    let Ok(text) = std::str::from_utf8(head) else { return Asked::Malformed };
    let line = text.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Asked::Malformed;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Malformed;
    }
    if method != "GET" && method != "HEAD" {
        return Asked::BadMethod;
    }
    // Query strings are ignored (Prometheus may add some).
    match target.split('?').next() {
        Some("/metrics") => Asked::Metrics,
        _ => Asked::NotFound,
    }
}

/// Reads one request head from `s` (bounded in size and time) and answers it.
fn answer(mut s: TcpStream, body: impl FnOnce() -> String) -> std::io::Result<()> {
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let asked = loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break parse(&head[..end]);
        }
        if head.len() > MAX_REQUEST {
            return reply(&mut s, "431 Request Header Fields Too Large", "request too large\n", false);
        }
        // One deadline for the whole head: a scraper trickling a byte at a time would
        // otherwise hold the responder as long as it likes.
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return reply(&mut s, "408 Request Timeout", "request too slow\n", false);
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return reply(&mut s, "408 Request Timeout", "request too slow\n", false);
            }
            Err(e) => return Err(e),
        }
    };
    let head_only = head.starts_with(b"HEAD ");
    match asked {
        Asked::Metrics => reply(&mut s, "200 OK", &body(), head_only),
        Asked::NotFound => reply(&mut s, "404 Not Found", "only /metrics is served here\n", head_only),
        Asked::BadMethod => reply(&mut s, "405 Method Not Allowed", "GET /metrics\n", false),
        Asked::Malformed => reply(&mut s, "400 Bad Request", "not an HTTP/1 request\n", false),
    }
}

fn reply(s: &mut TcpStream, status: &str, body: &str, head_only: bool) -> std::io::Result<()> {
    let ctype = if status.starts_with("200") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    s.write_all(out.as_bytes())?;
    s.flush()
}

/// The text exposition of one process: metric families each with `# HELP` and `# TYPE`, then
/// their samples.
struct Exposition {
    out: String,
    labels: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// A sample with the process's labels and `extra` ones (`key="value"`, comma-separated).
    fn sample(&mut self, name: &str, extra: &str, v: impl std::fmt::Display) {
        let sep = if extra.is_empty() { "" } else { "," };
        let _ = writeln!(self.out, "{name}{{{}{sep}{extra}}} {v}", self.labels);
    }

    fn counter(&mut self, name: &str, help: &str, v: u64) {
        self.family(name, "counter", help);
        self.sample(name, "", v);
    }

    fn gauge(&mut self, name: &str, help: &str, v: impl std::fmt::Display) {
        self.family(name, "gauge", help);
        self.sample(name, "", v);
    }
}

/// Every metric of the server serving on `ep`, and reaching other servers through `upstream`
/// (the meta server's endpoint to the io servers); see the README's metrics table.
pub fn render(
    server: ServerId,
    ep: &Endpoint,
    upstream: Option<&Endpoint>,
    report: Option<&ServerReport>,
) -> String {
    let mut x = Exposition { out: String::with_capacity(8 * 1024), labels: labels(server) };
    x.family("stripefs_build_info", "gauge", "Always 1; the server's version in a label.");
    x.sample("stripefs_build_info", &format!(r#"version="{}""#, env!("CARGO_PKG_VERSION")), 1);
    if let Some(r) = report {
        server_metrics(&mut x, r);
    }
    let mut endpoints = vec![("serve", ep.info())];
    endpoints.extend(upstream.map(|u| ("io_servers", u.info())));
    endpoint_metrics(&mut x, &endpoints);
    x.out
}

fn server_metrics(x: &mut Exposition, r: &ServerReport) {
    let s = &r.status;
    x.gauge("stripefs_uptime_seconds", "Seconds since the server started.", s.uptime_ns as f64 / 1e9);
    x.counter("stripefs_requests_total", "Requests received since the server started.", s.requests);
    x.counter("stripefs_request_errors_total", "Requests answered with an error.", s.errors);
    x.gauge("stripefs_requests_in_flight", "Requests being served now.", s.in_flight);
    x.gauge("stripefs_disk_total_bytes", "Size of the file system holding the data directory.", s.disk.total);
    x.gauge("stripefs_disk_free_bytes", "Free bytes of that file system.", s.disk.free);
    x.gauge(
        "stripefs_disk_avail_bytes",
        "Bytes of that file system free for the server's writes.",
        s.disk.avail,
    );
    if let Some(io) = &r.io {
        x.counter("stripefs_io_reads_total", "Read requests served.", io.reads);
        x.counter("stripefs_io_writes_total", "Write requests served.", io.writes);
        x.counter("stripefs_io_read_bytes_total", "Data bytes read by clients.", io.bytes_read);
        x.counter("stripefs_io_written_bytes_total", "Data bytes written by clients.", io.bytes_written);
        x.counter("stripefs_io_syncs_total", "Syncs served.", io.syncs);
        x.counter(
            "stripefs_io_written_behind_bytes_total",
            "Bytes whose writeback the server started as they landed, ahead of any fsync.",
            io.written_behind,
        );
        x.gauge("stripefs_io_open_files", "Object files open in the descriptor cache.", io.open_files);
        let name = "stripefs_io_path_requests_total";
        x.family(name, "counter", "Requests with data by the data path that took them (mapped or copied).");
        for (path, p) in [("mapped", &io.mapped), ("copied", &io.copied)] {
            x.sample(name, &format!(r#"path="{path}",op="read""#), p.reads);
            x.sample(name, &format!(r#"path="{path}",op="write""#), p.writes);
        }
        let name = "stripefs_io_path_bytes_total";
        x.family(name, "counter", "Bytes of successful requests by data path.");
        for (path, p) in [("mapped", &io.mapped), ("copied", &io.copied)] {
            x.sample(name, &format!(r#"path="{path}""#), p.bytes);
        }
        let name = "stripefs_io_fallbacks_total";
        x.family(name, "counter", "Requests the mapped path handed to the copying one, by reason.");
        let f = &io.fallbacks;
        for (reason, v) in
            [("unordered", f.unordered), ("beyond_map", f.beyond_map), ("no_fallocate", f.no_fallocate)]
        {
            x.sample(name, &format!(r#"reason="{reason}""#), v);
        }
    }
    if let Some(m) = &r.meta {
        x.gauge("stripefs_meta_files", "Regular files and symbolic links in the namespace.", m.files);
        x.gauge("stripefs_meta_directories", "Directories in the namespace, the root included.", m.dirs);
    }
    if let Some(m) = &r.meta_state {
        x.gauge(
            "stripefs_meta_unflushed_commits",
            "Commits acknowledged but not yet flushed to disk (changes of times, added mode bits).",
            m.unflushed,
        );
        x.gauge(
            "stripefs_meta_files_made_ahead",
            "Files whose objects are made ahead for creates.",
            m.made_ahead,
        );
    }
}

/// How one `ionet_*` metric reads an endpoint's `info()`.
type InfoRead = fn(&ionet::Info) -> u64;

/// The `ionet_*` metrics of every endpoint: name, type, help, value.
const ENDPOINT_METRICS: &[(&str, &str, &str, InfoRead)] = &[
    ("ionet_messages_sent_total", "counter", "Messages sent (sends, requests, replies).", |i| {
        i.counters.msgs_sent
    }),
    ("ionet_messages_received_total", "counter", "Messages received.", |i| i.counters.msgs_received),
    ("ionet_bytes_sent_total", "counter", "Payload bytes sent.", |i| i.counters.bytes_sent),
    ("ionet_bytes_received_total", "counter", "Payload bytes received.", |i| i.counters.bytes_received),
    ("ionet_host_copy_bytes_total", "counter", "Payload bytes the transport copied with the CPU.", |i| {
        i.counters.host_copy_bytes
    }),
    ("ionet_host_copies_total", "counter", "CPU copies of payload by the transport.", |i| {
        i.counters.host_copies
    }),
    ("ionet_connections_total", "counter", "Connections established (both directions).", |i| {
        i.counters.connections
    }),
    ("ionet_peers_lost_total", "counter", "Connections lost (error or peer death).", |i| {
        i.counters.peers_lost
    }),
    ("ionet_protocol_errors_total", "counter", "Protocol violations by peers.", |i| {
        i.counters.protocol_errors
    }),
    ("ionet_auth_failures_total", "counter", "Handshakes refused for authentication.", |i| {
        i.counters.auth_failures
    }),
    ("ionet_backpressure_pauses_total", "counter", "Times a peer was paused for back-pressure.", |i| {
        i.counters.backpressure_pauses
    }),
    (
        "ionet_stream_bytes_parked_total",
        "counter",
        "Streamed payload bytes read aside for late pulls.",
        |i| i.counters.stream_bytes_parked,
    ),
    ("ionet_access_denied_total", "counter", "One-sided accesses refused.", |i| i.counters.access_denied),
    ("ionet_ops_completed_total", "counter", "Operations completed.", |i| i.counters.ops_completed),
    ("ionet_ops_cancelled_total", "counter", "Operations cancelled (locally or by deadline).", |i| {
        i.counters.ops_cancelled
    }),
    ("ionet_credit_messages_total", "counter", "Explicit credit messages sent.", |i| i.counters.credit_msgs),
    ("ionet_wc_errors_total", "counter", "InfiniBand work requests completed with an error.", |i| {
        i.counters.wc_errors
    }),
    ("ionet_spin_yields_total", "counter", "Times a polling driver yielded its CPU.", |i| {
        i.counters.spin_yields
    }),
    ("ionet_waiter_wakeups_total", "counter", "Times a waiting thread was woken.", |i| {
        i.counters.waiter_wakeups
    }),
    ("ionet_spins_cut_short_total", "counter", "Adaptive waits that slept before their spin budget.", |i| {
        i.counters.spins_cut_short
    }),
    ("ionet_peers_connected", "gauge", "Peers known and connected now.", |i| i.peers_connected as u64),
    ("ionet_peers", "gauge", "Peer records held, connected or not.", |i| i.gauges.peers as u64),
    ("ionet_handshakes", "gauge", "Accepted connections still in their handshake.", |i| {
        i.gauges.handshakes as u64
    }),
    ("ionet_pending_ops", "gauge", "Operations posted and not yet completed.", |i| i.pending_ops as u64),
    ("ionet_exposures", "gauge", "Exposures registered now.", |i| i.exposures as u64),
    ("ionet_transmit_bytes", "gauge", "Bytes queued towards peers by the transport.", |i| {
        i.gauges.transmit_bytes as u64
    }),
    ("ionet_buffered_bytes", "gauge", "Bytes buffered from peers (early, unexpected, requests).", |i| {
        i.gauges.buffered_bytes as u64
    }),
    ("ionet_peers_paused", "gauge", "Peers not read because of their transmit backlog.", |i| {
        i.gauges.peers_paused as u64
    }),
    ("ionet_pool_in_use_bytes", "gauge", "Registered-buffer pool bytes handed out.", |i| i.pool.in_use_bytes),
    ("ionet_pool_cached_bytes", "gauge", "Registered-buffer pool bytes held but free.", |i| {
        i.pool.cached_bytes
    }),
];

/// How one registration-cache metric reads the cache's figures.
type RegcacheRead = fn(&ionet::RegcacheInfo) -> u64;

/// The registration cache's metrics, of the endpoints that have one (absent, not zero,
/// elsewhere).
const REGCACHE_METRICS: &[(&str, &str, &str, RegcacheRead)] = &[
    ("ionet_regcache_hits_total", "counter", "Registration cache lookups that found a registration.", |r| {
        r.hits
    }),
    ("ionet_regcache_misses_total", "counter", "Registration cache lookups that had to register.", |r| {
        r.misses
    }),
    ("ionet_regcache_entries", "gauge", "Registration cache entries now.", |r| r.entries as u64),
    ("ionet_regcache_pinned_bytes", "gauge", "Bytes pinned by the registration cache now.", |r| {
        r.pinned_bytes
    }),
];

/// The `ionet_*` metrics of each endpoint, labelled `endpoint="<name>"`: each family declared
/// once, with a sample per endpoint.
fn endpoint_metrics(x: &mut Exposition, endpoints: &[(&str, ionet::Info)]) {
    for (name, kind, help, read) in ENDPOINT_METRICS {
        x.family(name, kind, help);
        for (ep, info) in endpoints {
            x.sample(name, &format!(r#"endpoint="{ep}""#), read(info));
        }
    }
    let name = "ionet_transfers_total";
    x.family(
        name,
        "counter",
        "Transfers by mechanism: inline (eager), fast_rdma, server_rdma (rendezvous / server-based RDMA).",
    );
    for (ep, info) in endpoints {
        let c = &info.counters;
        for (m, v) in
            [("inline", c.mech_inline), ("fast_rdma", c.mech_fast_rdma), ("server_rdma", c.mech_server_rdma)]
        {
            x.sample(name, &format!(r#"endpoint="{ep}",mechanism="{m}""#), v);
        }
    }
    let cached: Vec<(&str, ionet::RegcacheInfo)> =
        endpoints.iter().filter_map(|(ep, i)| i.regcache.map(|r| (*ep, r))).collect();
    if !cached.is_empty() {
        for (name, kind, help, read) in REGCACHE_METRICS {
            x.family(name, kind, help);
            for (ep, r) in &cached {
                x.sample(name, &format!(r#"endpoint="{ep}""#), read(r));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_parsed_strictly() {
        assert_eq!(parse(b"GET /metrics HTTP/1.1\r\nHost: x"), Asked::Metrics);
        assert_eq!(parse(b"GET /metrics?x=1 HTTP/1.0"), Asked::Metrics);
        assert_eq!(parse(b"HEAD /metrics HTTP/1.1"), Asked::Metrics);
        assert_eq!(parse(b"GET / HTTP/1.1"), Asked::NotFound);
        assert_eq!(parse(b"POST /metrics HTTP/1.1"), Asked::BadMethod);
        assert_eq!(parse(b"GET /metrics"), Asked::Malformed);
        assert_eq!(parse(b"GET /metrics SPDY/3"), Asked::Malformed);
        assert_eq!(parse(b"GET  /metrics HTTP/1.1"), Asked::Malformed);
        assert_eq!(parse(&[0xff, 0xfe]), Asked::Malformed);
    }

    /// Every sample belongs to a family declared once with HELP and TYPE just before it, and
    /// carries the server's labels.
    #[test]
    fn every_family_is_declared_once_before_its_samples() {
        let ep = Endpoint::bind("tcp://127.0.0.1:0", ionet::Config::default()).unwrap();
        let up = Endpoint::client(ionet::Config::default()).unwrap();
        let text = render(ServerId::Io(3), &ep, Some(&up), None);
        let mut declared = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(declared.insert(name.clone()), "{name} declared twice");
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next(), Some(current.as_str()));
                assert!(matches!(it.next(), Some("counter" | "gauge")), "{line}");
            } else {
                let name = line.split('{').next().unwrap();
                assert_eq!(name, current, "{line}");
                assert!(line.contains(r#"role="io",index="3""#), "{line}");
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
                assert!(name.starts_with("stripefs_") || name.starts_with("ionet_"), "{line}");
                if name.ends_with("_total") {
                    assert!(text.contains(&format!("# TYPE {name} counter")));
                }
            }
        }
        assert!(declared.contains("ionet_bytes_sent_total") && declared.contains("ionet_transfers_total"));
        for ep in ["serve", "io_servers"] {
            let sample = format!(r#"ionet_bytes_sent_total{{role="io",index="3",endpoint="{ep}"}} 0"#);
            assert!(text.lines().any(|l| l == sample), "{sample} in {text}");
        }
    }
}
