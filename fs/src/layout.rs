//! Striping math: where every logical byte of a file lives. Pure, no I/O.
//!
//! A file is striped round-robin over `pcount` of the cluster's `N` io servers, starting at server
//! `base`, in units of `ssize` bytes (PVFS1's `pvfs_filestat {base, pcount, ssize}`). Stripe
//! unit `s = off / ssize` lives on the file's *relative* server `pnum = s mod pcount`, which is the absolute io server `(base + pnum) mod N`, at local offset
//! `(s / pcount)·ssize + off mod ssize`. Each server's local file is therefore the concatenation of
//! the units it holds, in logical order, which gives three facts everything below relies on:
//!
//! * the bytes of a contiguous logical extent `[a, b)` held by `pnum` are the *contiguous* local
//!   range `[local_size(pnum, a), local_size(pnum, b))`;
//! * so the data of any request can flow to each server in logical order, with one descriptor per
//!   server and no per-piece headers (the PVFS "I/O stream");
//! * the logical size of a file is the max over servers of the logical end implied by each local
//!   size (OrangeFS `physical_to_logical_size`), not PVFS1's sum, which is wrong for sparse files.
//!
//! On top of the stripe mapping sit the two non-contiguous access forms: a partitioned file
//! [`View`] (`set_view(offset, gsize, stride)`, PVFS1's `SETPART`) and [`ListIo`] (a memory
//! list and a file list of `(offset, len)` pairs). Both reduce to a sequence of logical file
//! [`Extent`]s in *request order*; [`Layout::plan`] turns that into one [`ServerPieces`] per
//! involved server for the client, and [`Layout::server_pieces`] computes the identical local
//! pieces on the io server from a compact descriptor.
//!
//! Positions use `u64` throughout; anything that could overflow for peer-supplied values is
//! checked and reported, never wrapped.

use serde::{Deserialize, Serialize};

/// Largest stripe size accepted: 1 GiB. Keeps `ssize · pcount` far from `u64` overflow and stops
/// a peer from describing a layout no server could hold.
pub const MAX_SSIZE: u64 = 1 << 30;

/// Smallest stripe size a new file or a directory's default may ask for: a page. Every stripe
/// a transfer touches is a piece of its own for the client and the io servers to handle, so a
/// file made with stripes of a few bytes (`--stripe-size 1` for a MiB) would cost every reader
/// and the io servers work out of all proportion to its bytes. Layouts already made keep
/// theirs.
pub const MIN_SSIZE: u64 = 4096;

/// Largest number of servers a file may be striped over.
pub const MAX_PCOUNT: u32 = 1 << 16;

/// Why a layout, view or list was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `ssize` is 0 or above [`MAX_SSIZE`].
    #[error("stripe size {0} outside 1..={MAX_SSIZE}")]
    BadStripeSize(u64),
    /// A new layout's `ssize` is below [`MIN_SSIZE`].
    #[error("stripe size {0} below the least a new layout may have, {MIN_SSIZE} bytes")]
    SmallStripeSize(u64),
    /// `pcount` is 0, above [`MAX_PCOUNT`], or above the number of io servers.
    #[error("stripe count {pcount} outside 1..={max}")]
    BadStripeCount {
        /// The requested count.
        pcount: u32,
        /// The largest allowed here.
        max: u32,
    },
    /// `base` does not name an io server.
    #[error("stripe base {base} is not an io server index (have {n_servers})")]
    BadBase {
        /// The requested base.
        base: u32,
        /// The number of io servers.
        n_servers: u32,
    },
    /// A view with `gsize == 0` or `stride < gsize`.
    #[error("bad view: gsize {gsize}, stride {stride} (need 0 < gsize <= stride)")]
    BadView {
        /// Bytes per block.
        gsize: u64,
        /// Distance between block starts.
        stride: u64,
    },
    /// List I/O with different memory and file totals.
    #[error("list I/O totals differ: memory {mem} bytes, file {file} bytes")]
    ListMismatch {
        /// Sum of the memory list.
        mem: u64,
        /// Sum of the file list.
        file: u64,
    },
    /// An offset plus length, or a sum of lengths, does not fit in `u64`.
    #[error("offset or length overflows u64")]
    Overflow,
}

/// A contiguous byte range `[off, off + len)`: a logical file extent, a local piece on an io
/// server, or a segment of a client buffer, depending on context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Extent {
    /// First byte.
    pub off: u64,
    /// Number of bytes.
    pub len: u64,
}

impl Extent {
    /// `[off, off + len)`.
    pub const fn new(off: u64, len: u64) -> Self {
        Extent { off, len }
    }

    /// One past the last byte, or `None` if that overflows.
    pub fn end(&self) -> Option<u64> {
        self.off.checked_add(self.len)
    }
}

/// A piece of an io server's local file, in the order it is streamed.
pub type Piece = Extent;

/// A segment of the client's buffer (`off` is the buffer offset), in the order it is streamed.
pub type Segment = Extent;

/// Where one logical offset lives, relative to the file's server list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapped {
    /// Relative server index within the file, `0..pcount`.
    pub pnum: u32,
    /// Offset in that server's local file.
    pub local_off: u64,
    /// Bytes from here to the end of the stripe unit.
    pub run_len: u64,
}

/// A file's distribution over the cluster's ordered io servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Absolute index of the io server holding stripe unit 0.
    pub base: u32,
    /// Number of io servers the file is striped over.
    pub pcount: u32,
    /// Stripe unit size in bytes.
    pub ssize: u64,
}

impl Layout {
    /// A layout with checked `pcount` and `ssize` (the base is checked against the cluster by
    /// [`Layout::validate`]).
    pub fn new(base: u32, pcount: u32, ssize: u64) -> Result<Self, LayoutError> {
        let l = Layout { base, pcount, ssize };
        l.check_shape()?;
        Ok(l)
    }

    fn check_shape(&self) -> Result<(), LayoutError> {
        if self.ssize == 0 || self.ssize > MAX_SSIZE {
            return Err(LayoutError::BadStripeSize(self.ssize));
        }
        if self.pcount == 0 || self.pcount > MAX_PCOUNT {
            return Err(LayoutError::BadStripeCount { pcount: self.pcount, max: MAX_PCOUNT });
        }
        Ok(())
    }

    /// Checks the layout against a cluster of `n_servers` io servers (as PVFS1's manager rejects
    /// `pcount > n_iods` or `base >= n_iods`).
    pub fn validate(&self, n_servers: u32) -> Result<(), LayoutError> {
        self.check_shape()?;
        if self.pcount > n_servers {
            return Err(LayoutError::BadStripeCount { pcount: self.pcount, max: n_servers });
        }
        if self.base >= n_servers {
            return Err(LayoutError::BadBase { base: self.base, n_servers });
        }
        Ok(())
    }

    /// Absolute io server of relative server `pnum`: `(base + pnum) mod n_servers`.
    pub fn server(&self, pnum: u32, n_servers: u32) -> u32 {
        if n_servers == 0 {
            return 0;
        }
        ((u64::from(self.base) + u64::from(pnum)) % u64::from(n_servers)) as u32
    }

    /// The file's absolute io servers in relative order (`pnum` 0, 1, …).
    pub fn servers(&self, n_servers: u32) -> impl Iterator<Item = u32> + '_ {
        (0..self.pcount).map(move |p| self.server(p, n_servers))
    }

    /// Where logical offset `off` lives: relative server, local offset, bytes left in the unit.
    pub fn map(&self, off: u64) -> Mapped {
        let (ssize, pcount) = (self.ssize.max(1), u64::from(self.pcount.max(1)));
        let s = off / ssize;
        let r = off % ssize;
        // (s / pcount) * ssize <= off, so this cannot overflow.
        Mapped { pnum: (s % pcount) as u32, local_off: (s / pcount) * ssize + r, run_len: ssize - r }
    }

    /// Logical offset → (absolute io server, local offset).
    pub fn locate(&self, off: u64, n_servers: u32) -> (u32, u64) {
        let m = self.map(off);
        (self.server(m.pnum, n_servers), m.local_off)
    }

    /// Bytes from `off` to the next stripe-unit boundary.
    pub fn run_len(&self, off: u64) -> u64 {
        self.map(off).run_len
    }

    /// The inverse of [`Layout::map`]: the logical offset of local byte `local` on `pnum`, or
    /// `None` if `pnum` is out of range or the result does not fit in `u64`.
    pub fn logical_offset(&self, pnum: u32, local: u64) -> Option<u64> {
        if pnum >= self.pcount || self.ssize == 0 {
            return None;
        }
        let (ssize, pcount) = (u128::from(self.ssize), u128::from(self.pcount));
        let local = u128::from(local);
        let s = (local / ssize) * pcount + u128::from(pnum);
        u64::try_from(s * ssize + local % ssize).ok()
    }

    /// First logical offset `>= off` held by `pnum` (PVFS1's NEXTPL, OrangeFS
    /// `next_mapped_offset`), or `None` if `pnum` is out of range or there is none below `u64::MAX`.
    pub fn next_mapped_offset(&self, pnum: u32, off: u64) -> Option<u64> {
        if pnum >= self.pcount || self.ssize == 0 {
            return None;
        }
        let m = self.map(off);
        if m.pnum == pnum {
            return Some(off);
        }
        // Start of the next unit of `pnum`: units to skip forward within (or past) this row.
        let ahead = (u64::from(pnum) + u64::from(self.pcount) - u64::from(m.pnum)) % u64::from(self.pcount);
        let unit = off / self.ssize + ahead;
        unit.checked_mul(self.ssize)
    }

    /// Size of `pnum`'s local file when the logical size is `logical`: the number of bytes of
    /// `[0, logical)` it holds (PVFS1's truncate formula). Returns 0 for an out-of-range `pnum`.
    pub fn local_size(&self, pnum: u32, logical: u64) -> u64 {
        if pnum >= self.pcount || self.ssize == 0 {
            return 0;
        }
        let (ssize, pcount, p) = (self.ssize, u64::from(self.pcount), u64::from(pnum));
        let q = logical / ssize;
        let r = logical % ssize;
        let full = q / pcount + u64::from(p < q % pcount);
        full * ssize + if p == q % pcount { r } else { 0 }
    }

    /// Per-server truncate sizes for logical size `logical`, indexed by `pnum`.
    pub fn local_sizes(&self, logical: u64) -> Vec<u64> {
        (0..self.pcount).map(|p| self.local_size(p, logical)).collect()
    }

    /// Logical end implied by `pnum` having `local_size` bytes: one past the logical offset of its
    /// last local byte (0 for an empty local file). Saturates at `u64::MAX` for impossible sizes.
    pub fn logical_end(&self, pnum: u32, local_size: u64) -> u64 {
        if local_size == 0 {
            return 0;
        }
        match self.logical_offset(pnum, local_size - 1) {
            Some(last) => last.saturating_add(1),
            None if pnum >= self.pcount => 0,
            None => u64::MAX,
        }
    }

    /// Logical file size from the servers' local sizes (indexed by `pnum`): the max over servers
    /// of [`Layout::logical_end`]. Holes at the end of a server's share are why this is a max.
    pub fn logical_size(&self, local_sizes: &[u64]) -> u64 {
        local_sizes.iter().enumerate().map(|(p, &s)| self.logical_end(p as u32, s)).max().unwrap_or(0)
    }

    /// The local range on `pnum` holding the bytes of logical extent `e` (possibly empty).
    pub fn local_range(&self, pnum: u32, e: Extent) -> Piece {
        let end = e.off.saturating_add(e.len);
        let a = self.local_size(pnum, e.off);
        let b = self.local_size(pnum, end);
        Extent { off: a, len: b - a }
    }

    /// The io server's side of a request: `pnum`'s local pieces for `extents` (logical, in request
    /// order), with adjacent pieces coalesced. Yields exactly the `pieces` that [`Layout::plan`]
    /// gives the client for `pnum`, in O(1) per extent.
    pub fn server_pieces<I>(&self, pnum: u32, extents: I) -> Coalesce<impl Iterator<Item = Piece> + use<I>>
    where
        I: IntoIterator<Item = Extent>,
    {
        let layout = *self;
        Coalesce::new(extents.into_iter().map(move |e| layout.local_range(pnum, e)))
    }

    /// Splits logical `extents` (in request order) at stripe-unit boundaries. Each chunk records
    /// its position in the request stream (the packed client buffer).
    pub fn chunks<I>(&self, extents: I) -> Chunks<'_, I::IntoIter>
    where
        I: IntoIterator<Item = Extent>,
    {
        Chunks { layout: self, extents: extents.into_iter(), cur: None, stream_pos: 0 }
    }

    /// The client's side of a request over logical `extents` (in request order): one
    /// [`ServerPieces`] per involved server, in `pnum` order. Segment offsets are positions in the
    /// request stream, i.e. in a buffer that holds the request's bytes packed in request order.
    pub fn plan<I>(&self, extents: I) -> Vec<ServerPieces>
    where
        I: IntoIterator<Item = Extent>,
    {
        let mut per: Vec<ServerPieces> = (0..self.pcount).map(ServerPieces::empty).collect();
        for c in self.chunks(extents) {
            // pnum < pcount by construction of `map`.
            if let Some(sp) = per.get_mut(c.pnum as usize) {
                sp.push(Extent::new(c.local_off, c.len), Extent::new(c.stream_pos, c.len));
            }
        }
        per.retain(|sp| sp.bytes > 0);
        per
    }
}

/// One stripe-unit-bounded piece of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Relative server.
    pub pnum: u32,
    /// Offset in that server's local file.
    pub local_off: u64,
    /// Logical file offset.
    pub logical_off: u64,
    /// Bytes, never crossing a stripe-unit boundary.
    pub len: u64,
    /// Position in the request stream.
    pub stream_pos: u64,
}

/// Iterator from [`Layout::chunks`].
#[derive(Debug)]
pub struct Chunks<'a, I> {
    layout: &'a Layout,
    extents: I,
    cur: Option<Extent>,
    stream_pos: u64,
}

impl<I: Iterator<Item = Extent>> Iterator for Chunks<'_, I> {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        loop {
            let e = match self.cur.take() {
                Some(e) if e.len > 0 => e,
                _ => {
                    self.cur = Some(self.extents.next()?);
                    continue;
                }
            };
            let m = self.layout.map(e.off);
            // An extent running to u64::MAX can only be cut short by the address space.
            let len = m.run_len.min(e.len);
            let chunk = Chunk {
                pnum: m.pnum,
                local_off: m.local_off,
                logical_off: e.off,
                len,
                stream_pos: self.stream_pos,
            };
            self.stream_pos = self.stream_pos.saturating_add(len);
            if let Some(off) = e.off.checked_add(len) {
                self.cur = Some(Extent::new(off, e.len - len));
            }
            return Some(chunk);
        }
    }
}

/// Merges consecutive extents that touch (`a.off + a.len == b.off`) and drops empty ones.
#[derive(Debug)]
pub struct Coalesce<I> {
    inner: I,
    pending: Option<Extent>,
}

impl<I> Coalesce<I> {
    /// Wraps an extent iterator.
    pub fn new(inner: I) -> Self {
        Coalesce { inner, pending: None }
    }
}

impl<I: Iterator<Item = Extent>> Iterator for Coalesce<I> {
    type Item = Extent;

    fn next(&mut self) -> Option<Extent> {
        for e in self.inner.by_ref() {
            if e.len == 0 {
                continue;
            }
            match self.pending {
                None => self.pending = Some(e),
                Some(ref mut p) if p.end() == Some(e.off) => p.len += e.len,
                Some(p) => {
                    self.pending = Some(e);
                    return Some(p);
                }
            }
        }
        self.pending.take()
    }
}

fn push_coalesced(v: &mut Vec<Extent>, e: Extent) {
    if e.len == 0 {
        return;
    }
    match v.last_mut() {
        Some(last) if last.end() == Some(e.off) => last.len += e.len,
        _ => v.push(e),
    }
}

/// Everything one io server sees of a request: its local pieces and, for the client, where the
/// bytes of its stream sit in the client buffer. Both lists are in stream (logical request) order
/// and have equal totals; the server's stream is the pieces concatenated, which is also the
/// segments concatenated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPieces {
    /// Relative server index.
    pub pnum: u32,
    /// Local-file pieces, coalesced: the descriptor sent to the server.
    pub pieces: Vec<Piece>,
    /// Client-buffer segments, coalesced.
    pub segments: Vec<Segment>,
    /// Total bytes.
    pub bytes: u64,
}

impl ServerPieces {
    fn empty(pnum: u32) -> Self {
        ServerPieces { pnum, pieces: Vec::new(), segments: Vec::new(), bytes: 0 }
    }

    fn push(&mut self, piece: Piece, seg: Segment) {
        push_coalesced(&mut self.pieces, piece);
        push_coalesced(&mut self.segments, seg);
        self.bytes += piece.len;
    }

    /// Splits into consecutive requests of at most `max_pieces` pieces and `max_bytes` bytes
    /// each (the wire limits `proto::MAX_PIECES` and `proto::MAX_IO_BYTES`, or a smaller
    /// per-request size the client chooses). The batches' streams, concatenated, are this
    /// stream; a piece is cut only where `max_bytes` falls inside it.
    pub fn split(&self, max_pieces: usize, max_bytes: u64) -> Vec<ServerPieces> {
        let (max_pieces, max_bytes) = (max_pieces.max(1), max_bytes.max(1));
        let mut out = Vec::new();
        let mut cur = ServerPieces::empty(self.pnum);
        let mut segs = self.segments.iter().copied();
        let mut seg: Option<Segment> = None;
        let mut pieces = self.pieces.iter().copied();
        let mut piece: Option<Piece> = None;
        while let Some(p) = piece.take().or_else(|| pieces.next()) {
            if cur.pieces.len() == max_pieces || cur.bytes == max_bytes {
                out.push(std::mem::replace(&mut cur, ServerPieces::empty(self.pnum)));
            }
            let n = p.len.min(max_bytes - cur.bytes);
            if n < p.len {
                piece = Some(Extent::new(p.off + n, p.len - n));
            }
            // Take the matching n bytes of segments.
            cur.pieces.push(Extent::new(p.off, n));
            cur.bytes += n;
            let mut need = n;
            while need > 0 {
                let Some(s) = seg.take().or_else(|| segs.next()) else { break };
                let k = s.len.min(need);
                push_coalesced(&mut cur.segments, Extent::new(s.off, k));
                if k < s.len {
                    seg = Some(Extent::new(s.off + k, s.len - k));
                }
                need -= k;
            }
        }
        if cur.bytes > 0 {
            out.push(cur);
        }
        out
    }
}

/// A partitioned file view (PVFS1 `SETPART`): the client sees the concatenation of `gsize`-byte
/// blocks every `stride` bytes starting at `offset`. View position `p` is file offset
/// `offset + (p / gsize)·stride + p mod gsize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct View {
    /// File offset of the first block.
    pub offset: u64,
    /// Bytes per block.
    pub gsize: u64,
    /// Distance between block starts.
    pub stride: u64,
}

impl View {
    /// A checked view (`0 < gsize <= stride`).
    pub fn new(offset: u64, gsize: u64, stride: u64) -> Result<Self, LayoutError> {
        let v = View { offset, gsize, stride };
        v.validate()?;
        Ok(v)
    }

    /// The identity view: view positions are file offsets.
    pub const fn contiguous() -> Self {
        View { offset: 0, gsize: u64::MAX, stride: u64::MAX }
    }

    /// Checks `0 < gsize <= stride`.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.gsize == 0 || self.stride < self.gsize {
            return Err(LayoutError::BadView { gsize: self.gsize, stride: self.stride });
        }
        Ok(())
    }

    /// True when the view has no gaps.
    pub fn is_contiguous(&self) -> bool {
        self.gsize == self.stride
    }

    /// File offset of view position `pos`, or `None` on overflow or an invalid view.
    pub fn file_offset(&self, pos: u64) -> Option<u64> {
        if self.validate().is_err() {
            return None;
        }
        let blk = u128::from(pos / self.gsize);
        let off = blk * u128::from(self.stride) + u128::from(pos % self.gsize) + u128::from(self.offset);
        u64::try_from(off).ok()
    }

    /// Number of view blocks `[pos, pos + len)` touches (the work a server does for it).
    pub fn blocks_spanned(&self, pos: u64, len: u64) -> u64 {
        if len == 0 || self.gsize == 0 {
            return 0;
        }
        let last = pos.saturating_add(len - 1);
        last / self.gsize - pos / self.gsize + 1
    }

    /// File extents of view range `[pos, pos + len)`, in view order. Fails if any byte of the
    /// range maps past `u64::MAX`.
    pub fn extents(&self, pos: u64, len: u64) -> Result<ViewExtents, LayoutError> {
        self.validate()?;
        if len > 0 {
            let last = pos.checked_add(len - 1).ok_or(LayoutError::Overflow)?;
            self.file_offset(last).ok_or(LayoutError::Overflow)?;
        }
        Ok(ViewExtents { view: *self, pos, left: len })
    }
}

/// Iterator from [`View::extents`].
#[derive(Debug, Clone)]
pub struct ViewExtents {
    view: View,
    pos: u64,
    left: u64,
}

impl Iterator for ViewExtents {
    type Item = Extent;

    fn next(&mut self) -> Option<Extent> {
        if self.left == 0 {
            return None;
        }
        let in_blk = self.pos % self.view.gsize;
        let mut len = (self.view.gsize - in_blk).min(self.left);
        let off = self.view.file_offset(self.pos)?;
        if self.view.is_contiguous() {
            // No gaps: the whole rest is one extent (also avoids one step per gsize).
            len = self.left;
        }
        self.pos = self.pos.saturating_add(len);
        self.left -= len;
        Some(Extent::new(off, len))
    }
}

/// List I/O: a memory list and a file list of `(offset, len)` pairs with equal totals. Bytes are
/// taken from memory in memory-list order and placed in the file in file-list order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListIo {
    mem: Vec<Extent>,
    file: Vec<Extent>,
    total: u64,
}

impl ListIo {
    /// Checks that both lists have the same total and that no extent overflows.
    pub fn new(mem: Vec<Extent>, file: Vec<Extent>) -> Result<Self, LayoutError> {
        let sum = |v: &[Extent]| -> Result<u64, LayoutError> {
            v.iter().try_fold(0u64, |acc, e| {
                e.end().ok_or(LayoutError::Overflow)?;
                acc.checked_add(e.len).ok_or(LayoutError::Overflow)
            })
        };
        let (m, f) = (sum(&mem)?, sum(&file)?);
        if m != f {
            return Err(LayoutError::ListMismatch { mem: m, file: f });
        }
        Ok(ListIo { mem, file, total: m })
    }

    /// Bytes moved.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The memory list.
    pub fn mem(&self) -> &[Extent] {
        &self.mem
    }

    /// The file list.
    pub fn file(&self) -> &[Extent] {
        &self.file
    }

    /// The client's plan: like [`Layout::plan`] over the file list, with segments translated from
    /// request-stream positions to memory-list offsets (split where the memory list jumps).
    pub fn plan(&self, layout: &Layout) -> Vec<ServerPieces> {
        let mut out = layout.plan(self.file.iter().copied());
        let mut starts = Vec::with_capacity(self.mem.len());
        let mut acc = 0u64;
        for e in &self.mem {
            starts.push(acc);
            acc += e.len; // cannot overflow: checked in new()
        }
        for sp in &mut out {
            let stream = std::mem::take(&mut sp.segments);
            for seg in stream {
                for m in map_stream(&self.mem, &starts, seg) {
                    push_coalesced(&mut sp.segments, m);
                }
            }
        }
        out
    }
}

/// Translates a request-stream range into memory-list extents.
fn map_stream(mem: &[Extent], starts: &[u64], seg: Extent) -> Vec<Extent> {
    let mut out = Vec::new();
    // Index of the memory extent holding stream position seg.off.
    let mut i = starts.partition_point(|&s| s <= seg.off).saturating_sub(1);
    let (mut pos, mut left) = (seg.off, seg.len);
    while left > 0 && i < mem.len() {
        let m = mem[i];
        let within = pos - starts[i];
        if within >= m.len {
            i += 1;
            continue;
        }
        let n = (m.len - within).min(left);
        out.push(Extent::new(m.off + within, n));
        pos += n;
        left -= n;
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// PVFS1's `/pvfs/foo` example: base 2, pcount 3, ssize 65536, 6 iods.
    const FOO: Layout = Layout { base: 2, pcount: 3, ssize: 65536 };

    #[test]
    fn pfs_worked_example() {
        assert!(FOO.validate(6).is_ok());
        let m = FOO.map(100_000);
        assert_eq!((m.pnum, m.local_off), (1, 34_464));
        assert_eq!(FOO.locate(100_000, 6), (3, 34_464));
        assert_eq!(m.run_len, 65_536 - 34_464);
        let m = FOO.map(200_000);
        assert_eq!((m.pnum, m.local_off), (0, 68_928));
        assert_eq!(FOO.locate(200_000, 6), (2, 65_536 + 3_392));
        assert_eq!(FOO.servers(6).collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(Layout { base: 5, pcount: 3, ssize: 1 }.servers(6).collect::<Vec<_>>(), vec![5, 0, 1]);
    }

    #[test]
    fn truncate_example() {
        // L = 200000: q = 3, r = 3392; pnum 0 holds units 0 and 3 (partial), 1 and 2 one unit each.
        assert_eq!(FOO.local_sizes(200_000), vec![65_536 + 3_392, 65_536, 65_536]);
        assert_eq!(FOO.logical_size(&[65_536 + 3_392, 65_536, 65_536]), 200_000);
        // A sparse file written only at 100000..100001 lives on pnum 1 alone.
        assert_eq!(FOO.logical_size(&[0, 34_465, 0]), 100_001);
    }

    #[test]
    fn validate_rejects_bad_layouts() {
        assert_eq!(Layout::new(0, 0, 1), Err(LayoutError::BadStripeCount { pcount: 0, max: MAX_PCOUNT }));
        assert_eq!(Layout::new(0, 1, 0), Err(LayoutError::BadStripeSize(0)));
        assert_eq!(Layout::new(0, 1, MAX_SSIZE + 1), Err(LayoutError::BadStripeSize(MAX_SSIZE + 1)));
        assert_eq!(FOO.validate(2), Err(LayoutError::BadStripeCount { pcount: 3, max: 2 }));
        assert_eq!(
            Layout { base: 3, ..FOO }.validate(3),
            Err(LayoutError::BadBase { base: 3, n_servers: 3 })
        );
    }

    #[test]
    fn next_mapped_offset_examples() {
        // pnum 1 holds [65536, 131072), [262144, 327680), …
        assert_eq!(FOO.next_mapped_offset(1, 0), Some(65_536));
        assert_eq!(FOO.next_mapped_offset(1, 70_000), Some(70_000));
        assert_eq!(FOO.next_mapped_offset(1, 131_072), Some(262_144));
        assert_eq!(FOO.next_mapped_offset(0, 65_536), Some(196_608));
        assert_eq!(FOO.next_mapped_offset(3, 0), None);
    }

    #[test]
    fn contiguous_extent_is_one_piece_per_server() {
        let plan = FOO.plan([Extent::new(10, 5 * 65_536)]);
        assert_eq!(plan.len(), 3);
        for sp in &plan {
            assert_eq!(sp.pieces.len(), 1, "{sp:?}");
        }
        assert_eq!(plan[0].pieces, vec![Extent::new(10, 65_536 - 10 + 65_536)]);
        assert_eq!(plan[0].segments, vec![Extent::new(0, 65_526), Extent::new(3 * 65_536 - 10, 65_536)]);
        assert_eq!(plan[2].pieces, vec![Extent::new(0, 65_536 + 10)]);
    }

    #[test]
    fn view_maps_like_setpart() {
        let v = View::new(100, 4, 10).unwrap();
        assert_eq!(v.file_offset(0), Some(100));
        assert_eq!(v.file_offset(5), Some(111));
        let ex: Vec<_> = v.extents(2, 7).unwrap().collect();
        assert_eq!(ex, vec![Extent::new(102, 2), Extent::new(110, 4), Extent::new(120, 1)]);
        assert!(View::new(0, 0, 1).is_err());
        assert!(View::new(0, 5, 4).is_err());
        assert_eq!(View::new(u64::MAX - 2, 1, 1).unwrap().extents(0, 4).err(), Some(LayoutError::Overflow));
        assert_eq!(
            View::contiguous().extents(7, 100).unwrap().collect::<Vec<_>>(),
            vec![Extent::new(7, 100)]
        );
        assert_eq!(v.blocks_spanned(2, 7), 3);
    }

    #[test]
    fn list_io_rejects_mismatched_totals() {
        let e = ListIo::new(vec![Extent::new(0, 3)], vec![Extent::new(0, 4)]);
        assert_eq!(e, Err(LayoutError::ListMismatch { mem: 3, file: 4 }));
        assert_eq!(ListIo::new(vec![Extent::new(u64::MAX, 2)], vec![]), Err(LayoutError::Overflow));
    }

    fn arb_layout() -> impl Strategy<Value = (Layout, u32)> {
        (1u32..8, 1u64..50).prop_flat_map(|(n, ssize)| {
            (1..=n, 0..n).prop_map(move |(pcount, base)| (Layout { base, pcount, ssize }, n))
        })
    }

    /// Simulated cluster: one byte vector per pnum, written through a plan.
    fn apply_plan(plan: &[ServerPieces], buf: &[u8], servers: &mut HashMap<u32, Vec<u8>>) {
        for sp in plan {
            let stream: Vec<u8> = sp
                .segments
                .iter()
                .flat_map(|s| &buf[s.off as usize..(s.off + s.len) as usize])
                .copied()
                .collect();
            assert_eq!(stream.len() as u64, sp.bytes);
            let local = servers.entry(sp.pnum).or_default();
            let mut at = 0usize;
            for p in &sp.pieces {
                let end = (p.off + p.len) as usize;
                if local.len() < end {
                    local.resize(end, 0);
                }
                local[p.off as usize..end].copy_from_slice(&stream[at..at + p.len as usize]);
                at += p.len as usize;
            }
        }
    }

    proptest! {
        #[test]
        fn map_is_a_bijection((l, _n) in arb_layout(), off in 0u64..100_000) {
            let m = l.map(off);
            prop_assert!(m.pnum < l.pcount);
            prop_assert!(m.run_len >= 1 && m.run_len <= l.ssize);
            prop_assert_eq!(l.logical_offset(m.pnum, m.local_off), Some(off));
            // Every byte of the run maps to the next local byte of the same server.
            let last = off + m.run_len - 1;
            prop_assert_eq!(l.map(last).pnum, m.pnum);
            prop_assert_eq!(l.map(last).local_off, m.local_off + m.run_len - 1);
            // …and the unit ends there: the next byte goes to the next server (if there is one).
            if l.pcount > 1 {
                prop_assert_eq!(l.map(last + 1).pnum, (m.pnum + 1) % l.pcount);
            }
        }

        #[test]
        fn inverse_is_a_bijection((l, _n) in arb_layout(), p in 0u32..8, local in 0u64..100_000) {
            prop_assume!(p < l.pcount);
            let off = l.logical_offset(p, local).unwrap();
            let m = l.map(off);
            prop_assert_eq!((m.pnum, m.local_off), (p, local));
        }

        #[test]
        fn pieces_cover_the_extent_exactly((l, _n) in arb_layout(), off in 0u64..2000, len in 0u64..2000) {
            let plan = l.plan([Extent::new(off, len)]);
            let mut seen = vec![false; len as usize];
            let total: u64 = plan.iter().map(|sp| sp.bytes).sum();
            prop_assert_eq!(total, len);
            for sp in &plan {
                prop_assert_eq!(sp.pieces.iter().map(|p| p.len).sum::<u64>(), sp.bytes);
                prop_assert_eq!(sp.segments.iter().map(|p| p.len).sum::<u64>(), sp.bytes);
                // Walk pieces and segments in lockstep: stream byte k is local byte and buffer byte.
                let locals = sp.pieces.iter().flat_map(|p| p.off..p.off + p.len);
                let bufs = sp.segments.iter().flat_map(|s| s.off..s.off + s.len);
                for (lo, b) in locals.zip(bufs) {
                    let m = l.map(off + b);
                    prop_assert_eq!((m.pnum, m.local_off), (sp.pnum, lo));
                    prop_assert!(!seen[b as usize], "byte {} twice", b);
                    seen[b as usize] = true;
                }
                // Coalesced: no two consecutive pieces touch.
                for w in sp.pieces.windows(2) {
                    prop_assert_ne!(w[0].off + w[0].len, w[1].off);
                }
                // The server computes the same descriptor on its own.
                let server: Vec<_> = l.server_pieces(sp.pnum, [Extent::new(off, len)]).collect();
                prop_assert_eq!(&server, &sp.pieces);
            }
            prop_assert!(seen.iter().all(|&s| s));
        }

        #[test]
        fn split_batches_respect_limits_and_concatenate_back(
            (l, _n) in arb_layout(), off in 0u64..500, len in 0u64..3000, mp in 1usize..5, mb in 1u64..200,
        ) {
            let view = View::new(off, 3, 5).unwrap();
            for sp in l.plan(view.extents(0, len).unwrap()) {
                let parts = sp.split(mp, mb);
                let expand = |v: &[Extent]| -> Vec<u64> { v.iter().flat_map(|e| e.off..e.off + e.len).collect() };
                let mut pieces = Vec::new();
                let mut segs = Vec::new();
                for b in &parts {
                    prop_assert!(b.pieces.len() <= mp && b.bytes <= mb && b.bytes > 0);
                    prop_assert_eq!(b.pieces.iter().map(|p| p.len).sum::<u64>(), b.bytes);
                    prop_assert_eq!(b.segments.iter().map(|p| p.len).sum::<u64>(), b.bytes);
                    pieces.extend(expand(&b.pieces));
                    segs.extend(expand(&b.segments));
                }
                prop_assert_eq!(pieces, expand(&sp.pieces));
                prop_assert_eq!(segs, expand(&sp.segments));
            }
        }

        #[test]
        fn truncate_sizes_give_back_the_logical_size((l, _n) in arb_layout(), size in 0u64..100_000) {
            let locals = l.local_sizes(size);
            prop_assert_eq!(locals.iter().sum::<u64>(), size);
            prop_assert_eq!(l.logical_size(&locals), size);
            // local_size counts exactly the bytes below `size` each server holds.
            if size < 3000 {
                let mut count = vec![0u64; l.pcount as usize];
                for off in 0..size { count[l.map(off).pnum as usize] += 1; }
                prop_assert_eq!(count, locals);
            }
        }

        #[test]
        fn logical_size_is_least_consistent_size(
            (l, _n) in arb_layout(), raw in proptest::collection::vec(0u64..5000, 8)
        ) {
            let locals = &raw[..l.pcount as usize];
            let size = l.logical_size(locals);
            // Every server's data lies below the logical size…
            for (p, &s) in locals.iter().enumerate() {
                prop_assert!(s <= l.local_size(p as u32, size));
            }
            // …and no smaller size would hold it all.
            if size > 0 {
                prop_assert!(locals.iter().enumerate().any(|(p, &s)| s > l.local_size(p as u32, size - 1)));
            }
            // Truncating to that size gives back the same logical size.
            prop_assert_eq!(l.logical_size(&l.local_sizes(size)), size);
        }

        #[test]
        fn next_mapped_offset_is_next_held_byte((l, _n) in arb_layout(), p in 0u32..8, off in 0u64..5000) {
            prop_assume!(p < l.pcount);
            let next = l.next_mapped_offset(p, off).unwrap();
            prop_assert!(next >= off);
            prop_assert_eq!(l.map(next).pnum, p);
            for o in off..next { prop_assert_ne!(l.map(o).pnum, p); }
        }

        #[test]
        fn view_and_list_io_match_a_flat_file(
            (l, _n) in arb_layout(),
            voff in 0u64..100, gsize in 1u64..20, gap in 0u64..20, pos in 0u64..200, len in 0u64..300,
            seed in any::<u8>(),
        ) {
            let view = View::new(voff, gsize, gsize + gap).unwrap();
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            // Reference: write through the view into a flat file.
            let mut flat = Vec::new();
            let mut at = 0usize;
            let extents: Vec<_> = view.extents(pos, len).unwrap().collect();
            for e in &extents {
                let end = (e.off + e.len) as usize;
                if flat.len() < end { flat.resize(end, 0); }
                flat[e.off as usize..end].copy_from_slice(&data[at..at + e.len as usize]);
                at += e.len as usize;
            }
            // Striped: the same extents through the plan.
            let mut servers = HashMap::new();
            apply_plan(&l.plan(extents.iter().copied()), &data, &mut servers);
            // The same bytes as list I/O with a reversed, scattered memory list.
            let mut mem_buf = vec![0u8; 2 * len as usize];
            let mut mem = Vec::new();
            for (i, ch) in data.chunks(7).enumerate().rev() {
                let o = 2 * 7 * i as u64;
                mem_buf[o as usize..o as usize + ch.len()].copy_from_slice(ch);
                mem.push(Extent::new(o, ch.len() as u64));
            }
            mem.reverse();
            let list = ListIo::new(mem, extents.clone()).unwrap();
            let mut servers2 = HashMap::new();
            apply_plan(&list.plan(&l), &mem_buf, &mut servers2);
            prop_assert_eq!(&servers, &servers2);
            // Read back every logical byte from the servers.
            for (off, &b) in flat.iter().enumerate() {
                let m = l.map(off as u64);
                let got = servers.get(&m.pnum).and_then(|v| v.get(m.local_off as usize)).copied().unwrap_or(0);
                prop_assert_eq!(got, b, "offset {}", off);
            }
            let locals: Vec<u64> = (0..l.pcount).map(|p| servers.get(&p).map_or(0, |v| v.len() as u64)).collect();
            prop_assert_eq!(l.logical_size(&locals), flat.len() as u64);
        }
    }
}
