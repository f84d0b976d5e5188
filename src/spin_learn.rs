//! How long an adaptive wait spins before it sleeps, learnt from how long recent waits needed.
//!
//! An adaptive waiter spins for at most the configured spin budget, then sleeps: the classic
//! bound for a wait of unknown length, which never pays more than the budget over the best
//! choice made in hindsight. Waits are rarely of unknown length, though, and their lengths are
//! often of two kinds. A sender keeping a window of large messages in flight over RDMA finds
//! most completions within microseconds of asking, and then waits far past the budget for the
//! receiver to pull the next batch: spinning the whole budget before each long wait buys
//! nothing, and on a host where a wake-up is cheap relative to the gap it is most of the
//! sender's CPU.
//!
//! So each kind of wait keeps the lengths of its recent *stretches* (the time from the start
//! of a wait, or from the last round that did work, to the next round that did) that ended
//! without sleeping, and spins for twice the longest of them, within a quarter of the budget
//! and the whole budget.
//! A stretch that slept, but ended within one and a half budgets (the budget is about twice a
//! wake-up), would have been caught by the whole budget: it counts as caught at half the
//! budget, which brings the whole budget back for the next [`REMEMBERED`] caught stretches.

use std::time::Duration;

/// Caught stretches remembered per kind of wait.
pub(crate) const REMEMBERED: usize = 16;

/// The learnt spin of one kind of wait.
#[derive(Debug, Clone)]
pub(crate) struct LearntSpin {
    /// Recent caught stretches in microseconds; `None` until the first, which keeps the whole
    /// budget until the kind of wait has shown what it needs.
    caught: [Option<u32>; REMEMBERED],
    next: usize,
}

impl Default for LearntSpin {
    fn default() -> Self {
        LearntSpin { caught: [None; REMEMBERED], next: 0 }
    }
}

impl LearntSpin {
    /// How long the next stretch spins before it sleeps, given the configured budget.
    pub(crate) fn budget(&self, max: Duration) -> Duration {
        let mut longest = 0u32;
        for c in &self.caught {
            match c {
                Some(us) => longest = longest.max(*us),
                None => return max,
            }
        }
        Duration::from_micros(u64::from(longest) * 2).clamp(max / 4, max)
    }

    /// A stretch that spinning caught after `d`.
    pub(crate) fn caught(&mut self, d: Duration) {
        self.caught[self.next] = Some(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
        self.next = (self.next + 1) % REMEMBERED;
    }

    /// A stretch that slept and ended after `d` (the sleep's wake-up included).
    pub(crate) fn slept(&mut self, d: Duration, max: Duration) {
        if d <= max + max / 2 {
            self.caught(max / 2);
        }
    }
}

/// The learnt spins an endpoint keeps: waits for the caller's own operations (a reply, a
/// send's completion) and waits for whatever peers send next (requests, unexpected messages)
/// follow different rhythms, so each kind learns its own.
#[derive(Debug, Default)]
pub(crate) struct LearntSpins {
    pub(crate) ops: LearntSpin,
    pub(crate) arrivals: LearntSpin,
}

/// Which of [`LearntSpins`] a wait learns in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitKind {
    Ops,
    Arrivals,
}

impl LearntSpins {
    pub(crate) fn get_mut(&mut self, k: WaitKind) -> &mut LearntSpin {
        match k {
            WaitKind::Ops => &mut self.ops,
            WaitKind::Arrivals => &mut self.arrivals,
        }
    }
}

/// One stretch of an adaptive wait: when it began, how long it may spin, and whether it slept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stretch {
    pub(crate) start: std::time::Instant,
    /// How long it spins before it sleeps.
    pub(crate) budget: Duration,
    /// It slept at least once.
    pub(crate) slept: bool,
}

impl Stretch {
    pub(crate) fn new(start: std::time::Instant, budget: Duration) -> Stretch {
        Stretch { start, budget, slept: false }
    }

    /// Teaches `learn` how this stretch, which ended at `now`, went.
    pub(crate) fn end(self, now: std::time::Instant, learn: &mut LearntSpin, max: Duration) {
        let d = now.saturating_duration_since(self.start);
        if self.slept {
            learn.slept(d, max);
        } else {
            learn.caught(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const MAX: Duration = Duration::from_micros(100);
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn the_whole_budget_until_enough_waits_were_caught() {
        let mut l = LearntSpin::default();
        for _ in 0..REMEMBERED - 1 {
            l.caught(US * 5);
            assert_eq!(l.budget(MAX), MAX);
        }
        l.caught(US * 5);
        assert_eq!(l.budget(MAX), MAX / 4, "never below a quarter of the budget");
    }

    #[test]
    fn spins_twice_the_longest_recent_catch() {
        let mut l = LearntSpin::default();
        for i in 0..REMEMBERED as u32 {
            l.caught(US * if i == 3 { 21 } else { 2 });
        }
        assert_eq!(l.budget(MAX), US * 42);
        // Once the 21 µs catch is forgotten, the short ones decide.
        for _ in 0..REMEMBERED {
            l.caught(US * 2);
        }
        assert_eq!(l.budget(MAX), MAX / 4);
        l.caught(US * 80);
        assert_eq!(l.budget(MAX), MAX, "never above the budget");
    }

    #[test]
    fn a_sleep_the_whole_budget_would_have_saved_brings_it_back() {
        let mut l = LearntSpin::default();
        for _ in 0..REMEMBERED {
            l.caught(US * 3);
        }
        // 75 µs of waiting and 50 of waking up.
        l.slept(US * 125, MAX);
        assert_eq!(l.budget(MAX), MAX);
    }

    #[test]
    fn a_sleep_past_the_budget_teaches_nothing() {
        let mut l = LearntSpin::default();
        for _ in 0..REMEMBERED {
            l.caught(US * 3);
        }
        l.slept(US * 600, MAX);
        assert_eq!(l.budget(MAX), MAX / 4);
    }

    #[test]
    fn a_stretch_teaches_by_whether_it_slept() {
        let t0 = Instant::now();
        let mut l = LearntSpin::default();
        let mut s = Stretch::new(t0, MAX);
        for _ in 0..REMEMBERED {
            s.end(t0 + US * 10, &mut l, MAX);
        }
        assert_eq!(l.budget(MAX), MAX / 4);
        s.slept = true;
        s.end(t0 + US * 140, &mut l, MAX);
        assert_eq!(l.budget(MAX), MAX);
    }
}
