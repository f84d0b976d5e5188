//! E5: list-I/O memory registration (PVFS over InfiniBand, Figure 14). The tiled access of E4 with
//! 64-byte elements and non-contiguous memory as well: every client holds the whole 2048×1536
//! array and reads / writes its tile in place, so its 768 tile rows are 64 KiB pieces 128 KiB
//! apart in memory and in the file. List requests carry 128 rows each (6 per tile, as in the
//! paper). Without allocation hints the transport registers every row (768 registrations per
//! tile per pass); with them (`IbConfig::list_alloc_hint`) one span per request. RDMA
//! transports only: TCP registers nothing.

use super::tiles::{self, Tiles};
use super::util::{mbs, parallel, prefaulted};
use super::{Ctx, Report};
use anyhow::{Context, Result, anyhow, bail};
use benchkit::plot::BarChart;
use benchkit::{Sample, Samples, Summary, Table, units};
use bytes::BytesMut;
use clap::Args;
use ionet::{IbConfig, Scheme};
use stripefs::capability::Rights;
use stripefs::layout::{Extent, ListIo};
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e5";

/// E5 options (defaults: PVFS over InfiniBand's).
#[derive(Args, Debug, Clone)]
pub struct E5Args {
    /// Element size in bytes.
    #[arg(long, value_parser = stripefs::units::parse_size, default_value_t = 64)]
    pub elem: u64,
    /// Tile width in elements.
    #[arg(long, default_value_t = 1024)]
    pub tile_cols: u64,
    /// Tile height in elements (= tile rows).
    #[arg(long, default_value_t = 768)]
    pub tile_rows: u64,
    /// Tile rows per list request (the paper: 128).
    #[arg(long, default_value_t = 128)]
    pub rows_per_request: u64,
    /// Stripe size (bytes or binary units: 64k; default: the file system's, 64 KiB).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    pub stripe_size: Option<u64>,
}

fn series(op: &str, hints: bool) -> String {
    format!("{op}, {}", if hints { "allocation hints" } else { "no hints" })
}

/// Word `i` of client `k`'s array: position-dependent, so misplaced rows show.
fn word(k: usize, off: usize) -> u64 {
    (off as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k as u64 + 1)
}

fn fill(buf: &mut [u8], rows: &[Extent], k: usize) {
    for e in rows {
        let (a, b) = (e.off as usize, (e.off + e.len) as usize);
        for (j, w) in buf[a..b].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(k, a + 8 * j).to_le_bytes());
        }
    }
}

fn check(buf: &[u8], rows: &[Extent], k: usize) -> bool {
    rows.iter().all(|e| {
        let (a, b) = (e.off as usize, (e.off + e.len) as usize);
        buf[a..b].chunks_exact(8).enumerate().all(|(j, w)| w == word(k, a + 8 * j).to_le_bytes())
    })
}

/// Per-client measurements of one round.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    write_s: f64,
    read_s: f64,
    write_regs: u64,
    read_regs: u64,
}

/// Runs E5.
pub fn run(ctx: &Ctx, a: &E5Args) -> Result<Report> {
    let t = Tiles { elem: a.elem, cols: a.tile_cols, rows: a.tile_rows };
    if !t.row_bytes().is_multiple_of(8) {
        bail!("E5 needs tile rows of a multiple of 8 bytes");
    }
    let mut s = Samples::new();
    let rdma: Vec<Scheme> = ctx.c.transports.iter().copied().filter(|&s| s != Scheme::Tcp).collect();
    if rdma.is_empty() {
        eprintln!("e5: no RDMA transport among {:?}; nothing to measure", ctx.c.transports);
    }
    for scheme in rdma {
        let cluster = ctx.cluster(scheme, 4, |o| o.stripe_size = a.stripe_size)?;
        let setup = ctx.client(&cluster, ClientOptions::default())?;
        let spec = LayoutSpec { base: Some(0), pcount: Some(4), ssize: None };
        let layout = setup.create("/e5", CreateOptions { mode: 0o644, layout: Some(spec) })?.layout();
        // Reads and writes alike: `rows_per_request` rows per request.
        let opts_for = |hints: bool| ClientOptions {
            max_request_bytes: Some(a.rows_per_request * t.row_bytes()),
            read_request_bytes: Some(a.rows_per_request * t.row_bytes()),
            // Registrations are counted per request, as the paper counted them: none kept from
            // one request to the next (kept ones would make both variants register nothing
            // after the first pass).
            ib: Some(IbConfig::default().list_alloc_hint(hints).cache_foreign(false)),
            ..Default::default()
        };
        let max_req = tiles::request_limits(&setup, &opts_for(false)).max;
        let requests: u64 = (0..4)
            .map(|k| {
                let rows = t.extents(k);
                ListIo::new(rows.clone(), rows).map(|l| tiles::requests_of(&l.plan(&layout), max_req))
            })
            .sum::<Result<u64, _>>()?;
        for hints in [false, true] {
            eprintln!("e5 {scheme}: {}", if hints { "allocation hints" } else { "no hints" });
            let rounds = ctx.c.runs() + 1;
            let per_client = parallel(4, ctx.step_timeout(), |k, gate| -> Result<Vec<Round>> {
                let client = ctx.client(&cluster, opts_for(hints))?;
                let ep = client.endpoint().clone();
                let f = client.open("/e5", Rights::READ_WRITE)?;
                let rows = t.extents(k);
                let mut array: BytesMut = prefaulted(t.array_bytes() as usize);
                fill(&mut array, &rows, k);
                let misses = || ep.info().regcache.map_or(0, |r| r.misses);
                let mut out = Vec::new();
                for round in 0..rounds {
                    let data = array.freeze();
                    let m0 = misses();
                    let t0 = gate.wait()?; // the round's start, not this thread's
                    f.write_list(&rows, &rows, &data)?;
                    let write_s = t0.elapsed().as_secs_f64();
                    let write_regs = misses() - m0;
                    array = data
                        .try_into_mut()
                        .map_err(|_| anyhow!("the array is still shared after the write"))?;
                    for e in &rows {
                        array[e.off as usize..(e.off + e.len) as usize].fill(0);
                    }
                    let m0 = misses();
                    let t0 = gate.wait()?; // the round's start, not this thread's
                    array = f.read_list(&rows, &rows, array)?;
                    let read_s = t0.elapsed().as_secs_f64();
                    let read_regs = misses() - m0;
                    if !check(&array, &rows, k) {
                        bail!("client {k} read back different data");
                    }
                    if round > 0 {
                        out.push(Round { write_s, read_s, write_regs, read_regs });
                    }
                }
                Ok(out)
            })
            .with_context(|| format!("E5 over {scheme}://"))?;
            let total = 4 * t.tile_bytes();
            for (op, w) in [("write", true), ("read", false)] {
                let name = series(op, hints);
                let sample = |m: &str, u: &str, r: usize, v: f64| {
                    Sample::new(EXP, scheme.as_str(), &name, 0.0)
                        .metric(m, u)
                        .run(r as u32, v)
                        .wait("adaptive")
                };
                for r in 0..ctx.c.runs() {
                    let secs = per_client
                        .iter()
                        .map(|v| if w { v[r].write_s } else { v[r].read_s })
                        .fold(0.0, f64::max);
                    let regs: u64 =
                        per_client.iter().map(|v| if w { v[r].write_regs } else { v[r].read_regs }).sum();
                    s.push(sample("bandwidth", "MB/s", r, mbs(total, secs)));
                    s.push(sample("registrations", "count", r, regs as f64));
                }
                s.push(sample("requests", "count", 0, requests as f64));
            }
        }
        cluster.stop();
    }
    render(&s, &ctx.link_prefix, &t, a.rows_per_request)
}

/// Table and plot of E5.
pub fn render(s: &Samples, prefix: &str, t: &Tiles, rows_per_request: u64) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts = e.distinct(|r| r.transport.clone());
    let v = |tr: &str, op: &str, hints: bool, m: &str| e.get(EXP, tr, &series(op, hints), m, 0.0);
    let mut tab = Table::new([
        "transport",
        "operation",
        "MB/s with hints",
        "MB/s without",
        "with / without",
        "registrations with hints",
        "registrations without",
        "list requests",
    ]);
    for tr in &ts {
        for op in ["write", "read"] {
            let (h, n) = (v(tr, op, true, "bandwidth"), v(tr, op, false, "bandwidth"));
            let count = |x: Option<Summary>| x.map_or("–".into(), |x| format!("{:.0}", x.median));
            tab.row([
                format!("{tr}://"),
                op.into(),
                h.map_or("–".into(), |x| x.to_string()),
                n.map_or("–".into(), |x| x.to_string()),
                match (h, n) {
                    (Some(a), Some(b)) => format!("{:.2}×", a.ratio_to(&b)),
                    _ => "–".into(),
                },
                count(v(tr, op, true, "registrations")),
                count(v(tr, op, false, "registrations")),
                count(v(tr, op, true, "requests")),
            ]);
        }
    }
    let mut md = format!(
        "4 clients × 4 io servers; a {}×{} array of {} B elements ({}); every client holds the whole array and \
         moves its {}×{} tile in place with one `write_list` / `read_list` per pass, {} rows of {} per request. \
         Registrations = the clients' registration-cache misses per pass (all clients); user memory is not \
         cached between requests (ionet deregisters foreign memory at its last release).\n\n",
        2 * t.cols,
        2 * t.rows,
        t.elem,
        units::size(t.array_bytes() as f64),
        t.cols,
        t.rows,
        rows_per_request,
        units::size(t.row_bytes() as f64),
    );
    md.push_str(&tab.render());
    let groups: Vec<(String, String)> =
        ts.iter().flat_map(|tr| ["write", "read"].map(|op| (tr.clone(), op.to_string()))).collect();
    let mut plots = Vec::new();
    if !groups.is_empty() {
        let chart = BarChart {
            title: "E5 list I/O with non-contiguous memory: allocation hints".into(),
            y_desc: "MB/s".into(),
            groups: groups.iter().map(|(tr, op)| format!("{tr} {op}")).collect(),
            series: [true, false]
                .iter()
                .map(|&h| {
                    (
                        if h { "allocation hints" } else { "no hints" }.to_string(),
                        groups.iter().map(|(tr, op)| v(tr, op, h, "bandwidth")).collect(),
                    )
                })
                .collect(),
            log_y: false,
        };
        md.push('\n');
        md.push_str(&super::image(prefix, "e5.svg"));
        plots.push(("e5.svg".to_string(), chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_and_check_agree_and_catch_moves() {
        let t = Tiles { elem: 8, cols: 4, rows: 2 };
        let rows = t.extents(3);
        let mut b = vec![0u8; t.array_bytes() as usize];
        fill(&mut b, &rows, 3);
        assert!(check(&b, &rows, 3));
        assert!(!check(&b, &rows, 2), "another client's words differ");
        b[rows[1].off as usize] ^= 1;
        assert!(!check(&b, &rows, 3));
    }
}
