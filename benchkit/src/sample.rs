//! One measured value, and the long-format CSV every experiment writes.
//!
//! Every run of every measurement is one row: which experiment, on which transport, which
//! series of a plot, at which x, of which metric — so tables and plots are computed from the
//! raw runs (median and min–max), and a report can be rebuilt from the CSV alone.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::stats::Summary;

/// One run of one measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Experiment id: `e1`, `e2`, …, `lat`, `bw`, `calibrate`, `qos`, `cpu`, `baseline`.
    pub experiment: String,
    /// Transport (`tcp`, `softib`), or the baseline's name (`raw-tcp`, `memcpy`, `iperf3`).
    pub transport: String,
    /// The line of a plot / row group of a table (`write`, `inline 100% hit`, …).
    pub series: String,
    /// The swept parameter (size in bytes, client count, transfer unit, …).
    pub x: f64,
    /// What was measured (`bandwidth`, `rtt_p50`, `client_cpu_per_gb`, `requests`, …).
    pub metric: String,
    /// Its unit (`MB/s`, `µs`, `s/GB`, `count`).
    pub unit: String,
    /// Wait mode of the measuring side (`spin`, `block`, `adaptive`, or `-`).
    pub wait: String,
    /// Run number (0-based) among the repetitions.
    pub run: u32,
    /// The value.
    pub value: f64,
    /// Free-form context (mechanism counters, hit rates) as `key=value;…`.
    #[serde(default)]
    pub note: String,
}

impl Sample {
    /// A sample of `experiment` on `transport`, line `series`, at `x`; set what it measured
    /// with [`Sample::metric`] and the value with [`Sample::run`]. Wait mode `-`, no note.
    pub fn new(experiment: &str, transport: &str, series: &str, x: f64) -> Sample {
        Sample {
            experiment: experiment.into(),
            transport: transport.into(),
            series: series.into(),
            x,
            metric: String::new(),
            unit: String::new(),
            wait: "-".into(),
            run: 0,
            value: f64::NAN,
            note: String::new(),
        }
    }

    /// Sets the metric and its unit.
    pub fn metric(mut self, metric: &str, unit: &str) -> Sample {
        self.metric = metric.into();
        self.unit = unit.into();
        self
    }

    /// Sets the run number and the value.
    pub fn run(mut self, run: u32, value: f64) -> Sample {
        self.run = run;
        self.value = value;
        self
    }

    /// Sets the wait mode.
    pub fn wait(mut self, w: &str) -> Sample {
        self.wait = w.into();
        self
    }

    /// Sets the note.
    pub fn note(mut self, n: impl Into<String>) -> Sample {
        self.note = n.into();
        self
    }

    /// The grouping key of this sample (everything but run, value and note).
    pub fn key(&self) -> Key {
        Key {
            experiment: self.experiment.clone(),
            transport: self.transport.clone(),
            series: self.series.clone(),
            metric: self.metric.clone(),
            wait: self.wait.clone(),
            x: OrdF64(self.x),
        }
    }
}

/// An `f64` ordered by `total_cmp`, for use in map keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrdF64(pub f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// What identifies one measurement across its runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    /// Experiment.
    pub experiment: String,
    /// Transport.
    pub transport: String,
    /// Series.
    pub series: String,
    /// Metric.
    pub metric: String,
    /// Wait mode.
    pub wait: String,
    /// Swept parameter.
    pub x: OrdF64,
}

/// A set of samples with look-ups by what they measured.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    rows: Vec<Sample>,
}

/// CSV errors.
#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    /// Reading or writing the file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A malformed row.
    #[error("{path}: {source}")]
    Csv {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: csv::Error,
    },
}

impl Samples {
    /// No samples.
    pub fn new() -> Samples {
        Samples::default()
    }

    /// Adds one.
    pub fn push(&mut self, s: Sample) {
        self.rows.push(s);
    }

    /// Adds many.
    pub fn extend(&mut self, it: impl IntoIterator<Item = Sample>) {
        self.rows.extend(it);
    }

    /// All rows in insertion order.
    pub fn rows(&self) -> &[Sample] {
        &self.rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows matching a filter, as a new set.
    pub fn filter(&self, f: impl Fn(&Sample) -> bool) -> Samples {
        Samples { rows: self.rows.iter().filter(|s| f(s)).cloned().collect() }
    }

    /// Median and spread of every measurement, by key.
    pub fn summaries(&self) -> BTreeMap<Key, Summary> {
        let mut by: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
        for s in &self.rows {
            by.entry(s.key()).or_default().push(s.value);
        }
        by.into_iter().filter_map(|(k, v)| Summary::of(&v).map(|s| (k, s))).collect()
    }

    /// The summary of one measurement: experiment, transport, series, metric and x must
    /// match (any wait mode).
    pub fn get(
        &self,
        experiment: &str,
        transport: &str,
        series: &str,
        metric: &str,
        x: f64,
    ) -> Option<Summary> {
        let v: Vec<f64> = self
            .rows
            .iter()
            .filter(|s| {
                s.experiment == experiment
                    && s.transport == transport
                    && s.series == series
                    && s.metric == metric
                    && s.x.total_cmp(&x).is_eq()
            })
            .map(|s| s.value)
            .collect();
        Summary::of(&v)
    }

    /// Distinct values of a field, in first-seen order.
    pub fn distinct(&self, field: impl Fn(&Sample) -> String) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.rows {
            let v = field(s);
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }

    /// Distinct x values, ascending.
    pub fn xs(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.rows.iter().map(|s| s.x).collect();
        v.sort_by(f64::total_cmp);
        v.dedup_by(|a, b| a.total_cmp(b).is_eq());
        v
    }

    /// Writes every row to `path` (with a header).
    pub fn write_csv(&self, path: &Path) -> Result<(), CsvError> {
        let p = path.display().to_string();
        let mut w =
            csv::Writer::from_path(path).map_err(|source| CsvError::Csv { path: p.clone(), source })?;
        for r in &self.rows {
            w.serialize(r).map_err(|source| CsvError::Csv { path: p.clone(), source })?;
        }
        w.flush().map_err(|source| CsvError::Io { path: p, source })
    }

    /// Reads rows written by [`Samples::write_csv`].
    pub fn read_csv(path: &Path) -> Result<Samples, CsvError> {
        let p = path.display().to_string();
        let mut r =
            csv::Reader::from_path(path).map_err(|source| CsvError::Csv { path: p.clone(), source })?;
        let mut rows = Vec::new();
        for s in r.deserialize() {
            rows.push(s.map_err(|source| CsvError::Csv { path: p.clone(), source })?);
        }
        Ok(Samples { rows })
    }
}

impl FromIterator<Sample> for Samples {
    fn from_iter<I: IntoIterator<Item = Sample>>(it: I) -> Self {
        Samples { rows: it.into_iter().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> Samples {
        let mut s = Samples::new();
        for (run, v) in [3.0, 1.0, 2.0].into_iter().enumerate() {
            s.push(
                Sample::new("e1", "tcp", "write", 2.0)
                    .metric("bandwidth", "MB/s")
                    .run(run as u32, v)
                    .wait("block"),
            );
        }
        s.push(
            Sample::new("e1", "softib", "write", 2.0)
                .metric("bandwidth", "MB/s")
                .run(0, 9.0)
                .note("mech=0/0/3"),
        );
        s.push(Sample::new("e1", "tcp", "write", 1.0).metric("bandwidth", "MB/s").run(0, 7.0));
        s
    }

    #[test]
    fn csv_round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.csv");
        let s = demo();
        s.write_csv(&path).unwrap();
        let back = Samples::read_csv(&path).unwrap();
        assert_eq!(back.rows(), s.rows());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("experiment,transport,series,x,metric,unit,wait,run,value,note\n"));
        assert!(text.contains("e1,softib,write,2.0,bandwidth,MB/s,-,0,9.0,mech=0/0/3"));
    }

    #[test]
    fn malformed_csv_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.csv");
        std::fs::write(&path, "experiment,transport\nx,y\n").unwrap();
        assert!(matches!(Samples::read_csv(&path), Err(CsvError::Csv { .. })));
        assert!(matches!(Samples::read_csv(&dir.path().join("missing.csv")), Err(CsvError::Csv { .. })));
    }

    #[test]
    fn summaries_group_runs_by_measurement() {
        let s = demo();
        let m = s.summaries();
        assert_eq!(m.len(), 3);
        let tcp2 = s.get("e1", "tcp", "write", "bandwidth", 2.0).unwrap();
        assert_eq!((tcp2.median, tcp2.min, tcp2.max, tcp2.n), (2.0, 1.0, 3.0, 3));
        assert!(s.get("e1", "tcp", "read", "bandwidth", 2.0).is_none());
        assert_eq!(s.xs(), vec![1.0, 2.0]);
        assert_eq!(s.distinct(|r| r.transport.clone()), vec!["tcp", "softib"]);
        assert_eq!(s.filter(|r| r.transport == "softib").len(), 1);
    }
}
