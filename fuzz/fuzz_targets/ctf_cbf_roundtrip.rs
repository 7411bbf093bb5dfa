#![no_main]
//! The `ctf_cbf_roundtrip` fuzz target; its check is [`cntkio_fuzz::ctf_cbf_roundtrip`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::ctf_cbf_roundtrip(data));
