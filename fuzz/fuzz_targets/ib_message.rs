//! ionet: InfiniBand engine messages, segment lists, queue-pair and IB_INFO records, through `ionet::internals::fuzzing::ib_message` (no panic, bounded allocation).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ionet::internals::fuzzing::ib_message(data);
});
