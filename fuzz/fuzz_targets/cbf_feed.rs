#![no_main]
//! The `cbf_feed` fuzz target; its check is [`cntkio_fuzz::cbf_feed`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::cbf_feed(data));
