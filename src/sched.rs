//! The priority send scheduler (sans-IO): smooth weighted round-robin over service levels.
//!
//! When several classes have data ready, each turn goes to the class with the highest running
//! credit; every backlogged class earns its weight per turn and the winner pays the total. Over
//! any window of `sum(weights)` turns with all classes backlogged, each class gets exactly its
//! weight in turns, so higher classes go first and no class with a non-zero weight starves.

use crate::types::ServiceLevel;

/// Weighted round-robin over the service levels.
#[derive(Debug, Clone)]
pub struct SendScheduler {
    weights: [i64; ServiceLevel::COUNT],
    current: [i64; ServiceLevel::COUNT],
}

impl SendScheduler {
    /// A scheduler with the given weights (each at least 1).
    pub fn new(weights: [u32; ServiceLevel::COUNT]) -> Self {
        SendScheduler { weights: weights.map(|w| i64::from(w.max(1))), current: [0; ServiceLevel::COUNT] }
    }

    /// The class to serve next among the backlogged ones, or `None` if none is.
    pub fn next(&mut self, backlogged: [bool; ServiceLevel::COUNT]) -> Option<ServiceLevel> {
        let mut total = 0;
        let mut best: Option<usize> = None;
        for (i, _) in backlogged.iter().enumerate().filter(|(_, b)| **b) {
            self.current[i] += self.weights[i];
            total += self.weights[i];
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(ServiceLevel::ALL[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_backlogged_classes_get_their_weight_per_window() {
        let mut s = SendScheduler::new([8, 4, 1]);
        let mut count = [0; 3];
        for _ in 0..13 * 10 {
            count[s.next([true; 3]).unwrap().index()] += 1;
        }
        assert_eq!(count, [80, 40, 10]);
    }

    #[test]
    fn bulk_is_never_starved_within_a_window() {
        let mut s = SendScheduler::new([8, 4, 1]);
        let mut since_bulk = 0;
        for _ in 0..1000 {
            if s.next([true; 3]) == Some(ServiceLevel::Bulk) {
                since_bulk = 0;
            } else {
                since_bulk += 1;
                assert!(since_bulk < 13, "bulk waited a whole window");
            }
        }
    }

    #[test]
    fn higher_class_goes_first_and_idle_classes_are_skipped() {
        let mut s = SendScheduler::new([8, 4, 1]);
        assert_eq!(s.next([true; 3]), Some(ServiceLevel::Control));
        let mut s = SendScheduler::new([8, 4, 1]);
        assert_eq!(s.next([false, false, true]), Some(ServiceLevel::Bulk));
        assert_eq!(s.next([false; 3]), None);
    }
}
