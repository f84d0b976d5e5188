//! InfiniBand: the `Verbs` seam, the software and hardware providers, and the engine.

#[cfg(feature = "verbs")]
pub mod hw;
pub mod soft;
pub mod verbs;

use std::sync::Arc;

use crate::addr::{Address, Scheme};
use crate::config::Config;
use crate::endpoint::{Backend, Core};
use crate::error::{Error, Result};

/// Builds the InfiniBand backend for `softib://` or `ib://`.
pub(crate) fn make_backend(
    scheme: Scheme,
    _bind: Option<&Address>,
    _cfg: &Config,
    _core: Arc<Core>,
) -> Result<Box<dyn Backend>> {
    Err(Error::Unsupported(format!("the {scheme}:// engine is not built yet")))
}
