//! Replays the committed `fs_proto` and `fs_config` fuzz corpora through the decoder and the
//! parser, so every seed (and every crash input added there later) is checked by `cargo test`
//! without a fuzzer.
//!
//! `STRIPEFS_WRITE_CORPUS=1 cargo test -p stripefs --test fuzz_corpus` rewrites the seeds from
//! `stripefs::proto::sample_messages` after a protocol change.

use std::path::PathBuf;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fs_proto")
}

#[test]
fn corpus_replays_through_the_decoder() {
    if std::env::var_os("STRIPEFS_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(corpus_dir()).unwrap();
        for (name, bytes) in stripefs::proto::sample_messages() {
            std::fs::write(corpus_dir().join(name), bytes).unwrap();
        }
    }
    let mut n = 0;
    for entry in std::fs::read_dir(corpus_dir()).expect("fuzz/corpus/fs_proto exists") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        stripefs::proto::fuzz_one(&data);
        n += 1;
    }
    assert!(n > 0, "empty corpus");
}

#[test]
fn corpus_has_a_seed_for_every_message_shape() {
    if std::env::var_os("STRIPEFS_WRITE_CORPUS").is_some() {
        return; // being rewritten by the other test
    }
    for (name, bytes) in stripefs::proto::sample_messages() {
        let path = corpus_dir().join(name);
        let seed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(seed, bytes, "{name} is stale: rerun with STRIPEFS_WRITE_CORPUS=1");
    }
}

#[test]
fn config_corpus_replays_through_the_parser() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fs_config");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("fuzz/corpus/fs_config exists") {
        stripefs::config::fuzz_one(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "empty corpus");
}
