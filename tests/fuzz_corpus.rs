//! Replays the committed fuzz corpora (`fuzz/corpus/{wire_frames,handshake,mem_handle}`)
//! through the same entry points the cargo-fuzz targets call, so CI catches regressions on
//! stable Rust. `IONET_WRITE_CORPUS=1 cargo test --test fuzz_corpus` regenerates the seeds.

use std::path::PathBuf;

use ionet::expose::MemHandle;
use ionet::wire::{FLAG_INLINE_DATA, FLAG_PAYLOAD_OUT, Header, Kind};
use ionet::{Access, ServiceLevel};

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
    ];
    for k in kinds {
        let payload: &[u8] =
            if matches!(k, Kind::Eager | Kind::Unexpected | Kind::Data | Kind::Push | Kind::Put) {
                b"payload bytes"
            } else {
                b""
            };
        s.push((
            "wire_frames",
            format!("{k:?}").to_lowercase(),
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
        ("wire_frames", ionet::fuzzing::wire as fn(&[u8])),
        ("handshake", ionet::fuzzing::handshake),
        ("mem_handle", ionet::fuzzing::mem_handle),
    ] {
        let entries = std::fs::read_dir(dir(target)).unwrap_or_else(|e| panic!("corpus {target}: {e}"));
        let mut n = 0;
        for e in entries {
            let bytes = std::fs::read(e.unwrap().path()).unwrap();
            f(&bytes);
            // Every prefix too: truncation must be as harmless as garbage.
            for cut in (0..bytes.len()).step_by(5) {
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
            _ => unreachable!(),
        }
    }
}
