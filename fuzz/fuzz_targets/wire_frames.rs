//! ionet: arbitrary peer bytes through `ionet::fuzzing::wire` (no panic, bounded allocation,
//! round trips).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::fuzzing::wire(data);
});
