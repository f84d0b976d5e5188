//! # stripefs
//!
//! A compact PVFS-style striped file system built only on ionet's public API.
//!
//! The pieces that need no network live here as plain modules, so the servers and the client
//! (written on ionet's `Endpoint`) are thin loops around them:
//!
//! * [`layout`]: the striping math — offset → server and local offset, per-server pieces of a
//!   request, views, list I/O, per-server truncate sizes, logical size.
//! * [`proto`]: the versioned, bounded wire messages between client, meta server and io servers.
//! * [`capability`]: per-open HMAC capability tokens the io servers check on every request.
//! * [`meta`]: the meta server's namespace, attributes and layouts in a `redb` database.
//! * [`store`]: an io server's objects, one local file per handle in hashed subdirectories.
//! * [`config`]: the TOML cluster file.
//! * [`errno`]: the errno-like codes carried in error replies.
//! * [`units`]: sizes as the command lines take and print them (`64k`, `1.5 MiB`).
//!
//! The network half sits on top of them, on ionet's public API only:
//!
//! * [`server::meta::MetaServer`] and [`server::io::IoServer`]: worker pools over a bound
//!   endpoint (see [`server`]); [`net`] has the tags, endpoint configuration and [`FsError`].
//! * [`client::Client`] / [`client::File`]: the client library — namespace calls to the meta
//!   server, data straight to the io servers, one request per server per call (reads over
//!   tcp: one per MiB, see [`client::DEFAULT_READ_REQUEST_BYTES`]).
//! * [`cluster::LocalCluster`]: a whole cluster as child processes of the `stripefs` binary
//!   (`stripefs serve`, `stripefs demo`, the integration tests).
//! * `fuse` (feature `fuse`): the FUSE mount.
//!
//! # How the network layer uses them
//!
//! * **Meta server**: decode each message with [`proto::decode::<MetaCall>`](proto::decode)
//!   (on failure send [`proto::error_reply`]), call the matching [`meta::MetaStore`] method with
//!   the call's credentials (it applies the POSIX permission rules to them), map its error with
//!   [`meta::MetaError::errno`]. `Create`: [`meta::MetaStore::create`] → mint an
//!   `ADMIN` capability → `IoRequest::CreateObject` to each server of the layout → on success
//!   `commit_create` and reply `Opened` with a capability from
//!   [`capability::CapabilityKey::mint`]; on failure `RemoveObject` on the servers that
//!   succeeded, then `abort_create`. `Unlink`/`Rename` over a file's last name: `RemoveObject`
//!   on the returned [`meta::Objects`], then `forget_orphan`. `Setattr` with a size:
//!   `TruncateObject` to [`layout::Layout::local_size`] per server. At start-up, finish what
//!   [`meta::MetaStore::pending_creates`] and [`meta::MetaStore::orphans`] list.
//! * **io server**: decode an [`proto::IoRequest`], verify its capability with
//!   [`capability::CapabilityKey::verify`] against [`proto::IoRequest::needed_rights`], then
//!   drive [`store::ObjectStore`]: a read or write builds a [`store::PieceCursor`] over
//!   [`proto::Descriptor::pieces`] and moves one transfer unit at a time. On a write error keep
//!   receiving (and discarding) the rest of the stream, then reply with the error code.
//! * **client**: [`layout::Layout::plan`] (or [`layout::ListIo::plan`], or a
//!   [`layout::View`]'s extents) gives one [`layout::ServerPieces`] per server; cut it with
//!   [`layout::ServerPieces::split`] to the wire limits, send `pieces` as a
//!   [`proto::Descriptor::List`] (or the O(1) [`proto::Descriptor::Strided`] for a view) and
//!   move the data from/to `segments` of the user buffer, in order, with no per-piece headers.
//!   Logical size = [`layout::Layout::logical_size`] over every server's `GetSize`, asked
//!   together with the meta server's `Getattr` (or `Setattr`) when the client kept a capability
//!   from the file's last open.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod buf;
pub mod capability;
pub mod client;
pub mod cluster;
pub mod config;
pub mod errno;
#[cfg(feature = "fuse")]
#[cfg_attr(docsrs, doc(cfg(feature = "fuse")))]
pub mod fuse;
mod handle;
mod health;
pub mod layout;
pub mod meta;
pub mod net;
pub mod private;
pub mod proto;
pub mod server;
pub mod store;
pub mod units;

pub use client::{
    Client, ClientOptions, ClusterSpace, ClusterStatus, CreateOptions, File, ServerState, SizeUnknown, Stat,
};

/// Locks `m`, taking a poisoned lock as it is: for maps and caches whose every critical section
/// leaves them consistent, so a panic elsewhere loses nothing.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
pub use errno::Errno;
pub use handle::Handle;
pub use net::{FsError, FsResult};

#[cfg(test)]
mod tests {
    /// The servers share these across threads.
    #[test]
    fn stores_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<crate::meta::MetaStore>();
        check::<crate::store::ObjectStore>();
        check::<crate::capability::CapabilityKey>();
    }
}
