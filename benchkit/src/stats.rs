//! Medians, spreads and percentiles of repeated measurements.

use std::fmt;

/// Median and spread (min–max) of repeated runs of one measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Median of the runs (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Number of runs.
    pub n: usize,
}

impl Summary {
    /// The summary of `xs`, ignoring NaNs; `None` when nothing is left.
    pub fn of(xs: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Summary { median, min: v[0], max: v[n - 1], n })
    }

    /// `median (min–max)` with `decimals` digits after the point.
    pub fn show(&self, decimals: usize) -> String {
        if self.n == 1 {
            return format!("{:.d$}", self.median, d = decimals);
        }
        format!("{:.d$} ({:.d$}–{:.d$})", self.median, self.min, self.max, d = decimals)
    }

    /// The same with a unit after the median.
    pub fn show_unit(&self, unit: &str, decimals: usize) -> String {
        if self.n == 1 {
            return format!("{:.d$} {unit}", self.median, d = decimals);
        }
        format!("{:.d$} {unit} ({:.d$}–{:.d$})", self.median, self.min, self.max, d = decimals)
    }

    /// Ratio of medians `self / base` (NaN when the base is zero).
    pub fn ratio_to(&self, base: &Summary) -> f64 {
        if base.median == 0.0 { f64::NAN } else { self.median / base.median }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.show(decimals_for(self.median)))
    }
}

/// A sensible number of decimals for a value: three significant digits, at most four
/// decimals.
pub fn decimals_for(x: f64) -> usize {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        0
    } else if a >= 10.0 {
        1
    } else if a >= 1.0 {
        2
    } else if a >= 0.1 {
        3
    } else {
        4
    }
}

/// Nearest-rank percentile `p` (0–100) of a sample; sorts it. `None` when empty.
pub fn percentile(xs: &mut [f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (xs.len() as f64 - 1.0)).round() as usize;
    Some(xs[i.min(xs.len() - 1)])
}

/// PVFS paper's method (003): with five or more runs drop the lowest and highest and average
/// the rest; with fewer, the median.
pub fn trimmed_mean(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.len() < 5 {
        return Summary::of(&v).map(|s| s.median);
    }
    v.sort_by(f64::total_cmp);
    let mid = &v[1..v.len() - 1];
    Some(mid.iter().sum::<f64>() / mid.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_spread_and_display() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 10.0, 4));
        assert_eq!(s.show(1), "2.5 (1.0–10.0)");
        assert_eq!(s.show_unit("µs", 0), "2 µs (1–10)");
        let one = Summary::of(&[5.0]).unwrap();
        assert_eq!(one.show(2), "5.00");
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
        assert_eq!(Summary::of(&[f64::NAN, 4.0]).unwrap().median, 4.0);
    }

    #[test]
    fn ratios_percentiles_and_trimmed_means() {
        let a = Summary::of(&[2.0]).unwrap();
        let b = Summary::of(&[4.0]).unwrap();
        assert_eq!(b.ratio_to(&a), 2.0);
        assert!(a.ratio_to(&Summary::of(&[0.0]).unwrap()).is_nan());
        let mut v = vec![5.0, 1.0, 4.0, 2.0, 3.0, 100.0];
        assert_eq!(percentile(&mut v, 50.0), Some(4.0));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut v, 100.0), Some(100.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        assert_eq!(trimmed_mean(&[1.0, 2.0, 3.0, 4.0, 100.0]), Some(3.0));
        assert_eq!(trimmed_mean(&[1.0, 2.0, 9.0]), Some(2.0));
    }

    #[test]
    fn decimals_scale_with_magnitude() {
        assert_eq!(decimals_for(1234.0), 0);
        assert_eq!(decimals_for(12.3), 1);
        assert_eq!(decimals_for(1.23), 2);
        assert_eq!(decimals_for(0.123), 3);
        assert_eq!(decimals_for(0.0123), 4);
    }
}
