//! E1: concurrent read/write bandwidth (the method of Carns et al.'s PVFS paper, repeated in PVFS over InfiniBand). Every client
//! writes, then reads back, one contiguous 2N MiB region (N = io servers) of one shared file
//! striped over all N servers; clients start each phase together and a round's time is the
//! slowest client's, counted from their common start.
//!
//! A cell runs in blocks of back-to-back rounds, each about as long as one `ionet-perf`
//! streaming run ([`E1Args::block_ms`]), and an `ionet-perf` run on the same transport is drawn
//! before every block and after the last ([`PairedReference`]; placed like the clients and
//! servers). A block's bandwidth is its bytes over the sum of its rounds' times, as a draw's is
//! its bytes over its time, so cell and reference are measured over windows of the same length
//! next to each other: every cell has its "fraction of what the transport moves" against the
//! machine state it ran in. The cells of one cluster take turns block by block ([`schedule`]),
//! so a slow spell of a few seconds lands on a few blocks of several cells, which their medians
//! discard, instead of on every block of one cell. (Single rounds of a small cell last half a millisecond; their median
//! skips the slow rounds that a draw's mean includes, and five of them see one moment of a
//! machine whose speed drifts by a quarter within a second.)
//!
//! Every draw is two runs: the transport's streaming peak (a window of buffers, which stay in
//! the caches) and, right after it, the same stream with its messages cycling through the
//! cell's footprint on each side ([`PairedReference::draw_with_footprint`]): C × 2N MiB, what
//! the cell's clients send from and its io servers' files take in. Over tcp every byte is
//! copied twice, and once the footprint outgrows the caches both copies run at memory speed;
//! the second reference shows what that costs the transport alone, so a cell's two ratios
//! separate stripefs's own cost from its workload's.
//!
//! Read cells have a third reference, drawn after those two: ionet-perf's `read` test from N
//! ionet-perf servers at once into one client, over the cell's footprint ([`Pattern::Reads`]).
//! A stripefs read is not a stream from the client: its N io servers push into the client's
//! buffers, all at once, and over tcp the senders then share the servers' CPU. This reference
//! moves data in that pattern with nothing of stripefs on top, so a read cell's ratio to it
//! tells stripefs's own share of the gap from the pattern's.

use super::reference::{PairedReference, Pattern, Placement, READ_WINDOW, WINDOW, Waits};
use super::util::{Gate, mbs, parallel, pattern, prefaulted};
use super::{Ctx, Report, image};
use anyhow::{Context, Result, bail};
use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table};
use clap::Args;
use ionet::{Scheme, WaitMode};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e1";
/// The experiment name of the reference draws.
const REF_EXP: &str = "e1-ref";
/// The experiment name of the reference draws over the cell's footprint.
const REF_FOOTPRINT_EXP: &str = "e1-ref-footprint";
/// The experiment name of the read-pattern draws (N servers into one client, over the footprint).
const REF_READS_EXP: &str = "e1-ref-reads";
/// The target: every cell at least this fraction of its reference.
pub const TARGET: f64 = 0.8;
/// Blocks per cell unless `--blocks` or a larger `--runs` says otherwise.
pub const DEFAULT_BLOCKS: usize = 15;

/// E1 options.
#[derive(Args, Debug, Clone)]
pub struct E1Args {
    /// io server counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub io_servers: Vec<u32>,
    /// Client counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub clients: Vec<u32>,
    /// MiB per client per io server (the papers: 2).
    #[arg(long, default_value_t = 2)]
    pub mib_per_server: u64,
    /// Stripe size in bytes (default: the file system's, 64 KiB; binary units allowed: 16k).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    pub stripe_size: Option<u64>,
    /// Blocks per cell (default: 15, or `--runs` if more; `--runs` in a smoke check). A block's
    /// figure scatters by about 0.1 (log scale) here, so a cell's median over 5 blocks against
    /// the median of 6 draws still moved by about 0.09 from grid to grid, and one cell in a
    /// 32-cell grid fell below the target in about half the grids; over 15 that fell to 0.03.
    #[arg(long)]
    pub blocks: Option<usize>,
    /// Skip the ionet-perf reference drawn beside every cell.
    #[arg(long)]
    pub no_reference: bool,
    /// How clients wait for the transport, and the ionet-perf reference's client. The default
    /// is stripefs's own (a client's and `stripefs serve`'s): adaptive waits spin while data
    /// moves and block once it stops, yielding their CPU while idle.
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
    /// How io servers wait, and the reference's server (default: as `--wait`). Up to four io
    /// servers share one CPU here, where each would have a node of its own, so servers that
    /// spin without yielding take it from each other.
    #[arg(long)]
    pub server_wait: Option<WaitMode>,
    /// Clients keep their buffers' InfiniBand registrations cached across calls
    /// (`IbConfig::cache_foreign`, MPI's leave_pinned) and invalidate them before freeing.
    #[arg(long)]
    pub cache_registrations: bool,
    /// Timed calls per block, in milliseconds of a client's time: about what one reference draw
    /// lasts (512 MiB at this machine's 5 GB/s), so blocks and draws see the machine over
    /// windows of the same length. Each block first runs untimed rounds for a tenth of this.
    #[arg(long, default_value_t = 100)]
    pub block_ms: u64,
    /// Let the scheduler place everything. By default (on 2 CPUs or more) each side gets a CPU
    /// of its own, as if clients and servers were separate nodes (the PVFS paper's setup): client
    /// threads on CPU 0, io and meta servers on CPU 1, and the ionet-perf reference pinned the
    /// same way (its client on 0, its server on 1, as `ionet-perf ab` pins by default).
    /// Unpinned, the figures also measure where the scheduler happened to put each thread.
    #[arg(long)]
    pub no_pin: bool,
}

impl E1Args {
    fn waits(&self) -> Waits {
        Waits { client: self.wait, server: self.server_wait.unwrap_or(self.wait) }
    }
}

/// What a client's next round of a block is.
const ROUND_WARM: u8 = 0;
const ROUND_TIMED: u8 = 1;
const ROUND_END: u8 = 2;

/// One client's share of a cell.
#[derive(Default)]
struct ClientRuns {
    /// Per block, each timed round's (write, read) seconds.
    blocks: Vec<Vec<(f64, f64)>>,
    /// Rounds of every kind, timed or not (each writes and reads the client's region once).
    rounds: u64,
}

/// The CPUs of pinned runs: clients, servers (ionet-perf's own split).
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;

/// Runs E1.
pub fn run(ctx: &Ctx, a: &E1Args) -> Result<Report> {
    let mut s = Samples::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = !a.no_pin && cpus >= 2;
    if !a.no_pin && !pin {
        eprintln!("e1: {cpus} CPU, so clients and servers are not pinned apart");
    }
    let (io, clients) = if ctx.c.quick && a.io_servers == [1, 2, 3, 4] && a.clients == [1, 2, 3, 4] {
        (vec![1, 4], vec![1, 4])
    } else {
        (a.io_servers.clone(), a.clients.clone())
    };
    let place =
        if pin { Placement::Pinned { client: CLIENT_CPU, server: SERVER_CPU } } else { Placement::Unpinned };
    // Every reference is placed and waits as the cells' clients and servers do, and its
    // connections use the congestion control the cells' clients use.
    let congestion = client_options(a).tcp_congestion;
    let start = |scheme: Scheme, pattern: Pattern| -> Result<PairedReference> {
        let perf = ctx.c.ionet_perf()?;
        PairedReference::start(
            &perf,
            scheme,
            pattern,
            place,
            a.waits(),
            congestion.as_deref(),
            ctx.step_timeout(),
        )
    };
    for &scheme in &ctx.c.transports {
        let mut reference = if a.no_reference {
            None
        } else {
            eprintln!("e1 {scheme}: starting the ionet-perf reference");
            let r = start(scheme, Pattern::Stream)
                .with_context(|| format!("the ionet-perf reference on {scheme}://"))?;
            Some(r)
        };
        for &n in &io {
            eprintln!("e1 {scheme}: {n} io servers");
            let cluster = ctx.cluster(scheme, n, |o| {
                o.stripe_size = a.stripe_size;
                o.io_args.extend(["--wait".into(), a.waits().server.name().into()]);
                if pin {
                    let cpu = ["--cpus".to_string(), SERVER_CPU.to_string()];
                    o.io_args.extend(cpu.clone());
                    o.meta_args.extend(cpu);
                }
            })?;
            // The read pattern's reference: as many ionet-perf servers as the cluster has io servers.
            let mut reads = match reference {
                None => None,
                Some(_) => {
                    Some(start(scheme, Pattern::Reads { servers: n as usize }).with_context(|| {
                        format!("the ionet-perf read reference from {n} servers on {scheme}://")
                    })?)
                }
            };
            let at = ClusterAt { cluster: &cluster, scheme, n, pin };
            let refs = reference.as_mut().map(|stream| References { stream, reads: reads.as_mut() });
            cluster_cells(ctx, at, &clients, a, refs, &mut s)
                .with_context(|| format!("E1 over {scheme}://, {n} io servers"))?;
            drop(reads);
            cluster.stop();
        }
    }
    render(&s, &ctx.link_prefix, a.mib_per_server)
}

/// The cells of one cluster: `clients[k]` clients each, on a cluster of `n` io servers.
#[derive(Clone, Copy)]
struct ClusterAt<'a> {
    cluster: &'a stripefs::cluster::LocalCluster,
    scheme: Scheme,
    n: u32,
    /// Client threads on [`CLIENT_CPU`] (the servers were started on [`SERVER_CPU`]).
    pin: bool,
}

/// One step of a cluster's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A reference draw beside a cell (an index into the cluster's cells).
    Draw { beside: usize },
    /// The next block of a cell.
    Block { cell: usize },
}

/// The order in which a cluster's cells run their blocks: pass `b` runs block `b` of every
/// cell, so a cell's blocks are spread over the whole cluster's run instead of back to back.
/// This machine has slow spells of a few seconds in which many busy processes (a cell's
/// clients and io servers) lose more than the two of a reference draw; with a cell's blocks
/// back to back, one spell could take all of them, while spread out it takes a few, which the
/// median over the blocks discards. A draw beside the cell runs right before every block and
/// right after its last one.
fn schedule(cells: usize, blocks: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for block in 0..blocks {
        for cell in 0..cells {
            steps.push(Step::Draw { beside: cell });
            steps.push(Step::Block { cell });
            if block + 1 == blocks {
                steps.push(Step::Draw { beside: cell });
            }
        }
    }
    steps
}

/// Blocks per cell: `--blocks` if given, else [`DEFAULT_BLOCKS`] or `--runs` if that is more;
/// in a smoke check (`--quick`), `--runs`. At least one.
fn blocks_per_cell(blocks: Option<usize>, runs: usize, quick: bool) -> usize {
    blocks.unwrap_or(if quick { runs } else { runs.max(DEFAULT_BLOCKS) }).max(1)
}

/// The options of every E1 client (and, for its congestion control, of the reference).
fn client_options(a: &E1Args) -> ClientOptions {
    let ib = a.cache_registrations.then(|| stripefs::client::default_ib_config().cache_foreign(true));
    ClientOptions { wait_mode: a.wait, ib, ..ClientOptions::default() }
}

/// Runs every cell of one cluster, their blocks interleaved as [`schedule`] orders them. Each
/// cell's clients are threads that stay connected for the whole cluster and run a block when
/// this thread, which also draws the reference, releases them.
fn cluster_cells(
    ctx: &Ctx,
    at: ClusterAt<'_>,
    clients: &[u32],
    a: &E1Args,
    reference: Option<References<'_>>,
    s: &mut Samples,
) -> Result<()> {
    let ClusterAt { cluster, scheme, n, pin } = at;
    let region = (a.mib_per_server * u64::from(n)) << 20;
    let opts = client_options(a);
    let congestion = opts.tcp_congestion.clone();
    let setup = ctx.client(cluster, opts.clone())?;
    let name = |c: u32| format!("/e1-{n}-{c}");
    let spec = LayoutSpec { base: Some(0), pcount: Some(n), ssize: None };
    for &c in clients {
        drop(setup.create(&name(c), CreateOptions { mode: 0o644, layout: Some(spec) })?);
    }
    let blocks = blocks_per_cell(a.blocks, ctx.c.runs(), ctx.c.quick);
    // A smoke check (--quick) needs only that the blocks work.
    let block = Duration::from_millis(if ctx.c.quick { a.block_ms.min(20) } else { a.block_ms }.max(1));
    let plan = BlockPlan { ctx, cluster, opts, region, blocks, block, warm: block / 10, pin };
    let before = path_totals(&setup)?;
    // Per cell: a gate its clients and this thread pass to start a block and to end it.
    let control: Vec<Gate> = clients.iter().map(|&c| Gate::new(c as usize + 1, ctx.step_timeout())).collect();
    let footprints: Vec<u64> = clients.iter().map(|&c| region * u64::from(c)).collect();
    let mut draws: Vec<CellDraws> = vec![CellDraws::default(); clients.len()];
    let (cells, ran) = std::thread::scope(|sc| {
        let groups: Vec<_> = clients
            .iter()
            .zip(&control)
            .map(|(&c, control)| {
                let (plan, name) = (&plan, name(c));
                sc.spawn(move || plan.cell_clients(c, &name, control))
            })
            .collect();
        let refs = reference.map(|r| (r, footprints.as_slice()));
        let ran = run_schedule(&schedule(clients.len(), blocks), &control, refs, &mut draws);
        if ran.is_err() {
            for g in &control {
                g.abort("the E1 schedule stopped");
            }
        }
        let cells: Vec<Result<Vec<ClientRuns>>> = groups
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a cell's thread panicked"))))
            .collect();
        (cells, ran)
    });
    // A client's own failure explains more than the schedule's "another client failed".
    let cells = cells.into_iter().collect::<Result<Vec<_>>>()?;
    ran?;
    // The figures are for io servers that move data straight to and from their mapped objects:
    // a silent fallback to the copying path would make them describe something else.
    let (mapped, copied) = path_totals(&setup)?;
    let moved: u64 = clients
        .iter()
        .zip(&cells)
        .map(|(&c, per_client)| 2 * per_client[0].rounds * region * u64::from(c))
        .sum();
    if copied != before.1 || mapped - before.0 != moved {
        bail!(
            "io servers moved {} B on the mapped path and {} B by copying, expected {moved} B mapped",
            mapped - before.0,
            copied - before.1
        );
    }
    let t = scheme.as_str();
    let server_wait = a.waits().server;
    let congestion = match (scheme, congestion) {
        (Scheme::Tcp, Some(cc)) => format!(" tcp_congestion={cc}"),
        (Scheme::Tcp, None) => " tcp_congestion=system".to_string(),
        _ => String::new(),
    };
    let note = format!(
        "region_bytes={region} block_ms={} interleaved{congestion}{}{}{}",
        block.as_millis(),
        if a.cache_registrations { " cached_registrations" } else { "" },
        if pin { " pinned" } else { "" },
        if server_wait != a.wait { format!(" server_wait={}", server_wait.name()) } else { String::new() }
    );
    // Every sample of this cluster: the cell's bandwidths and its reference draws alike.
    let sample = |exp: &str, series: &str, c: u32, run: usize, v: f64| {
        Sample::new(exp, t, series, f64::from(c))
            .metric("bandwidth", "MB/s")
            .run(run as u32, v)
            .wait(a.wait.name())
            .note(note.clone())
    };
    for ((&c, per_client), draws) in clients.iter().zip(&cells).zip(&draws) {
        let total = region * u64::from(c);
        for b in 0..blocks {
            let rounds: Vec<&[(f64, f64)]> = per_client.iter().map(|p| p.blocks[b].as_slice()).collect();
            let (w, r) = block_bandwidth(&rounds, total)
                .with_context(|| format!("{n} io servers, {c} clients, block {b}"))?;
            s.push(sample(EXP, &format!("write N={n}"), c, b, w));
            s.push(sample(EXP, &format!("read N={n}"), c, b, r));
        }
        for (r, &v) in draws.peak.iter().enumerate() {
            s.push(sample(REF_EXP, &ref_series(n), c, r, v));
        }
        for (r, &v) in draws.footprint.iter().enumerate() {
            s.push(sample(REF_FOOTPRINT_EXP, &ref_series(n), c, r, v));
        }
        for (r, &v) in draws.reads.iter().enumerate() {
            s.push(sample(REF_READS_EXP, &ref_series(n), c, r, v));
        }
    }
    for &c in clients {
        setup.unlink(&name(c))?;
    }
    Ok(())
}

/// The references a cluster's cells are drawn beside.
struct References<'a> {
    /// The stream (peak, then over the footprint).
    stream: &'a mut PairedReference,
    /// The read pattern from as many servers as the cluster's (over the footprint).
    reads: Option<&'a mut PairedReference>,
}

/// The reference runs drawn beside one cell, in MB/s.
#[derive(Debug, Clone, Default)]
struct CellDraws {
    /// At the transport's streaming peak.
    peak: Vec<f64>,
    /// The same stream over the cell's footprint, each right after a peak draw.
    footprint: Vec<f64>,
    /// Reads from N servers over the cell's footprint, each right after a footprint draw.
    reads: Vec<f64>,
}

/// Walks the schedule: draws the references (when there are; with each cell's footprint)
/// into `draws` of the cells beside them, and lets a cell's clients through their control gate
/// to run a block, then waits at it for the block's end.
fn run_schedule(
    steps: &[Step],
    control: &[Gate],
    mut reference: Option<(References<'_>, &[u64])>,
    draws: &mut [CellDraws],
) -> Result<()> {
    for &step in steps {
        match step {
            Step::Draw { beside } => {
                if let Some((rf, footprints)) = reference.as_mut() {
                    let fp = footprints[beside];
                    draws[beside].peak.push(rf.stream.draw()?);
                    draws[beside].footprint.push(rf.stream.draw_with_footprint(fp)?);
                    if let Some(reads) = rf.reads.as_mut() {
                        draws[beside].reads.push(reads.draw_with_footprint(fp)?);
                    }
                }
            }
            Step::Block { cell } => {
                control[cell].wait().context("starting a block")?;
                control[cell].wait().context("ending a block")?;
            }
        }
    }
    Ok(())
}

/// What every cell of a cluster runs: its clients' options and region, and its blocks.
struct BlockPlan<'a> {
    ctx: &'a Ctx,
    cluster: &'a stripefs::cluster::LocalCluster,
    opts: ClientOptions,
    /// Bytes each client writes and reads back per round.
    region: u64,
    blocks: usize,
    /// Timed calls per block (a client's time).
    block: Duration,
    /// Untimed calls before a block's timed ones.
    warm: Duration,
    /// Client threads on [`CLIENT_CPU`].
    pin: bool,
}

impl BlockPlan<'_> {
    /// The `c` client threads of one cell, on the file `name`: each connects, then runs the
    /// plan's blocks, each when the control gate lets it.
    fn cell_clients(&self, c: u32, name: &str, control: &Gate) -> Result<Vec<ClientRuns>> {
        let BlockPlan { ctx, cluster, ref opts, region, blocks, block, warm, pin } = *self;
        // Client 0 decides what each client's next round is and says so before the gate that ends
        // the round; every client reads it after that gate.
        let next = AtomicU8::new(ROUND_WARM);
        parallel(c as usize, ctx.step_timeout(), |i, gate| -> Result<ClientRuns> {
            let r = (|| {
                if pin {
                    stripefs::cluster::pin_to_cpus(&[CLIENT_CPU])
                        .with_context(|| format!("pinning to CPUs {:?}", [CLIENT_CPU]))?;
                }
                let client = ctx.client(cluster, opts.clone())?;
                let f = client.open(name, Rights::READ_WRITE)?;
                let data = pattern(region as usize, 0xe1 + i as u64);
                let mut buf = prefaulted(region as usize);
                let off = u64::from(i as u32) * region;
                let mut out = ClientRuns::default();
                for _ in 0..blocks {
                    control.wait()?;
                    // Untimed rounds first: the others' blocks and the draw left the servers idle
                    // (and, the first time, the servers' first write of a region allocates its
                    // pages).
                    let mut round = ROUND_WARM;
                    let (mut warmed, mut timed) = (Duration::ZERO, Duration::ZERO);
                    let mut times = Vec::new();
                    while round != ROUND_END {
                        // Timed from the gate's release, not from when this thread got the CPU.
                        let t = gate.wait()?;
                        f.write_at(off, &data)?;
                        let tw = t.elapsed();
                        let t = gate.wait()?;
                        let (back, got) = f.read_at(off, buf)?;
                        let tr = t.elapsed();
                        buf = back;
                        if i == 0 {
                            let spent = if round == ROUND_WARM { &mut warmed } else { &mut timed };
                            *spent += tw + tr;
                            let after = match round {
                                ROUND_WARM if warmed < warm => ROUND_WARM,
                                _ if timed < block => ROUND_TIMED,
                                _ => ROUND_END,
                            };
                            next.store(after, Ordering::SeqCst);
                        }
                        // Check the bytes once every client has read: a check run while the others
                        // still read takes their CPU (an 8 MiB compare is about a millisecond here)
                        // and stretches the slowest client's time, which is what E1 measures.
                        gate.wait()?;
                        if got != region as usize || buf[..] != data[..] {
                            bail!("client {i} read back different data");
                        }
                        if round == ROUND_TIMED {
                            times.push((tw.as_secs_f64(), tr.as_secs_f64()));
                        }
                        out.rounds += 1;
                        round = next.load(Ordering::SeqCst);
                    }
                    out.blocks.push(times);
                    control.wait()?;
                }
                // Cached registrations must not outlive the memory they cover.
                client.endpoint().invalidate_registrations(&data);
                client.endpoint().invalidate_registrations(&buf);
                Ok(out)
            })();
            if let Err(e) = &r {
                // The scheduling thread waits at this gate: let it know rather than time out.
                control.abort(&format!("client {i}: {}", crate::error_line(e)));
            }
            r
        })
    }
}

/// A block's (write, read) bandwidth in MB/s: `bytes` per round over the sum of its rounds'
/// times, a round's time being its slowest client's. `rounds[i]` is client `i`'s (write, read)
/// seconds per timed round; every client must have run the same rounds.
fn block_bandwidth(rounds: &[&[(f64, f64)]], bytes: u64) -> Result<(f64, f64)> {
    let n = rounds.first().map_or(0, |r| r.len());
    if n == 0 || rounds.iter().any(|r| r.len() != n) {
        bail!("the clients ran different numbers of timed rounds (or none)");
    }
    let slowest =
        |k: usize, pick: fn(&(f64, f64)) -> f64| rounds.iter().map(|r| pick(&r[k])).fold(0.0, f64::max);
    let tw: f64 = (0..n).map(|k| slowest(k, |x| x.0)).sum();
    let tr: f64 = (0..n).map(|k| slowest(k, |x| x.1)).sum();
    Ok((mbs(bytes * n as u64, tw), mbs(bytes * n as u64, tr)))
}

/// Bytes the cluster's io servers have moved on the mapped and on the copying path.
fn path_totals(client: &stripefs::Client) -> Result<(u64, u64)> {
    let mut t = (0, 0);
    for st in client.server_stats() {
        let st = st.context("io server statistics")?;
        t.0 += st.mapped.bytes;
        t.1 += st.copied.bytes;
    }
    Ok(t)
}

fn cell_text(v: Option<Summary>) -> String {
    v.map_or("–".into(), |v| v.to_string())
}

/// The series of the reference draws beside the cells with `n` io servers.
fn ref_series(n: u32) -> String {
    format!("ionet-perf N={n}")
}

/// The io server counts in E1's rows.
fn server_counts(e: &Samples) -> Vec<u32> {
    let mut v: Vec<u32> = e
        .rows()
        .iter()
        .filter(|r| r.experiment == EXP)
        .filter_map(|r| r.series.split("N=").nth(1).and_then(|x| x.parse().ok()))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Which reference a cell is held against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// The transport's streaming peak.
    Peak,
    /// The same stream over the cell's footprint.
    Footprint,
    /// Reads from N servers at once over the cell's footprint (read cells only).
    Reads,
}

impl Reference {
    fn exp(self) -> &'static str {
        match self {
            Reference::Peak => REF_EXP,
            Reference::Footprint => REF_FOOTPRINT_EXP,
            Reference::Reads => REF_READS_EXP,
        }
    }

    /// The cells it is a reference for.
    fn ops(self) -> &'static [&'static str] {
        match self {
            Reference::Peak | Reference::Footprint => &["write", "read"],
            Reference::Reads => &["read"],
        }
    }
}

/// The reference drawn beside the runs of the cell with `n` io servers and `c` clients on `t`.
pub fn paired_reference(s: &Samples, which: Reference, t: &str, n: u32, c: f64) -> Option<Summary> {
    s.get(which.exp(), t, &ref_series(n), "bandwidth", c)
}

/// Every reference draw of one kind on `t` in this run.
pub fn all_draws(s: &Samples, which: Reference, t: &str) -> Option<Summary> {
    let v: Vec<f64> = s
        .rows()
        .iter()
        .filter(|r| r.experiment == which.exp() && r.transport == t && r.metric == "bandwidth")
        .map(|r| r.value)
        .collect();
    Summary::of(&v)
}

/// One cell against its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRatio {
    pub io_servers: u32,
    pub clients: u32,
    pub op: &'static str,
    /// The cell's median over the median of the reference drawn beside it.
    pub ratio: f64,
}

/// Every cell on `t` that has a reference of this kind, against it.
pub fn cell_ratios(s: &Samples, which: Reference, t: &str) -> Vec<CellRatio> {
    let mut out = Vec::new();
    let clients = s.filter(|r| r.experiment == EXP && r.transport == t).xs();
    for n in server_counts(s) {
        for &c in &clients {
            let Some(rf) = paired_reference(s, which, t, n, c) else { continue };
            for &op in which.ops() {
                if let Some(v) = s.get(EXP, t, &format!("{op} N={n}"), "bandwidth", c) {
                    out.push(CellRatio { io_servers: n, clients: c as u32, op, ratio: v.ratio_to(&rf) });
                }
            }
        }
    }
    out
}

/// Every cell on `t` against ionet-perf moving the cell's bytes the way the cell does: a write
/// cell against the stream over its footprint (clients pushing into servers), a read cell
/// against the read pattern (N servers pushing into a client over the same footprint). The
/// peak is one cache-hot buffer; these two move what the cell moves, through the same memory.
pub fn same_transfer_ratios(s: &Samples, t: &str) -> Vec<CellRatio> {
    let mut out: Vec<CellRatio> =
        cell_ratios(s, Reference::Footprint, t).into_iter().filter(|r| r.op == "write").collect();
    out.extend(cell_ratios(s, Reference::Reads, t));
    out.sort_by_key(|r| (r.io_servers, r.clients, r.op != "write"));
    out
}

/// Tables and plots of E1.
pub fn render(s: &Samples, prefix: &str, mib_per_server: u64) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts: Vec<String> = e.distinct(|r| r.transport.clone());
    let ns = server_counts(&e);
    let cs = e.xs();
    let waits = e.distinct(|r| r.wait.clone()).join("/");
    // Servers wait as the clients do unless a run's note says otherwise.
    let server_waits = e
        .distinct(|r| {
            r.note
                .split(' ')
                .find_map(|w| w.strip_prefix("server_wait="))
                .map_or(r.wait.clone(), str::to_string)
        })
        .join("/");
    let cached = if e.rows().iter().any(|r| r.note.contains("cached_registrations")) {
        " Clients keep their buffers' registrations cached across calls (`--cache-registrations`)."
    } else {
        ""
    };
    let placement = if e.rows().iter().any(|r| r.note.contains("pinned")) {
        " Pinned, as two nodes: client threads on CPU 0, io and meta servers on CPU 1, the ionet-perf \
         reference pinned the same way."
    } else {
        " No CPU pinning (`--no-pin`), for the clients, the servers and the ionet-perf reference."
    };
    let congestion = e
        .rows()
        .iter()
        .find_map(|r| r.note.split(' ').find_map(|w| w.strip_prefix("tcp_congestion=")).map(str::to_string))
        .map_or(String::new(), |cc| {
            if cc == "system" {
                " TCP congestion control: the kernel's default.".to_string()
            } else {
                format!(
                    " TCP congestion control: `{cc}` on every connection, the clients', the servers' and both sides \
                     of the reference's (stripefs's default, or `STRIPEFS_TCP_CONGESTION`)."
                )
            }
        });
    let block = e
        .rows()
        .iter()
        .find_map(|r| r.note.split(' ').find_map(|w| w.strip_prefix("block_ms=")).map(str::to_string))
        .map_or(String::new(), |ms| format!(" of at least {ms} ms of timed calls"));
    let blocks = e.rows().iter().map(|r| r.run + 1).max().unwrap_or(0);
    let interleaved = if e.rows().iter().any(|r| r.note.split(' ').any(|w| w == "interleaved")) {
        " The cells of one cluster take turns, one block each (the first block of every cell, then the second, …), \
         so a slow spell of the machine takes a few blocks of several cells rather than every block of one."
    } else {
        ""
    };
    let mut md = format!(
        "Each client writes, then reads back, one contiguous {mib_per_server}N MiB region (N = io servers) of one \
         shared file striped over the N servers (64 KiB stripes unless stated); a round's time is the slowest client's \
         from the clients' common start. A cell runs in {blocks} blocks{block}: untimed rounds for a tenth of that first, then \
         timed rounds back to back; a block's bandwidth = its bytes / the sum of its rounds' times, MB/s = 10⁶ B/s, \
         and the table gives the median (min–max) over the blocks.{interleaved} Clients: threads of the bench \
         process, one `Client` each, {waits} waits; io servers: child processes, {server_waits} waits, data on tmpfs, every byte moved \
         on their mapped path (checked against their counters).{cached}{placement}{congestion}\n\n"
    );
    for t in &ts {
        md.push_str(&format!("**{t}://**"));
        if let Some(all) = all_draws(s, Reference::Peak, t) {
            let ratios = cell_ratios(s, Reference::Peak, t);
            let met = ratios.iter().filter(|r| r.ratio >= TARGET).count();
            md.push_str(&format!(
                " — ionet-perf streaming bandwidth (1 MiB messages, {WINDOW} in flight, where it peaks here; about 0.1 s, its client and server waiting as \
                 the clients and io servers do), drawn before each of the cell's blocks and after the last: {} MB/s over all {} draws. Cells at ≥ {TARGET}× of the reference beside \
                 them: {met} of {}.",
                cell_text(Some(all)),
                all.n,
                ratios.len()
            ));
        }
        if let Some(all) = all_draws(s, Reference::Footprint, t) {
            let ratios = cell_ratios(s, Reference::Footprint, t);
            let met = ratios.iter().filter(|r| r.ratio >= TARGET).count();
            md.push_str(&format!(
                " Right after each draw, the same stream with its messages cycling through the cell's footprint on each side \
                 (its clients' regions, C × {mib_per_server}N MiB, at least a window's worth): {} MB/s over all {} draws. Cells at ≥ {TARGET}× of it: {met} of {}.",
                cell_text(Some(all)),
                all.n,
                ratios.len()
            ));
        }
        let reads = all_draws(s, Reference::Reads, t);
        if let Some(all) = reads {
            let ratios = cell_ratios(s, Reference::Reads, t);
            let met = ratios.iter().filter(|r| r.ratio >= TARGET).count();
            md.push_str(&format!(
                " Then the read pattern with nothing of stripefs: one ionet-perf client reading 1 MiB at a time from N ionet-perf \
                 servers at once ({READ_WINDOW} request outstanding at each, where these reads run fastest here; the servers push into its buffers), over the cell's \
                 footprint (the client's buffers C × {mib_per_server}N MiB, each server's payloads its share): {} MB/s over all {} draws. \
                 Read cells at ≥ {TARGET}× of it: {met} of {}.",
                cell_text(Some(all)),
                all.n,
                ratios.len()
            ));
            let same = same_transfer_ratios(s, t);
            let met = same.iter().filter(|r| r.ratio >= TARGET).count();
            md.push_str(&format!(
                " Against ionet-perf moving each cell's bytes the way the cell does (a write cell against the stream over its \
                 footprint, a read cell against the read pattern): {met} of {} cells at ≥ {TARGET}×.",
                same.len()
            ));
        }
        md.push_str("\n\n");
        let mut head = vec![
            "io servers",
            "clients",
            "write MB/s",
            "read MB/s",
            "ionet-perf beside, MB/s",
            "write / ionet-perf",
            "read / ionet-perf",
            "ionet-perf over the footprint, MB/s",
            "write / footprint",
            "read / footprint",
        ];
        if reads.is_some() {
            head.extend(["ionet-perf reads from N servers, MB/s", "read / reads"]);
        }
        let mut tab = Table::new(head);
        for &n in &ns {
            for &c in &cs {
                let w = e.get(EXP, t, &format!("write N={n}"), "bandwidth", c);
                let r = e.get(EXP, t, &format!("read N={n}"), "bandwidth", c);
                if w.is_none() && r.is_none() {
                    continue;
                }
                let rf = paired_reference(s, Reference::Peak, t, n, c);
                let fp = paired_reference(s, Reference::Footprint, t, n, c);
                let ratio = |x: Option<Summary>, rf: Option<Summary>| match (x, rf) {
                    (Some(x), Some(b)) => format!("{:.2}×", x.ratio_to(&b)),
                    _ => "–".into(),
                };
                let mut row = vec![
                    n.to_string(),
                    format!("{c:.0}"),
                    cell_text(w),
                    cell_text(r),
                    cell_text(rf),
                    ratio(w, rf),
                    ratio(r, rf),
                    cell_text(fp),
                    ratio(w, fp),
                    ratio(r, fp),
                ];
                if reads.is_some() {
                    let rd = paired_reference(s, Reference::Reads, t, n, c);
                    row.extend([cell_text(rd), ratio(r, rd)]);
                }
                tab.row(row);
            }
        }
        md.push_str(&tab.render());
        md.push('\n');
    }
    if ts.len() == 2 {
        let (a, b) = (&ts[0], &ts[1]);
        let mut tab =
            Table::new(["io servers", "clients", &format!("write {b} / {a}"), &format!("read {b} / {a}")]);
        for &n in &ns {
            for &c in &cs {
                let r = |op: &str| match (
                    e.get(EXP, b, &format!("{op} N={n}"), "bandwidth", c),
                    e.get(EXP, a, &format!("{op} N={n}"), "bandwidth", c),
                ) {
                    (Some(x), Some(y)) => format!("{:.2}×", x.ratio_to(&y)),
                    _ => "–".into(),
                };
                tab.row([n.to_string(), format!("{c:.0}"), r("write"), r("read")]);
            }
        }
        md.push_str(&format!("Ratio of medians, {b}:// over {a}:// (same run):\n\n"));
        md.push_str(&tab.render());
        md.push('\n');
    }
    let mut plots = Vec::new();
    for op in ["write", "read"] {
        let mut series = Vec::new();
        for t in &ts {
            for &n in &ns {
                let pts: Vec<(f64, Summary)> = cs
                    .iter()
                    .filter_map(|&c| e.get(EXP, t, &format!("{op} N={n}"), "bandwidth", c).map(|v| (c, v)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                let name = format!("{t} N={n}");
                series.push(if t == "tcp" { Series::baseline(name, pts) } else { Series::new(name, pts) });
            }
        }
        if series.is_empty() {
            continue;
        }
        let chart = LineChart {
            title: format!("E1 concurrent {op}: each client {mib_per_server}N MiB of one file"),
            x_desc: "clients".into(),
            y_desc: "aggregate MB/s".into(),
            x_scale: Scale::Count,
            y_scale: Scale::Linear,
            series,
        };
        let name = format!("e1-{op}.svg");
        md.push_str(&image(prefix, &name));
        plots.push((name, chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchkit::Sample;

    fn bw(exp: &str, series: &str, clients: f64, run: u32, v: f64) -> Sample {
        Sample::new(exp, "tcp", series, clients).metric("bandwidth", "MB/s").run(run, v).wait("block")
    }

    /// Each cell is judged against the draws beside its own runs, not against the transport's
    /// draws as a whole: here the two cells have the same bandwidth, but the machine ran twice
    /// as fast beside the second.
    #[test]
    fn each_cell_is_compared_with_the_reference_drawn_beside_it() {
        let mut s = Samples::new();
        for r in 0..3 {
            for (c, beside) in [(1.0, 5000.0), (4.0, 10_000.0)] {
                s.push(bw(EXP, "write N=1", c, r, 4500.0));
                s.push(bw(EXP, "read N=1", c, r, 4500.0));
                s.push(bw(REF_EXP, &ref_series(1), c, r, beside + f64::from(r)));
            }
        }
        let got = cell_ratios(&s, Reference::Peak, "tcp");
        let ratio = |c: u32, op: &str| {
            got.iter().find(|x| x.clients == c && x.op == op).map(|x| (x.ratio * 100.0).round() / 100.0)
        };
        assert_eq!(got.len(), 4);
        assert_eq!(ratio(1, "write"), Some(0.9));
        assert_eq!(ratio(1, "read"), Some(0.9));
        assert_eq!(ratio(4, "write"), Some(0.45));
        let md = render(&s, "", 2).unwrap().md;
        assert!(
            md.contains(
                "| 1 | 1 | 4500 (4500–4500) | 4500 (4500–4500) | 5001 (5000–5002) | 0.90× | 0.90× | – |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| 1 | 4 | 4500 (4500–4500) | 4500 (4500–4500) | 10001 (10000–10002) | 0.45× | 0.45× | – |"
            ),
            "{md}"
        );
        assert!(
            md.contains("over all 6 draws. Cells at ≥ 0.8× of the reference beside them: 2 of 4."),
            "{md}"
        );
        assert!(md.contains("A cell runs in 3 blocks"), "{md}");
        // The report names the window its draws streamed with.
        assert!(md.contains(&format!("1 MiB messages, {WINDOW} in flight")), "{md}");
    }

    /// The draws over a cell's footprint are a second reference, reported beside the peak's:
    /// each cell gets its ratio to both, and each kind counts its own cells at the target.
    #[test]
    fn each_cell_also_has_its_ratio_to_the_stream_over_its_footprint() {
        let mut s = Samples::new();
        for r in 0..3 {
            for (c, peak, spread) in [(1.0, 5000.0, 5000.0), (4.0, 6000.0, 4000.0)] {
                s.push(bw(EXP, "write N=1", c, r, 3600.0));
                s.push(bw(EXP, "read N=1", c, r, 4500.0));
                s.push(bw(REF_EXP, &ref_series(1), c, r, peak));
                s.push(bw(REF_FOOTPRINT_EXP, &ref_series(1), c, r, spread));
            }
        }
        let ratios = |which| -> Vec<(u32, &str, f64)> {
            cell_ratios(&s, which, "tcp")
                .into_iter()
                .map(|x| (x.clients, x.op, (x.ratio * 100.0).round() / 100.0))
                .collect()
        };
        assert_eq!(
            ratios(Reference::Peak),
            [(1, "write", 0.72), (1, "read", 0.9), (4, "write", 0.6), (4, "read", 0.75)]
        );
        assert_eq!(
            ratios(Reference::Footprint),
            [(1, "write", 0.72), (1, "read", 0.9), (4, "write", 0.9), (4, "read", 1.13)]
        );
        let md = render(&s, "", 2).unwrap().md;
        assert!(md.contains("Cells at ≥ 0.8× of the reference beside them: 1 of 4."), "{md}");
        assert!(md.contains("over all 6 draws. Cells at ≥ 0.8× of it: 3 of 4."), "{md}");
        assert!(
            md.contains("| 1 | 4 | 3600 (3600–3600) | 4500 (4500–4500) | 6000 (6000–6000) | 0.60× | 0.75× | 4000 (4000–4000) | 0.90× | 1.12× |"),
            "{md}"
        );
    }

    /// The read pattern's draws are a reference for the read cells only, with their own
    /// columns and count; a run without them has neither.
    #[test]
    fn read_cells_also_have_their_ratio_to_the_read_pattern() {
        let mut s = Samples::new();
        for r in 0..3 {
            for c in [1.0, 4.0] {
                s.push(bw(EXP, "write N=2", c, r, 3600.0));
                s.push(bw(EXP, "read N=2", c, r, 4500.0));
                s.push(bw(REF_EXP, &ref_series(2), c, r, 8000.0));
                s.push(bw(REF_FOOTPRINT_EXP, &ref_series(2), c, r, 7000.0));
            }
        }
        let without = render(&s, "", 2).unwrap().md;
        assert!(!without.contains("read / reads") && !without.contains("Read cells at"), "{without}");
        for r in 0..3 {
            for (c, reads) in [(1.0, 4000.0), (4.0, 6000.0)] {
                s.push(bw(REF_READS_EXP, &ref_series(2), c, r, reads));
            }
        }
        let ratios: Vec<(u32, &str, f64)> = cell_ratios(&s, Reference::Reads, "tcp")
            .into_iter()
            .map(|x| (x.clients, x.op, (x.ratio * 100.0).round() / 100.0))
            .collect();
        assert_eq!(ratios, [(1, "read", 1.13), (4, "read", 0.75)], "read cells only");
        let same: Vec<(u32, &str, f64)> = same_transfer_ratios(&s, "tcp")
            .into_iter()
            .map(|x| (x.clients, x.op, (x.ratio * 100.0).round() / 100.0))
            .collect();
        assert_eq!(
            same,
            [(1, "write", 0.51), (1, "read", 1.13), (4, "write", 0.51), (4, "read", 0.75)],
            "writes against the footprint stream, reads against the read pattern"
        );
        let md = render(&s, "", 2).unwrap().md;
        assert!(md.contains("over all 6 draws. Read cells at ≥ 0.8× of it: 1 of 2."), "{md}");
        assert!(md.contains("the read pattern): 1 of 4 cells at ≥ 0.8×."), "{md}");
        assert!(md.contains("| ionet-perf reads from N servers, MB/s | read / reads |"), "{md}");
        assert!(md.contains("| 0.51× | 0.64× | 6000 (6000–6000) | 0.75× |"), "{md}");
    }

    /// Each draw asks the stream reference for a peak run and then for a run over the footprint
    /// of the cell it is beside, then the read reference for reads over that footprint; every
    /// process of both gets the congestion control they were started with, and the read
    /// reference's client reads from all of its servers. A stand-in for ionet-perf (a shell
    /// script speaking its on-demand protocol) logs the requests and the arguments.
    #[test]
    fn each_draw_runs_the_peak_the_cells_footprint_and_the_read_pattern() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("requests");
        let args = d.path().join("args");
        let fake = d.path().join("ionet-perf");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho \"$*\" >> {}\ncase \"$1\" in\n server) echo LISTEN tcp://127.0.0.1:9; exec sleep 60;;\n \
                 client) echo '# stand-in'; echo READY\n  while read -r l; do echo \"[$l]\" >> {}; echo RUN 1048576 5.5; done;;\nesac\n",
                args.display(),
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let waits = Waits { client: WaitMode::Block, server: WaitMode::Block };
        let start = |pattern| {
            PairedReference::start(
                &fake,
                Scheme::Tcp,
                pattern,
                Placement::Unpinned,
                waits,
                Some("reno"),
                Duration::from_secs(10),
            )
            .unwrap()
        };
        let mut stream = start(Pattern::Stream);
        let mut reads = start(Pattern::Reads { servers: 2 });
        let steps = [Step::Draw { beside: 1 }, Step::Draw { beside: 0 }];
        let mut draws = vec![CellDraws::default(); 2];
        let refs = References { stream: &mut stream, reads: Some(&mut reads) };
        run_schedule(&steps, &[], Some((refs, &[2 << 20, 8 << 20])), &mut draws).unwrap();
        drop((stream, reads));
        assert_eq!(draws[0].peak, [5500.0]);
        assert_eq!(draws[0].footprint, [5500.0]);
        assert_eq!(draws[0].reads, [5500.0]);
        assert_eq!(draws[1].peak.len() + draws[1].footprint.len() + draws[1].reads.len(), 3);
        let asked = std::fs::read_to_string(&log).unwrap();
        let cell = |fp: u64| format!("[]\n[footprint {fp}]\n[footprint {fp}]\n");
        assert_eq!(asked, cell(8 << 20) + &cell(2 << 20));
        let started = std::fs::read_to_string(&args).unwrap();
        let lines: Vec<&str> = started.lines().collect();
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("server ")).count(),
            3,
            "one stream server, two read servers"
        );
        assert_eq!(lines.iter().filter(|l| l.contains("--tcp-congestion reno")).count(), 5, "{started}");
        let client =
            |test: &str| lines.iter().find(|l| l.contains(&format!("--test {test}"))).copied().unwrap();
        assert!(client("bw").contains("--connect tcp://127.0.0.1:9 "), "{started}");
        assert!(client("read").contains("--connect tcp://127.0.0.1:9,tcp://127.0.0.1:9 "), "{started}");
        assert!(client("read").contains("--iters 256 "), "each server half a stream's bytes: {started}");
        assert!(client("read").contains("--window 1 ") && client("bw").contains("--window 4 "), "{started}");
    }

    /// A block counts every round at its slowest client's time, and its bandwidth is its
    /// bytes over the sum of those times (a mean over the window, as a reference draw's is),
    /// not the median of single rounds, which would leave out the slow ones.
    #[test]
    fn a_block_is_its_bytes_over_its_rounds_slowest_times() {
        // Two clients, three rounds; round 2 is slow for client 1 only, round 3 for client 0.
        let c0 = [(0.001, 0.002), (0.001, 0.002), (0.004, 0.002)];
        let c1 = [(0.002, 0.001), (0.003, 0.001), (0.001, 0.001)];
        let (w, r) = block_bandwidth(&[&c0, &c1], 1_000_000).unwrap();
        // Writes: 2 + 3 + 4 ms for 3 MB; reads: 2 + 2 + 2 ms for 3 MB.
        assert!((w - 3e6 / 1e6 / 0.009).abs() < 1e-6, "{w}");
        assert!((r - 3e6 / 1e6 / 0.006).abs() < 1e-6, "{r}");
        assert!(block_bandwidth(&[&c0, &c1[..2]], 1).is_err());
        assert!(block_bandwidth(&[&[], &[]], 1).is_err());
    }

    /// Every cell gets `blocks` blocks, each right after a draw, and its blocks are spread out:
    /// between two blocks of a cell every other cell runs one. Each cell is beside the draws
    /// before its blocks and the one right after its last: `blocks + 1` draws.
    #[test]
    fn a_clusters_cells_take_turns_block_by_block() {
        let (cells, blocks) = (4, 3);
        let steps = schedule(cells, blocks);
        let order: Vec<usize> = steps
            .iter()
            .filter_map(|s| if let Step::Block { cell } = s { Some(*cell) } else { None })
            .collect();
        assert_eq!(order, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        for (i, s) in steps.iter().enumerate() {
            if let Step::Block { cell } = s {
                assert_eq!(steps[i - 1], Step::Draw { beside: *cell }, "step {i}: no draw right before");
            }
        }
        let mut beside = vec![0; cells];
        for s in &steps {
            if let Step::Draw { beside: k } = s {
                beside[*k] += 1;
            }
        }
        assert_eq!(beside, vec![blocks + 1; cells]);
        // The draw after a cell's last block is beside it.
        let last = |cell: usize| steps.iter().rposition(|s| *s == Step::Block { cell }).unwrap();
        for cell in 0..cells {
            assert_eq!(steps[last(cell) + 1], Step::Draw { beside: cell });
        }
        assert!(schedule(0, 3).is_empty() && schedule(2, 0).is_empty());
        assert_eq!(schedule(1, 2).len(), 5, "draw, block, draw, block, draw");
    }

    #[test]
    fn a_cell_runs_fifteen_blocks_unless_told_otherwise() {
        assert_eq!(blocks_per_cell(None, 5, false), DEFAULT_BLOCKS);
        assert_eq!(DEFAULT_BLOCKS, 15);
        assert_eq!(blocks_per_cell(None, 21, false), 21, "more --runs mean more blocks");
        assert_eq!(blocks_per_cell(Some(7), 21, false), 7, "--blocks wins");
        assert_eq!(blocks_per_cell(None, 2, true), 2, "a smoke check runs --runs blocks");
        assert_eq!(blocks_per_cell(Some(0), 5, false), 1);
    }

    /// The schedule lets a cell's clients run a block and goes on only once they end it.
    #[test]
    fn the_schedule_waits_for_each_block_to_end_before_the_next_step() {
        let control = [Gate::new(2, Duration::from_secs(5))];
        let ends = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|sc| {
            let client = sc.spawn(|| {
                for _ in 0..2 {
                    control[0].wait().unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                    ends.fetch_add(1, Ordering::SeqCst);
                    control[0].wait().unwrap();
                }
            });
            let mut draws = vec![CellDraws::default()];
            run_schedule(&schedule(1, 2), &control, None, &mut draws).unwrap();
            // Both blocks ended before the schedule returned.
            assert_eq!(ends.load(Ordering::SeqCst), 2);
            assert!(draws[0].peak.is_empty() && draws[0].footprint.is_empty(), "no reference, no draws");
            client.join().unwrap();
        });
    }

    #[test]
    fn a_cell_whose_clients_failed_stops_the_schedule() {
        let control = [Gate::new(2, Duration::from_secs(30))];
        control[0].abort("client 0: connection refused");
        let err = run_schedule(&schedule(1, 2), &control, None, &mut [CellDraws::default()]).unwrap_err();
        assert!(format!("{err:#}").contains("connection refused"), "{err:#}");
    }

    #[test]
    fn without_a_reference_the_cells_have_no_ratio() {
        let mut s = Samples::new();
        s.push(bw(EXP, "write N=1", 1.0, 0, 4500.0));
        s.push(bw(EXP, "read N=1", 1.0, 0, 4500.0));
        assert!(cell_ratios(&s, Reference::Peak, "tcp").is_empty());
        assert!(cell_ratios(&s, Reference::Footprint, "tcp").is_empty());
        let md = render(&s, "", 2).unwrap().md;
        assert!(md.contains("| 1 | 1 | 4500 | 4500 | – | – | – | – | – | – |"), "{md}");
        assert!(!md.contains("draws"), "{md}");
    }

    #[test]
    fn the_report_says_whether_clients_and_servers_were_pinned() {
        let cell = |note: &str| {
            let mut s = Samples::new();
            for op in ["write", "read"] {
                s.push(
                    Sample::new(EXP, "tcp", &format!("{op} N=1"), 1.0)
                        .metric("bandwidth", "MB/s")
                        .run(0, 5000.0)
                        .wait("block")
                        .note(note.to_string()),
                );
            }
            render(&s, "", 2).unwrap().md
        };
        assert!(cell("region_bytes=2097152 pinned").contains("Pinned, as two nodes"));
        assert!(cell("region_bytes=2097152").contains("No CPU pinning"));
        assert!(cell("region_bytes=2097152 interleaved pinned").contains("take turns, one block each"));
        assert!(!cell("region_bytes=2097152 pinned").contains("take turns"));
        assert!(
            cell("region_bytes=2097152 tcp_congestion=reno")
                .contains("TCP congestion control: `reno` on every connection, the clients', the servers'")
        );
        assert!(cell("region_bytes=2097152 tcp_congestion=system").contains("the kernel's default"));
        assert!(!cell("region_bytes=2097152").contains("congestion"));
    }
}
