//! Where a [`CbfWriter`](super::CbfWriter)'s bytes go: the writer fills [`Segment`]s (pieces of up to
//! [`SEG`] bytes, taken from a pool) and hands them over in file order; a background thread copies them
//! into page-aligned staging buffers and gives the segments back to the pool, and [`IO_THREADS`] I/O
//! threads write the full staging buffers at their offsets, with `O_DIRECT` on Linux where the file
//! system allows it. With [`STAGES`] buffers on their way the disk is kept busy while the next one is
//! filled (with one thread doing both, the disk waited during every copy), and with two writes in
//! flight it has the next one while a finished write's thread waits for a core (on busy cores one write in
//! flight leaves the disk idle whenever its thread is not scheduled). The file's
//! blocks are allocated ahead of the writes, on a thread of their own (see `Allocator`).
//!
//! Why direct I/O: on many machines the cost of a large write is not the disk but the page cache, whose
//! fresh pages the kernel must allocate and fill (and which a virtual machine may have to fault in from
//! its host), while a direct write from a reused buffer hands the device pages that already exist.
//!
//! Records instead of segments ([`Sink::pass_records`]): the writer may also hand over data whose records
//! the background thread encodes itself, straight into the staging buffer, which saves a copy of every
//! byte of them (the writer does so for the largest stream of data it was given to keep, see
//! `CbfWriter::write_owned`).
//!
//! Why segments: a CBF chunk is written stream after stream, so none of its bytes can go out before the
//! chunk is complete, and then all of them go at once. Segments let the writer encode each sequence as
//! it arrives (no parsed data is kept) and let the write thread free the finished chunk piece by piece:
//! as the disk drains a chunk faster than a parser fills the next, the memory in flight stays near one
//! chunk, and the writer waits for the disk only when it runs [`SPARE_SEGMENTS`] segments ahead of it.
//! Small pieces (a small chunk's sections, meta counts, the header) are gathered into one segment first,
//! so that a file of many small chunks costs a copy per piece, not a trip through the write thread.
//!
//! Direct I/O needs buffers, offsets and lengths aligned to the device's block size: the staging buffer
//! is [`BUF`] bytes at a 4 KiB-aligned address and is written at a multiple of [`BUF`]; the last one is
//! padded with zeros to 4 KiB and the caller truncates the file to [`Sink::finish`]'s length. When
//! direct I/O cannot be used (another system, a file system that refuses the flag or the alignment, or
//! `CNTKIO_DIRECT_IO=0` in the environment) the same buffer is written through the page cache.

use crossbeam_channel::{unbounded, Receiver, Sender};
use std::fs::File;
use std::io;
use std::path::Path;
use std::thread::JoinHandle;

/// Bytes per staging buffer (a multiple of [`ALIGN`]).
pub(crate) const BUF: usize = 2 << 20;
/// Alignment of direct I/O buffers, offsets and lengths.
const ALIGN: usize = 4096;
/// Bytes per pooled segment.
pub(crate) const SEG: usize = 1 << 20;
/// Segments the writer may fill beyond those of the chunk it is encoding before it waits for the disk.
pub(crate) const SPARE_SEGMENTS: usize = 8;
/// Staging buffers on their way to the disk while the next one is filled.
const STAGES: usize = 3;
/// Threads writing staging buffers (writes in flight).
const IO_THREADS: usize = 2;
/// Segments of at most this many bytes are copied together before they go out (see [`Sink::pass`]).
pub(crate) const SMALL: usize = 64 << 10;

/// A staging buffer: `BUF` bytes at an `ALIGN`-aligned address, at the start of a huge page of an
/// anonymous map where the system gives one (else inside a vector).
///
/// Why huge pages: a direct write hands the device the buffer's pages, and a device takes a limited number
/// of separate pieces per request (`max_segments`, 254 on a typical virtio disk): 2 MiB of scattered 4 KiB
/// pages go out as two or three requests, 2 MiB of one huge page as one. Pinning one page instead of 512
/// also costs the I/O threads less.
struct Buf {
    mem: BufMem,
    off: usize,
}

enum BufMem {
    Map(memmap2::MmapMut),
    Vec(Vec<u8>),
}

/// A huge page (x86-64, and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;

impl Buf {
    fn new() -> Buf {
        // A map of a huge page more than needed holds an aligned huge page whatever address it gets; the
        // rest of it is never touched, so it takes no memory.
        if let Ok(map) = memmap2::MmapMut::map_anon(BUF + HUGE) {
            let off = map.as_ptr().align_offset(HUGE).min(HUGE);
            // Only a hint: without it (another system, huge pages turned off) the buffer is as before.
            #[cfg(target_os = "linux")]
            let _ = map.advise_range(memmap2::Advice::HugePage, off, BUF);
            return Buf { mem: BufMem::Map(map), off };
        }
        let v = vec![0u8; BUF + ALIGN];
        // When the offset cannot be computed the buffer is unaligned: direct writes then fail with
        // EINVAL and the writer falls back to the page cache.
        let off = v.as_ptr().align_offset(ALIGN).min(ALIGN);
        Buf { mem: BufMem::Vec(v), off }
    }
    fn bytes(&self) -> &[u8] {
        match &self.mem {
            BufMem::Map(m) => &m[self.off..self.off + BUF],
            BufMem::Vec(v) => &v[self.off..self.off + BUF],
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.mem {
            BufMem::Map(m) => &mut m[self.off..self.off + BUF],
            BufMem::Vec(v) => &mut v[self.off..self.off + BUF],
        }
    }
}

/// Bytes on their way to the file: a buffer (zeroed when made, so no byte is ever uninitialised) of
/// which the first `len` are filled.
pub(crate) struct Segment {
    buf: Box<[u8]>,
    len: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("len", &self.len).field("size", &self.buf.len()).finish()
    }
}

impl Segment {
    fn new(size: usize) -> Segment {
        Segment { buf: vec![0u8; size].into_boxed_slice(), len: 0 }
    }
    /// Bytes still free.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        self.buf.len() - self.len
    }
    /// The bytes filled so far.
    pub(crate) fn filled(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// Appends what `fill` writes into the front of the free bytes: it returns how many items it wrote
    /// and their bytes, which this returns and appends (nothing if it fails).
    #[inline]
    pub(crate) fn append_fitting<E>(
        &mut self,
        fill: impl FnOnce(&mut [u8]) -> Result<(usize, usize), E>,
    ) -> Result<usize, E> {
        let (k, n) = fill(&mut self.buf[self.len..])?;
        debug_assert!(n <= self.room());
        self.len += n.min(self.room());
        Ok(k)
    }
    /// Appends as much of `bytes` as fits; returns how many.
    pub(crate) fn append(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.room());
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        n
    }
    fn pooled(&self) -> bool {
        self.buf.len() == SEG
    }
}

/// Records the write thread encodes itself, straight into its staging buffers, in order (see
/// [`Sink::pass_records`]): the bytes of a large stream section then go from the caller's data to the
/// staging buffer in one copy instead of two (through a segment first). The value is dropped on the write
/// thread once its records are staged, which is when the caller's data can be given back.
pub(crate) trait Records: Send {
    /// Number of records.
    fn count(&self) -> usize;
    /// Bytes of record `i`.
    fn record_len(&self, i: usize) -> usize;
    /// Writes record `i` into `dst`, which is [`Records::record_len`] bytes long.
    fn encode(&self, i: usize, dst: &mut [u8]) -> Result<(), String>;
    /// Writes records `i..` one after the other into the front of `dst`, as many whole ones as fit:
    /// how many, and their bytes (none when record `i` does not fit). One record at a time by default.
    fn encode_fitting(&self, i: usize, dst: &mut [u8]) -> Result<(usize, usize), String> {
        let (mut k, mut at) = (i, 0usize);
        while k < self.count() && self.record_len(k) <= dst.len() - at {
            let len = self.record_len(k);
            self.encode(k, &mut dst[at..at + len])?;
            (k, at) = (k + 1, at + len);
        }
        Ok((k - i, at))
    }
    /// Bytes of all the records.
    fn len(&self) -> u64;
}

/// What the writer hands the write thread, in file order.
enum Item {
    Segment(Segment),
    Records(Box<dyn Records>),
}

/// What the write thread gives back: a segment it is done with, or the length of records it staged.
enum Back {
    Segment(Segment),
    Records(u64),
}

/// The I/O threads stopped (their error is in their join handles).
struct Stopped;

/// The write thread's staging: the buffer being filled and the way to the I/O threads.
struct Stager {
    stage: Buf,
    /// Bytes of `stage` filled.
    fill: usize,
    /// File offset of `stage`.
    at: u64,
    /// Staging buffers made.
    made: usize,
    full_tx: Sender<(Buf, usize, u64)>,
    empty_rx: Receiver<Buf>,
    allocator: Allocator,
}

impl Stager {
    /// The unfilled part of the staging buffer (never empty).
    #[inline]
    fn room(&mut self) -> &mut [u8] {
        &mut self.stage.bytes_mut()[self.fill..]
    }

    /// `n` bytes of [`Stager::room`] were filled: a full buffer goes to the I/O threads.
    #[inline]
    fn filled(&mut self, n: usize) -> Result<(), Stopped> {
        self.fill += n;
        if self.fill < BUF {
            return Ok(());
        }
        let next = match self.empty_rx.try_recv() {
            Ok(b) => b,
            Err(_) if self.made < STAGES + 1 => {
                self.made += 1;
                Buf::new()
            }
            Err(_) => self.empty_rx.recv().map_err(|_| Stopped)?,
        };
        let full = std::mem::replace(&mut self.stage, next);
        self.allocator.wrote(self.at + BUF as u64);
        self.full_tx.send((full, BUF, self.at)).map_err(|_| Stopped)?;
        self.at += BUF as u64;
        self.fill = 0;
        Ok(())
    }

    /// Copies `bytes` after those staged before.
    fn put(&mut self, mut bytes: &[u8]) -> Result<(), Stopped> {
        while !bytes.is_empty() {
            let room = self.room();
            let n = bytes.len().min(room.len());
            room[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.filled(n)?;
        }
        Ok(())
    }

    /// The end: the last bytes, zero-padded to the alignment.
    fn finish(mut self) -> Result<(), Stopped> {
        let padded = self.fill.div_ceil(ALIGN) * ALIGN;
        let fill = self.fill;
        self.stage.bytes_mut()[fill..padded].fill(0);
        if padded > 0 {
            self.full_tx.send((self.stage, padded, self.at)).map_err(|_| Stopped)?;
        }
        Ok(())
    }
}

/// The files an I/O thread writes through.
struct Files {
    plain: File,
    direct: Option<File>,
}

/// Allocates the output's blocks ahead of the writes, on a thread of its own, [`ALLOCATE_STEP`] bytes at
/// a time (`fallocate`, which also moves the file's size: the caller truncates it to the bytes
/// written). Writes into allocated blocks within the file's size do not each extend the file, which
/// costs a journaled size update per write. The thread keeps [`ALLOCATE_AHEAD`] bytes allocated beyond
/// the last write: a call usually takes a few milliseconds but sometimes waits tens of milliseconds for
/// the file system's journal, and made between two writes it would leave the disk without work for that
/// long. Best effort: where the
/// system or the file system cannot, the writes extend the file as before. A write beyond the allocated
/// blocks (the thread late) is correct too, only slower: the kernel orders the two on the file.
struct Allocator {
    /// Where the writes have got to (the thread allocates ahead of the latest).
    tx: Option<Sender<u64>>,
    handle: Option<JoinHandle<()>>,
}

/// Bytes allocated at a time.
const ALLOCATE_STEP: u64 = 64 << 20;
/// Bytes kept allocated beyond the writes.
const ALLOCATE_AHEAD: u64 = 2 * ALLOCATE_STEP;

impl Allocator {
    fn new(file: File) -> Allocator {
        let (tx, rx) = unbounded::<u64>();
        let spawned = std::thread::Builder::new().name("cntkio-cbf-alloc".into()).spawn(move || {
            let mut done = 0u64;
            while let Ok(mut end) = rx.recv() {
                // Only the latest position matters.
                while let Ok(e) = rx.try_recv() {
                    end = end.max(e);
                }
                let want = end.saturating_add(ALLOCATE_AHEAD);
                while done < want {
                    if !allocate(&file, done, ALLOCATE_STEP) {
                        return;
                    }
                    done += ALLOCATE_STEP;
                }
            }
        });
        match spawned {
            Ok(h) => Allocator { tx: Some(tx), handle: Some(h) },
            Err(_) => Allocator { tx: None, handle: None },
        }
    }

    /// The writes have got to `end`.
    fn wrote(&self, end: u64) {
        if let Some(tx) = &self.tx {
            // The thread may have stopped (allocation refused): nothing to do then.
            let _ = tx.send(end);
        }
    }
}

impl Drop for Allocator {
    /// Waits for the thread: the caller truncates the file to its length afterwards.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Allocates `len` bytes of `file` from `at` on; `false` when the system or the file system refuses.
fn allocate(file: &File, at: u64, len: u64) -> bool {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{fallocate, FallocateFlags};
        fallocate(file, FallocateFlags::empty(), at, len).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, at, len);
        false
    }
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

#[cfg(windows)]
fn write_all_at(f: &File, mut buf: &[u8], mut at: u64) -> io::Result<()> {
    // `seek_write` passes the offset with the write itself, so the I/O threads' writes through cloned handles
    // (which share one cursor) land where each asked, whatever the cursor.
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_write(f, buf, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(not(any(unix, windows)))]
fn write_all_at(f: &File, buf: &[u8], at: u64) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    // Cloned handles share one cursor: no other thread's seek may come between this seek and its write.
    static CURSOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = CURSOR.lock().unwrap_or_else(|e| e.into_inner());
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

/// A sequential writer of one file from segments (see the module documentation).
pub(crate) struct Sink {
    /// Bytes sent so far (the file offset of the next byte).
    pos: u64,
    tx: Option<Sender<Item>>,
    /// Segments the write thread is done with, and records it staged.
    back: Receiver<Back>,
    handle: Option<JoinHandle<io::Result<()>>>,
    /// Pooled segments made so far, and those sent and not yet given back.
    made: usize,
    in_flight: usize,
    /// Pooled segments that may exist before the writer waits for the disk (more are made while none
    /// is in flight: the chunk being encoded always gets what it needs).
    limit: usize,
    /// Small pieces gathered before they go out (see [`Sink::pass`]).
    gather: Option<Segment>,
    /// Pooled segments whose bytes [`Sink::pass`] gathered, free for reuse.
    free: Vec<Segment>,
    /// Bytes of records sent and not yet staged, and how many may be before the writer waits.
    records_in_flight: u64,
    records_limit: u64,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").field("position", &self.position()).finish_non_exhaustive()
    }
}

impl Sink {
    /// A sink writing `file` (open for writing at `path`) from offset 0; `direct` asks for direct I/O;
    /// `chunk_size` is the writer's chunk size (how many segments one chunk needs).
    pub(crate) fn new(file: &File, path: &Path, direct: bool, chunk_size: u64) -> io::Result<Sink> {
        let mut files = Vec::with_capacity(IO_THREADS);
        for _ in 0..IO_THREADS {
            let plain = file.try_clone()?;
            let direct = if direct { open_direct(path) } else { None };
            files.push(Files { plain, direct });
        }
        let allocator = Allocator::new(file.try_clone()?);
        let (tx, rx) = unbounded::<Item>();
        let (back_tx, back) = unbounded::<Back>();
        let handle = std::thread::Builder::new().name("cntkio-cbf-write".into()).spawn(move || {
            // This thread copies segments into staging buffers; I/O threads of their own write the
            // full ones, so the disk is kept busy while the next buffer is filled. With two writes
            // in flight the disk still has one to do while the other's thread waits for a core.
            let (full_tx, full_rx) = crossbeam_channel::bounded::<(Buf, usize, u64)>(STAGES);
            let (empty_tx, empty_rx) = unbounded::<Buf>();
            let mut io = Vec::with_capacity(IO_THREADS);
            for mut files in files {
                let (full_rx, empty_tx) = (full_rx.clone(), empty_tx.clone());
                io.push(std::thread::Builder::new().name("cntkio-cbf-io".into()).spawn(
                    move || -> io::Result<()> {
                        for (stage, len, at) in full_rx {
                            files.write_at(&stage.bytes()[..len], at)?;
                            // The stage thread may be gone (it stops when the writer does).
                            let _ = empty_tx.send(stage);
                        }
                        Ok(())
                    },
                )?);
            }
            drop((full_rx, empty_tx));
            // Waits for the I/O threads; the first error, if any.
            let join = |io: Vec<JoinHandle<io::Result<()>>>| {
                let mut first = Ok(());
                for h in io {
                    let r = h.join().unwrap_or_else(|_| Err(io::Error::other("a CBF I/O thread panicked")));
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            };
            let io_error = |io| match join(io) {
                Err(e) => e,
                Ok(()) => io::Error::other("the CBF I/O threads stopped"),
            };
            let mut st = Stager { stage: Buf::new(), fill: 0, at: 0, made: 1, full_tx, empty_rx, allocator };
            // For a record that straddles two staging buffers.
            let mut scratch = Vec::new();
            for item in rx {
                match item {
                    Item::Segment(seg) => {
                        if st.put(seg.filled()).is_err() {
                            return Err(io_error(io));
                        }
                        if seg.pooled() {
                            // The writer may be gone (it failed or finished early): the segment is then
                            // freed.
                            let _ = back_tx.send(Back::Segment(seg));
                        }
                    }
                    Item::Records(r) => {
                        let mut i = 0;
                        while i < r.count() {
                            let encoded = match r.encode_fitting(i, st.room()) {
                                Ok((0, _)) => {
                                    // Record `i` straddles two staging buffers (or is larger than one).
                                    let len = r.record_len(i);
                                    scratch.resize(len, 0);
                                    let e = r.encode(i, &mut scratch).map(|()| st.put(&scratch));
                                    if scratch.capacity() > BUF {
                                        scratch = Vec::new();
                                    }
                                    i += 1;
                                    e
                                }
                                Ok((k, bytes)) => {
                                    i += k;
                                    Ok(st.filled(bytes))
                                }
                                Err(e) => Err(e),
                            };
                            match encoded {
                                Ok(Ok(())) => {}
                                Ok(Err(Stopped)) => return Err(io_error(io)),
                                Err(e) => {
                                    drop(st);
                                    let _ = join(io);
                                    return Err(io::Error::other(e));
                                }
                            }
                        }
                        let len = r.len();
                        // Gives the caller's data back (see `Records`) before saying it is done.
                        drop(r);
                        let _ = back_tx.send(Back::Records(len));
                    }
                }
            }
            if st.finish().is_err() {
                return Err(io_error(io));
            }
            join(io)
        })?;
        let per_chunk = usize::try_from(chunk_size / SEG as u64).unwrap_or(usize::MAX);
        Ok(Sink {
            pos: 0,
            tx: Some(tx),
            back,
            handle: Some(handle),
            made: 0,
            in_flight: 0,
            limit: per_chunk.saturating_add(SPARE_SEGMENTS),
            gather: None,
            free: Vec::new(),
            records_in_flight: 0,
            records_limit: chunk_size,
        })
    }

    /// Bytes sent so far (the file offset of the next byte).
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// An empty segment with room for at least `min` bytes: one the write thread gave back, a new one,
    /// or, when [`Sink::new`]'s limit is reached and some are on their way to the disk, the next one the
    /// write thread gives back. A segment for more than [`SEG`] bytes is made for the purpose.
    pub(crate) fn segment(&mut self, min: usize) -> io::Result<Segment> {
        if min > SEG {
            return Ok(Segment::new(min));
        }
        loop {
            if let Some(mut s) = self.free.pop() {
                s.len = 0;
                return Ok(s);
            }
            let back = match self.back.try_recv() {
                Ok(b) => b,
                Err(_) if self.made < self.limit || self.in_flight == 0 => {
                    self.made += 1;
                    return Ok(Segment::new(SEG));
                }
                Err(_) => self.back.recv().map_err(|_| self.worker_error())?,
            };
            self.returned(back);
        }
    }

    /// Takes what the write thread gave back into account: a segment becomes free for reuse.
    fn returned(&mut self, back: Back) {
        match back {
            Back::Segment(s) => {
                self.in_flight -= 1;
                self.free.push(s);
            }
            Back::Records(len) => self.records_in_flight -= len,
        }
    }

    /// Waits until the records on their way and `held` bytes more (those the caller holds for the next
    /// chunk, say) are within a chunk, or none is on its way: so that the data records hold stay bounded
    /// when the disk is slower than the caller.
    pub(crate) fn wait_for_records(&mut self, held: u64) -> io::Result<()> {
        while self.records_in_flight > 0 && self.records_in_flight.saturating_add(held) > self.records_limit {
            let back = self.back.recv().map_err(|_| self.worker_error())?;
            self.returned(back);
        }
        Ok(())
    }

    /// Passes on records for the write thread to encode into the file after the bytes passed before
    /// (see [`Records`]).
    pub(crate) fn pass_records(&mut self, records: Box<dyn Records>) -> io::Result<()> {
        self.send_gathered()?;
        let len = records.len();
        let tx = self.tx.as_ref().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
        if tx.send(Item::Records(records)).is_err() {
            return Err(self.worker_error());
        }
        self.records_in_flight += len;
        self.pos += len;
        Ok(())
    }

    /// Passes on a filled segment: its bytes follow those passed before. A small one (up to [`SMALL`]
    /// bytes) is copied into a segment that gathers small pieces and kept for [`Sink::segment`] to hand
    /// out again: small chunks (say `ctf2bin.py`'s one sequence per chunk) then cost a copy each, not a
    /// trip through the write thread. A larger one is sent as it is (after what was gathered).
    pub(crate) fn pass(&mut self, seg: Segment) -> io::Result<()> {
        if seg.len > SMALL {
            return self.send(seg);
        }
        self.put(seg.filled())?;
        if seg.pooled() {
            self.free.push(seg);
        }
        Ok(())
    }

    /// Copies `bytes` after those passed before (into the gathering segment).
    pub(crate) fn put(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let mut g = match self.gather.take() {
                Some(g) => g,
                None => self.segment(SEG)?,
            };
            let n = g.append(bytes);
            bytes = &bytes[n..];
            self.pos += n as u64;
            if g.room() == 0 {
                self.send_segment(g)?;
            } else {
                self.gather = Some(g);
            }
        }
        Ok(())
    }

    /// Sends what was gathered, if anything.
    fn send_gathered(&mut self) -> io::Result<()> {
        match self.gather.take() {
            Some(g) if g.len > 0 => self.send_segment(g),
            Some(g) => {
                self.gather = Some(g);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Sends a filled segment (after what was gathered).
    fn send(&mut self, seg: Segment) -> io::Result<()> {
        self.send_gathered()?;
        let len = seg.len as u64;
        self.send_segment(seg)?;
        self.pos += len;
        Ok(())
    }

    /// Hands a segment to the write thread (its bytes already counted in `pos` if gathered).
    fn send_segment(&mut self, seg: Segment) -> io::Result<()> {
        let pooled = seg.pooled();
        let tx = self.tx.as_ref().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
        if tx.send(Item::Segment(seg)).is_err() {
            return Err(self.worker_error());
        }
        self.in_flight += usize::from(pooled);
        Ok(())
    }

    /// The write thread's error (it stopped).
    fn worker_error(&mut self) -> io::Error {
        self.tx = None;
        match self.handle.take() {
            Some(h) => match h.join() {
                Ok(Err(e)) => e,
                Ok(Ok(())) => io::Error::other("the CBF write thread stopped"),
                Err(_) => io::Error::other("the CBF write thread panicked"),
            },
            None => io::Error::other("the CBF output is closed"),
        }
    }

    /// Waits for every write (the last bytes zero-padded to the alignment) and returns the number of
    /// bytes sent: the caller truncates the file to it.
    pub(crate) fn finish(mut self) -> io::Result<u64> {
        self.send_gathered()?;
        self.tx = None;
        let h = self.handle.take().ok_or_else(|| io::Error::other("the CBF output is closed"))?;
        h.join().map_err(|_| io::Error::other("the CBF write thread panicked"))??;
        Ok(self.pos)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // Abandoned (the writer was dropped or failed): let the thread finish what it has and stop.
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
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
        let mut sink = Sink::new(&file, &path, direct, 3 * SEG as u64).unwrap();
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
                let mut seg = sink.segment(n).unwrap();
                assert!(seg.room() >= n);
                let k = seg
                    .append_fitting(|d: &mut [u8]| -> Result<(usize, usize), ()> {
                        d[..n].copy_from_slice(&bytes);
                        Ok((1, n))
                    })
                    .unwrap();
                assert_eq!(k, 1);
                // A failing fill appends nothing.
                assert!(seg.append_fitting(|_: &mut [u8]| Err(())).is_err());
                assert_eq!(seg.filled(), &bytes[..]);
                let free = sink.free.len();
                sink.pass(seg).unwrap();
                // A small segment is kept for reuse, a larger one sent.
                assert_eq!(sink.free.len(), free + usize::from(n <= SMALL));
            }
            expect.extend_from_slice(&bytes);
            assert_eq!(sink.position(), expect.len() as u64);
            assert!(sink.made <= sink.limit.max(1));
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
            run(direct, &[SEG - 1, SEG, SEG + 1, 0, 1, 2 * SEG]);
            run(direct, &[7, BUF + 1, 2 * BUF + 3, 2, 5 * BUF]);
        }
    }

    /// A staging buffer is `BUF` zeroed bytes aligned for direct I/O, and at a huge page when mapped.
    #[test]
    fn staging_buffers_are_aligned_and_zeroed() {
        for _ in 0..3 {
            let mut b = Buf::new();
            assert_eq!(b.bytes().len(), BUF);
            let at = b.bytes().as_ptr() as usize;
            assert_eq!(at % ALIGN, 0);
            if matches!(b.mem, BufMem::Map(_)) {
                assert_eq!(at % HUGE, 0);
            }
            assert!(b.bytes().iter().all(|&x| x == 0));
            b.bytes_mut()[BUF - 1] = 7;
            assert_eq!(b.bytes()[BUF - 1], 7);
        }
    }

    /// Records of the given lengths, record `i` filled with bytes from `seed + i` on; `fail` makes record
    /// `fail` refuse to encode.
    struct TestRecords {
        lens: Vec<usize>,
        seed: u8,
        fail: Option<usize>,
    }

    impl TestRecords {
        fn bytes(&self) -> Vec<u8> {
            let mut v = Vec::new();
            for (i, &n) in self.lens.iter().enumerate() {
                v.extend((0..n).map(|k| self.seed.wrapping_add(i as u8).wrapping_add(k as u8)));
            }
            v
        }
    }

    impl Records for TestRecords {
        fn count(&self) -> usize {
            self.lens.len()
        }
        fn record_len(&self, i: usize) -> usize {
            self.lens[i]
        }
        fn encode(&self, i: usize, dst: &mut [u8]) -> Result<(), String> {
            if self.fail == Some(i) {
                return Err(format!("record {i} cannot be encoded"));
            }
            assert_eq!(dst.len(), self.lens[i]);
            for (k, b) in dst.iter_mut().enumerate() {
                *b = self.seed.wrapping_add(i as u8).wrapping_add(k as u8);
            }
            Ok(())
        }
        fn len(&self) -> u64 {
            self.lens.iter().sum::<usize>() as u64
        }
    }

    /// Records the write thread encodes itself land between the segments passed before and after them,
    /// whether they fit a staging buffer, straddle two or are larger than one; the records on their way
    /// stay within the limit.
    #[test]
    fn records_land_in_order_between_segments() {
        let cases: Vec<Vec<usize>> =
            vec![vec![], vec![1], vec![4096; 700], vec![BUF - 5, 10, BUF, 3 * BUF + 1, 7], vec![100_003; 90]];
        for direct in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out");
            let file =
                std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let limit = 3 * SEG as u64;
            let mut sink = Sink::new(&file, &path, direct, limit).unwrap();
            let mut expect = Vec::new();
            for (j, lens) in cases.iter().enumerate() {
                let head = vec![j as u8; 1 + 1000 * j];
                sink.put(&head).unwrap();
                expect.extend_from_slice(&head);
                let r = TestRecords { lens: lens.clone(), seed: j as u8 * 40, fail: None };
                expect.extend(r.bytes());
                sink.wait_for_records(r.len()).unwrap();
                assert!(sink.records_in_flight == 0 || sink.records_in_flight + r.len() <= limit);
                sink.pass_records(Box::new(r)).unwrap();
                assert_eq!(sink.position(), expect.len() as u64);
            }
            let n = sink.finish().unwrap();
            assert_eq!(n, expect.len() as u64);
            file.set_len(n).unwrap();
            assert!(std::fs::read(&path).unwrap() == expect, "direct {direct}");
        }
    }

    /// Records that cannot be encoded stop the write thread with their error.
    #[test]
    fn a_record_that_cannot_be_encoded_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let mut sink = Sink::new(&file, &path, false, SEG as u64).unwrap();
        sink.put(b"head").unwrap();
        sink.pass_records(Box::new(TestRecords { lens: vec![10; 5], seed: 1, fail: Some(3) })).unwrap();
        let e = sink.finish().unwrap_err();
        assert!(e.to_string().contains("record 3 cannot be encoded"), "{e}");
    }

    #[test]
    fn a_failing_write_is_reported_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        std::fs::write(&path, b"").unwrap();
        // Open read-only: every write of the thread fails.
        let file = std::fs::File::open(&path).unwrap();
        for total in [10usize, 5 * BUF + 3] {
            let mut sink = Sink::new(&file, &path, false, 2 * SEG as u64).unwrap();
            let bytes = vec![7u8; 4096];
            let mut failed = false;
            for _ in 0..total.div_ceil(bytes.len()) {
                if sink.put(&bytes).is_err() {
                    failed = true;
                    break;
                }
            }
            // The error comes from a later put or, at the latest, from finish.
            assert!(failed || sink.finish().is_err(), "{total} bytes");
        }
    }
}
