//! Where a [`CbfWriter`](super::CbfWriter)'s bytes go: page-aligned staging buffers handed to a
//! background thread that writes them at their offsets, with `O_DIRECT` on Linux where the file system
//! allows it.
//!
//! Why: on many machines the cost of a large write is not the disk but the page cache, whose fresh pages
//! the kernel must allocate and fill (and which a virtual machine may have to fault in from its host):
//! writing 1 GB through the page cache took over a second of system time in measurements, against a
//! twentieth of that with direct I/O from a few reused buffers. The write thread also lets the device
//! work while the caller encodes the next bytes.
//!
//! Direct I/O needs buffers, offsets and lengths aligned to the device's block size: every buffer is
//! [`BUF`] bytes at a 4 KiB-aligned address and is written at a multiple of [`BUF`]; the last one is
//! padded with zeros to 4 KiB and the caller truncates the file to [`Sink::finish`]'s length. When
//! direct I/O cannot be used (another system, a file system that refuses the flag or the alignment, or
//! `CNTKIO_DIRECT_IO=0` in the environment) the same buffers are written through the page cache.

use crossbeam_channel::{unbounded, Receiver, Sender};
use std::fs::File;
use std::io;
use std::path::Path;
use std::thread::JoinHandle;

/// Bytes per staging buffer (a multiple of [`ALIGN`]).
pub(crate) const BUF: usize = 2 << 20;
/// Alignment of direct I/O buffers, offsets and lengths.
const ALIGN: usize = 4096;
/// Staging buffers at most: one being filled, one being written, one queued.
const POOL: usize = 3;

/// A staging buffer: `BUF` bytes at an `ALIGN`-aligned address inside a vector (the vector's heap
/// block never moves, so the offset stays valid when the buffer is sent to the write thread).
struct Buf {
    v: Vec<u8>,
    off: usize,
}

impl Buf {
    fn new() -> Buf {
        let v = vec![0u8; BUF + ALIGN];
        // When the offset cannot be computed the buffer is unaligned: direct writes then fail with
        // EINVAL and the writer falls back to the page cache.
        let off = v.as_ptr().align_offset(ALIGN).min(ALIGN);
        Buf { v, off }
    }
    fn bytes(&self) -> &[u8] {
        &self.v[self.off..self.off + BUF]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + BUF]
    }
}

/// The files the write thread writes through.
struct Files {
    plain: File,
    direct: Option<File>,
}

impl Files {
    /// Writes `buf` at `at`: directly when possible (the first refusal switches to the page cache for
    /// good; the buffer is then rewritten whole, so a partial direct write does no harm).
    fn write_at(&mut self, buf: &[u8], at: u64) -> io::Result<()> {
        if let Some(d) = &self.direct {
            match write_all_at(d, buf, at) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                    log::debug!("direct I/O refused ({e}); writing through the page cache");
                    self.direct = None;
                }
                Err(e) => return Err(e),
            }
        }
        write_all_at(&self.plain, buf, at)
    }
}

#[cfg(unix)]
fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(f, buf, at)
}

#[cfg(not(unix))]
fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = f;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(buf)
}

/// Opens `path` again for direct writes, if this system and file system allow it.
fn open_direct(path: &Path) -> Option<File> {
    if std::env::var_os("CNTKIO_DIRECT_IO").is_some_and(|v| v == "0") {
        return None;
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        None
    }
}

/// The write thread, started when the first buffer is full.
struct Worker {
    tx: Sender<(Buf, usize, u64)>,
    free: Receiver<Buf>,
    handle: JoinHandle<io::Result<()>>,
}

/// A sequential writer of one file through staging buffers (see the module documentation).
pub(crate) struct Sink {
    cur: Buf,
    len: usize,
    /// File offset of `cur`'s first byte.
    at: u64,
    /// Buffers made so far (at most [`POOL`]).
    made: usize,
    /// The files, until the write thread takes them.
    files: Option<Files>,
    worker: Option<Worker>,
    /// Records that straddle two buffers are built here.
    tmp: Vec<u8>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").field("position", &self.position()).finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink writing `file` (open for writing at `path`) from offset 0; `direct` asks for direct I/O.
    pub(crate) fn new(file: &File, path: &Path, direct: bool) -> io::Result<Sink> {
        let plain = file.try_clone()?;
        let direct = if direct { open_direct(path) } else { None };
        Ok(Sink {
            cur: Buf::new(),
            len: 0,
            at: 0,
            made: 1,
            files: Some(Files { plain, direct }),
            worker: None,
            tmp: Vec::new(),
        })
    }

    /// Bytes put so far (the file offset of the next byte).
    pub(crate) fn position(&self) -> u64 {
        self.at + self.len as u64
    }

    /// Appends `bytes`.
    pub(crate) fn put(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(BUF - self.len);
            self.cur.bytes_mut()[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
            if self.len == BUF {
                self.send_full()?;
            }
        }
        Ok(())
    }

    /// Appends `len` bytes that `fill` writes (in place when they fit in the current buffer). If `fill`
    /// fails nothing is appended and its error is returned as `Ok(Err(e))`.
    #[inline]
    pub(crate) fn put_with<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> io::Result<Result<(), E>> {
        if len <= BUF - self.len {
            let r = fill(&mut self.cur.bytes_mut()[self.len..self.len + len]);
            if r.is_ok() {
                self.len += len;
                if self.len == BUF {
                    self.send_full()?;
                }
            }
            return Ok(r);
        }
        let mut tmp = std::mem::take(&mut self.tmp);
        tmp.clear();
        tmp.resize(len, 0);
        let r = fill(&mut tmp);
        let w = if r.is_ok() { self.put(&tmp) } else { Ok(()) };
        if tmp.capacity() <= BUF {
            self.tmp = tmp;
        }
        w.map(|()| r)
    }

    /// Hands the full current buffer to the write thread (starting it if needed) and takes an empty one.
    fn send_full(&mut self) -> io::Result<()> {
        if self.worker.is_none() {
            let mut files = self.files.take().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
            let (tx, rx) = unbounded::<(Buf, usize, u64)>();
            let (free_tx, free) = unbounded::<Buf>();
            let handle = std::thread::Builder::new().name("cntkio-cbf-write".into()).spawn(move || {
                for (buf, len, at) in rx {
                    files.write_at(&buf.bytes()[..len], at)?;
                    let _ = free_tx.send(buf);
                }
                Ok(())
            })?;
            self.worker = Some(Worker { tx, free, handle });
        }
        let next = self.take_buffer()?;
        let full = std::mem::replace(&mut self.cur, next);
        let w = self.worker.as_ref().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
        if w.tx.send((full, BUF, self.at)).is_err() {
            return Err(self.worker_error());
        }
        self.at += BUF as u64;
        self.len = 0;
        Ok(())
    }

    /// An empty buffer: a new one while fewer than [`POOL`] exist, else one the write thread is done with.
    fn take_buffer(&mut self) -> io::Result<Buf> {
        let w = self.worker.as_ref().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
        if let Ok(b) = w.free.try_recv() {
            return Ok(b);
        }
        if self.made < POOL {
            self.made += 1;
            return Ok(Buf::new());
        }
        match w.free.recv() {
            Ok(b) => Ok(b),
            Err(_) => Err(self.worker_error()),
        }
    }

    /// The write thread's error (it stopped).
    fn worker_error(&mut self) -> io::Error {
        match self.worker.take() {
            Some(w) => {
                drop(w.tx);
                match w.handle.join() {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => io::Error::other("the CBF write thread stopped"),
                    Err(_) => io::Error::other("the CBF write thread panicked"),
                }
            }
            None => io::Error::other("the CBF output is closed"),
        }
    }

    /// Writes what is left (the last buffer, zero-padded to the alignment), waits for every write and
    /// returns the number of bytes put: the caller truncates the file to it.
    pub(crate) fn finish(mut self) -> io::Result<u64> {
        let total = self.position();
        let padded = self.len.div_ceil(ALIGN) * ALIGN;
        let len = self.len;
        self.cur.bytes_mut()[len..padded].fill(0);
        match self.worker.take() {
            None => {
                let mut files = self.files.take().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
                if padded > 0 {
                    files.write_at(&self.cur.bytes()[..padded], self.at)?;
                }
            }
            Some(w) => {
                let last = std::mem::replace(&mut self.cur, Buf { v: Vec::new(), off: 0 });
                let sent = padded == 0 || w.tx.send((last, padded, self.at)).is_ok();
                drop(w.tx);
                let r = w.handle.join().map_err(|_| io::Error::other("the CBF write thread panicked"))?;
                r?;
                if !sent {
                    return Err(io::Error::other("the CBF write thread stopped"));
                }
            }
        }
        Ok(total)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // Abandoned (the writer was dropped or failed): let the thread finish what it has and stop.
        if let Some(w) = self.worker.take() {
            drop(w.tx);
            let _ = w.handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(direct: bool, pieces: &[usize]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mut sink = Sink::new(&file, &path, direct).unwrap();
        let mut expect = Vec::new();
        let mut k = 0u8;
        for &n in pieces {
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    k = k.wrapping_add(7);
                    k
                })
                .collect();
            if n % 2 == 0 {
                sink.put(&bytes).unwrap();
            } else {
                sink.put_with(n, |d: &mut [u8]| -> Result<(), ()> {
                    d.copy_from_slice(&bytes);
                    Ok(())
                })
                .unwrap()
                .unwrap();
                // A failing fill appends nothing.
                assert!(sink.put_with(3, |_: &mut [u8]| Err(())).unwrap().is_err());
            }
            expect.extend_from_slice(&bytes);
            assert_eq!(sink.position(), expect.len() as u64);
        }
        let n = sink.finish().unwrap();
        assert_eq!(n, expect.len() as u64);
        file.set_len(n).unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect);
        got
    }

    #[test]
    fn bytes_arrive_in_order_with_and_without_direct_io() {
        for direct in [false, true] {
            run(direct, &[]);
            run(direct, &[12]);
            run(direct, &[4095, 1, 4097]);
            run(direct, &[BUF - 1, 1, BUF, 3 * BUF + 5, 17]);
            run(direct, &[1001; 10_000]);
            run(direct, &[7, BUF + 1, 2 * BUF + 3, 2, 5 * BUF]);
        }
    }
}
