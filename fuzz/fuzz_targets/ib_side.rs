//! ionet: a whole InfiniBand side-channel conversation (handshake, then IB_INFO), through `ionet::internals::fuzzing::ib_side` (no panic, bounded allocation).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::internals::fuzzing::ib_side(data);
});
