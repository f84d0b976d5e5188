//! ionet: arbitrary peer bytes through `ionet::internals::fuzzing::wire` (no panic, bounded allocation,
//! round trips).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::internals::fuzzing::wire(data);
});
