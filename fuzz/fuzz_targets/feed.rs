#![no_main]
//! The `feed` fuzz target; its check is [`cntkio_fuzz::feed`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::feed(data));
