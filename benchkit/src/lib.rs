//! Shared plumbing of the ionet / stripefs benchmark suite (`ionet-perf`, `stripefs-bench`).
//!
//! Every measured run becomes a [`Sample`] in one long-format CSV schema; tables and plots are
//! computed from those rows (median of the runs with the min–max spread), so a report can be
//! rebuilt from the CSV without re-running anything. Generated Markdown goes into
//! `BENCHMARKS.md` between markers ([`doc::splice`]), beside a [`Machine`] description.

pub mod cpu;
pub mod criterion;
pub mod doc;
pub mod machine;
pub mod md;
pub mod plot;
pub mod sample;
pub mod stats;
pub mod units;

pub use machine::Machine;
pub use md::Table;
pub use sample::{Sample, Samples};
pub use stats::Summary;

/// Touches every page of `buf` so a measurement never pays first-touch page faults (about
/// 2.5 s/GiB on the reference VM).
pub fn prefault(buf: &mut [u8]) {
    for i in (0..buf.len()).step_by(4096) {
        buf[i] = buf[i].wrapping_add(1);
    }
}
