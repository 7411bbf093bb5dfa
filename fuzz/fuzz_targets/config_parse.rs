#![no_main]
//! The `config_parse` fuzz target; its check is [`cntkio_fuzz::config_parse`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::config_parse(data));
