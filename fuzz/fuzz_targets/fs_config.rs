//! Parses arbitrary bytes as a cluster file: no panic, only typed errors.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    stripefs::config::fuzz_one(data);
});
