//! ionet: a live TCP server fed arbitrary frames after an honest handshake, through `ionet::internals::fuzzing::tcp_session` (no panic, bounded allocation).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::internals::fuzzing::tcp_session(data);
});
