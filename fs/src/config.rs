//! The cluster file: where the meta server and the io servers are, over which transport, where
//! data lives, the cluster key and the layout defaults.
//!
//! ```toml
//! transport = "tcp"                       # tcp | softib | ib (default: the meta address's scheme)
//! meta = "tcp://10.0.0.1:3000"
//! io_servers = ["10.0.0.2:7000", "tcp://10.0.0.3:7000"]   # scheme optional, must match
//! data_dir = "/var/lib/stripefs"          # servers only; relative to the cluster file
//! cluster_key = "00112233445566778899aabbccddeeff"          # hex, or:
//! # cluster_key_file = "cluster.key"      # a file holding the hex key
//! transfer_unit = 1048576                 # bytes per pipelined transfer (default 1 MiB)
//!
//! [layout]
//! stripe_size = 65536                     # default 64 KiB
//! stripe_count = 4                        # default: all io servers
//! ```
//!
//! The io servers' order in `io_servers` is the cluster's server order that every file layout
//! (`base`, `pcount`) refers to, so it must never be reordered for an existing file system.
//! Parsing is bounded ([`MAX_CONFIG_BYTES`], [`MAX_IO_SERVERS`]) and unknown keys are refused, so
//! a typo is an error rather than a silently ignored setting.

use crate::capability::{MAX_KEY_LEN, MIN_KEY_LEN};
use crate::layout::{MAX_SSIZE, MIN_SSIZE};
use ionet::{Address, Scheme, addr::AddrError};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest cluster file read.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// Most io servers in a cluster.
pub const MAX_IO_SERVERS: usize = 4096;

/// Default stripe size: 64 KiB (PVFS 1.5 and OrangeFS).
pub const DEFAULT_SSIZE: u64 = 64 * 1024;

/// Default transfer unit: 1 MiB. PVFS2's flow buffers are 256 KiB; on loopback TCP 1 MiB
/// units move about twice the bytes per system call, and the io servers keep only
/// `pipeline_depth` of them per request.
pub const DEFAULT_TRANSFER_UNIT: u64 = 1 << 20;

/// Smallest transfer unit accepted.
pub const MIN_TRANSFER_UNIT: u64 = 4 * 1024;

/// Largest transfer unit accepted.
pub const MAX_TRANSFER_UNIT: u64 = 64 * 1024 * 1024;

/// Why a cluster file was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Reading a file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// Over [`MAX_CONFIG_BYTES`] (or a key file over its limit).
    #[error("{what} is larger than {max} bytes")]
    TooLarge {
        /// Which file.
        what: &'static str,
        /// The limit.
        max: u64,
    },
    /// Not valid TOML, or wrong types or unknown keys.
    #[error("cluster file: {0}")]
    Toml(String),
    /// An address that does not parse.
    #[error("{field}: {error}")]
    Address {
        /// Which setting.
        field: String,
        /// Why.
        error: AddrError,
    },
    /// An address whose scheme differs from the transport.
    #[error("{field}: address {addr} does not use transport {transport}")]
    SchemeMismatch {
        /// Which setting.
        field: String,
        /// The address.
        addr: String,
        /// The cluster's transport.
        transport: Scheme,
    },
    /// A transport other than tcp, softib, ib.
    #[error("unknown transport {0:?}; expected tcp, softib or ib")]
    UnknownTransport(String),
    /// A setting outside its range.
    #[error("{field} = {value}: {reason}")]
    Value {
        /// Which setting.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is allowed.
        reason: String,
    },
    /// Both or neither of `cluster_key` and `cluster_key_file`.
    #[error("set exactly one of cluster_key and cluster_key_file")]
    KeySource,
    /// The key is not hex or has the wrong length.
    #[error("cluster key: {0}")]
    Key(String),
}

/// Where the cluster key comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Given inline (decoded).
    Inline(Vec<u8>),
    /// A file holding the key in hex.
    File(PathBuf),
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Inline(k) => write!(f, "Inline(<{} bytes>)", k.len()),
            KeySource::File(p) => f.debug_tuple("File").field(p).finish(),
        }
    }
}

/// Layout defaults for new files (per-directory defaults override them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutDefaults {
    /// Stripe size.
    pub ssize: u64,
    /// Stripe count; `None` = all io servers.
    pub pcount: Option<u32>,
}

/// A parsed, validated cluster file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The transport every address uses.
    pub transport: Scheme,
    /// The meta server.
    pub meta: Address,
    /// The io servers, in cluster order (layouts index into this list).
    pub io_servers: Vec<Address>,
    /// Root of the servers' data (meta database and io objects).
    pub data_dir: Option<PathBuf>,
    /// The cluster key.
    pub key: KeySource,
    /// Bytes per pipelined data transfer.
    pub transfer_unit: u64,
    /// Defaults for new files.
    pub layout: LayoutDefaults,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLayout {
    #[serde(skip_serializing_if = "Option::is_none")]
    stripe_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stripe_count: Option<u32>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    transport: Option<String>,
    meta: String,
    io_servers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_key_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transfer_unit: Option<u64>,
    #[serde(default)]
    layout: RawLayout,
}

fn parse_scheme(s: &str) -> Result<Scheme, ConfigError> {
    s.parse().map_err(|_| ConfigError::UnknownTransport(s.to_owned()))
}

/// Parses a server address of a cluster using `transport`: `host:port` takes the transport's
/// scheme, a full address must have it. `field` names the setting (or argument) in errors.
pub fn parse_addr(field: String, s: &str, transport: Scheme) -> Result<Address, ConfigError> {
    let full = if s.contains("://") { s.to_owned() } else { format!("{transport}://{s}") };
    let addr: Address = full.parse().map_err(|error| ConfigError::Address { field: field.clone(), error })?;
    if addr.scheme() != transport {
        return Err(ConfigError::SchemeMismatch { field, addr: s.to_owned(), transport });
    }
    Ok(addr)
}

/// Decodes a hex key (surrounding whitespace ignored) and checks its length.
/// The rule is ionet's, so every tool reads keys alike.
pub fn decode_key_hex(text: &str) -> Result<Vec<u8>, ConfigError> {
    let key = ionet::key_file::parse_key_hex(text).map_err(ConfigError::Key)?;
    // ionet's bounds are the capability key's: checked here so a change to either shows.
    debug_assert!((MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()));
    Ok(key)
}

/// Reads a cluster key file by ionet's rules: hex text, owner-only. A file group or others
/// could read is tightened, with a warning: the key may have leaked. One they could write is
/// refused.
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use ionet::key_file::{KeyFileError, MAX_KEY_FILE_BYTES};
    match ionet::key_file::read_key_file(path) {
        Ok(k) => {
            if let Some(mode) = k.loose_mode {
                tracing::warn!(
                    "cluster key file {} was mode {mode:o}, readable beyond its owner; set to owner-only \
                     (the key may have leaked: consider a new one)",
                    path.display()
                );
            }
            Ok(k.key)
        }
        Err(KeyFileError::Io { path, error }) => Err(ConfigError::Io { path, error }),
        Err(KeyFileError::TooLarge { .. }) => {
            Err(ConfigError::TooLarge { what: "key file", max: MAX_KEY_FILE_BYTES })
        }
        // The key's own error names the file; the variant says it is the cluster key.
        Err(KeyFileError::Key { path, reason }) => {
            Err(ConfigError::Key(format!("{}: {reason}", path.display())))
        }
        Err(e) => Err(ConfigError::Key(e.to_string())),
    }
}

/// Encodes a key as lowercase hex.
pub fn encode_key_hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

fn range<T: PartialOrd + ToString>(field: &'static str, v: T, lo: T, hi: T) -> Result<T, ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::Value {
            field,
            value: v.to_string(),
            reason: format!("must be in {}..={}", lo.to_string(), hi.to_string()),
        });
    }
    Ok(v)
}

impl ClusterConfig {
    /// Parses and validates cluster-file text. Pure: relative paths are kept as written, and a
    /// key file is not read until [`ClusterConfig::cluster_key`].
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { what: "cluster file", max: MAX_CONFIG_BYTES as u64 });
        }
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        let transport = match &raw.transport {
            Some(t) => parse_scheme(t)?,
            None => match raw.meta.split_once("://") {
                Some((s, _)) => parse_scheme(s)?,
                None => Scheme::Tcp,
            },
        };
        let meta = parse_addr("meta".into(), &raw.meta, transport)?;
        if raw.io_servers.is_empty() {
            return Err(ConfigError::Value {
                field: "io_servers",
                value: "[]".into(),
                reason: "at least one io server".into(),
            });
        }
        range("io_servers (count)", raw.io_servers.len(), 1, MAX_IO_SERVERS)?;
        let io_servers = raw
            .io_servers
            .iter()
            .enumerate()
            .map(|(i, s)| parse_addr(format!("io_servers[{i}]"), s, transport))
            .collect::<Result<Vec<_>, _>>()?;
        let key = match (&raw.cluster_key, &raw.cluster_key_file) {
            (Some(hex), None) => KeySource::Inline(decode_key_hex(hex)?),
            (None, Some(p)) => KeySource::File(p.clone()),
            _ => return Err(ConfigError::KeySource),
        };
        let transfer_unit = range(
            "transfer_unit",
            raw.transfer_unit.unwrap_or(DEFAULT_TRANSFER_UNIT),
            MIN_TRANSFER_UNIT,
            MAX_TRANSFER_UNIT,
        )?;
        let ssize = range(
            "layout.stripe_size",
            raw.layout.stripe_size.unwrap_or(DEFAULT_SSIZE),
            MIN_SSIZE,
            MAX_SSIZE,
        )?;
        let pcount = match raw.layout.stripe_count {
            Some(c) => Some(range("layout.stripe_count", c, 1, io_servers.len() as u32)?),
            None => None,
        };
        Ok(ClusterConfig {
            transport,
            meta,
            io_servers,
            data_dir: raw.data_dir,
            key,
            transfer_unit,
            layout: LayoutDefaults { ssize, pcount },
        })
    }

    /// Reads (at most [`MAX_CONFIG_BYTES`]) and parses a cluster file; relative `data_dir` and
    /// `cluster_key_file` paths are taken relative to the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = read_bounded(path, MAX_CONFIG_BYTES as u64, "cluster file")?;
        let text = String::from_utf8(text).map_err(|_| ConfigError::Toml("not UTF-8".into()))?;
        let mut cfg = Self::parse(&text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        // Joined by components, so `data_dir = "."` is the file's directory, not `dir/.`.
        let beside = |p: &Path| base.join(p).components().collect::<PathBuf>();
        if let Some(d) = cfg.data_dir.as_mut().filter(|d| d.is_relative()) {
            *d = beside(d);
        }
        if let KeySource::File(p) = &mut cfg.key
            && p.is_relative()
        {
            *p = beside(p);
        }
        Ok(cfg)
    }

    /// The cluster key bytes, reading the key file if there is one.
    pub fn cluster_key(&self) -> Result<Vec<u8>, ConfigError> {
        match &self.key {
            KeySource::Inline(k) => Ok(k.clone()),
            KeySource::File(p) => read_key_file(p),
        }
    }

    /// Number of io servers.
    pub fn n_io_servers(&self) -> u32 {
        // Bounded by MAX_IO_SERVERS at parse time.
        self.io_servers.len() as u32
    }

    fn data_root(&self) -> &Path {
        self.data_dir.as_deref().unwrap_or(Path::new("stripefs-data"))
    }

    /// The meta server's database file: `<data_dir>/meta/meta.redb`.
    pub fn meta_db_path(&self) -> PathBuf {
        self.data_root().join("meta").join("meta.redb")
    }

    /// io server `i`'s object directory: `<data_dir>/io<i>` (so a whole test cluster can share
    /// one data directory).
    pub fn io_data_dir(&self, i: u32) -> PathBuf {
        self.data_root().join(format!("io{i}"))
    }

    /// The first address two servers of this configuration share, with the two servers: the
    /// second could not listen there, and clients would reach the first. Port 0 ("any port",
    /// as in a local launcher's file before its servers are bound) is never shared.
    pub fn shared_address(&self) -> Option<(ServerId, ServerId, &Address)> {
        let servers = std::iter::once((ServerId::Meta, &self.meta))
            .chain(self.io_servers.iter().enumerate().map(|(i, a)| (ServerId::Io(i), a)));
        let mut seen = std::collections::HashMap::new();
        for (id, a) in servers.filter(|(_, a)| a.port() != 0) {
            if let Some(first) = seen.insert(a, id) {
                return Some((first, id, a));
            }
        }
        None
    }

    /// Writes this configuration to the cluster file `path`, owner-only (it names the key).
    /// With `replace` an existing file is replaced whole (readers see the old file or the new
    /// one, never a part); without, an existing file is left alone and the error is
    /// `AlreadyExists`.
    pub fn save(&self, path: &Path, replace: bool) -> std::io::Result<()> {
        self.save_with_header(path, replace, "")
    }

    /// As [`ClusterConfig::save`], with `header` (comment lines) before the settings.
    pub fn save_with_header(&self, path: &Path, replace: bool, header: &str) -> std::io::Result<()> {
        use std::io::Write;
        let mut text = format!("{header}{}", self.to_toml());
        if !text.ends_with('\n') {
            text.push('\n');
        }
        if !replace {
            let mut f = crate::private::options().write(true).create_new(true).open(path)?;
            return f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        crate::private::write_file(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, path)
    }

    /// The cluster file text for this configuration (inline keys are written as hex).
    pub fn to_toml(&self) -> String {
        let raw = RawConfig {
            transport: Some(self.transport.to_string()),
            meta: self.meta.to_string(),
            io_servers: self.io_servers.iter().map(ToString::to_string).collect(),
            data_dir: self.data_dir.clone(),
            cluster_key: match &self.key {
                KeySource::Inline(k) => Some(encode_key_hex(k)),
                KeySource::File(_) => None,
            },
            cluster_key_file: match &self.key {
                KeySource::File(p) => Some(p.clone()),
                KeySource::Inline(_) => None,
            },
            transfer_unit: Some(self.transfer_unit),
            layout: RawLayout { stripe_size: Some(self.layout.ssize), stripe_count: self.layout.pcount },
        };
        // Only strings, integers, paths and arrays: serialization cannot fail.
        toml::to_string(&raw).unwrap_or_default()
    }
}

fn read_bounded(path: &Path, max: u64, what: &'static str) -> Result<Vec<u8>, ConfigError> {
    let io = |error| ConfigError::Io { path: path.to_owned(), error };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut buf = Vec::new();
    f.take(max + 1).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 > max {
        return Err(ConfigError::TooLarge { what, max });
    }
    Ok(buf)
}

/// Entry point of the `fs_config` fuzz target: parsing arbitrary bytes returns a typed result
/// and, when it succeeds, the re-serialized file parses to the same configuration.
pub fn fuzz_one(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = ClusterConfig::parse(text) {
        let again = ClusterConfig::parse(&cfg.to_toml()).expect("re-serialized config parses");
        assert_eq!(cfg, again);
    }
}

/// A server of a cluster: the meta server or io server `i`, as the cluster file lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServerId {
    /// The meta server.
    Meta,
    /// Io server `i`.
    Io(usize),
}

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerId::Meta => f.write_str("meta server"),
            ServerId::Io(i) => write!(f, "io server {i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff";

    fn full() -> String {
        format!(
            r#"
transport = "tcp"
meta = "tcp://127.0.0.1:3000"
io_servers = ["127.0.0.1:7000", "tcp://127.0.0.1:7001", "[::1]:7002"]
data_dir = "/srv/stripefs"
cluster_key = "{KEY}"
transfer_unit = 1048576

[layout]
stripe_size = 1048576
stripe_count = 2
"#
        )
    }

    #[test]
    fn parses_a_full_file() {
        let c = ClusterConfig::parse(&full()).unwrap();
        assert_eq!(c.transport, Scheme::Tcp);
        assert_eq!(c.meta.to_string(), "tcp://127.0.0.1:3000");
        assert_eq!(c.n_io_servers(), 3);
        assert_eq!(c.io_servers[2].to_string(), "tcp://[::1]:7002");
        assert_eq!(c.cluster_key().unwrap().len(), 16);
        assert_eq!(c.transfer_unit, 1 << 20);
        assert_eq!(c.layout, LayoutDefaults { ssize: 1 << 20, pcount: Some(2) });
        assert_eq!(c.meta_db_path(), Path::new("/srv/stripefs/meta/meta.redb"));
        assert_eq!(c.io_data_dir(1), Path::new("/srv/stripefs/io1"));
        assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn defaults_apply() {
        let c = ClusterConfig::parse(&format!(
            "meta = \"softib://10.0.0.1:3000\"\nio_servers = [\"10.0.0.2:7000\"]\ncluster_key = \"{KEY}\"\n"
        ))
        .unwrap();
        assert_eq!(c.transport, Scheme::SoftIb);
        assert_eq!(c.io_servers[0].scheme(), Scheme::SoftIb);
        assert_eq!(c.transfer_unit, DEFAULT_TRANSFER_UNIT);
        assert_eq!(c.layout, LayoutDefaults { ssize: DEFAULT_SSIZE, pcount: None });
        assert_eq!(c.data_dir, None);
    }

    #[test]
    fn typed_errors() {
        let base = |extra: &str| format!("meta = \"tcp://h:1\"\nio_servers = [\"h:2\"]\n{extra}");
        let k = format!("cluster_key = \"{KEY}\"\n");
        let err = |s: String| ClusterConfig::parse(&s).unwrap_err();
        assert!(matches!(err(base("")), ConfigError::KeySource));
        assert!(matches!(err(base(&format!("{k}cluster_key_file = \"k\"\n"))), ConfigError::KeySource));
        assert!(matches!(err(base("cluster_key = \"abc\"\n")), ConfigError::Key(_)));
        assert!(matches!(
            err(base("cluster_key = \"zz112233445566778899aabbccddeeff\"\n")),
            ConfigError::Key(_)
        ));
        assert!(matches!(err(base("cluster_key = \"0011\"\n")), ConfigError::Key(_)));
        assert!(matches!(err(base(&format!("{k}transport = \"udp\"\n"))), ConfigError::UnknownTransport(_)));
        assert!(matches!(err(base(&format!("{k}transport = \"ib\"\n"))), ConfigError::SchemeMismatch { .. }));
        assert!(matches!(err(base(&format!("{k}typo = 1\n"))), ConfigError::Toml(_)));
        assert!(matches!(err(base(&format!("{k}transfer_unit = 1\n"))), ConfigError::Value { .. }));
        assert!(matches!(
            err(base(&format!("{k}[layout]\nstripe_count = 2\n"))),
            ConfigError::Value { field: "layout.stripe_count", .. }
        ));
        assert!(matches!(err(base(&format!("{k}[layout]\nstripe_size = 0\n"))), ConfigError::Value { .. }));
        assert!(matches!(
            err(format!("meta = \"tcp://h:1\"\nio_servers = []\n{k}")),
            ConfigError::Value { field: "io_servers", .. }
        ));
        assert!(matches!(
            err(format!("meta = \"tcp://h\"\nio_servers = [\"h:1\"]\n{k}")),
            ConfigError::Address { .. }
        ));
        assert!(matches!(err(base(&format!("{k}transfer_unit = -5\n"))), ConfigError::Toml(_)));
        assert!(matches!(err("x".repeat(MAX_CONFIG_BYTES + 1)), ConfigError::TooLarge { .. }));
    }

    #[test]
    fn a_key_file_that_is_not_hex_is_named_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.key");
        std::fs::write(&path, b"not a key").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = read_key_file(&path).unwrap_err().to_string();
        assert_eq!(e.matches("cluster key").count(), 1, "{e}");
        assert!(e.contains(&path.display().to_string()) && e.contains("hex"), "{e}");
    }

    #[test]
    fn load_resolves_relative_paths_and_reads_the_key_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cluster.key"), format!("{KEY}\n")).unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(
            &path,
            "meta = \"tcp://127.0.0.1:3000\"\nio_servers = [\"127.0.0.1:7000\"]\n\
             data_dir = \"data\"\ncluster_key_file = \"cluster.key\"\n",
        )
        .unwrap();
        let c = ClusterConfig::load(&path).unwrap();
        assert_eq!(c.data_dir.as_deref(), Some(dir.path().join("data").as_path()));
        assert_eq!(c.cluster_key().unwrap(), decode_key_hex(KEY).unwrap());
        std::fs::write(dir.path().join("cluster.key"), "0".repeat(5000)).unwrap();
        assert!(matches!(c.cluster_key(), Err(ConfigError::TooLarge { what: "key file", .. })));
        std::fs::remove_file(dir.path().join("cluster.key")).unwrap();
        assert!(matches!(c.cluster_key(), Err(ConfigError::Io { .. })));
        // The file's own directory, as a local cluster's file names it: that directory itself.
        let text = std::fs::read_to_string(&path).unwrap().replace("\"data\"", "\".\"");
        std::fs::write(&path, text).unwrap();
        let c = ClusterConfig::load(&path).unwrap();
        assert_eq!(c.data_dir.unwrap().as_os_str(), dir.path().as_os_str());
    }

    #[test]
    fn a_shared_address_is_found_with_both_servers_but_port_0_is_not_one() {
        let cfg = |meta: &str, io: &str| {
            ClusterConfig::parse(&format!(
                "meta = \"{meta}\"\nio_servers = [{io}]\ncluster_key = \"{KEY}\"\n"
            ))
            .unwrap()
        };
        assert_eq!(cfg("tcp://h:1", "\"h:2\", \"h:3\"").shared_address(), None);
        let c = cfg("tcp://h:1", "\"h:2\", \"g:2\", \"h:2\"");
        let (a, b, addr) = c.shared_address().unwrap();
        assert_eq!((a, b, addr.to_string()), (ServerId::Io(0), ServerId::Io(2), "tcp://h:2".into()));
        let c = cfg("tcp://h:2", "\"h:2\"");
        assert_eq!(c.shared_address().map(|(a, b, _)| (a, b)), Some((ServerId::Meta, ServerId::Io(0))));
        assert_eq!(cfg("tcp://h:0", "\"h:0\", \"h:0\"").shared_address(), None, "port 0: any port");
    }

    #[test]
    fn save_writes_an_owner_only_file_that_loads_and_replaces_only_when_asked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        let c = ClusterConfig::parse(&full()).unwrap();
        c.save_with_header(&path, false, "# hello\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# hello\n") && text.ends_with('\n'), "{text}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ClusterConfig::load(&path).unwrap(), c);
        let mut other = c.clone();
        other.transfer_unit = 1 << 16;
        let e = other.save(&path, false).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(ClusterConfig::load(&path).unwrap(), c, "kept without replace");
        other.save(&path, true).unwrap();
        assert_eq!(ClusterConfig::load(&path).unwrap(), other);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
    }

    #[test]
    fn fuzz_entry_handles_garbage() {
        for s in ["", "meta = 1", "[[[", "\u{0}", &full(), "io_servers = [\"a:1\"]\nmeta = \"tcp://[::1]:9\""]
        {
            fuzz_one(s.as_bytes());
        }
    }
}
