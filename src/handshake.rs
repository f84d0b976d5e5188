//! The connection handshake (sans-IO): `HELLO` → `HELLO_ACK` → `AUTH` → `READY`.
//!
//! Both sides exchange endpoint ids, fresh 32-byte nonces and their limits. With a cluster key,
//! each side proves it holds the key with an HMAC-SHA256 over both nonces, both endpoint ids and
//! the service level, under a side-specific label so a proof cannot be reflected back. A server
//! with a key delivers nothing from a connection until the client's proof checks out; a client
//! with a key refuses a server that cannot prove it has the same key.
//!
//! The same messages serve the InfiniBand side channel.

use crate::core::loss::Loss;
use crate::error::ProtocolError;
use crate::types::ServiceLevel;
use crate::util;
use crate::wire::{Header, Kind};

/// Length of a nonce and of a proof.
pub const NONCE_LEN: usize = 32;
const PROOF_LEN: usize = 32;
/// HELLO flag: the sender has a cluster key.
pub const HS_HAS_KEY: u32 = 1;
/// HELLO flag: the sender reads STREAM frames, so a peer may stream request payloads to it.
pub const HS_STREAMS: u32 = 2;
/// READY status: accepted.
pub const READY_OK: u32 = 0;
/// READY status: authentication failed.
pub const READY_AUTH_FAILED: u32 = 1;
/// READY status: refused for limits (too many peers).
pub const READY_REFUSED: u32 = 2;
/// READY status: shed to make room for newer connections (the server's limits on connections
/// in their handshake). Sent in place of whatever the server would have sent next.
pub const READY_BUSY: u32 = 3;

/// The READY frame that tells a client its connection is being shed ([`READY_BUSY`]).
pub fn busy_frame(sl: ServiceLevel) -> Header {
    let mut h = Header::new(Kind::Ready, sl);
    h.aux = READY_BUSY;
    h
}

/// Why a server refused a connection, from the status of its READY frame (not [`READY_OK`]).
pub fn refusal(status: u32) -> String {
    match status {
        READY_AUTH_FAILED => "the server refused our cluster key".into(),
        READY_REFUSED => "the server refused the connection: it has as many peers as it admits".into(),
        READY_BUSY => "the server refused the connection during the handshake: it has too many \
                       connections in their handshake (try again)"
            .into(),
        s => format!("the server refused the connection during the handshake (status {s})"),
    }
}

/// Limits a side announces in its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloInfo {
    /// Sender's endpoint id.
    pub endpoint_id: u64,
    /// Sender's nonce.
    pub nonce: [u8; NONCE_LEN],
    /// Port the sender listens on (0 = client only).
    pub listen_port: u16,
    /// Largest eager message the sender accepts.
    pub eager_limit: u32,
    /// Largest message the sender accepts.
    pub max_message: u64,
    /// Sender has a cluster key.
    pub has_key: bool,
    /// Sender accepts request payloads streamed behind their requests ([`HS_STREAMS`]).
    pub streams: bool,
}

const HELLO_BODY: usize = NONCE_LEN + 2 + 4 + 8;

/// Why a handshake message was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// Wrong length or kind.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The peer's proof did not verify, or it has no key while we require one.
    #[error("{0}")]
    Auth(&'static str),
}

impl HelloInfo {
    /// A fresh hello with a random nonce.
    pub fn new(
        endpoint_id: u64,
        listen_port: u16,
        eager_limit: u32,
        max_message: u64,
        has_key: bool,
    ) -> Self {
        let mut nonce = [0u8; NONCE_LEN];
        util::fill_random(&mut nonce);
        HelloInfo { endpoint_id, nonce, listen_port, eager_limit, max_message, has_key, streams: true }
    }

    /// The HELLO / HELLO_ACK flags (header `aux`) that announce this hello's capabilities.
    fn flags(&self) -> u32 {
        (if self.has_key { HS_HAS_KEY } else { 0 }) | if self.streams { HS_STREAMS } else { 0 }
    }

    fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_BODY + PROOF_LEN);
        b.extend_from_slice(&self.nonce);
        b.extend_from_slice(&self.listen_port.to_le_bytes());
        b.extend_from_slice(&self.eager_limit.to_le_bytes());
        b.extend_from_slice(&self.max_message.to_le_bytes());
        b
    }

    fn parse(h: &Header, payload: &[u8]) -> Result<(HelloInfo, Option<[u8; PROOF_LEN]>), HandshakeError> {
        if payload.len() != HELLO_BODY && payload.len() != HELLO_BODY + PROOF_LEN {
            return Err(HandshakeError::Malformed("hello body"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&payload[..NONCE_LEN]);
        let p = &payload[NONCE_LEN..];
        let info = HelloInfo {
            endpoint_id: h.a,
            nonce,
            listen_port: u16::from_le_bytes([p[0], p[1]]),
            eager_limit: u32::from_le_bytes([p[2], p[3], p[4], p[5]]),
            max_message: u64::from_le_bytes([p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13]]),
            has_key: h.aux & HS_HAS_KEY != 0,
            streams: h.aux & HS_STREAMS != 0,
        };
        let proof = (payload.len() == HELLO_BODY + PROOF_LEN).then(|| {
            let mut pr = [0u8; PROOF_LEN];
            pr.copy_from_slice(&payload[HELLO_BODY..]);
            pr
        });
        Ok((info, proof))
    }
}

fn frame(kind: Kind, sl: ServiceLevel, a: u64, aux: u32, body: Vec<u8>) -> (Header, Vec<u8>) {
    let mut h = Header::new(kind, sl);
    h.a = a;
    h.aux = aux;
    h.len = body.len() as u32;
    (h, body)
}

/// The bytes a proof covers: a side label, both nonces (the verifier's first, so each side
/// signs the other's fresh challenge), both endpoint ids and the service level.
fn proof_input(
    label: &[u8],
    first: &HelloInfo,
    second: &HelloInfo,
    client_id: u64,
    server_id: u64,
    sl: ServiceLevel,
) -> Vec<u8> {
    let mut v = Vec::with_capacity(label.len() + 2 * NONCE_LEN + 17);
    v.extend_from_slice(label);
    v.extend_from_slice(&first.nonce);
    v.extend_from_slice(&second.nonce);
    v.extend_from_slice(&client_id.to_le_bytes());
    v.extend_from_slice(&server_id.to_le_bytes());
    v.push(sl as u8);
    v
}

const SERVER_LABEL: &[u8] = b"ionet-v1 server proof";
const CLIENT_LABEL: &[u8] = b"ionet-v1 client proof";

/// Client side of one connection's handshake.
#[derive(Debug)]
pub struct ClientHandshake {
    sl: ServiceLevel,
    mine: HelloInfo,
    key: Option<Vec<u8>>,
    server: Option<HelloInfo>,
}

impl ClientHandshake {
    /// Starts a handshake; returns it and the HELLO frame to send.
    pub fn start(sl: ServiceLevel, mine: HelloInfo, key: Option<Vec<u8>>) -> (Self, (Header, Vec<u8>)) {
        let hello = frame(Kind::Hello, sl, mine.endpoint_id, mine.flags(), mine.body());
        (ClientHandshake { sl, mine, key, server: None }, hello)
    }

    /// Handles HELLO_ACK: verifies the server (when we have a key) and returns the AUTH frame.
    pub fn on_hello_ack(&mut self, h: &Header, payload: &[u8]) -> Result<(Header, Vec<u8>), HandshakeError> {
        if h.kind != Kind::HelloAck || self.server.is_some() {
            return Err(HandshakeError::Malformed("hello-ack"));
        }
        let (server, server_proof) = HelloInfo::parse(h, payload)?;
        let body = match &self.key {
            Some(key) => {
                let Some(sp) = server_proof else {
                    return Err(HandshakeError::Auth("server did not prove the cluster key"));
                };
                let input = proof_input(
                    SERVER_LABEL,
                    &self.mine,
                    &server,
                    self.mine.endpoint_id,
                    server.endpoint_id,
                    self.sl,
                );
                if !util::verify_mac(key, &[&input], &sp) {
                    return Err(HandshakeError::Auth("server proof does not match our cluster key"));
                }
                let input = proof_input(
                    CLIENT_LABEL,
                    &server,
                    &self.mine,
                    self.mine.endpoint_id,
                    server.endpoint_id,
                    self.sl,
                );
                util::mac(key, &[&input]).to_vec()
            }
            None => Vec::new(),
        };
        self.server = Some(server);
        Ok(frame(Kind::Auth, self.sl, self.mine.endpoint_id, 0, body))
    }

    /// The server's hello, once received.
    pub fn server(&self) -> Option<&HelloInfo> {
        self.server.as_ref()
    }
}

/// Server side of one connection's handshake.
#[derive(Debug)]
pub struct ServerHandshake {
    mine_template: (u64, u16, u32, u64),
    key: Option<Vec<u8>>,
    state: Option<(ServiceLevel, HelloInfo, HelloInfo)>,
}

impl ServerHandshake {
    /// Waits for a HELLO.
    pub fn new(
        endpoint_id: u64,
        listen_port: u16,
        eager_limit: u32,
        max_message: u64,
        key: Option<Vec<u8>>,
    ) -> Self {
        ServerHandshake {
            mine_template: (endpoint_id, listen_port, eager_limit, max_message),
            key,
            state: None,
        }
    }

    /// Handles HELLO: returns the client's hello and the HELLO_ACK to send.
    pub fn on_hello(
        &mut self,
        h: &Header,
        payload: &[u8],
    ) -> Result<(HelloInfo, (Header, Vec<u8>)), HandshakeError> {
        if h.kind != Kind::Hello || self.state.is_some() {
            return Err(HandshakeError::Malformed("hello"));
        }
        let (client, p) = HelloInfo::parse(h, payload)?;
        if p.is_some() {
            return Err(HandshakeError::Malformed("hello carries a proof"));
        }
        let (eid, port, eager, maxm) = self.mine_template;
        let mine = HelloInfo::new(eid, port, eager, maxm, self.key.is_some());
        let mut body = mine.body();
        if let Some(key) = &self.key {
            let input = proof_input(SERVER_LABEL, &client, &mine, client.endpoint_id, eid, h.sl);
            body.extend_from_slice(&util::mac(key, &[&input]));
        }
        let aux = mine.flags();
        self.state = Some((h.sl, client, mine));
        Ok((client, frame(Kind::HelloAck, h.sl, eid, aux, body)))
    }

    /// Handles AUTH: returns the READY status to send (accept only with [`READY_OK`]).
    pub fn on_auth(&mut self, h: &Header, payload: &[u8]) -> Result<(), HandshakeError> {
        let Some((sl, client, mine)) = &self.state else {
            return Err(HandshakeError::Malformed("auth before hello"));
        };
        if h.kind != Kind::Auth {
            return Err(HandshakeError::Malformed("auth"));
        }
        match &self.key {
            None => Ok(()),
            Some(key) => {
                if payload.len() != PROOF_LEN {
                    return Err(HandshakeError::Auth("client did not prove the cluster key"));
                }
                let input =
                    proof_input(CLIENT_LABEL, mine, client, client.endpoint_id, mine.endpoint_id, *sl);
                if util::verify_mac(key, &[&input], payload) {
                    Ok(())
                } else {
                    Err(HandshakeError::Auth("client proof does not match our cluster key"))
                }
            }
        }
    }

    /// A READY frame with a status.
    /// The server's answer to the client's AUTH: `READY_OK` when the client proved its key and
    /// `admitted` says there is room for it, `READY_REFUSED` when there is none, and
    /// `READY_AUTH_FAILED` (logged with the client's address `remote`, counted) when the proof
    /// failed. Returns the status and the READY frame to send.
    pub(crate) fn answer_auth(
        &mut self,
        h: &Header,
        payload: &[u8],
        admitted: impl FnOnce() -> bool,
        remote: std::net::SocketAddr,
        counters: &crate::info::Counters,
    ) -> (u32, Header, Vec<u8>) {
        let status = match self.on_auth(h, payload) {
            Ok(()) if admitted() => READY_OK,
            Ok(()) => READY_REFUSED,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "refusing connection: authentication failed");
                crate::info::Counters::add(&counters.auth_failures, 1);
                READY_AUTH_FAILED
            }
        };
        let (rh, rb) = self.ready(status);
        (status, rh, rb)
    }

    pub fn ready(&self, status: u32) -> (Header, Vec<u8>) {
        let sl = self.state.as_ref().map_or(ServiceLevel::Control, |s| s.0);
        frame(Kind::Ready, sl, self.mine_template.0, status, Vec::new())
    }
}

/// Where one connection's handshake stands, on either side: the phases both transports go
/// through before a connection is theirs (the InfiniBand side channel then exchanges its queue
/// pairs). Each arrived frame moves it on by [`Hs::on_frame`], which sends nothing itself.
#[derive(Debug)]
pub(crate) enum Hs {
    /// Our HELLO went: the server's HELLO_ACK (or a refusal) comes next.
    ClientWaitAck(Box<ClientHandshake>),
    /// Our AUTH went: READY comes next.
    ClientWaitReady(Box<ClientHandshake>),
    /// The client's HELLO comes next.
    ServerWaitHello(Box<ServerHandshake>),
    /// Our HELLO_ACK went to the client of this hello: its AUTH comes next.
    ServerWaitAuth(Box<ServerHandshake>, HelloInfo),
}

/// What a handshake frame leads to.
#[derive(Debug)]
pub(crate) enum HsStep {
    /// Send `frame`; the handshake goes on in `next`. `class`: the service level the client's
    /// HELLO named, which the connection now serves.
    Send { frame: (Header, Vec<u8>), next: Hs, class: Option<ServiceLevel> },
    /// The server accepted `client`: send READY (`frame`); the connection is the driver's.
    Accepted { frame: (Header, Vec<u8>), client: HelloInfo },
    /// The server refuses the client: send `frame` (READY with the refusal), then close once it
    /// is written, so the client learns why rather than waiting for its deadline.
    Refused { frame: (Header, Vec<u8>) },
    /// The server accepted us; `server` is its hello.
    Ready { server: HelloInfo },
    /// The connection goes, for this reason.
    Failed(Loss),
}

fn violation(what: String) -> Loss {
    Loss::Protocol(ProtocolError::Handshake(what))
}

impl Hs {
    /// Whether this end dialled the connection.
    pub(crate) fn is_client(&self) -> bool {
        matches!(self, Hs::ClientWaitAck(_) | Hs::ClientWaitReady(_))
    }

    /// A handshake frame `h` with `body` arrived. `admits` says whether the server has room for
    /// a client of this endpoint id; a failed proof is logged with the client's address `remote`
    /// and counted in `counters`.
    pub(crate) fn on_frame(
        self,
        h: &Header,
        body: &[u8],
        admits: impl FnOnce(u64) -> bool,
        remote: std::net::SocketAddr,
        counters: &crate::info::Counters,
    ) -> HsStep {
        match self {
            Hs::ServerWaitHello(mut hs) => match hs.on_hello(h, body) {
                Ok((client, frame)) => {
                    HsStep::Send { frame, next: Hs::ServerWaitAuth(hs, client), class: Some(h.sl) }
                }
                Err(e) => HsStep::Failed(violation(e.to_string())),
            },
            Hs::ServerWaitAuth(mut hs, client) => {
                let (status, rh, rb) =
                    hs.answer_auth(h, body, || admits(client.endpoint_id), remote, counters);
                if status == READY_OK {
                    HsStep::Accepted { frame: (rh, rb), client }
                } else {
                    HsStep::Refused { frame: (rh, rb) }
                }
            }
            // A server that cannot take us answers the HELLO with a READY that says why.
            Hs::ClientWaitAck(_) if h.kind == Kind::Ready && h.aux != READY_OK => {
                HsStep::Failed(Loss::Lost(refusal(h.aux)))
            }
            Hs::ClientWaitAck(mut hs) => match hs.on_hello_ack(h, body) {
                Ok(frame) => HsStep::Send { frame, next: Hs::ClientWaitReady(hs), class: None },
                Err(HandshakeError::Auth(e)) => HsStep::Failed(Loss::Auth(e.into())),
                Err(e) => HsStep::Failed(violation(e.to_string())),
            },
            Hs::ClientWaitReady(hs) => {
                if h.kind != Kind::Ready {
                    return HsStep::Failed(violation("expected READY".into()));
                }
                match h.aux {
                    READY_OK => HsStep::Ready { server: *hs.server().expect("hello-ack seen before ready") },
                    READY_AUTH_FAILED => HsStep::Failed(Loss::Auth(refusal(h.aux))),
                    status => HsStep::Failed(Loss::Lost(refusal(status))),
                }
            }
        }
    }
}

/// Why a connection this end dialled (`dialling`, still in its handshake) was lost: a server
/// that closes it then refused it (limits, or a key we do not have), which says more than a
/// bare end of file.
pub(crate) fn lost_in_handshake(why: Loss, dialling: bool) -> Loss {
    match why {
        Loss::Lost(r) if dialling => {
            Loss::Lost(format!("the server closed the connection during the handshake ({r})"))
        }
        why => why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn run(client_key: Option<&[u8]>, server_key: Option<&[u8]>) -> Result<(), HandshakeError> {
        let sl = ServiceLevel::Bulk;
        let (mut c, (h1, b1)) = ClientHandshake::start(
            sl,
            HelloInfo::new(11, 0, 16384, 1 << 20, client_key.is_some()),
            client_key.map(|k| k.to_vec()),
        );
        let mut s = ServerHandshake::new(22, 7000, 16384, 1 << 20, server_key.map(|k| k.to_vec()));
        let h1 = Header::decode(&h1.encode()).unwrap();
        let (client, (h2, b2)) = s.on_hello(&h1, &b1)?;
        assert_eq!(client.endpoint_id, 11);
        let (h3, b3) = c.on_hello_ack(&h2, &b2)?;
        assert_eq!(c.server().unwrap().listen_port, 7000);
        s.on_auth(&h3, &b3)
    }

    #[test]
    fn no_keys_and_matching_keys_succeed() {
        run(None, None).unwrap();
        run(Some(KEY), Some(KEY)).unwrap();
    }

    #[test]
    fn wrong_or_missing_keys_fail() {
        assert!(matches!(run(None, Some(KEY)), Err(HandshakeError::Auth(_))));
        assert!(matches!(run(Some(KEY), None), Err(HandshakeError::Auth(_))));
        assert!(matches!(
            run(Some(b"another-key-another-key-another!"), Some(KEY)),
            Err(HandshakeError::Auth(_))
        ));
    }

    #[test]
    fn a_server_proof_cannot_be_reflected_as_a_client_proof() {
        let sl = ServiceLevel::Normal;
        let mut s = ServerHandshake::new(22, 0, 1, 1, Some(KEY.to_vec()));
        let (_c, (h1, b1)) = ClientHandshake::start(sl, HelloInfo::new(11, 0, 1, 1, false), None);
        let (_, (_h2, b2)) = s.on_hello(&h1, &b1).unwrap();
        let reflected = b2[HELLO_BODY..].to_vec();
        let mut auth = Header::new(Kind::Auth, sl);
        auth.len = 32;
        assert!(s.on_auth(&auth, &reflected).is_err());
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let mut s = ServerHandshake::new(1, 0, 1, 1, None);
        let mut h = Header::new(Kind::Hello, ServiceLevel::Normal);
        h.len = 3;
        assert!(s.on_hello(&h, &[1, 2, 3]).is_err());
        let auth = Header::new(Kind::Auth, ServiceLevel::Normal);
        assert!(s.on_auth(&auth, &[]).is_err(), "auth before hello");
    }

    /// The shared phases, as both transports drive them: one frame in, one step out.
    mod phases {
        use super::*;
        use crate::info::Counters;

        const REMOTE: std::net::SocketAddr =
            std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9);

        fn client(key: Option<&[u8]>) -> (Hs, (Header, Vec<u8>)) {
            let mine = HelloInfo::new(11, 0, 16384, 1 << 20, key.is_some());
            let (c, hello) = ClientHandshake::start(ServiceLevel::Bulk, mine, key.map(<[u8]>::to_vec));
            (Hs::ClientWaitAck(Box::new(c)), hello)
        }

        fn server(key: Option<&[u8]>) -> Hs {
            Hs::ServerWaitHello(Box::new(ServerHandshake::new(
                22,
                7000,
                16384,
                1 << 20,
                key.map(<[u8]>::to_vec),
            )))
        }

        fn step(hs: Hs, (h, body): &(Header, Vec<u8>), admits: bool, counters: &Counters) -> HsStep {
            hs.on_frame(h, body, |_| admits, REMOTE, counters)
        }

        /// Runs a client and a server to the server's answer to AUTH; returns that step and the
        /// client waiting for it.
        fn to_auth(ck: Option<&[u8]>, sk: Option<&[u8]>, admits: bool, counters: &Counters) -> (HsStep, Hs) {
            let (c, hello) = client(ck);
            let HsStep::Send { frame: ack, next: s, class } = step(server(sk), &hello, admits, counters)
            else {
                panic!("the server answers a hello")
            };
            assert_eq!(class, Some(ServiceLevel::Bulk), "the hello names the class");
            let HsStep::Send { frame: auth, next: c, class: None } = step(c, &ack, admits, counters) else {
                panic!("the client answers the ack")
            };
            assert!(c.is_client() && !s.is_client());
            (step(s, &auth, admits, counters), c)
        }

        fn lost(s: HsStep) -> Loss {
            match s {
                HsStep::Failed(l) => l,
                other => panic!("expected a failure, got {other:?}"),
            }
        }

        #[test]
        fn hello_auth_ready_accepts_both_ends() {
            let counters = Counters::default();
            let (s, c) = to_auth(Some(b"k"), Some(b"k"), true, &counters);
            let HsStep::Accepted { frame: ready, client } = s else { panic!("accepted: {s:?}") };
            assert_eq!((client.endpoint_id, ready.0.kind, ready.0.aux), (11, Kind::Ready, READY_OK));
            let HsStep::Ready { server } = step(c, &ready, true, &counters) else { panic!() };
            assert_eq!((server.endpoint_id, server.listen_port), (22, 7000));
            assert_eq!(counters.auth_failures.load(std::sync::atomic::Ordering::Relaxed), 0);
        }

        #[test]
        fn a_server_without_room_refuses_and_the_client_says_why() {
            let counters = Counters::default();
            let (s, c) = to_auth(None, None, false, &counters);
            let HsStep::Refused { frame } = s else { panic!("refused: {s:?}") };
            assert_eq!((frame.0.kind, frame.0.aux), (Kind::Ready, READY_REFUSED));
            assert!(
                matches!(lost(step(c, &frame, true, &counters)), Loss::Lost(r) if r.contains("as many peers"))
            );
        }

        #[test]
        fn a_wrong_key_is_refused_counted_and_reported_as_authentication() {
            let counters = Counters::default();
            let (s, c) = to_auth(None, Some(b"k"), true, &counters);
            let HsStep::Refused { frame } = s else { panic!("refused: {s:?}") };
            assert_eq!(frame.0.aux, READY_AUTH_FAILED);
            assert_eq!(counters.auth_failures.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert!(matches!(lost(step(c, &frame, true, &counters)), Loss::Auth(_)));
            // A client with a key refuses a server that cannot prove it holds it.
            let (c, hello) = client(Some(b"k"));
            let HsStep::Send { frame: ack, .. } = step(server(None), &hello, true, &counters) else {
                panic!()
            };
            assert!(matches!(lost(step(c, &ack, true, &counters)), Loss::Auth(_)));
        }

        #[test]
        fn a_refusal_instead_of_the_ack_ends_the_client() {
            let counters = Counters::default();
            let (c, _) = client(None);
            let busy = (busy_frame(ServiceLevel::Bulk), Vec::new());
            assert!(
                matches!(lost(step(c, &busy, true, &counters)), Loss::Lost(r) if r.contains("try again"))
            );
        }

        #[test]
        fn frames_out_of_order_are_protocol_violations() {
            let counters = Counters::default();
            let (c, hello) = client(None);
            // The server gets an AUTH where a hello belongs; the client a hello for an ack.
            let auth = frame(Kind::Auth, ServiceLevel::Bulk, 11, 0, Vec::new());
            assert!(matches!(lost(step(server(None), &auth, true, &counters)), Loss::Protocol(_)));
            assert!(matches!(lost(step(c, &hello, true, &counters)), Loss::Protocol(_)));
            let (_, c) = to_auth(None, None, true, &counters);
            let HsStep::Failed(Loss::Protocol(e)) = step(c, &hello, true, &counters) else { panic!() };
            assert!(e.to_string().contains("expected READY"), "{e}");
        }

        #[test]
        fn a_close_in_our_handshake_reads_as_a_refusal() {
            let eof = || Loss::Lost("end of file".into());
            assert!(
                matches!(lost_in_handshake(eof(), true), Loss::Lost(r) if r.contains("during the handshake"))
            );
            assert!(matches!(lost_in_handshake(eof(), false), Loss::Lost(r) if r == "end of file"));
            assert!(matches!(lost_in_handshake(Loss::Auth("k".into()), true), Loss::Auth(_)));
        }
    }
}
