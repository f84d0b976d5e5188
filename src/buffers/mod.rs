//! The memory operations carry: owned transfer buffers and the registered pool ([`buf`]),
//! files mapped so transfers reach the page cache without a second copy ([`filemap`]), and the
//! bulk copy that moves bytes between them and the transports' own buffers ([`copy`]).
//!
//! The crate re-exports the three as `ionet::buf`, `ionet::filemap` and `ionet::copy`.

pub mod buf;
pub mod copy;
pub mod filemap;
