//! What the meta server, the io servers and the client share on the network: message tags,
//! endpoint configuration, and the typed error every network operation returns.
//!
//! Every stripefs exchange is one ionet *request*: the header is an encoded [`proto`] message
//! (an [`Envelope`](crate::proto::Envelope)), the reply header is the encoded reply, and bulk
//! data travels as the request's payload (`Payload::Out` for writes, `Payload::In` for reads),
//! so ionet's communication manager picks the mechanism (inline, fast RDMA, server RDMA).
//! Errors a server detects are sent as typed [`ErrorReply`](crate::proto::ErrorReply)s in the
//! reply header; ionet's own `reply_error` is never used, so a client always gets an errno.

use crate::errno::Errno;
use crate::proto::{self, DecodeError, ProtoError};
use ionet::{Config, Tag, WaitMode};
use std::io;
use std::time::Duration;

/// Tag of requests to the meta server.
pub const TAG_META: Tag = 0x5346_4d45; // "SFME"

/// Tag of requests to an io server.
pub const TAG_IO: Tag = 0x5346_494f; // "SFIO"

/// Default time an operation may take before the client gives up on it (per request, plus
/// [`SLOW_RATE`] for its data).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Slowest data rate, in bytes per second, allowed before a request's deadline passes: a
/// request moving `n` bytes gets `timeout + n / SLOW_RATE` (10 MB/s).
pub const SLOW_RATE: u64 = 10_000_000;

/// The ionet configuration every stripefs endpoint uses: the cluster key authenticates every
/// connection, headers may be as large as the largest protocol message, and TCP connections
/// ask for `tcp_congestion` (`None`: the kernel's; see [`tcp_congestion`]).
pub fn endpoint_config(
    key: &[u8],
    wait_mode: WaitMode,
    progress_thread: bool,
    tcp_congestion: Option<&str>,
) -> Config {
    let cfg = Config::default()
        .cluster_key(key.to_vec())
        .max_header(proto::MAX_MESSAGE)
        .wait_mode(wait_mode)
        .progress_thread(progress_thread);
    match tcp_congestion {
        Some(cc) => cfg.tcp_congestion(cc),
        None => cfg,
    }
}

/// Environment variable naming the congestion control of stripefs's TCP connections, clients'
/// and servers' alike: unset or empty for [`DEFAULT_TCP_CONGESTION`], `system` for the
/// kernel's, or a name the kernel knows.
pub const TCP_CONGESTION_ENV: &str = "STRIPEFS_TCP_CONGESTION";

/// Congestion control of stripefs's TCP connections unless [`TCP_CONGESTION_ENV`] says
/// otherwise: reno. Both ends send bursts (a client a request and its payload to each of
/// several io servers in turn; an io server a read's data); a pacing algorithm such as BBR,
/// many kernels' default, spreads each burst at its estimate of the path's rate and leaves the
/// other end polling an empty socket. On this project's BBR machine reno made a client's
/// writes up to 1.5× as fast, and on the io servers E1's reads 1.4× as fast
/// (`benchmarks/journal/e1-clients-and-reno.md`, `e1-io-servers-on-reno-and-listeners-that-set-it.md`). Reno is built into every Linux kernel and
/// allowed to every process; on a WAN with a large bandwidth-delay product set `system` or
/// `cubic`.
pub const DEFAULT_TCP_CONGESTION: &str = "reno";

/// The congestion control stripefs's connections ask for: [`TCP_CONGESTION_ENV`]'s, else
/// [`DEFAULT_TCP_CONGESTION`]; `None` for the kernel's.
pub fn tcp_congestion() -> Option<String> {
    congestion_from(std::env::var(TCP_CONGESTION_ENV).ok().as_deref())
}

fn congestion_from(var: Option<&str>) -> Option<String> {
    match var.map(str::trim) {
        Some("system") => None,
        Some("") | None => Some(DEFAULT_TCP_CONGESTION.to_string()),
        Some(name) => Some(name.to_string()),
    }
}

/// Deadline slack for a request moving `bytes` bytes.
pub fn io_timeout(base: Duration, bytes: u64) -> Duration {
    base + Duration::from_millis(bytes.saturating_mul(1000) / SLOW_RATE)
}

/// Why a stripefs operation failed. [`FsError::errno`] gives the POSIX code; `From<FsError> for
/// io::Error` makes it usable wherever `std::io` errors are.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// A server processed the request and refused it.
    #[error("{code}{}", remote_detail(*code, message))]
    Remote {
        /// The code the server sent.
        code: Errno,
        /// Its explanation (for humans).
        message: String,
    },
    /// The transport failed: peer lost, timeout, authentication, ….
    #[error("transport: {0}")]
    Net(ionet::Error),
    /// A request to this server failed in the transport: the server could not be reached,
    /// was lost during the request, or did not answer in time.
    #[error("{server}: {}", net_cause(error))]
    Server {
        /// Which server, by role and address: `io server 2 (tcp://10.0.0.3:7000)`.
        server: String,
        /// What went wrong.
        error: ionet::Error,
    },
    /// Not sent: a request to this server went unanswered until its deadline and it has not
    /// answered since, so requests to it fail at once until it answers a ping (tried after a
    /// hold-off of a second, doubling up to ten).
    #[error("{server}: not answering (no reply to a request sent {}s ago)", silent.as_secs())]
    Silent {
        /// Which server, by role and address.
        server: String,
        /// Since the request that went unanswered was sent.
        silent: Duration,
    },
    /// A peer sent a message that does not decode, or we could not encode ours.
    #[error("protocol: {0}")]
    Proto(ProtoError),
    /// A reply that does not answer the request (wrong kind or id).
    #[error("unexpected reply: {0}")]
    UnexpectedReply(String),
    /// A bad argument from the caller.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A layout, view or list that does not make sense.
    #[error(transparent)]
    Layout(#[from] crate::layout::LayoutError),
    /// The cluster file.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A local OS error.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<ionet::Error> for FsError {
    fn from(e: ionet::Error) -> Self {
        FsError::Net(e)
    }
}

impl From<ProtoError> for FsError {
    fn from(e: ProtoError) -> Self {
        FsError::Proto(e)
    }
}

impl From<DecodeError> for FsError {
    fn from(e: DecodeError) -> Self {
        FsError::Proto(e.error)
    }
}

impl FsError {
    /// A remote-style error with a code (used for checks the client makes itself).
    pub fn code(code: Errno, message: impl Into<String>) -> Self {
        FsError::Remote { code, message: message.into() }
    }

    /// This error, with a transport failure attributed to `server` (see [`io_server_name`]
    /// and [`meta_server_name`]); other errors are returned as they are.
    pub fn at(self, server: impl FnOnce() -> String) -> Self {
        match self {
            FsError::Net(error) => FsError::Server { server: server(), error },
            e => e,
        }
    }

    /// The POSIX code for this error. A lost or unreachable server is `ENOTCONN`, a deadline
    /// `ETIMEDOUT`, anything else the transport reports `EIO`.
    pub fn errno(&self) -> Errno {
        match self {
            FsError::Remote { code, .. } => *code,
            FsError::Net(e) | FsError::Server { error: e, .. } => net_errno(e),
            FsError::Silent { .. } => Errno::ETIMEDOUT,
            FsError::Proto(e) => e.errno(),
            FsError::UnexpectedReply(_) => Errno::EPROTO,
            FsError::Invalid(_) | FsError::Layout(_) | FsError::Config(_) => Errno::EINVAL,
            FsError::Io(e) => Errno::from_io(e),
        }
    }
}

/// How errors name io server `index` at `addr`.
pub fn io_server_name(index: usize, addr: &ionet::Address) -> String {
    format!("io server {index} ({addr})")
}

/// How errors name the meta server at `addr`.
pub fn meta_server_name(addr: &ionet::Address) -> String {
    format!("meta server ({addr})")
}

/// The cause of a transport failure, said once: a lost peer's reason without the transport's
/// peer number, nor the peer's address that ionet puts first (the caller names the server).
fn net_cause(e: &ionet::Error) -> String {
    match e {
        ionet::Error::PeerLost { reason, .. } => {
            let unaddressed = reason
                .split_once(": ")
                .filter(|(addr, _)| addr.parse::<std::net::SocketAddr>().is_ok())
                .map(|(_, rest)| rest);
            unaddressed.unwrap_or(reason).to_string()
        }
        e => e.to_string(),
    }
}

/// What a remote error's message adds to its code: nothing when the server only spelled out
/// the code (`ENOENT (no such file or directory)` then needs no second "no such file or
/// directory").
fn remote_detail(code: Errno, message: &str) -> String {
    let mut m = message.trim();
    if let Some(d) = code.description() {
        // "invalid argument: cannot move …" after "EINVAL (invalid argument)" says it twice.
        let said = m.get(..d.len()).is_some_and(|head| head.eq_ignore_ascii_case(d));
        if said && (m.len() == d.len() || m[d.len()..].starts_with(':')) {
            m = m[d.len()..].trim_start_matches(':').trim_start();
        }
    }
    if m.is_empty() { String::new() } else { format!(": {m}") }
}

/// The code for a transport error.
pub fn net_errno(e: &ionet::Error) -> Errno {
    use ionet::Error as E;
    match e {
        E::PeerLost { .. } | E::Closed => Errno::ENOTCONN,
        E::Timeout => Errno::ETIMEDOUT,
        E::Auth(_) => Errno::EACCES,
        E::TooLarge { .. } => Errno::EMSGSIZE,
        E::Unsupported(_) => Errno::EOPNOTSUPP,
        E::Exhausted(_) => Errno::EAGAIN,
        E::Protocol { .. } => Errno::EPROTO,
        E::Io(io) => Errno::from_io(io),
        _ => Errno::EIO,
    }
}

impl From<FsError> for io::Error {
    fn from(e: FsError) -> io::Error {
        match e {
            FsError::Io(e) => e,
            e => io::Error::new(io::Error::from(e.errno()).kind(), e),
        }
    }
}

/// Result of stripefs operations.
pub type FsResult<T> = Result<T, FsError>;

/// Bytes of random data from the kernel (keys, nonces).
pub fn random_bytes(n: usize) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut v = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut v)?;
    Ok(v)
}

/// A request's `request` span and start time, to log its outcome and how long it took; the
/// clock is read only when the span is enabled.
pub(crate) struct Traced {
    pub(crate) span: tracing::Span,
    start: Option<std::time::Instant>,
}

impl Traced {
    pub(crate) fn new(span: tracing::Span) -> Self {
        let start = (!span.is_disabled()).then(std::time::Instant::now);
        Traced { span, start }
    }

    /// Logs the request's outcome (at debug, inside its span): for a server, once served; for
    /// a client, once answered.
    pub(crate) fn done(&self, result: impl std::fmt::Display) {
        if let Some(t) = self.start {
            let elapsed_us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.span.record("result", tracing::field::display(&result));
            self.span.record("elapsed_us", elapsed_us);
            tracing::debug!(parent: &self.span, "done");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with its `source()` chain, as `anyhow`'s `{:#}` prints it.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut next = e.source();
        while let Some(c) = next {
            s = format!("{s}: {c}");
            next = c.source();
        }
        s
    }

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let refused = || io::Error::from_raw_os_error(libc::ECONNREFUSED);
        let cases: Vec<(Box<dyn std::error::Error>, &str)> = vec![
            (
                Box::new(FsError::Net(ionet::Error::from(refused()))),
                "transport: I/O error: Connection refused (os error 111)",
            ),
            (Box::new(FsError::from(ProtoError::Malformed("x".into()))), "protocol: malformed body: x"),
            (
                Box::new(crate::server::ServerError::from(ionet::Error::from(refused()))),
                "transport: I/O error: Connection refused (os error 111)",
            ),
            (
                Box::new(crate::store::StoreError::Io {
                    op: "write",
                    handle: crate::proto::Handle(2),
                    error: refused(),
                }),
                "write 0x2: Connection refused (os error 111)",
            ),
            (
                Box::new(crate::meta::MetaError::from(crate::meta::NameError::Slash)),
                "invalid name: name contains '/'",
            ),
            (
                Box::new(crate::config::ConfigError::Io { path: "/c.toml".into(), error: refused() }),
                "/c.toml: Connection refused (os error 111)",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(chain(&*e), want);
        }
    }

    #[test]
    fn connections_use_reno_unless_the_environment_names_another_or_the_kernels() {
        assert_eq!(congestion_from(None).as_deref(), Some("reno"), "the default");
        assert_eq!(congestion_from(Some("")).as_deref(), Some("reno"));
        assert_eq!(congestion_from(Some("system")), None, "the kernel's");
        assert_eq!(congestion_from(Some("reno")).as_deref(), Some("reno"));
        assert_eq!(congestion_from(Some(" cubic ")).as_deref(), Some("cubic"));
        let cfg = endpoint_config(b"key", WaitMode::Block, false, None);
        assert_eq!(cfg.get_tcp_congestion(), None, "set by each kind of endpoint from its config");
        let cfg = endpoint_config(b"key", WaitMode::Block, false, Some("cubic"));
        assert_eq!(cfg.get_tcp_congestion(), Some("cubic"));
        let want = tcp_congestion();
        let io = crate::server::io::IoServerConfig::new("tcp://127.0.0.1:0".parse().unwrap(), "/d", b"key");
        assert_eq!(io.tcp_congestion, want, "io servers use the same as clients");
        let cluster = crate::config::ClusterConfig::parse(
            "meta = \"tcp://127.0.0.1:3000\"\nio_servers = [\"127.0.0.1:7000\"]\ncluster_key = \"00112233445566778899aabbccddeeff\"\n",
        )
        .unwrap();
        assert_eq!(crate::server::meta::MetaServerConfig::new(cluster, b"key").tcp_congestion, want);
    }

    #[test]
    fn errors_map_to_posix_codes() {
        let lost = FsError::Net(ionet::Error::PeerLost { peer: dummy_peer(), reason: "x".into() });
        assert_eq!(lost.errno(), Errno::ENOTCONN);
        assert_eq!(FsError::Net(ionet::Error::Timeout).errno(), Errno::ETIMEDOUT);
        let e: io::Error = FsError::code(Errno::ENOENT, "gone").into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(io_timeout(Duration::from_secs(1), 20_000_000), Duration::from_secs(3));
    }

    #[test]
    fn a_transport_failure_names_the_server_and_says_the_cause_once() {
        let addr: ionet::Address = "tcp://127.0.0.1:7012".parse().unwrap();
        let reason = "connect to 127.0.0.1:7012: Connection refused (os error 111)".to_string();
        let lost = FsError::Net(ionet::Error::PeerLost { peer: dummy_peer(), reason: reason.clone() });
        let e = lost.at(|| io_server_name(2, &addr));
        assert_eq!(e.to_string(), format!("io server 2 (tcp://127.0.0.1:7012): {reason}"));
        // The transport names the peer's address first; the server's name says it already.
        let shed = "the server refused the connection during the handshake: it has too many connections in their handshake (try again)";
        let lost = FsError::Net(ionet::Error::PeerLost {
            peer: dummy_peer(),
            reason: format!("127.0.0.1:7012: {shed}"),
        });
        assert_eq!(
            lost.at(|| io_server_name(2, &addr)).to_string(),
            format!("io server 2 (tcp://127.0.0.1:7012): {shed}")
        );
        assert_eq!(e.errno(), Errno::ENOTCONN);
        let e = FsError::Net(ionet::Error::Timeout).at(|| meta_server_name(&addr));
        assert_eq!(e.to_string(), "meta server (tcp://127.0.0.1:7012): operation timed out");
        assert_eq!(e.errno(), Errno::ETIMEDOUT);
        // A server's own refusal already comes from that server: left as it is.
        let e = FsError::code(Errno::ENOSPC, "").at(|| unreachable!("not a transport failure"));
        assert!(matches!(e, FsError::Remote { code: Errno::ENOSPC, .. }));
    }

    #[test]
    fn a_remote_error_says_its_code_once() {
        let e = FsError::code(Errno::ENOENT, "no such file or directory");
        assert_eq!(e.to_string(), "ENOENT (no such file or directory)");
        assert_eq!(FsError::code(Errno::ENOENT, "").to_string(), "ENOENT (no such file or directory)");
        let e = FsError::code(Errno::EINVAL, "stripe count 9 outside 1..=3");
        assert_eq!(e.to_string(), "EINVAL (invalid argument): stripe count 9 outside 1..=3");
        let e = FsError::code(Errno::EINVAL, "invalid argument: cannot move a directory into itself");
        assert_eq!(e.to_string(), "EINVAL (invalid argument): cannot move a directory into itself");
        let e = FsError::code(Errno::EINVAL, "invalid argumentation");
        assert_eq!(e.to_string(), "EINVAL (invalid argument): invalid argumentation", "only a whole prefix");
        let e = FsError::code(Errno::EINVAL, "é");
        assert_eq!(e.to_string(), "EINVAL (invalid argument): é", "no slicing inside a character");
    }

    fn dummy_peer() -> ionet::PeerId {
        // PeerIds are only made by endpoints; connect a client endpoint to get one.
        let ep = ionet::Endpoint::client(Config::default()).unwrap();
        ep.connect("tcp://127.0.0.1:9").unwrap()
    }
}
