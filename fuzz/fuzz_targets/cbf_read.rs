#![no_main]
//! The `cbf_read` fuzz target; its check is [`cntkio_fuzz::cbf_read`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::cbf_read(data));
