//! InfiniBand: the `Verbs` seam, the software and hardware providers, and the engine.

pub mod soft;
pub mod verbs;
