//! Replays the committed fuzz corpora (`fuzz/corpus/<target>` for every ionet target) through
//! the same entry points the cargo-fuzz targets call, so CI catches regressions on stable Rust.
//! `IONET_WRITE_CORPUS=1 cargo test --test fuzz_corpus` regenerates the seeds.

use std::path::PathBuf;

use ionet::expose::MemHandle;
use ionet::internals::ib::verbs::{Gid, QpEndpointInfo};
use ionet::internals::wire::{
    FLAG_ABORT, FLAG_INLINE_DATA, FLAG_PAYLOAD_OUT, FLAG_STREAMED, HEADER_LEN, Header, Kind,
};
use ionet::{Access, ServiceLevel};

const LIMITS: ionet::internals::wire::Limits =
    ionet::internals::wire::Limits { eager: 16384, chunk: 1 << 20, header: 65536, message: 64 << 20 };

fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

fn frame(kind: Kind, f: impl FnOnce(&mut Header), payload: &[u8]) -> Vec<u8> {
    let mut h = Header::new(kind, ServiceLevel::Normal);
    f(&mut h);
    h.len = payload.len() as u32;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut s = Vec::new();
    let kinds = [
        Kind::Eager,
        Kind::Unexpected,
        Kind::Rts,
        Kind::Cts,
        Kind::Data,
        Kind::Pull,
        Kind::PullData,
        Kind::Push,
        Kind::Reply,
        Kind::Put,
        Kind::PutAck,
        Kind::Get,
        Kind::GetResp,
        Kind::CancelRequest,
        Kind::Bye,
        Kind::Stream,
    ];
    for k in kinds {
        let payload: &[u8] = if matches!(
            k,
            Kind::Eager | Kind::Unexpected | Kind::Data | Kind::Push | Kind::Put | Kind::Stream
        ) {
            b"payload bytes"
        } else {
            b""
        };
        s.push((
            "wire_frames",
            // "stream" already names the multi-frame seed below.
            if k == Kind::Stream { "stream_frame".into() } else { format!("{k:?}").to_lowercase() },
            frame(
                k,
                |h| {
                    h.a = 7;
                    h.b = 9;
                    h.c = 13
                },
                payload,
            ),
        ));
    }
    let req = frame(
        Kind::Request,
        |h| {
            h.aux = 4;
            h.c = 5;
            h.flags = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        },
        b"hdr!data!",
    );
    s.push(("wire_frames", "request_inline".into(), req));
    let mut stream = frame(Kind::Eager, |h| h.a = 1, b"abc");
    stream.extend(frame(
        Kind::Rts,
        |h| {
            h.b = 2;
            h.c = 1 << 20
        },
        b"",
    ));
    stream.extend(frame(Kind::Bye, |_| {}, b""));
    s.push(("wire_frames", "stream".into(), stream));
    let hello_body = [0u8; 46];
    s.push(("handshake", "hello".into(), frame(Kind::Hello, |h| h.a = 3, &hello_body)));
    s.push((
        "handshake",
        "hello_with_key".into(),
        frame(
            Kind::Hello,
            |h| {
                h.a = 3;
                h.aux = 1
            },
            &hello_body,
        ),
    ));
    s.push((
        "handshake",
        "hello_ack_proof".into(),
        frame(
            Kind::HelloAck,
            |h| {
                h.a = 4;
                h.aux = 1
            },
            &[1u8; 78],
        ),
    ));
    s.push(("handshake", "auth".into(), frame(Kind::Auth, |_| {}, &[2u8; 32])));
    // InfiniBand engine messages: 8-byte prefix (credits, ring returns), header, payload.
    let ib_msg = |kind: Kind, f: &dyn Fn(&mut Header), payload: &[u8]| {
        let mut v = vec![3, 0, 1, 0, 0, 0, 0, 0];
        v.extend(frame(kind, f, payload));
        v
    };
    let segs = |list: &[(u64, u32, u32)]| {
        let mut v = (list.len() as u32).to_le_bytes().to_vec();
        for (addr, len, rkey) in list {
            v.extend_from_slice(&addr.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
            v.extend_from_slice(&rkey.to_le_bytes());
        }
        v
    };
    s.push(("ib_message", "eager".into(), ib_msg(Kind::Eager, &|h| h.a = 5, b"small message")));
    s.push(("ib_message", "credit".into(), ib_msg(Kind::Credit, &|_| {}, b"")));
    let two = segs(&[(0x7f00_0000_0000, 65536, 0x11), (0x7f00_0001_0000, 4096, 0x12)]);
    s.push((
        "ib_message",
        "request_segments".into(),
        ib_msg(
            Kind::Request,
            &|h| {
                h.aux = 3;
                h.c = 69632;
                h.flags = FLAG_PAYLOAD_OUT;
            },
            &[b"hdr".as_slice(), &two].concat(),
        ),
    ));
    s.push(("ib_message", "rdv".into(), ib_msg(Kind::Rdv, &|h| h.c = 69632, &two)));
    let qp = QpEndpointInfo { qpn: 0x11, psn: 0x2222, lid: 3, gid: Gid([7; 16]) };
    let mut info = qp.encode().to_vec();
    info.extend_from_slice(&20u16.to_le_bytes());
    info.extend_from_slice(&[0, 0]);
    info.extend_from_slice(&16384u32.to_le_bytes());
    info.extend_from_slice(&0x7f00_0010_0000u64.to_le_bytes());
    info.extend_from_slice(&0x33u32.to_le_bytes());
    info.extend_from_slice(&8u16.to_le_bytes());
    info.extend_from_slice(&[0, 0]);
    info.extend_from_slice(&69632u32.to_le_bytes());
    s.push(("ib_message", "ib_info".into(), info.clone()));
    s.push(("ib_message", "qp_info".into(), qp.encode().to_vec()));
    // A side-channel conversation as the server sees it: HELLO, AUTH, IB_INFO, IB_READY.
    let mut side = frame(Kind::Hello, |h| h.a = 3, &hello_body);
    side.extend(frame(Kind::Auth, |h| h.a = 3, b""));
    side.extend(frame(Kind::IbInfo, |_| {}, &info));
    side.extend(frame(Kind::IbReady, |_| {}, b""));
    s.push(("ib_side", "server_view".into(), side));
    let mut side = frame(Kind::HelloAck, |h| h.a = 4, &hello_body);
    side.extend(frame(Kind::Ready, |_| {}, b""));
    side.extend(frame(Kind::IbInfo, |_| {}, &info));
    s.push(("ib_side", "client_view".into(), side));
    // A live session: the frames a well-behaved client sends after its handshake.
    let mut session = frame(Kind::Unexpected, |h| h.a = 1, b"hello");
    session.extend(frame(Kind::Eager, |h| h.a = 2, b"eager"));
    session.extend(frame(
        Kind::Request,
        |h| {
            h.a = 3;
            h.b = 1;
            h.aux = 3;
            h.c = 4;
            h.flags = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        },
        b"hdrdata",
    ));
    session.extend(frame(
        Kind::Rts,
        |h| {
            h.a = 4;
            h.b = 2;
            h.c = 100_000
        },
        b"",
    ));
    session.extend(frame(Kind::Data, |h| h.b = 2, &[7u8; 1000]));
    session.extend(frame(
        Kind::Get,
        |h| {
            h.a = 5;
            h.b = 0x1234;
            h.aux = 16
        },
        b"",
    ));
    s.push(("tcp_session", "client_frames".into(), session));
    // A streamed request: its payload follows in two STREAM frames; and one the client stops.
    let streamed = |id: u64, len: u64| {
        frame(
            Kind::Request,
            |h| {
                (h.a, h.b, h.aux, h.c) = (3, id, 3, len);
                h.flags = FLAG_PAYLOAD_OUT | FLAG_STREAMED;
            },
            b"hdr",
        )
    };
    let mut session = streamed(7, 2000);
    session.extend(frame(Kind::Stream, |h| (h.b, h.c) = (7, 0), &[1u8; 1000]));
    session.extend(frame(Kind::Stream, |h| (h.b, h.c) = (7, 1000), &[2u8; 1000]));
    s.push(("tcp_session", "streamed_request".into(), session));
    let mut session = streamed(8, 2000);
    session.extend(frame(Kind::Stream, |h| (h.b, h.c) = (8, 0), &[3u8; 500]));
    session.extend(frame(
        Kind::Stream,
        |h| {
            (h.b, h.c) = (8, 500);
            h.flags = FLAG_ABORT;
        },
        b"",
    ));
    s.push(("tcp_session", "stream_stopped".into(), session));
    // A streamed request the server pulls into a scatter list, whose first STREAM frame claims
    // 20 000 bytes and brings 3 000 before the client's EOF: a direct read across pieces.
    let mut session = streamed(9, 40_000);
    let mut first = frame(Kind::Stream, |h| (h.b, h.c) = (9, 0), &[4u8; 20_000]);
    first.truncate(HEADER_LEN + 3000);
    session.extend(first);
    s.push(("tcp_session", "stream_into_pieces".into(), session));
    s.push((
        "tcp_session",
        "put".into(),
        frame(
            Kind::Put,
            |h| {
                h.a = 6;
                h.b = 0x1234;
                h.c = 0x7f00_0000_0000
            },
            b"1234",
        ),
    ));
    // Gets of the server's whole exposure (a key with the top bit clear is aimed at it) that the
    // client reads only after writing them all: the answers hold the server at its transmit
    // bound until the client reads.
    let mut session = Vec::new();
    for i in 0..48 {
        session.extend(frame(
            Kind::Get,
            |h| {
                (h.a, h.b, h.c) = (100 + i, 1, 0);
                h.aux = 64 << 10;
            },
            b"",
        ));
    }
    s.push(("tcp_session", "gets_unread".into(), session));
    let mh = MemHandle {
        addr: 0x7f00_0000_1000,
        len: 4096,
        key: 0x1234_5678_9abc_def0,
        rkey: 0,
        access: Access::READ_WRITE,
    };
    s.push(("mem_handle", "handle".into(), mh.to_bytes().to_vec()));
    s
}

#[test]
fn corpora_replay_through_the_decoders() {
    if std::env::var_os("IONET_WRITE_CORPUS").is_some() {
        for (target, name, bytes) in seeds() {
            std::fs::create_dir_all(dir(target)).unwrap();
            std::fs::write(dir(target).join(format!("seed-{name}")), bytes).unwrap();
        }
    }
    let mut replayed = 0;
    for (target, f) in [
        ("wire_frames", ionet::internals::fuzzing::wire as fn(&[u8])),
        ("handshake", ionet::internals::fuzzing::handshake),
        ("mem_handle", ionet::internals::fuzzing::mem_handle),
        ("ib_message", ionet::internals::fuzzing::ib_message),
        ("ib_side", ionet::internals::fuzzing::ib_side),
        ("tcp_session", ionet::internals::fuzzing::tcp_session),
    ] {
        let entries = std::fs::read_dir(dir(target)).unwrap_or_else(|e| panic!("corpus {target}: {e}"));
        let mut n = 0;
        for e in entries {
            let bytes = std::fs::read(e.unwrap().path()).unwrap();
            f(&bytes);
            // Every prefix too: truncation must be as harmless as garbage (a live session is
            // slower per input, so it gets fewer cuts).
            let step = if target == "tcp_session" { 97 } else { 5 };
            for cut in (0..bytes.len()).step_by(step) {
                f(&bytes[..cut]);
            }
            n += 1;
        }
        assert!(n > 0, "empty corpus for {target}");
        replayed += n;
    }
    assert!(replayed >= seeds().len());
}

#[test]
fn seeds_are_valid_inputs() {
    // The seeds decode (so the fuzzer starts from the interesting paths, not from rejects).
    for (target, name, bytes) in seeds() {
        match target {
            "wire_frames" | "handshake" => assert!(Header::decode(&bytes).is_ok(), "{name}"),
            "mem_handle" => assert!(MemHandle::from_bytes(&bytes).is_ok(), "{name}"),
            "ib_message" if name.ends_with("_info") => {}
            "ib_message" => assert!(Header::decode(&bytes[8..]).is_ok(), "{name}"),
            "ib_side" | "tcp_session" => {
                assert!(ionet::internals::wire::scan_stream(&bytes, &LIMITS).is_ok(), "{name}")
            }
            _ => unreachable!(),
        }
    }
}
