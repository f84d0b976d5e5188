//! InfiniBand: the `Verbs` seam, the software and hardware providers, and the engine.

#[cfg(feature = "verbs")]
#[cfg_attr(docsrs, doc(cfg(feature = "verbs")))]
pub mod hw;
pub mod soft;
pub mod verbs;

pub(crate) mod engine;

pub(crate) use engine::make_backend;
