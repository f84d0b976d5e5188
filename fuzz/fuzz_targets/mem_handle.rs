//! ionet: arbitrary peer bytes through `ionet::fuzzing::mem_handle` (no panic, bounded allocation,
//! round trips).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::fuzzing::mem_handle(data);
});
