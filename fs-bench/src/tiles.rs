//! Tiled access (mpi-tile-io, as PVFS over InfiniBand ran it): a 2-D array of fixed-size elements stored
//! row-major in one file, split into a 2×2 grid of tiles, one client per tile. A tile row is
//! contiguous in the file; consecutive tile rows are a global row apart. E4 (this module) reads
//! and writes each tile with one contiguous call per tile row ("without list I/O") or one list
//! I/O call per tile; E5 (`e5.rs`) uses the same geometry with non-contiguous memory.

use super::util::{mbs, parallel, pattern, prefaulted};
use super::{Ctx, Report};
use anyhow::{Context, Result, bail};
use benchkit::plot::BarChart;
use benchkit::{Sample, Samples, Summary, Table, units};
use bytes::BytesMut;
use clap::Args;
use stripefs::capability::Rights;
use stripefs::client::RequestLimits;
use stripefs::layout::{Extent, Layout, ListIo, ServerPieces};
use stripefs::proto::{self, LayoutSpec};
use stripefs::{Client, ClientOptions, CreateOptions};

/// Tile geometry: 2×2 tiles of `cols`×`rows` elements of `elem` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    pub elem: u64,
    pub cols: u64,
    pub rows: u64,
}

impl Tiles {
    /// Bytes of one tile row.
    pub fn row_bytes(&self) -> u64 {
        self.cols * self.elem
    }

    /// Bytes of one global row (two tiles wide).
    pub fn global_row_bytes(&self) -> u64 {
        2 * self.row_bytes()
    }

    /// Bytes of one tile.
    pub fn tile_bytes(&self) -> u64 {
        self.rows * self.row_bytes()
    }

    /// Bytes of the whole array (= the file).
    pub fn array_bytes(&self) -> u64 {
        4 * self.tile_bytes()
    }

    /// Where tile `k`'s rows sit in the array (file or a full in-memory copy), in row order.
    pub fn extents(&self, k: usize) -> Vec<Extent> {
        let (kx, ky) = ((k % 2) as u64, (k / 2) as u64);
        (0..self.rows)
            .map(|i| {
                Extent::new(
                    (ky * self.rows + i) * self.global_row_bytes() + kx * self.row_bytes(),
                    self.row_bytes(),
                )
            })
            .collect()
    }
}

/// Tile options (E4 defaults: PVFS over InfiniBand's).
#[derive(Args, Debug, Clone)]
pub struct TileArgs {
    /// Element size in bytes.
    #[arg(long, value_parser = stripefs::units::parse_size, default_value_t = 24)]
    pub elem: u64,
    /// Tile width in elements.
    #[arg(long, default_value_t = 1024)]
    pub tile_cols: u64,
    /// Tile height in elements (= tile rows).
    #[arg(long, default_value_t = 768)]
    pub tile_rows: u64,
    /// Stripe size (bytes or binary units: 64k; default: the file system's, 64 KiB).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    pub stripe_size: Option<u64>,
}

impl TileArgs {
    /// The geometry.
    pub fn tiles(&self) -> Tiles {
        Tiles { elem: self.elem, cols: self.tile_cols, rows: self.tile_rows }
    }
}

/// The largest request payloads a client with `opts` sends (as the client computes them).
pub fn request_limits(client: &Client, opts: &ClientOptions) -> RequestLimits {
    let info = client.endpoint().info();
    opts.request_limits(info.scheme, info.max_message as u64)
}

/// Requests a plan turns into (the client splits a server's share at the wire limits).
pub fn requests_of(plan: &[ServerPieces], max_req: u64) -> u64 {
    plan.iter()
        .map(|sp| {
            if sp.pieces.len() <= proto::MAX_PIECES && sp.bytes <= max_req {
                1
            } else {
                sp.split(proto::MAX_PIECES, max_req).len() as u64
            }
        })
        .sum()
}

/// Requests all four clients send for one pass over their tiles: one contiguous call per tile
/// row, or one list call per tile (memory: the tile contiguous at 0).
pub fn expected_requests(t: &Tiles, layout: &Layout, max_req: u64, list: bool) -> Result<u64> {
    let mut n = 0;
    for k in 0..4 {
        let file = t.extents(k);
        if list {
            let l = ListIo::new(vec![Extent::new(0, t.tile_bytes())], file)?;
            n += requests_of(&l.plan(layout), max_req);
        } else {
            for e in file {
                n += requests_of(&layout.plan([e]), max_req);
            }
        }
    }
    Ok(n)
}

fn server_counts(c: &Client) -> Result<(u64, u64)> {
    let mut w = 0;
    let mut r = 0;
    for s in c.server_stats() {
        let s = s?;
        w += s.writes;
        r += s.reads;
    }
    Ok((w, r))
}

const EXP: &str = "e4";

/// Series names.
fn series(op: &str, list: bool) -> String {
    format!("{op}, {}", if list { "list I/O" } else { "no list I/O" })
}

/// Runs E4.
pub fn run_e4(ctx: &Ctx, a: &TileArgs) -> Result<Report> {
    let t = a.tiles();
    let mut s = Samples::new();
    for &scheme in &ctx.c.transports {
        let cluster = ctx.cluster(scheme, 4, |o| o.stripe_size = a.stripe_size)?;
        let setup = ctx.client(&cluster, ClientOptions::default())?;
        let spec = LayoutSpec { base: Some(0), pcount: Some(4), ssize: None };
        let layout = setup.create("/e4", CreateOptions { mode: 0o644, layout: Some(spec) })?.layout();
        let limits = request_limits(&setup, &ClientOptions::default());
        for list in [true, false] {
            eprintln!("e4 {scheme}: {}", if list { "list I/O" } else { "one call per tile row" });
            let (w0, r0) = server_counts(&setup)?;
            let rounds = ctx.c.runs() + 1;
            let times = parallel(4, ctx.step_timeout(), |k, gate| -> Result<Vec<(f64, f64)>> {
                let client = ctx.client(&cluster, ClientOptions::default())?;
                let f = client.open("/e4", Rights::READ_WRITE)?;
                let file = t.extents(k);
                let data = pattern(t.tile_bytes() as usize, 0xe4 + k as u64);
                let mut tile = Some(prefaulted(t.tile_bytes() as usize));
                let mut rows: Vec<BytesMut> =
                    (0..t.rows).map(|_| prefaulted(t.row_bytes() as usize)).collect();
                let mut out = Vec::new();
                for round in 0..rounds {
                    let t0 = gate.wait()?; // the round's start, not this thread's
                    if list {
                        f.write_list(&[Extent::new(0, t.tile_bytes())], &file, &data)?;
                    } else {
                        for (i, e) in file.iter().enumerate() {
                            let rb = t.row_bytes() as usize;
                            f.write_at(e.off, &data.slice(i * rb..(i + 1) * rb))?;
                        }
                    }
                    let tw = t0.elapsed().as_secs_f64();
                    let t0 = gate.wait()?; // the round's start, not this thread's
                    if list {
                        let b = tile.take().unwrap_or_default();
                        tile = Some(f.read_list(&[Extent::new(0, t.tile_bytes())], &file, b)?);
                    } else {
                        for (row, e) in rows.iter_mut().zip(&file) {
                            let (b, n) = f.read_at(e.off, std::mem::take(row))?;
                            if n != t.row_bytes() as usize {
                                bail!("short read of a tile row");
                            }
                            *row = b;
                        }
                    }
                    let tr = t0.elapsed().as_secs_f64();
                    let ok = if list {
                        tile.as_ref().is_some_and(|b| b[..] == data[..])
                    } else {
                        rows.iter().enumerate().all(|(i, r)| {
                            let rb = t.row_bytes() as usize;
                            r[..] == data[i * rb..(i + 1) * rb]
                        })
                    };
                    if !ok {
                        bail!("client {k} read back different data");
                    }
                    if round > 0 {
                        out.push((tw, tr));
                    }
                }
                Ok(out)
            })
            .with_context(|| format!("E4 over {scheme}://"))?;
            let (w1, r1) = server_counts(&setup)?;
            let per_round = |d: u64| d as f64 / rounds as f64;
            let want_w = expected_requests(&t, &layout, limits.max, list)? as f64;
            let want_r = expected_requests(&t, &layout, limits.read, list)? as f64;
            let (wr, rr) = (per_round(w1 - w0), per_round(r1 - r0));
            if wr != want_w || rr != want_r {
                bail!(
                    "E4 over {scheme}://: io servers counted {wr} write and {rr} read requests per pass, the layout \
                     says {want_w} and {want_r}"
                );
            }
            let total = t.array_bytes();
            for (op, idx, reqs) in [("write", 0, wr), ("read", 1, rr)] {
                let name = series(op, list);
                let sample = |m: &str, u: &str, run: usize, v: f64| {
                    Sample::new(EXP, scheme.as_str(), &name, 0.0)
                        .metric(m, u)
                        .run(run as u32, v)
                        .wait("adaptive")
                };
                for r in 0..ctx.c.runs() {
                    let secs =
                        times.iter().map(|v| if idx == 0 { v[r].0 } else { v[r].1 }).fold(0.0, f64::max);
                    s.push(sample("bandwidth", "MB/s", r, mbs(total, secs)));
                }
                s.push(sample("requests", "count", 0, reqs));
            }
        }
        cluster.stop();
    }
    render_e4(&s, &ctx.link_prefix, &t)
}

fn value(s: &Samples, t: &str, series: &str, metric: &str) -> Option<Summary> {
    s.get(EXP, t, series, metric, 0.0)
}

/// Table and plot of E4.
pub fn render_e4(s: &Samples, prefix: &str, t: &Tiles) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts = e.distinct(|r| r.transport.clone());
    let mut tab = Table::new([
        "transport",
        "operation",
        "list I/O MB/s",
        "no list I/O MB/s",
        "list / no list",
        "requests, list I/O",
        "requests, no list I/O",
    ]);
    for tr in &ts {
        for op in ["write", "read"] {
            let l = value(&e, tr, &series(op, true), "bandwidth");
            let n = value(&e, tr, &series(op, false), "bandwidth");
            let count = |list| {
                value(&e, tr, &series(op, list), "requests")
                    .map_or("–".into(), |v| format!("{:.0}", v.median))
            };
            tab.row([
                format!("{tr}://"),
                op.to_string(),
                l.map_or("–".into(), |v| v.to_string()),
                n.map_or("–".into(), |v| v.to_string()),
                match (l, n) {
                    (Some(a), Some(b)) => format!("{:.2}×", a.ratio_to(&b)),
                    _ => "–".into(),
                },
                count(true),
                count(false),
            ]);
        }
    }
    let mut md = format!(
        "4 clients, 4 io servers; a {}×{} array of {} B elements ({}) in one file, each client one {}×{} tile \
         ({}): its {} tile rows of {} are a global row ({}) apart in the file and contiguous in memory. \
         Without list I/O a client makes one `write_at` / `read_at` per tile row; with list I/O one \
         `write_list` / `read_list` per tile. Bandwidth = array bytes / slowest client (timed from the clients' common start); requests = io-server \
         requests per pass, all clients (checked against the layout).\n\n",
        2 * t.cols,
        2 * t.rows,
        t.elem,
        units::size(t.array_bytes() as f64),
        t.cols,
        t.rows,
        units::size(t.tile_bytes() as f64),
        t.rows,
        units::size(t.row_bytes() as f64),
        units::size(t.global_row_bytes() as f64),
    );
    md.push_str(&tab.render());
    let groups: Vec<(String, String, String)> = ts
        .iter()
        .flat_map(|tr| ["write", "read"].map(|op| (tr.clone(), op.to_string(), format!("{tr} {op}"))))
        .collect();
    let bars: Vec<(String, Vec<Option<Summary>>)> = [true, false]
        .iter()
        .map(|&list| {
            (
                if list { "list I/O" } else { "no list I/O" }.to_string(),
                groups.iter().map(|(tr, op, _)| value(&e, tr, &series(op, list), "bandwidth")).collect(),
            )
        })
        .collect();
    let mut plots = Vec::new();
    if !groups.is_empty() {
        let chart = BarChart {
            title: "E4 tiled access (mpi-tile-io), 4 clients × 4 io servers".into(),
            y_desc: "MB/s".into(),
            groups: groups.into_iter().map(|g| g.2).collect(),
            series: bars,
            log_y: false,
        };
        md.push('\n');
        md.push_str(&super::image(prefix, "e4.svg"));
        plots.push(("e4.svg".to_string(), chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_extents_cover_the_array_exactly_once() {
        let t = Tiles { elem: 3, cols: 4, rows: 2 };
        let mut all: Vec<Extent> = (0..4).flat_map(|k| t.extents(k)).collect();
        all.sort_by_key(|e| e.off);
        let mut pos = 0;
        for e in &all {
            assert_eq!(e.off, pos);
            assert_eq!(e.len, t.row_bytes());
            pos += e.len;
        }
        assert_eq!(pos, t.array_bytes());
        // Tile 1 (top right) starts half a global row in; tile 2 (bottom left) after tile 0's rows.
        assert_eq!(t.extents(1)[0].off, t.row_bytes());
        assert_eq!(t.extents(2)[0].off, t.rows * t.global_row_bytes());
    }

    #[test]
    fn expected_requests_follow_the_layout() {
        // Rows of exactly one stripe, stripes alternating over 4 servers: every row is one
        // request without list I/O; with list I/O each client's rows go to 2 servers.
        let t = Tiles { elem: 64, cols: 16, rows: 8 };
        let layout = Layout::new(0, 4, t.row_bytes()).unwrap();
        assert_eq!(expected_requests(&t, &layout, 1 << 30, false).unwrap(), 4 * 8);
        assert_eq!(expected_requests(&t, &layout, 1 << 30, true).unwrap(), 4 * 2);
        // A request limit of 2 rows splits each server's 4 rows in two.
        assert_eq!(expected_requests(&t, &layout, 2 * t.row_bytes(), true).unwrap(), 4 * 2 * 2);
        // The paper's geometry on 64 KiB stripes: 24 KiB rows straddle stripes now and then.
        let p = Tiles { elem: 24, cols: 1024, rows: 768 };
        let l = Layout::new(0, 4, 64 << 10).unwrap();
        let rows = expected_requests(&p, &l, 1 << 30, false).unwrap();
        assert!(rows > 4 * 768 && rows < 2 * 4 * 768, "{rows}");
        assert!(expected_requests(&p, &l, 1 << 30, true).unwrap() <= 16);
    }
}
