//! Send credits over pre-posted receive buffers (BMI-IB's scheme).

use std::collections::VecDeque;

use super::FlowError;
use crate::error::{Error, Result};

/// Default pre-posted receive buffers per connection: BMI-IB's `DEFAULT_EAGER_BUF_NUM` (20).
pub const DEFAULT_RECV_BUFFERS: u16 = 20;
/// Default receive buffer size: BMI-IB's `DEFAULT_EAGER_BUF_SIZE` (16 KiB; 8 KiB "prevented it
/// from ever using small-io", and PVFS's small-I/O limit is 16 KiB).
pub const DEFAULT_RECV_BUFFER_SIZE: u32 = 16 << 10;
/// The explicit-credit watermark is `N - WATERMARK_MARGIN` by default: BMI-IB returns credits
/// explicitly when more than `N - 4` are owed, so a peer sending steadily is never more than a
/// few buffers from running dry.
pub const WATERMARK_MARGIN: u16 = 4;
/// Smallest watermark: with 1, receiving a CREDIT message (whose buffer is re-posted at once)
/// would itself reach the watermark and the two sides would trade CREDIT messages forever.
pub const MIN_WATERMARK: u16 = 2;
/// Fewest receive buffers: one is held back for CREDIT messages and the watermark must lie in
/// `MIN_WATERMARK..N`.
pub const MIN_RECV_BUFFERS: u16 = MIN_WATERMARK + 1;
/// Most receive buffers per connection (bounds the receive queue and the memory a peer can
/// make us pre-post: 4096 × 16 KiB = 64 MiB).
pub const MAX_RECV_BUFFERS: u16 = 4096;
/// Default bound on sends queued for lack of credit, per connection. Beyond it
/// [`Credits::push`] refuses, so a stalled peer cannot make us queue without limit.
pub const DEFAULT_MAX_QUEUED: usize = 1024;

/// Credit parameters of one side of a connection. Each side advertises its own
/// [`recv_buffers`](CreditConfig::recv_buffers) at connect; its send credits come from the
/// peer's advertisement.
///
/// ```
/// use ionet::internals::flowctl::CreditConfig;
/// let cfg = CreditConfig::default().recv_buffers(32).watermark(24);
/// assert!(cfg.validate().is_ok());
/// assert_eq!(CreditConfig::default().effective_watermark(), 16);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditConfig {
    pub(crate) recv_buffers: u16,
    pub(crate) buffer_size: u32,
    pub(crate) watermark: Option<u16>,
    pub(crate) max_queued: usize,
}

impl Default for CreditConfig {
    fn default() -> Self {
        CreditConfig {
            recv_buffers: DEFAULT_RECV_BUFFERS,
            buffer_size: DEFAULT_RECV_BUFFER_SIZE,
            watermark: None,
            max_queued: DEFAULT_MAX_QUEUED,
        }
    }
}

impl CreditConfig {
    /// Receive buffers this side pre-posts per connection, N (default
    /// [`DEFAULT_RECV_BUFFERS`]).
    pub fn recv_buffers(mut self, n: u16) -> Self {
        self.recv_buffers = n;
        self
    }

    /// Size of each receive buffer (default [`DEFAULT_RECV_BUFFER_SIZE`]). Not used by the
    /// accounting; carried so the engine negotiates one value.
    pub fn buffer_size(mut self, bytes: u32) -> Self {
        self.buffer_size = bytes;
        self
    }

    /// Owed credits that trigger an explicit CREDIT message (default N − 4, at least
    /// [`MIN_WATERMARK`]).
    pub fn watermark(mut self, w: u16) -> Self {
        self.watermark = Some(w);
        self
    }

    /// Most sends queued for lack of credit (default [`DEFAULT_MAX_QUEUED`]).
    pub fn max_queued(mut self, n: usize) -> Self {
        self.max_queued = n;
        self
    }

    /// The advertised receive-buffer count.
    pub fn advertised_buffers(&self) -> u16 {
        self.recv_buffers
    }

    /// The watermark in force: the configured one, else `max(N − 4, 2)`.
    pub fn effective_watermark(&self) -> u16 {
        self.watermark.unwrap_or(self.recv_buffers.saturating_sub(WATERMARK_MARGIN).max(MIN_WATERMARK))
    }

    /// Checks the rules.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] naming the first rule broken.
    pub fn validate(&self) -> Result<()> {
        if !(MIN_RECV_BUFFERS..=MAX_RECV_BUFFERS).contains(&self.recv_buffers) {
            return Err(Error::misuse(format!(
                "recv_buffers must be in {MIN_RECV_BUFFERS}..={MAX_RECV_BUFFERS}"
            )));
        }
        let w = self.effective_watermark();
        if w < MIN_WATERMARK || w >= self.recv_buffers {
            return Err(Error::misuse(format!(
                "credit watermark must be in {MIN_WATERMARK}..recv_buffers (N − 1 at most, so that a \
                 peer stalled on credit always owes enough to trigger a CREDIT message)"
            )));
        }
        if self.buffer_size == 0 {
            return Err(Error::misuse("receive buffer size must be at least 1"));
        }
        if self.max_queued == 0 {
            return Err(Error::misuse("max_queued must be at least 1"));
        }
        Ok(())
    }
}

/// A message [`Credits::poll_transmit`] allows out now. Each consumes one peer receive buffer.
#[must_use = "a transmit has already consumed a credit; it must be sent"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit<T> {
    /// Send this queued operation, with `piggyback` in its header's credit field.
    Data {
        /// The operation, as pushed.
        op: T,
        /// Credits returned to the peer in this header.
        piggyback: u16,
    },
    /// Send an explicit CREDIT message returning `credits` (which may be 0 when it was
    /// requested for other returns, e.g. ring slots, via [`Credits::request_explicit`]).
    Credit {
        /// Credits returned.
        credits: u16,
    },
}

/// Counters of one connection's credit state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreditStats {
    /// Data messages let out.
    pub sent: u64,
    /// Explicit CREDIT messages let out.
    pub credit_messages: u64,
    /// Credits returned in data headers (and through [`Credits::take_piggyback`]).
    pub piggybacked: u64,
    /// Pushes that found the connection out of credit.
    pub blocked: u64,
    /// Messages received from the peer.
    pub received: u64,
}

/// Credit state of one connection, with the queue of sends waiting for a credit.
///
/// # Driving it (the IB engine)
///
/// - **Connect:** [`Credits::new`] with our [`CreditConfig`] and the peer's advertised buffer
///   count; pre-post our N receive buffers.
/// - **Send:** [`Credits::push`] the operation, then drain [`Credits::poll_transmit`] and post
///   each [`Transmit`] (its credit field goes in the header). Every message that lands in a
///   peer receive buffer goes through here, so none is ever sent without a credit.
/// - **Other headers** that do not consume a peer receive buffer (fast-RDMA ring writes) carry
///   [`Credits::take_piggyback`].
/// - **Receive completion** of a SEND from the peer: [`Credits::on_message`] with the header's
///   credit field, then drain `poll_transmit` (credits may have unblocked sends). A CREDIT
///   message is consumed by the engine at once: also call [`Credits::on_repost`] right away.
/// - **Buffer done:** when the engine (or the application) is done with a receive buffer and
///   re-posts it, [`Credits::on_repost`], then drain `poll_transmit` (it may now emit a CREDIT).
/// - **Connection lost:** [`Credits::drain`] and fail every returned operation.
///
/// Any [`FlowError`] from `on_message` / `on_credits` is a protocol violation: close the
/// connection.
#[derive(Debug, Clone)]
pub struct Credits<T> {
    local_buffers: u16,
    peer_buffers: u16,
    watermark: u16,
    /// Peer receive buffers we may still fill, including the one held back for CREDIT.
    credits: u16,
    /// Local buffers re-posted and not yet reported to the peer.
    owed: u16,
    /// Messages the peer may still send us: our record of its credits.
    granted: u16,
    /// Local buffers holding a message, not yet re-posted.
    held: u16,
    explicit_wanted: bool,
    queue: VecDeque<T>,
    max_queued: usize,
    stats: CreditStats,
}

impl<T> Credits<T> {
    /// Credit state for a connection whose peer advertised `peer_buffers` receive buffers.
    ///
    /// # Errors
    ///
    /// [`FlowError::Negotiation`] when the peer's value is outside
    /// [`MIN_RECV_BUFFERS`]`..=`[`MAX_RECV_BUFFERS`]; [`FlowError::Misuse`] when `cfg` is
    /// invalid.
    pub fn new(cfg: &CreditConfig, peer_buffers: u16) -> Result<Self, FlowError> {
        cfg.validate().map_err(|_| FlowError::Misuse("invalid CreditConfig"))?;
        if !(MIN_RECV_BUFFERS..=MAX_RECV_BUFFERS).contains(&peer_buffers) {
            tracing::debug!(peer_buffers, "peer advertised an unusable receive-buffer count");
            return Err(FlowError::Negotiation("peer receive-buffer count out of range"));
        }
        Ok(Credits {
            local_buffers: cfg.recv_buffers,
            peer_buffers,
            watermark: cfg.effective_watermark(),
            credits: peer_buffers,
            owed: 0,
            granted: cfg.recv_buffers,
            held: 0,
            explicit_wanted: false,
            queue: VecDeque::new(),
            max_queued: cfg.max_queued,
            stats: CreditStats::default(),
        })
    }

    /// Queues an operation that needs a peer receive buffer; it comes out of
    /// [`Credits::poll_transmit`] in push order once a credit allows.
    ///
    /// # Errors
    ///
    /// Gives the operation back when [`CreditConfig::max_queued`] operations already wait.
    pub fn push(&mut self, op: T) -> Result<(), T> {
        if self.queue.len() >= self.max_queued {
            return Err(op);
        }
        if !self.queue.is_empty() || self.credits < 2 {
            self.stats.blocked += 1;
        }
        self.queue.push_back(op);
        Ok(())
    }

    /// The next message allowed out, if any. Call until `None` after every event.
    ///
    /// Data goes first, in push order, while more than the reserved credit is left; it carries
    /// every owed credit. When no data can go and the owed credits reached the watermark (or an
    /// explicit return was requested), a CREDIT message goes out on the reserved credit.
    pub fn poll_transmit(&mut self) -> Option<Transmit<T>> {
        if self.credits >= 2
            && let Some(op) = self.queue.pop_front()
        {
            self.credits -= 1;
            self.stats.sent += 1;
            let piggyback = self.take_piggyback();
            return Some(Transmit::Data { op, piggyback });
        }
        if (self.owed >= self.watermark || self.explicit_wanted) && self.credits >= 1 {
            self.credits -= 1;
            self.explicit_wanted = false;
            self.stats.credit_messages += 1;
            let credits = self.return_owed();
            return Some(Transmit::Credit { credits });
        }
        None
    }

    /// The owed credits, for a header that does not go through [`Credits::poll_transmit`]
    /// (e.g. a fast-RDMA write); zeroes the owed count.
    pub fn take_piggyback(&mut self) -> u16 {
        let n = self.return_owed();
        self.stats.piggybacked += u64::from(n);
        n
    }

    /// Moves the owed credits to the peer's grant (they are about to be reported).
    fn return_owed(&mut self) -> u16 {
        let n = std::mem::take(&mut self.owed);
        self.granted += n; // granted + held + owed == local_buffers, so no overflow
        n
    }

    /// Asks for an explicit CREDIT message at the next opportunity even below the watermark
    /// (the engine uses it to return fast-RDMA ring slots when no traffic carries them).
    pub fn request_explicit(&mut self) {
        self.explicit_wanted = true;
    }

    /// A message from the peer landed in one of our receive buffers; `piggyback` is its
    /// header's credit field.
    ///
    /// # Errors
    ///
    /// [`FlowError::NoCredit`] when the peer had no credit for it;
    /// [`FlowError::ExcessCredits`] when `piggyback` returns more than we spent.
    pub fn on_message(&mut self, piggyback: u16) -> Result<(), FlowError> {
        if self.granted == 0 {
            tracing::debug!(
                local_buffers = self.local_buffers,
                held = self.held,
                "peer sent without a credit"
            );
            return Err(FlowError::NoCredit);
        }
        self.on_credits(piggyback)?;
        self.granted -= 1;
        self.held += 1;
        self.stats.received += 1;
        Ok(())
    }

    /// Credits returned by the peer in a header that did not consume a receive buffer.
    ///
    /// # Errors
    ///
    /// [`FlowError::ExcessCredits`] when they exceed what we spent.
    pub fn on_credits(&mut self, n: u16) -> Result<(), FlowError> {
        let outstanding = self.peer_buffers - self.credits;
        if n > outstanding {
            tracing::debug!(returned = n, outstanding, "peer returned more credits than outstanding");
            return Err(FlowError::ExcessCredits { returned: n, outstanding });
        }
        self.credits += n;
        Ok(())
    }

    /// One of our receive buffers was re-posted (its message is consumed).
    ///
    /// # Errors
    ///
    /// [`FlowError::Misuse`] when no buffer holds a message.
    pub fn on_repost(&mut self) -> Result<(), FlowError> {
        if self.held == 0 {
            return Err(FlowError::Misuse("re-post without a filled receive buffer"));
        }
        self.held -= 1;
        self.owed += 1;
        Ok(())
    }

    /// Empties the send queue (connection lost): every returned operation must be failed.
    pub fn drain(&mut self) -> std::collections::vec_deque::Drain<'_, T> {
        self.queue.drain(..)
    }

    /// Peer buffers we may still fill, including the reserved one.
    pub fn credits(&self) -> u16 {
        self.credits
    }

    /// Credits we owe the peer.
    pub fn owed(&self) -> u16 {
        self.owed
    }

    /// Operations waiting for a credit.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// True when data cannot go out for lack of credit.
    pub fn is_blocked(&self) -> bool {
        self.credits < 2
    }

    /// Our receive buffers (N) and the peer's.
    pub fn buffers(&self) -> (u16, u16) {
        (self.local_buffers, self.peer_buffers)
    }

    /// Counters.
    pub fn stats(&self) -> CreditStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn starts_with_the_peers_buffers_and_holds_one_back() {
        let mut c: Credits<u32> = Credits::new(&CreditConfig::default(), 20).unwrap();
        for i in 0..25 {
            c.push(i).unwrap();
        }
        let mut sent = 0;
        while let Some(t) = c.poll_transmit() {
            assert!(matches!(t, Transmit::Data { op, piggyback: 0 } if op == sent));
            sent += 1;
        }
        assert_eq!(sent, 19, "N − 1 data messages, one credit held back");
        assert_eq!(c.credits(), 1);
        assert_eq!(c.queued(), 6);
        assert!(c.is_blocked());
        // Credits returned by the peer release the queue in order.
        c.on_credits(3).unwrap();
        let ops: Vec<_> = std::iter::from_fn(|| c.poll_transmit()).collect();
        assert_eq!(
            ops,
            vec![
                Transmit::Data { op: 19, piggyback: 0 },
                Transmit::Data { op: 20, piggyback: 0 },
                Transmit::Data { op: 21, piggyback: 0 }
            ]
        );
    }

    #[test]
    fn owed_credits_piggyback_on_the_next_header() {
        let mut c: Credits<()> = Credits::new(&CreditConfig::default(), 20).unwrap();
        for _ in 0..3 {
            c.on_message(0).unwrap();
            c.on_repost().unwrap();
        }
        assert_eq!(c.owed(), 3);
        assert_eq!(c.poll_transmit(), None, "below the watermark nothing is sent by itself");
        c.push(()).unwrap();
        assert_eq!(c.poll_transmit(), Some(Transmit::Data { op: (), piggyback: 3 }));
        assert_eq!(c.owed(), 0);
        c.on_message(0).unwrap();
        c.on_repost().unwrap();
        assert_eq!(c.take_piggyback(), 1);
        assert_eq!(c.take_piggyback(), 0);
    }

    #[test]
    fn explicit_credit_at_the_watermark_uses_the_reserved_credit() {
        let cfg = CreditConfig::default();
        assert_eq!(cfg.effective_watermark(), 16);
        let mut c: Credits<()> = Credits::new(&cfg, 20).unwrap();
        // Use every regular credit so only the reserved one is left.
        for _ in 0..19 {
            c.push(()).unwrap();
            let _ = c.poll_transmit().unwrap();
        }
        c.push(()).unwrap();
        for i in 1..=16 {
            c.on_message(0).unwrap();
            c.on_repost().unwrap();
            let t = c.poll_transmit();
            if i < 16 {
                assert_eq!(t, None);
            } else {
                assert_eq!(t, Some(Transmit::Credit { credits: 16 }));
            }
        }
        assert_eq!(c.credits(), 0);
        assert_eq!(c.poll_transmit(), None);
        assert_eq!(c.queued(), 1, "data still waits for a real credit");
    }

    #[test]
    fn requested_explicit_credit_goes_out_below_the_watermark() {
        let mut c: Credits<()> = Credits::new(&CreditConfig::default(), 20).unwrap();
        c.request_explicit();
        assert_eq!(c.poll_transmit(), Some(Transmit::Credit { credits: 0 }));
        assert_eq!(c.poll_transmit(), None);
    }

    #[test]
    fn peer_sending_without_credit_is_a_protocol_violation() {
        let cfg = CreditConfig::default().recv_buffers(4).watermark(2);
        let mut c: Credits<()> = Credits::new(&cfg, 4).unwrap();
        for _ in 0..4 {
            c.on_message(0).unwrap();
        }
        let err = c.on_message(0).unwrap_err();
        assert_eq!(err, FlowError::NoCredit);
        assert!(err.is_peer_fault());
        assert!(matches!(Error::from(err), Error::Protocol { .. }));
        // A re-post gives the peer a credit back only once we tell it.
        c.on_repost().unwrap();
        assert_eq!(c.on_message(0), Err(FlowError::NoCredit));
        assert_eq!(c.take_piggyback(), 1);
        c.on_message(0).unwrap();
    }

    #[test]
    fn peer_returning_excess_credits_is_a_protocol_violation() {
        let mut c: Credits<()> = Credits::new(&CreditConfig::default(), 20).unwrap();
        assert_eq!(c.on_credits(1), Err(FlowError::ExcessCredits { returned: 1, outstanding: 0 }));
        c.push(()).unwrap();
        let _ = c.poll_transmit();
        c.on_credits(1).unwrap();
        assert_eq!(
            c.on_message(u16::MAX),
            Err(FlowError::ExcessCredits { returned: u16::MAX, outstanding: 0 })
        );
    }

    #[test]
    fn negotiation_and_config_are_validated() {
        let cfg = CreditConfig::default();
        assert!(matches!(Credits::<()>::new(&cfg, 0), Err(FlowError::Negotiation(_))));
        assert!(matches!(Credits::<()>::new(&cfg, MAX_RECV_BUFFERS + 1), Err(FlowError::Negotiation(_))));
        assert!(CreditConfig::default().recv_buffers(2).validate().is_err());
        assert!(CreditConfig::default().watermark(1).validate().is_err());
        assert!(CreditConfig::default().watermark(20).validate().is_err());
        assert!(CreditConfig::default().recv_buffers(3).validate().is_ok());
        assert_eq!(CreditConfig::default().recv_buffers(5).effective_watermark(), 2);
        let mut c: Credits<()> = Credits::new(&cfg, 20).unwrap();
        assert_eq!(c.on_repost(), Err(FlowError::Misuse("re-post without a filled receive buffer")));
    }

    #[test]
    fn queue_is_bounded_and_drained_on_loss() {
        let cfg = CreditConfig::default().max_queued(2);
        let mut c: Credits<u8> = Credits::new(&cfg, 3).unwrap();
        c.push(1).unwrap();
        c.push(2).unwrap();
        assert_eq!(c.push(3), Err(3));
        let _ = c.poll_transmit(); // 1 goes (3 peer buffers: 2 usable)
        let _ = c.poll_transmit(); // 2 goes
        c.push(3).unwrap();
        c.push(4).unwrap();
        assert_eq!(c.poll_transmit(), None);
        assert_eq!(c.drain().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(c.queued(), 0);
    }

    // ---- two-party models ---------------------------------------------------------------

    /// A message on the wire: data (with its sequence number) or CREDIT, with the credit
    /// field.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Msg {
        Data(u32, u16),
        Credit(u16),
    }

    /// One end of the in-memory connection, with the engine's rules for driving `Credits`.
    #[derive(Debug, Clone)]
    struct Side {
        fc: Credits<u32>,
        /// Messages the application still wants to send.
        to_send: u32,
        next_seq: u32,
        /// Delivered, not yet consumed by the application (buffers held).
        unconsumed: u32,
        /// Sequence numbers received, in order.
        received: u32,
        /// Receive buffers actually posted (checks that no message ever meets an empty RQ: RNR).
        posted: u16,
    }

    impl Side {
        fn new(cfg: &CreditConfig, peer: &CreditConfig, to_send: u32) -> Side {
            Side {
                fc: Credits::new(cfg, peer.advertised_buffers()).unwrap(),
                to_send,
                next_seq: 0,
                unconsumed: 0,
                received: 0,
                posted: cfg.advertised_buffers(),
            }
        }

        /// Engine step after any event: let out everything credits allow.
        fn transmit(&mut self, wire: &mut VecDeque<Msg>) {
            while let Some(t) = self.fc.poll_transmit() {
                wire.push_back(match t {
                    Transmit::Data { op, piggyback } => Msg::Data(op, piggyback),
                    Transmit::Credit { credits } => Msg::Credit(credits),
                });
            }
        }

        fn app_send(&mut self, wire: &mut VecDeque<Msg>) {
            self.to_send -= 1;
            self.fc.push(self.next_seq).unwrap();
            self.next_seq += 1;
            self.transmit(wire);
        }

        fn deliver(&mut self, m: Msg, out: &mut VecDeque<Msg>) -> Result<(), String> {
            if self.posted == 0 {
                return Err("RNR: message arrived with no receive posted".into());
            }
            self.posted -= 1;
            match m {
                Msg::Data(seq, pb) => {
                    self.fc.on_message(pb).map_err(|e| e.to_string())?;
                    if seq != self.received {
                        return Err(format!("out of order: got {seq}, expected {}", self.received));
                    }
                    self.received += 1;
                    self.unconsumed += 1;
                }
                Msg::Credit(pb) => {
                    self.fc.on_message(pb).map_err(|e| e.to_string())?;
                    self.posted += 1;
                    self.fc.on_repost().unwrap();
                }
            }
            self.transmit(out);
            Ok(())
        }

        fn app_consume(&mut self, out: &mut VecDeque<Msg>) {
            self.unconsumed -= 1;
            self.posted += 1;
            self.fc.on_repost().unwrap();
            self.transmit(out);
        }

        fn key(&self) -> impl std::hash::Hash + Eq + use<> {
            let f = &self.fc;
            (
                f.credits,
                f.owed,
                f.granted,
                f.held,
                f.queue.len(),
                self.to_send,
                self.unconsumed,
                self.received,
                self.posted,
            )
        }
    }

    /// Two sides and the two directions of the wire (RC: reliable, in order).
    #[derive(Debug, Clone)]
    struct Pair {
        a: Side,
        b: Side,
        ab: VecDeque<Msg>,
        ba: VecDeque<Msg>,
    }

    impl Pair {
        fn new(ca: &CreditConfig, cb: &CreditConfig, na: u32, nb: u32) -> Pair {
            Pair {
                a: Side::new(ca, cb, na),
                b: Side::new(cb, ca, nb),
                ab: VecDeque::new(),
                ba: VecDeque::new(),
            }
        }

        /// The enabled actions, as indices for `apply`.
        fn actions(&self) -> Vec<u8> {
            let mut v = Vec::new();
            let c = [
                self.a.to_send > 0,
                self.b.to_send > 0,
                !self.ab.is_empty(),
                !self.ba.is_empty(),
                self.a.unconsumed > 0,
                self.b.unconsumed > 0,
            ];
            for (i, &on) in c.iter().enumerate() {
                if on {
                    v.push(i as u8);
                }
            }
            v
        }

        fn apply(&mut self, action: u8) -> Result<(), String> {
            let Pair { a, b, ab, ba } = self;
            match action {
                0 => a.app_send(ab),
                1 => b.app_send(ba),
                2 => {
                    let m = ab.pop_front().unwrap();
                    b.deliver(m, ba)?
                }
                3 => {
                    let m = ba.pop_front().unwrap();
                    a.deliver(m, ab)?
                }
                4 => a.app_consume(ab),
                5 => b.app_consume(ba),
                _ => unreachable!(),
            }
            Ok(())
        }

        /// Every message sent, delivered and consumed, nothing in flight but credits.
        fn done(&self) -> bool {
            self.a.to_send == 0
                && self.b.to_send == 0
                && self.a.fc.queued() == 0
                && self.b.fc.queued() == 0
                && self.a.received == self.b.next_seq
                && self.b.received == self.a.next_seq
                && self.a.unconsumed == 0
                && self.b.unconsumed == 0
                && self.ab.iter().chain(&self.ba).all(|m| matches!(m, Msg::Credit(_)))
        }

        /// One deterministic round: every application sends what it has, every message in
        /// flight is delivered, every application consumes what arrived.
        fn step(&mut self) -> Result<(), String> {
            while self.a.to_send > 0 {
                self.apply(0)?;
            }
            while self.b.to_send > 0 {
                self.apply(1)?;
            }
            for _ in 0..self.ab.len() {
                self.apply(2)?;
            }
            for _ in 0..self.ba.len() {
                self.apply(3)?;
            }
            while self.a.unconsumed > 0 {
                self.apply(4)?;
            }
            while self.b.unconsumed > 0 {
                self.apply(5)?;
            }
            Ok(())
        }

        /// Steps until both sides are idle; fails if that takes more than `max` steps
        /// (a credit deadlock or livelock).
        fn drive_bounded(&mut self, max: usize) -> Result<usize, String> {
            for n in 0..max {
                if self.done() && self.ab.is_empty() && self.ba.is_empty() {
                    return Ok(n);
                }
                self.step()?;
            }
            Err(format!("not idle after {max} steps: {self:?}"))
        }

        fn key(&self) -> impl std::hash::Hash + Eq + use<> {
            (self.a.key(), self.b.key(), self.ab.clone(), self.ba.clone())
        }
    }

    #[test]
    fn both_sides_exhausting_credits_at_once_recovers() {
        let cfg = CreditConfig::default();
        let mut p = Pair::new(&cfg, &cfg, 500, 500);
        // Both queue far more than the peer has buffers, in the same step.
        let steps = p.drive_bounded(200).unwrap();
        assert!(steps > 1);
        assert_eq!((p.a.received, p.b.received), (500, 500));
        let (sa, sb) = (p.a.fc.stats(), p.b.fc.stats());
        assert_eq!((sa.sent, sb.sent), (500, 500));
        assert!(sa.blocked > 0 && sb.blocked > 0, "both sides ran out of credit");
    }

    #[test]
    fn one_way_traffic_is_kept_flowing_by_explicit_credits() {
        let cfg = CreditConfig::default();
        let mut p = Pair::new(&cfg, &cfg, 1000, 0);
        p.drive_bounded(200).unwrap();
        assert_eq!(p.b.received, 1000);
        assert!(p.b.fc.stats().credit_messages > 0, "the silent side returned credits explicitly");
        assert_eq!(p.a.fc.stats().credit_messages, 0);
    }

    #[test]
    fn asymmetric_buffer_counts_work() {
        let big = CreditConfig::default().recv_buffers(64);
        let small = CreditConfig::default().recv_buffers(3);
        let mut p = Pair::new(&big, &small, 300, 300);
        p.drive_bounded(1000).unwrap();
        assert_eq!((p.a.received, p.b.received), (300, 300));
    }

    /// Exhaustive exploration of every interleaving of sends, deliveries and consumptions for
    /// small buffer counts: no reachable state violates the protocol or hits RNR, no state is
    /// stuck, and from every reachable state the run can still finish (no livelock).
    fn explore(ca: &CreditConfig, cb: &CreditConfig, na: u32, nb: u32) -> usize {
        let start = Pair::new(ca, cb, na, nb);
        let mut ids: HashMap<_, usize> = HashMap::new();
        let mut states: Vec<Pair> = Vec::new();
        let mut edges: Vec<Vec<usize>> = Vec::new();
        ids.insert(start.key(), 0);
        states.push(start);
        edges.push(Vec::new());
        let mut i = 0;
        while i < states.len() {
            let s = states[i].clone();
            let acts = s.actions();
            assert!(!acts.is_empty() || s.done(), "stuck state: {s:?}");
            for a in acts {
                let mut n = s.clone();
                n.apply(a).unwrap_or_else(|e| panic!("{e} after action {a} from {s:?}"));
                let next = ids.len();
                let id = *ids.entry(n.key()).or_insert_with(|| {
                    states.push(n);
                    edges.push(Vec::new());
                    next
                });
                edges[i].push(id);
            }
            i += 1;
        }
        // Backward reachability from the finished states.
        let mut rev: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
        for (from, tos) in edges.iter().enumerate() {
            for &to in tos {
                rev[to].push(from);
            }
        }
        let mut can_finish: HashSet<usize> = (0..states.len()).filter(|&i| states[i].done()).collect();
        let mut stack: Vec<usize> = can_finish.iter().copied().collect();
        while let Some(s) = stack.pop() {
            for &p in &rev[s] {
                if can_finish.insert(p) {
                    stack.push(p);
                }
            }
        }
        assert!(!can_finish.is_empty());
        for (i, s) in states.iter().enumerate() {
            assert!(can_finish.contains(&i), "state cannot finish any more: {s:?}");
        }
        states.len()
    }

    #[test]
    fn exhaustive_model_never_deadlocks_and_never_sends_without_credit() {
        let n3 = CreditConfig::default().recv_buffers(3);
        let n4 = CreditConfig::default().recv_buffers(4);
        let n5w3 = CreditConfig::default().recv_buffers(5).watermark(3);
        let mut total = 0;
        total += explore(&n3, &n3, 5, 5);
        total += explore(&n4, &n3, 6, 4);
        total += explore(&n5w3, &n4, 6, 6);
        assert!(total > 1000, "the models explored {total} states");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Random interleavings at the default N = 20 (too many states to enumerate), then a
        /// bounded drive to the end: every message is delivered once, in order, and no
        /// violation or RNR ever occurs.
        #[test]
        fn random_send_patterns_deliver_everything(
            na in 0..200u32,
            nb in 0..200u32,
            n_a in MIN_RECV_BUFFERS..24,
            n_b in MIN_RECV_BUFFERS..24,
            choices in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let ca = CreditConfig::default().recv_buffers(n_a);
            let cb = CreditConfig::default().recv_buffers(n_b);
            let mut p = Pair::new(&ca, &cb, na, nb);
            for c in choices {
                let acts = p.actions();
                if acts.is_empty() {
                    break;
                }
                let a = acts[c as usize % acts.len()];
                p.apply(a).map_err(TestCaseError::fail)?;
            }
            p.drive_bounded(1000).map_err(TestCaseError::fail)?;
            prop_assert_eq!((p.a.received, p.b.received), (nb, na));
        }
    }
}
