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
//! So each kind of wait remembers the longest of its recent *stretches* (the time from the
//! start of a wait, or from the last round that did work, to the next round that did) that
//! ended without sleeping, and spins for twice that, within a quarter of the budget and the
//! whole budget. "Recent" is by time, the current and the previous [`PERIOD`]: a receiver
//! draining a stream ends thousands of tiny stretches a second, and a memory counted in
//! stretches would forget within a millisecond the occasional longer gap it must still spin
//! through. A stretch that slept, but ended within one and a half budgets (the budget is about
//! twice a wake-up), would have been caught by the whole budget: it counts as caught at half
//! the budget, which brings the whole budget back for at least a period. So a wait that sleeps
//! early by mistake costs one wake-up per period at most.

use std::time::{Duration, Instant};

/// How long a caught stretch is remembered: for the rest of its period and the next.
pub(crate) const PERIOD: Duration = Duration::from_millis(20);

/// The learnt spin of one kind of wait.
#[derive(Debug, Clone, Default)]
pub(crate) struct LearntSpin {
    /// When the current period began (at the first stretch).
    since: Option<Instant>,
    /// The longest caught stretch of the current period, in microseconds.
    current: u32,
    /// That of the previous period; `None` until a whole period has passed, which keeps the
    /// whole budget until the kind of wait has shown what it needs.
    previous: Option<u32>,
}

impl LearntSpin {
    /// How long the next stretch spins before it sleeps, given the configured budget.
    pub(crate) fn budget(&self, max: Duration) -> Duration {
        match self.previous {
            None => max,
            Some(p) => Duration::from_micros(u64::from(p.max(self.current)) * 2).clamp(max / 4, max),
        }
    }

    /// A stretch that spinning caught after `d`, ending at `now`.
    pub(crate) fn caught(&mut self, d: Duration, now: Instant) {
        self.roll(now);
        self.current = self.current.max(u32::try_from(d.as_micros()).unwrap_or(u32::MAX));
    }

    /// A stretch that slept and ended after `d` (the sleep's wake-up included), at `now`.
    pub(crate) fn slept(&mut self, d: Duration, max: Duration, now: Instant) {
        if d <= max + max / 2 {
            self.caught(max / 2, now);
        } else {
            self.roll(now);
        }
    }

    /// Starts a new period if the current one is over.
    fn roll(&mut self, now: Instant) {
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= PERIOD {
            self.previous = Some(self.current);
            self.current = 0;
            self.since = Some(now);
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
    pub(crate) start: Instant,
    /// How long it spins before it sleeps.
    pub(crate) budget: Duration,
    /// It slept at least once.
    pub(crate) slept: bool,
}

impl Stretch {
    pub(crate) fn new(start: Instant, budget: Duration) -> Stretch {
        Stretch { start, budget, slept: false }
    }

    /// Teaches `learn` how this stretch, which ended at `now`, went.
    pub(crate) fn end(self, now: Instant, learn: &mut LearntSpin, max: Duration) {
        let d = now.saturating_duration_since(self.start);
        if self.slept {
            learn.slept(d, max, now);
        } else {
            learn.caught(d, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_micros(100);
    const US: Duration = Duration::from_micros(1);

    /// Catches of `d` every 100 µs for `periods` periods from `t`; returns the time after.
    fn catches(l: &mut LearntSpin, t: Instant, d: Duration, periods: u32) -> Instant {
        let mut now = t;
        while now < t + PERIOD * periods {
            l.caught(d, now);
            now += US * 100;
        }
        now
    }

    #[test]
    fn the_whole_budget_until_a_period_has_shown_what_waits_need() {
        let mut l = LearntSpin::default();
        let t0 = Instant::now();
        l.caught(US * 5, t0);
        l.caught(US * 5, t0 + PERIOD / 2);
        assert_eq!(l.budget(MAX), MAX);
        l.caught(US * 5, t0 + PERIOD);
        assert_eq!(l.budget(MAX), MAX / 4, "never below a quarter of the budget");
    }

    #[test]
    fn spins_twice_the_longest_recent_catch() {
        let mut l = LearntSpin::default();
        let t = catches(&mut l, Instant::now(), US * 2, 2);
        l.caught(US * 21, t);
        assert_eq!(l.budget(MAX), US * 42);
        // Remembered through the next period, forgotten after it.
        let t = catches(&mut l, t, US * 2, 1);
        assert_eq!(l.budget(MAX), US * 42);
        let t = catches(&mut l, t, US * 2, 1);
        l.caught(US * 2, t);
        assert_eq!(l.budget(MAX), MAX / 4);
        l.caught(US * 80, t);
        assert_eq!(l.budget(MAX), MAX, "never above the budget");
    }

    #[test]
    fn a_rare_longer_gap_among_many_tiny_ones_keeps_its_spin() {
        // A streaming receiver: a 1 µs stretch every 2 µs, and a 45 µs gap every 15 ms.
        let mut l = LearntSpin::default();
        let t0 = Instant::now();
        let mut now = t0;
        let mut next_gap = t0;
        while now < t0 + PERIOD * 10 {
            if now >= next_gap {
                l.caught(US * 45, now);
                next_gap = now + Duration::from_millis(15);
            } else {
                l.caught(US, now);
            }
            if now > t0 + PERIOD * 2 {
                assert_eq!(l.budget(MAX), US * 90);
            }
            now += US * 2;
        }
    }

    #[test]
    fn a_sleep_the_whole_budget_would_have_saved_brings_it_back() {
        let mut l = LearntSpin::default();
        let t = catches(&mut l, Instant::now(), US * 3, 2);
        assert_eq!(l.budget(MAX), MAX / 4);
        // 75 µs of waiting and 50 of waking up.
        l.slept(US * 125, MAX, t);
        assert_eq!(l.budget(MAX), MAX);
    }

    #[test]
    fn a_sleep_past_the_budget_teaches_nothing() {
        let mut l = LearntSpin::default();
        let t = catches(&mut l, Instant::now(), US * 3, 2);
        l.slept(US * 600, MAX, t);
        assert_eq!(l.budget(MAX), MAX / 4);
    }

    #[test]
    fn a_stretch_teaches_by_whether_it_slept() {
        let mut l = LearntSpin::default();
        let t0 = Instant::now();
        let mut t = t0;
        while t < t0 + PERIOD * 2 {
            Stretch::new(t, MAX).end(t + US * 10, &mut l, MAX);
            t += US * 100;
        }
        assert_eq!(l.budget(MAX), MAX / 4);
        let mut s = Stretch::new(t, MAX / 4);
        s.slept = true;
        s.end(t + US * 140, &mut l, MAX);
        assert_eq!(l.budget(MAX), MAX);
    }
}
