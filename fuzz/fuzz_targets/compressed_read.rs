#![no_main]
//! The `compressed_read` fuzz target; its check is [`cntkio_fuzz::compressed_read`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::compressed_read(data));
