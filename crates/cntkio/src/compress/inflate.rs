//! Raw deflate decompression that can stop between two blocks and start again there: zlib's `inflate`
//! with `Z_BLOCK`, `inflatePrime`, `inflateSetDictionary` and `inflateGetDictionary`, which flate2 does not
//! expose. They come from zlib-rs, the decompressor behind flate2, whose inflate functions are public with
//! its `__internal-api` feature (the version is pinned in `Cargo.toml` for that reason).
//!
//! The third module of cntkio with `unsafe` code, all of it in [`Inflate`]: the stream is zlib's C-shaped
//! `z_stream`, whose input and output are raw pointers set for the length of one call.
#![allow(unsafe_code)]

use zlib_rs::c_api::z_stream;
use zlib_rs::inflate::{self, InflateConfig, InflateStream};
use zlib_rs::{InflateFlush, ReturnCode};

/// Raw deflate (no zlib or gzip header) with deflate's largest window, 32 KiB.
const RAW: InflateConfig = InflateConfig { window_bits: -15 };

/// `z_stream::data_type` after a call: set when the decoder stopped between two blocks ...
const BETWEEN_BLOCKS: i32 = 128;
/// ... and the block just finished was the stream's last.
const LAST_BLOCK: i32 = 64;
/// Its low bits: how many bits the decoder has taken from the input but not used yet.
const PENDING_BITS: i32 = 63;

/// Where a call stops, besides having filled the output or used the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Only there.
    None,
    /// Also at the end of each block, so that the caller can note the place.
    Block,
}

/// What a call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Input bytes taken (some of their bits may still wait in the decoder: [`Inflate::pending_bits`]).
    pub read: usize,
    /// Output bytes written.
    pub written: usize,
    pub end: Ending,
}

/// Why a call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The deflate stream's last block has ended.
    StreamEnd,
    /// Between two blocks, the stream not ended: a place where decompression can start again.
    Boundary,
    /// The input is used up or the output full.
    More,
}

/// A raw deflate decompressor.
pub(crate) struct Inflate {
    /// Initialised by `inflate::init` (a state is allocated), ended in `drop`.
    z: z_stream,
}

// SAFETY: `z` owns its state allocation alone (zlib-rs declares its `InflateStream`, the same layout, `Send`
// for that reason); its input and output pointers are set in `run` and cleared before it returns, so no
// borrowed memory is reachable from it between calls.
unsafe impl Send for Inflate {}

impl std::fmt::Debug for Inflate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflate").field("total_in", &self.z.total_in).field("total_out", &self.z.total_out).finish()
    }
}

impl Inflate {
    /// A decompressor at the start of a raw deflate stream.
    pub(crate) fn new() -> Result<Inflate, String> {
        let mut z = z_stream::default();
        match inflate::init(&mut z, RAW) {
            ReturnCode::Ok => Ok(Inflate { z }),
            rc => Err(format!("cannot start a deflate decompressor ({rc:?})")),
        }
    }

    /// The stream as zlib-rs's inflate functions take it.
    fn stream(&mut self) -> &mut InflateStream<'_> {
        // SAFETY: `z` is a valid, exclusively borrowed `z_stream` that `inflate::init` initialised (`new`
        // keeps only those) and that is ended only in `drop`; `InflateStream` has `z_stream`'s layout
        // (zlib-rs asserts it), and the result borrows `self`.
        let s = unsafe { InflateStream::from_stream_mut(&mut self.z) };
        s.expect("an initialised inflate stream has a state and an allocator")
    }

    /// Starts a new raw deflate stream (the window emptied).
    pub(crate) fn reset(&mut self) {
        let rc = inflate::reset_with_config(self.stream(), RAW);
        debug_assert_eq!(rc, ReturnCode::Ok);
    }

    /// Starts decompression at a block boundary inside a byte: `value`'s low `bits` bits (1 to 7) are the
    /// unread bits of the byte before the input.
    pub(crate) fn prime(&mut self, bits: u8, value: u8) {
        debug_assert!((1..8).contains(&bits));
        let rc = inflate::prime(self.stream(), i32::from(bits), i32::from(value));
        debug_assert_eq!(rc, ReturnCode::Ok, "a fresh stream has room for 7 bits");
    }

    /// Gives the decompressor the data that preceded its start (at most 32 KiB are kept), for the back
    /// references of the blocks that follow.
    pub(crate) fn set_dictionary(&mut self, window: &[u8]) {
        let rc = inflate::set_dictionary(self.stream(), window);
        debug_assert_eq!(rc, ReturnCode::Ok, "a raw stream takes a dictionary at any time");
    }

    /// The last 32 KiB of the output since the start or the last [`reset`](Self::reset) (all of it when
    /// shorter): what [`set_dictionary`](Self::set_dictionary) needs to resume here.
    pub(crate) fn window(&mut self) -> Vec<u8> {
        let stream = self.stream();
        // SAFETY: with a null destination `get_dictionary` copies nothing and returns the window's length.
        let len = unsafe { inflate::get_dictionary(stream, std::ptr::null_mut()) };
        let mut out = vec![0u8; len];
        // SAFETY: `out` has room for exactly the `len` bytes the window holds, which is what it copies.
        let copied = unsafe { inflate::get_dictionary(stream, out.as_mut_ptr()) };
        debug_assert_eq!(copied, len);
        out
    }

    /// Bits taken from the input that the decoder holds unused: after [`Ending::Boundary`], the next block
    /// starts that many bits before the end of the input read; after [`Ending::StreamEnd`] a multiple of 8
    /// (the deflate data ends on a byte), the bytes after it.
    pub(crate) fn pending_bits(&self) -> u64 {
        (self.z.data_type & PENDING_BITS) as u64
    }

    /// Decompresses from `input` into `output` until either is used up, the stream ends, or (with
    /// [`Flush::Block`]) a block ends. Damaged data is an error with zlib's message.
    pub(crate) fn run(&mut self, input: &[u8], output: &mut [u8], flush: Flush) -> Result<Step, String> {
        // zlib counts in 32 bits; a larger buffer is used in part, as a short call.
        let (in_len, out_len) = (input.len().min(u32::MAX as usize), output.len().min(u32::MAX as usize));
        self.z.next_in = input.as_ptr();
        self.z.avail_in = in_len as u32;
        self.z.next_out = output.as_mut_ptr();
        self.z.avail_out = out_len as u32;
        let flush = match flush {
            Flush::None => InflateFlush::NoFlush,
            Flush::Block => InflateFlush::Block,
        };
        // SAFETY: `next_in`/`avail_in` describe bytes of `input` and `next_out`/`avail_out` bytes of `output`,
        // both borrowed for this call; the stream is initialised (see `stream`), and zlib-rs keeps no pointer
        // into either after the call (the pointers are cleared below all the same).
        let rc = unsafe { inflate::inflate(self.stream(), flush) };
        let step = Step {
            read: in_len - self.z.avail_in as usize,
            written: out_len - self.z.avail_out as usize,
            end: Ending::More,
        };
        self.z.next_in = std::ptr::null();
        self.z.avail_in = 0;
        self.z.next_out = std::ptr::null_mut();
        self.z.avail_out = 0;
        let between = self.z.data_type & (BETWEEN_BLOCKS | LAST_BLOCK) == BETWEEN_BLOCKS;
        match rc {
            ReturnCode::StreamEnd => Ok(Step { end: Ending::StreamEnd, ..step }),
            ReturnCode::Ok | ReturnCode::BufError if between => Ok(Step { end: Ending::Boundary, ..step }),
            ReturnCode::Ok | ReturnCode::BufError => Ok(step),
            ReturnCode::DataError => Err(format!("corrupt deflate data: {}", self.message())),
            rc => Err(format!("deflate decompression failed: {rc:?} ({})", self.message())),
        }
    }

    /// zlib's message for the last error.
    fn message(&self) -> String {
        if self.z.msg.is_null() {
            return "no message".into();
        }
        // SAFETY: zlib-rs sets `msg` to null or to one of its static, NUL-terminated messages.
        let msg = unsafe { std::ffi::CStr::from_ptr(self.z.msg) };
        msg.to_string_lossy().into_owned()
    }
}

impl Drop for Inflate {
    fn drop(&mut self) {
        inflate::end(self.stream());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::io::Write;

    fn deflate(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// CTF-like text of `n` bytes with numbers from a generator.
    pub(crate) fn text(n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 32);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        while out.len() < n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let line = format!("{} |x {} {}.{}\n", (x >> 60) % 7, (x >> 40) % 1000, (x >> 20) % 100, (x >> 8) % 1000);
            out.extend_from_slice(line.as_bytes());
        }
        out.truncate(n);
        out
    }

    /// A block boundary: bit offset, output offset, window.
    type Mark = (u64, usize, Vec<u8>);

    /// Decompresses the whole of `z` through `Block` flushes, noting each boundary.
    fn boundaries(z: &[u8], out_len: usize) -> (Vec<u8>, Vec<Mark>) {
        let mut d = Inflate::new().unwrap();
        let mut out = vec![0u8; out_len];
        let (mut i, mut o) = (0, 0);
        let mut marks = Vec::new();
        loop {
            // Small pieces of input and output, so that calls stop for each reason.
            let step =
                d.run(&z[i..(i + 999).min(z.len())], &mut out[o..(o + 7777).min(out_len)], Flush::Block).unwrap();
            i += step.read;
            o += step.written;
            match step.end {
                Ending::StreamEnd => break,
                Ending::Boundary => marks.push((i as u64 * 8 - d.pending_bits(), o, d.window())),
                Ending::More => assert!(step.read + step.written > 0, "progress"),
            }
        }
        assert_eq!(d.pending_bits() % 8, 0, "the stream ends on a byte");
        assert_eq!(i as u64 - d.pending_bits() / 8, z.len() as u64, "the stream's end is found");
        out.truncate(o);
        (out, marks)
    }

    /// From every block boundary, a fresh decompressor primed with the bits before it and given the
    /// window decompresses the rest of the stream exactly.
    #[test]
    fn decompression_resumes_at_every_block_boundary() {
        for level in [0, 1, 6, 9] {
            // zlib-rs's level 1 makes blocks of about a MiB of output.
            let data = text(1_500_000);
            let z = deflate(&data, level);
            let (out, marks) = boundaries(&z, data.len());
            assert!(out == data, "level {level}");
            assert!(marks.len() >= if level == 1 { 1 } else { 10 }, "level {level}: {} boundaries", marks.len());
            assert!(marks.iter().any(|(bit, ..)| bit % 8 != 0) || level < 2, "level {level}: inside a byte");
            let every = marks.len().div_ceil(12);
            for (bit, at, window) in marks.into_iter().step_by(every) {
                assert_eq!(window, data[at.saturating_sub(32 << 10)..at], "level {level}");
                let mut d = Inflate::new().unwrap();
                let (byte, skip) = ((bit / 8) as usize, (bit % 8) as u8);
                let from = if skip > 0 {
                    d.prime(8 - skip, z[byte] >> skip);
                    byte + 1
                } else {
                    byte
                };
                d.set_dictionary(&window);
                let mut rest = vec![0u8; data.len() - at];
                let step = d.run(&z[from..], &mut rest, Flush::None).unwrap();
                assert_eq!(step.end, Ending::StreamEnd, "level {level} at {at}");
                assert!(rest[..step.written] == data[at..], "level {level} at {at}");
            }
        }
    }

    #[test]
    fn damaged_data_is_an_error_with_zlibs_message() {
        let mut d = Inflate::new().unwrap();
        let e = d.run(&[0xff; 16], &mut [0u8; 64], Flush::None).unwrap_err();
        assert!(e.starts_with("corrupt deflate data: invalid"), "{e}");
    }
}
