#![no_main]
//! The `index_cache` fuzz target; its check is [`cntkio_fuzz::index_cache`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::index_cache(data));
