//! The frames view: BGZF blocks and zstd frames of known sizes, decompressed on demand.

use super::walk::Frame;
use super::{Compression, Source};
use crate::Error;
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many decompressed bytes of recently read frames are kept: a read that ends inside a frame leaves
/// it here for the next read, which starts there.
const CACHE_BYTES: u64 = 128 << 20;

/// A compressed file read by its frames.
#[derive(Debug)]
pub(crate) struct Frames {
    file: Source,
    compression: Compression,
    frames: Vec<Frame>,
    len: u64,
    path: String,
    cache: Mutex<Cache>,
}

#[derive(Debug, Default)]
struct Cache {
    frames: HashMap<usize, (Arc<Vec<u8>>, u64)>,
    bytes: u64,
    clock: u64,
}

impl Cache {
    fn get(&mut self, k: usize) -> Option<Arc<Vec<u8>>> {
        self.clock += 1;
        let clock = self.clock;
        self.frames.get_mut(&k).map(|(d, used)| {
            *used = clock;
            d.clone()
        })
    }
    fn put(&mut self, k: usize, d: Arc<Vec<u8>>) {
        self.clock += 1;
        self.bytes += d.len() as u64;
        if let Some((old, _)) = self.frames.insert(k, (d, self.clock)) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > CACHE_BYTES && self.frames.len() > 1 {
            let oldest = self.frames.iter().min_by_key(|(_, (_, used))| *used).map(|(&k, _)| k);
            if let Some((d, _)) = oldest.and_then(|k| self.frames.remove(&k)) {
                self.bytes -= d.len() as u64;
            }
        }
    }
}

/// One frame's part of a read: `frame`'s bytes `from..from + dst.len()`.
struct Piece<'a> {
    frame: usize,
    from: usize,
    dst: &'a mut [u8],
}

impl Frames {
    pub(crate) fn new(file: Source, compression: Compression, frames: Vec<Frame>, path: String) -> Frames {
        let len = frames.last().map_or(0, |f| f.out_off + f.out_len);
        Frames { file, compression, frames, len, path, cache: Mutex::new(Cache::default()) }
    }

    pub(crate) fn count(&self) -> usize {
        self.frames.len()
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Reads up to `buf.len()` bytes at `offset`: the frames it covers are decompressed in parallel, each
    /// whole one straight into `buf`.
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        if offset >= self.len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(self.len - offset) as usize;
        let first = self.frames.partition_point(|f| f.out_off + f.out_len <= offset);
        let mut pieces = Vec::new();
        let mut rest = &mut buf[..n];
        let mut at = offset;
        for (k, f) in self.frames.iter().enumerate().skip(first) {
            if rest.is_empty() {
                break;
            }
            let from = (at - f.out_off) as usize;
            let take = rest.len().min(f.out_len as usize - from);
            let (dst, tail) = rest.split_at_mut(take);
            pieces.push(Piece { frame: k, from, dst });
            rest = tail;
            at += take as u64;
        }
        if pieces.len() > 1 {
            pieces.into_par_iter().try_for_each(|p| self.fill(p))?;
        } else {
            pieces.into_iter().try_for_each(|p| self.fill(p))?;
        }
        Ok(n)
    }

    /// Fills a piece: from the cache, by decompressing the whole frame into it, or by decompressing the
    /// frame into the cache and copying.
    fn fill(&self, p: Piece<'_>) -> Result<(), Error> {
        let f = self.frames[p.frame];
        if p.from == 0 && p.dst.len() as u64 == f.out_len {
            // Wholly inside the read: nothing is kept (a sequential pass does not come back to it).
            return self.decode(&f, p.dst);
        }
        let cached = self.cache.lock().expect("lock").get(p.frame);
        let data = match cached {
            Some(d) => d,
            None => {
                let mut d = vec![0u8; f.out_len as usize];
                self.decode(&f, &mut d)?;
                let d = Arc::new(d);
                self.cache.lock().expect("lock").put(p.frame, d.clone());
                d
            }
        };
        let len = p.dst.len();
        p.dst.copy_from_slice(&data[p.from..p.from + len]);
        Ok(())
    }

    /// Decompresses frame `f` into `dst` (exactly its decompressed length).
    fn decode(&self, f: &Frame, dst: &mut [u8]) -> Result<(), Error> {
        let bad = |problem: String| {
            Error::compressed(self.compression.name(), Some(f.comp_off), problem).with_path(self.path.clone())
        };
        let mut src = vec![0u8; f.comp_len as usize];
        self.file.read_exact_at(&mut src, f.comp_off).map_err(|e| {
            Error::io(format!("cannot read {} bytes at byte {} of {}", f.comp_len, f.comp_off, self.path), e)
        })?;
        match self.compression {
            Compression::Bgzf => inflate_block(&src, dst).map_err(bad),
            _ => unzstd_frame(&src, dst).map_err(bad),
        }
    }
}

/// Decompresses a BGZF block's deflate data and checks its trailer (CRC-32 and size) against `dst`.
fn inflate_block(src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    thread_local! {
        static INFLATE: RefCell<flate2::Decompress> = RefCell::new(flate2::Decompress::new(false));
    }
    let (data, trailer) = src.split_at(src.len() - 8);
    INFLATE.with(|d| {
        let mut d = d.borrow_mut();
        d.reset(false);
        match d.decompress(data, dst, flate2::FlushDecompress::Finish) {
            Ok(flate2::Status::StreamEnd) if d.total_out() == dst.len() as u64 && d.total_in() == data.len() as u64 => {
            }
            Ok(_) => return Err("the block's deflate data does not end where the block does".into()),
            Err(e) => return Err(format!("corrupt deflate data: {e}")),
        }
        let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        if crc32fast::hash(dst) != crc {
            return Err("CRC-32 mismatch: the block is damaged".into());
        }
        Ok(())
    })
}

/// Decompresses one zstd frame into `dst`, which must be filled exactly.
fn unzstd_frame(src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    thread_local! {
        static UNZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    }
    UNZSTD.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        let d = d.as_mut().expect("set above");
        match d.decompress_to_buffer(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(format!("the frame holds {n} bytes, not the {} it declares", dst.len())),
            Err(e) => Err(e.to_string()),
        }
    })
}
