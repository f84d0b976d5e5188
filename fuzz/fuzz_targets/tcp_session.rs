//! ionet: a live TCP server fed arbitrary frames after an honest handshake, through `ionet::fuzzing::tcp_session` (no panic, bounded allocation).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::fuzzing::tcp_session(data);
});
