//! Decodes arbitrary bytes as every stripefs message kind: no panic, bounded allocation, and
//! whatever decodes round-trips (see `stripefs::proto::fuzz_one`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    stripefs::proto::fuzz_one(data);
});
