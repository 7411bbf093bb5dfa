#![no_main]
//! The `ctf_parse` fuzz target; its check is [`cntkio_fuzz::ctf_parse`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::ctf_parse(data));
