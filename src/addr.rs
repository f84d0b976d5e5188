//! Endpoint addresses: `tcp://host:port`, `softib://host:port`, `ib://host:port`.
//!
//! The host may be an IPv4 literal, a bracketed IPv6 literal (`tcp://[::1]:7000`) or a host
//! name, resolved when the address is used. Port 0 means "any free port" when binding.
//! For the InfiniBand schemes the host:port is the TCP side channel used to exchange queue-pair
//! information, exactly as BMI-IB does.
//!
//! An InfiniBand address may end in a query selecting this endpoint's RDMA device, port and
//! source GID index: `ib://0.0.0.0:7000?dev=mlx5_0&port=1&gid=3` ([`DeviceSelect`]). It is
//! read from the address an endpoint binds to and overrides [`crate::IbConfig`] and
//! `IONET_IB_DEVICE`; on the address of a peer it describes nothing of ours and is ignored
//! (a client-only endpoint selects its device with [`crate::IbConfig`] or the environment).

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;

/// Which transport an address selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Scheme {
    /// Kernel TCP sockets (`tcp://`).
    Tcp,
    /// The InfiniBand engine over the software verbs provider (`softib://`); runs anywhere.
    SoftIb,
    /// The InfiniBand engine over a hardware HCA (`ib://`, cargo feature `verbs`).
    Ib,
}

impl Scheme {
    /// The URL prefix, without `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::SoftIb => "softib",
            Scheme::Ib => "ib",
        }
    }
}

/// Scheme names on a command line (`--transport softib`), for tools built on clap (feature
/// `clap`).
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
impl clap::ValueEnum for Scheme {
    fn value_variants<'a>() -> &'a [Self] {
        &[Scheme::Tcp, Scheme::SoftIb, Scheme::Ib]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()))
    }
}

/// Parses a scheme name as it appears before `://`: `tcp`, `softib` or `ib`, in any case.
///
/// ```
/// use ionet::Scheme;
/// assert_eq!("softib".parse::<Scheme>().unwrap(), Scheme::SoftIb);
/// assert!("udp".parse::<Scheme>().is_err());
/// ```
impl FromStr for Scheme {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Scheme::Tcp),
            "softib" => Ok(Scheme::SoftIb),
            "ib" => Ok(Scheme::Ib),
            _ => Err(AddrError::UnknownScheme(s.to_string())),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host part of an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A literal IPv4 or IPv6 address.
    Ip(IpAddr),
    /// A name, resolved with the system resolver when used.
    Name(String),
}

/// A parsed endpoint address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    scheme: Scheme,
    host: Host,
    port: u16,
    select: Option<Box<DeviceSelect>>,
}

/// The device selection of an InfiniBand address: `?dev=NAME&port=N&gid=I`, each optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct DeviceSelect {
    /// RDMA device name (`dev=mlx5_0`).
    pub device: Option<String>,
    /// Port, from 1 (`port=1`).
    pub port: Option<u8>,
    /// Source GID index (`gid=3`); without it a RoCE port picks a RoCE v2 GID itself.
    pub gid_index: Option<u8>,
}

impl DeviceSelect {
    fn parse(addr: &str, query: &str) -> Result<DeviceSelect, AddrError> {
        let bad = |reason: String| AddrError::BadQuery { addr: addr.to_string(), reason };
        let mut d = DeviceSelect::default();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("{pair:?} is not key=value")))?;
            let num = |what: &str, lo: u8| -> Result<u8, AddrError> {
                v.parse::<u8>()
                    .ok()
                    .filter(|&n| n >= lo && v.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| bad(format!("{what} {v:?} is not a number in {lo}..=255")))
            };
            match k {
                "dev" if d.device.is_none() => {
                    let ok = !v.is_empty()
                        && v.len() <= 64
                        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
                    if !ok {
                        return Err(bad(format!("device name {v:?}: letters, digits, '_', '-', '.' only")));
                    }
                    d.device = Some(v.to_string());
                }
                "port" if d.port.is_none() => d.port = Some(num("port", 1)?),
                "gid" if d.gid_index.is_none() => d.gid_index = Some(num("gid index", 0)?),
                "dev" | "port" | "gid" => return Err(bad(format!("{k} given twice"))),
                _ => return Err(bad(format!("unknown parameter {k:?}; expected dev, port or gid"))),
            }
        }
        Ok(d)
    }
}

impl fmt::Display for DeviceSelect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = '?';
        let mut put = |f: &mut fmt::Formatter<'_>, k: &str, v: &dyn fmt::Display| {
            let r = write!(f, "{sep}{k}={v}");
            sep = '&';
            r
        };
        if let Some(d) = &self.device {
            put(f, "dev", d)?;
        }
        if let Some(p) = self.port {
            put(f, "port", &p)?;
        }
        if let Some(g) = self.gid_index {
            put(f, "gid", &g)?;
        }
        Ok(())
    }
}

/// Why an address string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddrError {
    /// No `scheme://` prefix.
    #[error("address {0:?} has no scheme; expected tcp://, softib:// or ib://")]
    MissingScheme(String),
    /// A scheme other than the three supported ones.
    #[error("unknown scheme {0:?}; expected tcp, softib or ib")]
    UnknownScheme(String),
    /// Nothing between `://` and `:port`.
    #[error("address {0:?} has an empty host")]
    EmptyHost(String),
    /// No `:port` suffix.
    #[error("address {0:?} has no port")]
    MissingPort(String),
    /// The port is not a number in 0..=65535.
    #[error("address {addr:?} has an invalid port {port:?}")]
    BadPort {
        /// The whole address.
        addr: String,
        /// The offending port text.
        port: String,
    },
    /// A `[` without a matching `]`, or a bracketed host that is not IPv6.
    #[error("address {0:?} has a malformed bracketed IPv6 host")]
    BadIpv6(String),
    /// Characters that cannot appear in a host name (paths, user info, spaces, ...).
    #[error("address {addr:?} has an invalid host {host:?}")]
    BadHost {
        /// The whole address.
        addr: String,
        /// The offending host text.
        host: String,
    },
    /// A `?query` that is malformed, names an unknown parameter, or follows a scheme that has
    /// none (only `ib://` and `softib://` take device selection).
    #[error("address {addr:?}: {reason}")]
    BadQuery {
        /// The whole address.
        addr: String,
        /// What is wrong with the query.
        reason: String,
    },
    /// Name resolution failed or gave no address.
    #[error("cannot resolve {host:?}: {reason}")]
    Resolve {
        /// The host that failed.
        host: String,
        /// The resolver's message.
        reason: String,
    },
}

impl Address {
    /// Builds an address from its parts.
    pub fn new(scheme: Scheme, host: Host, port: u16) -> Self {
        Address { scheme, host, port, select: None }
    }

    /// Builds an address from a socket address.
    pub fn from_socket(scheme: Scheme, sa: SocketAddr) -> Self {
        Address { scheme, host: Host::Ip(sa.ip()), port: sa.port(), select: None }
    }

    /// The transport this address selects.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host part.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port (0 = any, when binding).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The same host and port under another scheme.
    pub fn with_scheme(&self, scheme: Scheme) -> Self {
        Address { scheme, ..self.clone() }
    }

    /// The device selection of an InfiniBand address (`?dev=..&port=..&gid=..`), if any.
    pub fn device_select(&self) -> Option<&DeviceSelect> {
        self.select.as_deref()
    }

    /// The same scheme and host with another port.
    pub fn with_port(&self, port: u16) -> Self {
        Address { port, ..self.clone() }
    }

    /// Resolves the host to socket addresses (literal IPs need no resolver).
    pub fn resolve(&self) -> Result<Vec<SocketAddr>, AddrError> {
        match &self.host {
            Host::Ip(ip) => Ok(vec![SocketAddr::new(*ip, self.port)]),
            Host::Name(name) => {
                let addrs: Vec<SocketAddr> = (name.as_str(), self.port)
                    .to_socket_addrs()
                    .map_err(|e| AddrError::Resolve { host: name.clone(), reason: e.to_string() })?
                    .collect();
                if addrs.is_empty() {
                    return Err(AddrError::Resolve { host: name.clone(), reason: "no addresses".into() });
                }
                Ok(addrs)
            }
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "{}://[{}]:{}", self.scheme, ip, self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{}://{}:{}", self.scheme, ip, self.port),
            Host::Name(n) => write!(f, "{}://{}:{}", self.scheme, n, self.port),
        }?;
        match &self.select {
            Some(d) => d.fmt(f),
            None => Ok(()),
        }
    }
}

fn valid_host_name(h: &str) -> bool {
    // RFC 1123 labels: letters, digits, '-', separated by '.'; no empty label, at most 253 bytes.
    h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
        })
}

impl FromStr for Address {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| AddrError::MissingScheme(s.to_string()))?;
        let scheme: Scheme = scheme.parse()?;
        let (rest, select) = match rest.split_once('?') {
            None => (rest, None),
            Some(_) if scheme == Scheme::Tcp => {
                return Err(AddrError::BadQuery {
                    addr: s.to_string(),
                    reason: "tcp:// addresses take no parameters".into(),
                });
            }
            Some((rest, q)) => (rest, Some(Box::new(DeviceSelect::parse(s, q)?))),
        };
        let (host, port) = if let Some(after) = rest.strip_prefix('[') {
            let (inside, tail) = after.split_once(']').ok_or_else(|| AddrError::BadIpv6(s.to_string()))?;
            let ip: std::net::Ipv6Addr = inside.parse().map_err(|_| AddrError::BadIpv6(s.to_string()))?;
            let port = tail.strip_prefix(':').ok_or_else(|| AddrError::MissingPort(s.to_string()))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = rest.rsplit_once(':').ok_or_else(|| AddrError::MissingPort(s.to_string()))?;
            if host.is_empty() {
                return Err(AddrError::EmptyHost(s.to_string()));
            }
            if host.contains(':') {
                // An unbracketed IPv6 literal is ambiguous with the port separator.
                return Err(AddrError::BadIpv6(s.to_string()));
            }
            let host = match host.parse::<std::net::Ipv4Addr>() {
                Ok(ip) => Host::Ip(IpAddr::V4(ip)),
                Err(_) if valid_host_name(host) => Host::Name(host.to_ascii_lowercase()),
                Err(_) => {
                    return Err(AddrError::BadHost { addr: s.to_string(), host: host.to_string() });
                }
            };
            (host, port)
        };
        if port.is_empty() {
            return Err(AddrError::MissingPort(s.to_string()));
        }
        let port: u16 = if port.bytes().all(|b| b.is_ascii_digit()) {
            port.parse().map_err(|_| AddrError::BadPort { addr: s.to_string(), port: port.to_string() })?
        } else {
            return Err(AddrError::BadPort { addr: s.to_string(), port: port.to_string() });
        };
        Ok(Address { scheme, host, port, select })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme_and_host_form() {
        let a: Address = "tcp://127.0.0.1:7000".parse().unwrap();
        assert_eq!(a.scheme(), Scheme::Tcp);
        assert_eq!(a.host(), &Host::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(a.port(), 7000);

        let a: Address = "softib://[::1]:0".parse().unwrap();
        assert_eq!(a.scheme(), Scheme::SoftIb);
        assert_eq!(a.host(), &Host::Ip("::1".parse().unwrap()));
        assert_eq!(a.port(), 0);

        let a: Address = "IB://Node-7.cluster.local:3335".parse().unwrap();
        assert_eq!(a.scheme(), Scheme::Ib);
        assert_eq!(a.host(), &Host::Name("node-7.cluster.local".into()));
    }

    #[test]
    fn display_round_trips() {
        for s in ["tcp://10.0.0.1:1", "softib://[fe80::1]:65535", "ib://localhost:0"] {
            let a: Address = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
            assert_eq!(a.to_string().parse::<Address>().unwrap(), a);
        }
    }

    #[test]
    fn malformed_addresses_name_the_problem() {
        use AddrError::*;
        type Check = fn(&AddrError) -> bool;
        let cases: &[(&str, Check)] = &[
            ("127.0.0.1:80", |e| matches!(e, MissingScheme(_))),
            ("udp://127.0.0.1:80", |e| matches!(e, UnknownScheme(s) if s == "udp")),
            ("tcp://:80", |e| matches!(e, EmptyHost(_))),
            ("tcp://host", |e| matches!(e, MissingPort(_))),
            ("tcp://host:", |e| matches!(e, MissingPort(_))),
            ("tcp://host:65536", |e| matches!(e, BadPort { .. })),
            ("tcp://host:-1", |e| matches!(e, BadPort { .. })),
            ("tcp://host:8x", |e| matches!(e, BadPort { .. })),
            ("tcp://[::1:80", |e| matches!(e, BadIpv6(_))),
            ("tcp://[zz]:80", |e| matches!(e, BadIpv6(_))),
            ("tcp://::1:80", |e| matches!(e, BadIpv6(_))),
            ("tcp://a/b:80", |e| matches!(e, BadHost { .. })),
            ("tcp://user@h:80", |e| matches!(e, BadHost { .. })),
            ("tcp://a..b:80", |e| matches!(e, BadHost { .. })),
        ];
        for (s, ok) in cases {
            let e = s.parse::<Address>().unwrap_err();
            assert!(ok(&e), "{s}: unexpected error {e:?}");
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn device_selection_parses_and_round_trips() {
        let a: Address = "ib://10.0.0.1:7000?dev=mlx5_0&port=1&gid=3".parse().unwrap();
        let d = a.device_select().unwrap();
        assert_eq!((d.device.as_deref(), d.port, d.gid_index), (Some("mlx5_0"), Some(1), Some(3)));
        assert_eq!(a.port(), 7000);
        assert_eq!(a.to_string(), "ib://10.0.0.1:7000?dev=mlx5_0&port=1&gid=3");
        let a: Address = "softib://[::1]:0?gid=0".parse().unwrap();
        assert_eq!(a.device_select().unwrap().gid_index, Some(0));
        assert_eq!(a.to_string().parse::<Address>().unwrap(), a);
        assert!("ib://h:1".parse::<Address>().unwrap().device_select().is_none());
        for bad in [
            "tcp://h:1?dev=x",
            "ib://h:1?dev=",
            "ib://h:1?dev=a/b",
            "ib://h:1?port=0",
            "ib://h:1?port=256",
            "ib://h:1?gid=-1",
            "ib://h:1?gid=+1",
            "ib://h:1?speed=100",
            "ib://h:1?port=1&port=2",
            "ib://h:1?dev",
            "ib://h:1?",
        ] {
            let e = bad.parse::<Address>().unwrap_err();
            assert!(matches!(e, AddrError::BadQuery { .. }), "{bad}: {e:?}");
        }
    }

    #[test]
    fn resolves_literals_and_localhost() {
        let a: Address = "tcp://127.0.0.1:9".parse().unwrap();
        assert_eq!(a.resolve().unwrap(), vec!["127.0.0.1:9".parse().unwrap()]);
        let a: Address = "tcp://localhost:9".parse().unwrap();
        assert!(a.resolve().unwrap().iter().all(|sa| sa.ip().is_loopback()));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,64}") {
            let _ = s.parse::<Address>();
        }
    }
}
