//! Criterion results (`target/criterion/<group>/<bench>/new/estimates.json`) as a table: the
//! median per iteration with its 95 % confidence interval.

use std::path::Path;

use serde::Deserialize;

use crate::Table;

#[derive(Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Deserialize)]
struct Estimate {
    confidence_interval: Interval,
    point_estimate: f64,
}

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

#[derive(Deserialize)]
struct Meta {
    full_id: String,
}

/// One benchmark's median time per iteration (ns) and its 95 % confidence interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Micro {
    /// `group/function`.
    pub id: String,
    /// Median, ns.
    pub median_ns: f64,
    /// Lower bound of the interval, ns.
    pub lo_ns: f64,
    /// Upper bound, ns.
    pub hi_ns: f64,
}

/// Every benchmark under a criterion output directory, sorted by id. Unreadable entries are
/// skipped (a partial run reports what it has).
pub fn read(root: &Path) -> Vec<Micro> {
    let mut out = Vec::new();
    let Ok(groups) = std::fs::read_dir(root) else { return out };
    for g in groups.flatten() {
        let Ok(benches) = std::fs::read_dir(g.path()) else { continue };
        for b in benches.flatten() {
            let new = b.path().join("new");
            let (Ok(e), Ok(m)) = (
                std::fs::read_to_string(new.join("estimates.json")),
                std::fs::read_to_string(new.join("benchmark.json")),
            ) else {
                continue;
            };
            let (Ok(e), Ok(m)) = (serde_json::from_str::<Estimates>(&e), serde_json::from_str::<Meta>(&m))
            else {
                continue;
            };
            out.push(Micro {
                id: m.full_id,
                median_ns: e.median.point_estimate,
                lo_ns: e.median.confidence_interval.lower_bound,
                hi_ns: e.median.confidence_interval.upper_bound,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// The results as a Markdown table.
pub fn table(m: &[Micro]) -> String {
    let mut t = Table::new(["benchmark", "median per iteration", "95 % CI of the median"]);
    for x in m {
        t.row([format!("`{}`", x.id), time(x.median_ns), format!("{} – {}", time(x.lo_ns), time(x.hi_ns))]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_output_and_skips_junk() {
        let d = tempfile::tempdir().unwrap();
        let b = d.path().join("wire/header_encode/new");
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(
            b.join("estimates.json"),
            r#"{"mean":{"confidence_interval":{"confidence_level":0.95,"lower_bound":1,"upper_bound":2},"point_estimate":1.5,"standard_error":0.1},
               "median":{"confidence_interval":{"confidence_level":0.95,"lower_bound":12.1,"upper_bound":13.9},"point_estimate":13.25,"standard_error":0.5}}"#,
        )
        .unwrap();
        std::fs::write(b.join("benchmark.json"), r#"{"group_id":"wire","full_id":"wire/header_encode"}"#)
            .unwrap();
        std::fs::create_dir_all(d.path().join("wire/report")).unwrap();
        std::fs::create_dir_all(d.path().join("broken/x/new")).unwrap();
        std::fs::write(d.path().join("broken/x/new/estimates.json"), "{").unwrap();
        let m = read(d.path());
        assert_eq!(
            m,
            vec![Micro { id: "wire/header_encode".into(), median_ns: 13.25, lo_ns: 12.1, hi_ns: 13.9 }]
        );
        assert_eq!(
            table(&m),
            "| benchmark | median per iteration | 95 % CI of the median |\n|---|---|---|\n| `wire/header_encode` | 13.2 ns | 12.1 ns – 13.9 ns |\n"
        );
        assert!(read(&d.path().join("missing")).is_empty());
        assert_eq!(time(30_526.0), "30.53 µs");
    }
}
