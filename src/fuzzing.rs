//! Entry points for the cargo-fuzz targets in `fuzz/` and for the corpus-replay test. Each
//! takes arbitrary bytes, as a peer could send them, and must neither panic nor allocate from
//! announced lengths; whatever decodes must re-encode to the same bytes.

use crate::expose::MemHandle;
use crate::tcp::handshake::{ClientHandshake, HelloInfo, ServerHandshake};
use crate::types::ServiceLevel;
use crate::wire::{self, HEADER_LEN, Header, Limits};

/// Limits a default endpoint applies.
fn limits() -> Limits {
    Limits { eager: 16 * 1024, chunk: 64 << 20, header: 64 * 1024, message: 64 << 20 }
}

/// Frame headers: a stream of frames, and every 40-byte window as a header.
pub fn wire(data: &[u8]) {
    let _ = wire::scan_stream(data, &limits());
    for w in data.windows(HEADER_LEN).step_by(7) {
        if let Ok(h) = Header::decode(w) {
            assert_eq!(&h.encode()[..], w, "decode/encode round trip");
            let _ = h.check_limits(&limits());
        }
    }
}

/// The handshake, both sides: bytes as a HELLO to a server (with and without a key), and as a
/// HELLO_ACK to a client that sent a HELLO.
pub fn handshake(data: &[u8]) {
    let Some((head, body)) = data.split_at_checked(HEADER_LEN) else { return };
    let Ok(h) = Header::decode(head) else { return };
    if h.check_limits(&Limits { eager: 0, chunk: 0, header: 0, message: 0 }).is_err() {
        return;
    }
    let body = &body[..body.len().min(h.len as usize)];
    for key in [None, Some(b"fuzzing-cluster-key-0123456789ab".to_vec())] {
        let mut s = ServerHandshake::new(1, 0, 16384, 1 << 20, key.clone());
        if s.on_hello(&h, body).is_ok() {
            let _ = s.on_auth(&h, body);
        }
        let (mut c, _) = ClientHandshake::start(
            ServiceLevel::Normal,
            HelloInfo::new(2, 0, 16384, 1 << 20, key.is_some()),
            key,
        );
        let _ = c.on_hello_ack(&h, body);
    }
}

/// Memory handles carried inside requests.
pub fn mem_handle(data: &[u8]) {
    if let Ok(h) = MemHandle::from_bytes(data) {
        assert_eq!(&h.to_bytes()[..], data, "handle round trip");
    }
}

/// InfiniBand engine messages (prefix + header + payload), segment lists, and the side-channel
/// queue-pair information.
pub fn ib_message(data: &[u8]) {
    crate::ib::engine::fuzz_decoders(data);
}

/// Ids for benchmarks of the sans-IO matcher (`benches/matching.rs`): peer and operation ids
/// are otherwise only minted by an endpoint.
pub fn ids(peer: u32, op: u64) -> (crate::types::PeerId, crate::types::OpId) {
    (crate::types::PeerId(peer), crate::types::OpId(op))
}
