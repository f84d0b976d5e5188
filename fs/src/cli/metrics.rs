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
use stripefs::server::ServerReport;

/// Largest request head accepted (request line and headers); a scrape needs a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;

/// How long a connection may take to send its request, and to take the reply.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Which server a process exports: its role and, for an io server, its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The meta server.
    Meta,
    /// io server `i`.
    Io(u32),
}

impl Role {
    fn labels(self) -> String {
        match self {
            Role::Meta => r#"role="meta",index="0""#.into(),
            Role::Io(i) => format!(r#"role="io",index="{i}""#),
        }
    }
}

/// Binds `addr` and serves `/metrics` for the server on `ep` (reporting through `report`) in a
/// thread of its own, for the life of the process; returns the bound address (port 0 = any).
pub fn start(
    addr: SocketAddr,
    role: Role,
    ep: Endpoint,
    report: impl Fn() -> Option<ServerReport> + Send + 'static,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("binding the metrics address {addr}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    let peer = s.peer_addr().ok();
                    if let Err(e) = answer(s, || render(role, &ep, report().as_ref())) {
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

/// Every metric of the server on `ep` (see the README's metrics table).
pub fn render(role: Role, ep: &Endpoint, report: Option<&ServerReport>) -> String {
    let mut x = Exposition { out: String::with_capacity(8 * 1024), labels: role.labels() };
    x.family("stripefs_build_info", "gauge", "Always 1; the server's version in a label.");
    x.sample("stripefs_build_info", &format!(r#"version="{}""#, env!("CARGO_PKG_VERSION")), 1);
    if let Some(r) = report {
        server_metrics(&mut x, r);
    }
    endpoint_metrics(&mut x, &ep.info());
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
}

fn endpoint_metrics(x: &mut Exposition, info: &ionet::Info) {
    let c = &info.counters;
    x.counter("ionet_messages_sent_total", "Messages sent (sends, requests, replies).", c.msgs_sent);
    x.counter("ionet_messages_received_total", "Messages received.", c.msgs_received);
    x.counter("ionet_bytes_sent_total", "Payload bytes sent.", c.bytes_sent);
    x.counter("ionet_bytes_received_total", "Payload bytes received.", c.bytes_received);
    let name = "ionet_transfers_total";
    x.family(
        name,
        "counter",
        "Transfers by mechanism: inline (eager), fast_rdma, server_rdma (rendezvous / server-based RDMA).",
    );
    for (m, v) in
        [("inline", c.mech_inline), ("fast_rdma", c.mech_fast_rdma), ("server_rdma", c.mech_server_rdma)]
    {
        x.sample(name, &format!(r#"mechanism="{m}""#), v);
    }
    x.counter(
        "ionet_host_copy_bytes_total",
        "Payload bytes the transport copied with the CPU.",
        c.host_copy_bytes,
    );
    x.counter("ionet_host_copies_total", "CPU copies of payload by the transport.", c.host_copies);
    x.counter("ionet_connections_total", "Connections established (both directions).", c.connections);
    x.counter("ionet_peers_lost_total", "Connections lost (error or peer death).", c.peers_lost);
    x.counter("ionet_protocol_errors_total", "Protocol violations by peers.", c.protocol_errors);
    x.counter("ionet_auth_failures_total", "Handshakes refused for authentication.", c.auth_failures);
    x.counter(
        "ionet_backpressure_pauses_total",
        "Times a peer was paused for back-pressure.",
        c.backpressure_pauses,
    );
    x.counter("ionet_access_denied_total", "One-sided accesses refused.", c.access_denied);
    x.counter("ionet_ops_completed_total", "Operations completed.", c.ops_completed);
    x.counter("ionet_ops_cancelled_total", "Operations cancelled (locally or by deadline).", c.ops_cancelled);
    x.counter("ionet_credit_messages_total", "Explicit credit messages sent.", c.credit_msgs);
    x.counter("ionet_wc_errors_total", "InfiniBand work requests completed with an error.", c.wc_errors);
    x.counter("ionet_spin_yields_total", "Times a polling driver yielded its CPU.", c.spin_yields);
    x.counter("ionet_waiter_wakeups_total", "Times a waiting thread was woken.", c.waiter_wakeups);
    x.gauge("ionet_peers_connected", "Peers known and connected now.", info.peers_connected);
    x.gauge("ionet_peers", "Peer records held, connected or not.", info.gauges.peers);
    x.gauge("ionet_handshakes", "Accepted connections still in their handshake.", info.gauges.handshakes);
    x.gauge("ionet_pending_ops", "Operations posted and not yet completed.", info.pending_ops);
    x.gauge("ionet_exposures", "Exposures registered now.", info.exposures);
    x.gauge(
        "ionet_transmit_bytes",
        "Bytes queued towards peers by the transport.",
        info.gauges.transmit_bytes,
    );
    x.gauge(
        "ionet_buffered_bytes",
        "Bytes buffered from peers (early, unexpected, requests).",
        info.gauges.buffered_bytes,
    );
    x.gauge(
        "ionet_peers_paused",
        "Peers not read because of their transmit backlog.",
        info.gauges.peers_paused,
    );
    x.gauge("ionet_pool_in_use_bytes", "Registered-buffer pool bytes handed out.", info.pool.in_use_bytes);
    x.gauge("ionet_pool_cached_bytes", "Registered-buffer pool bytes held but free.", info.pool.cached_bytes);
    // Only transports with a registration cache have these; absent, not zero, elsewhere.
    if let Some(r) = &info.regcache {
        x.counter(
            "ionet_regcache_hits_total",
            "Registration cache lookups that found a registration.",
            r.hits,
        );
        x.counter(
            "ionet_regcache_misses_total",
            "Registration cache lookups that had to register.",
            r.misses,
        );
        x.gauge("ionet_regcache_entries", "Registration cache entries now.", r.entries);
        x.gauge("ionet_regcache_pinned_bytes", "Bytes pinned by the registration cache now.", r.pinned_bytes);
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
        let text = render(Role::Io(3), &ep, None);
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
    }
}
