//! The single-thread `memcpy` baseline: what one core moves when it only copies, the ceiling of
//! any copying transport on this machine.

use std::time::{Duration, Instant};

/// Source and destination buffers, pre-faulted once and reused by every run.
pub struct MemcpyBench {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl MemcpyBench {
    /// Buffers for copies up to `max` bytes.
    pub fn new(max: usize) -> MemcpyBench {
        let mut src = vec![0u8; max.max(1)];
        let mut dst = vec![0u8; max.max(1)];
        benchkit::prefault(&mut src);
        benchkit::prefault(&mut dst);
        for (i, b) in src.iter_mut().enumerate().step_by(64) {
            *b = i as u8;
        }
        MemcpyBench { src, dst }
    }

    /// GB/s (10^9 bytes per second) copying `size` bytes repeatedly for about `target`.
    pub fn run(&mut self, size: usize, target: Duration) -> f64 {
        let size = size.min(self.src.len());
        let (src, dst) = (&self.src[..size], &mut self.dst[..size]);
        // Warm the caches and calibrate the count on a short burst.
        let mut iters = 1u64;
        loop {
            let t = Instant::now();
            for _ in 0..iters {
                dst.copy_from_slice(std::hint::black_box(src));
                std::hint::black_box(&mut *dst);
            }
            let e = t.elapsed();
            if e >= target / 8 || iters >= 1 << 30 {
                let per = e.as_secs_f64() / iters as f64;
                iters = ((target.as_secs_f64() / per.max(1e-9)) as u64).max(1);
                break;
            }
            iters *= 4;
        }
        let t = Instant::now();
        for _ in 0..iters {
            dst.copy_from_slice(std::hint::black_box(src));
            std::hint::black_box(&mut *dst);
        }
        (size as f64 * iters as f64) / t.elapsed().as_secs_f64() / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_reports_a_positive_rate() {
        let mut m = MemcpyBench::new(1 << 16);
        let g = m.run(4096, Duration::from_millis(5));
        assert!(g.is_finite() && g > 0.0);
        assert_eq!(m.dst[..4096], m.src[..4096]);
        // Sizes past the buffers are clamped, not a panic.
        assert!(m.run(1 << 20, Duration::from_millis(1)) > 0.0);
    }
}
