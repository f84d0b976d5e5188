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
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod capability;
pub mod config;
pub mod errno;
pub mod layout;
pub mod meta;
pub mod proto;
pub mod store;

pub use errno::Errno;
pub use proto::Handle;
