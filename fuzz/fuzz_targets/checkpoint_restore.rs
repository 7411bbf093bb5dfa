#![no_main]
//! The `checkpoint_restore` fuzz target; its check is [`cntkio_fuzz::checkpoint_restore`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| cntkio_fuzz::checkpoint_restore(data));
