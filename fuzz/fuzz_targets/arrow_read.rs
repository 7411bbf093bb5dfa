#![no_main]
//! The `arrow_read` fuzz target; its check is [`cntkio_fuzz::arrow_read`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::arrow_read(data));
