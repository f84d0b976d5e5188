//! One run's outcome.

use crate::params::{Params, Test};
use crate::stats;

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub test: Test,
    pub size: usize,
    pub secs: f64,
    pub bytes: u64,
    pub msgs: u64,
    /// Round-trip times (µs) of a latency run.
    pub rtt_p50: Option<f64>,
    pub rtt_p99: Option<f64>,
    pub client_cpu: f64,
    pub server_cpu: Option<f64>,
}

impl RunResult {
    pub fn new(
        p: &Params,
        secs: f64,
        mut rtts: Vec<f64>,
        client_cpu: f64,
        server_cpu: Option<f64>,
    ) -> RunResult {
        let msgs = match p.test {
            Test::Bibw => 2 * p.iters as u64,
            _ => p.iters as u64,
        };
        let bytes = msgs * p.size as u64;
        let (rtt_p50, rtt_p99) = if rtts.is_empty() {
            (None, None)
        } else {
            (Some(stats::percentile(&mut rtts, 50.0)), Some(stats::percentile(&mut rtts, 99.0)))
        };
        RunResult { test: p.test, size: p.size, secs, bytes, msgs, rtt_p50, rtt_p99, client_cpu, server_cpu }
    }

    /// Bandwidth in GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }

    /// Messages per second.
    pub fn msg_rate(&self) -> f64 {
        self.msgs as f64 / self.secs
    }

    /// Client CPU seconds per GB moved.
    pub fn client_cpu_per_gb(&self) -> f64 {
        self.client_cpu / (self.bytes as f64 / 1e9)
    }

    /// Server CPU seconds per GB moved.
    pub fn server_cpu_per_gb(&self) -> Option<f64> {
        self.server_cpu.map(|c| c / (self.bytes as f64 / 1e9))
    }
}
