//! Seek points: a plain gzip stream (one member or several) read at any offset after one pass in order,
//! with zlib's `zran` technique and no temporary file.
//!
//! A thread decompresses the stream once, in order, into a [`Window`] of memory, which the readers that
//! follow it read from. On the way it notes a *point* every [`SPAN`] decompressed bytes or more, where a
//! deflate block ends: the bit of the compressed file where the next block starts, the decompressed
//! offset, and the 32 KiB decompressed before it (deflate's window, which the next blocks may refer back
//! into); the start of a gzip member is a point with an empty window. The pass checks every member's
//! CRC-32 and length, as gzip does.
//!
//! A read behind the window decompresses from the nearest point at or before it, or from where an earlier
//! read stopped if that is nearer ([`DECODERS`] decoders are kept for reads that continue one another); a
//! read that covers several points decompresses from each of them at once, on the rayon pool. A read
//! beyond the thread waits for it, and the length is known once it has reached the end. A later view of
//! the same local file in this process (a command opens its input several times) starts from the points
//! of a pass that reached the end, and makes none of its own.
//!
//! Asked to ([`Points::keep_in`], with `cacheIndex`), a view also keeps the points of its pass in a file
//! (see [`super::kept`]), and a view of a later process that finds them there starts from them: its
//! length known at once, no pass run.
//!
//! Memory: the window (48 MiB), the points (one deflated window each: about 22 KiB of CTF text's 32 KiB,
//! some 0.5% of the decompressed size at [`SPAN`] = 4 MiB; at most [`BUDGET`]) and the kept decoders
//! (about 0.4 MiB each).

use super::inflate::{Ending, Flush, Inflate};
use super::spool::{damaged, TRUNCATED};
use super::window::{Fill, Window};
use super::{Compression, Source};
use crate::Error;
use rayon::prelude::*;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Decompressed bytes from one point to the next, at least (fewer in tests, so that small streams have
/// many). A read behind the window decompresses half a span on average before its first byte (a few
/// milliseconds), small beside a chunk of tens of MiB, while the points cost a 32 KiB window (kept
/// deflated) per span.
pub(crate) const SPAN: u64 = if cfg!(test) { 64 << 10 } else { 4 << 20 };
/// The most memory the points may take: past it, every other point is dropped and the span doubles, so
/// that memory stays bounded whatever the stream (a crafted one can make 4 MiB of output whose window does
/// not deflate from 4 KiB of input, 8 times as much memory as file; CTF text takes 256 MiB of points at
/// about 50 GB).
pub(crate) const BUDGET: usize = 256 << 20;
/// Compressed bytes read at a time (an odd few in tests, so that headers and trailers straddle reads).
const INPUT: usize = if cfg!(test) { 1000 } else { 256 << 10 };
/// Decoders kept for reads that continue where others stopped.
const DECODERS: usize = 8;
/// The longest file name or comment in a gzip header (as flate2's `GzDecoder`).
const MAX_FIELD: usize = 65535;

/// A place where decompression can start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Point {
    /// Offset in the decompressed data.
    pub out: u64,
    /// Offset in the compressed file, in bits, of the first bit to decompress (a whole byte at a member's
    /// start).
    pub bit: u64,
    /// The decompressed bytes before `out` that deflate may refer back to (32 KiB, fewer near a member's
    /// start, none at it), deflated.
    pub window: Arc<[u8]>,
}

/// What the thread and the readers share.
#[derive(Debug)]
struct Index {
    source: Source,
    /// The compressed length.
    len: u64,
    path: String,
    /// The points found so far, in order.
    points: Mutex<Vec<Point>>,
    /// The most memory the points may take.
    budget: usize,
    /// The file's identity, for [`FINISHED`].
    key: Option<FileKey>,
    /// Where the points are to be kept on disk, and the pass's end.
    keep: Mutex<Keep>,
}

/// Where a pass's points go on disk ([`Points::keep_in`]) and the pass, once it has ended.
#[derive(Debug, Default)]
struct Keep {
    /// The file, and the key that names the compressed content in it.
    file: Option<(std::path::PathBuf, Vec<u8>)>,
    /// The pass, ended.
    done: Option<Arc<Done>>,
}

impl Keep {
    /// Writes the ended pass over `len` compressed bytes to the file, if both are there and the file does
    /// not hold valid points for this content yet.
    fn write(&self, shown: &str, len: u64) {
        let (Some((path, key)), Some(done)) = (&self.file, &self.done) else { return };
        if matches!(super::kept::load(path, key, len), Ok(Some(_))) {
            return;
        }
        match super::kept::save(path, key, done) {
            Ok(()) => log::debug!("{shown}: {} seek points kept in {}", done.points.len(), path.display()),
            Err(e) => log::warn!("could not keep the seek points of {shown} in {}: {e}", path.display()),
        }
    }
}

/// What tells a local file's content apart, for [`FINISHED`]: device, inode, length, modification and
/// change times (the change time cannot be set back), and a CRC-32 of the first and last 64 KiB. A pass
/// over [`SHARE_MIN`] bytes takes several ticks of the clock that stamps the times, so a file written again
/// after a pass was remembered has other times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    device: u64,
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
    sample: u32,
}

impl FileKey {
    /// The key of `source` (`len` bytes), if it is a local file worth remembering (at least
    /// [`SHARE_MIN`] bytes: smaller ones are decompressed again quickly).
    fn of(source: &Source, len: u64) -> Option<FileKey> {
        #[cfg(unix)]
        if let Source::File(f) = source {
            use std::os::unix::fs::MetadataExt;
            let m = f.metadata().ok().filter(|m| m.len() == len && len >= SHARE_MIN)?;
            let mut sample = vec![0u8; 64 << 10];
            let mut crc = crc32fast::Hasher::new();
            for at in [0, len - sample.len() as u64] {
                source.read_exact_at(&mut sample, at).ok()?;
                crc.update(&sample);
            }
            return Some(FileKey {
                device: m.dev(),
                inode: m.ino(),
                len,
                modified: (m.mtime(), m.mtime_nsec()),
                changed: (m.ctime(), m.ctime_nsec()),
                sample: crc.finalize(),
            });
        }
        let _ = (source, len);
        None
    }
}

/// The smallest compressed file whose points are remembered (small in tests, so that they have some).
const SHARE_MIN: u64 = if cfg!(test) { 1 << 20 } else { 8 << 20 };

/// A pass done: its points and the decompressed length.
#[derive(Debug)]
pub(crate) struct Done {
    pub points: Vec<Point>,
    pub len: u64,
    /// The memory the points take.
    pub cost: usize,
}

/// The passes done in this process over local files, the most recently used last, taking at most
/// [`BUDGET`] bytes together: a command opens its input several times (to tell its format, to infer a
/// schema, to read it), and each later view starts from these points, its length known, instead of
/// decompressing the whole file again first.
static FINISHED: Mutex<Vec<(FileKey, Arc<Done>)>> = Mutex::new(Vec::new());

/// The pass done over the file with `key`, if one is remembered.
fn recall(key: &FileKey) -> Option<Arc<Done>> {
    let mut done = FINISHED.lock().expect("lock");
    let k = done.iter().position(|(k, _)| k == key)?;
    let entry = done.remove(k);
    let found = entry.1.clone();
    done.push(entry);
    Some(found)
}

/// Remembers a pass done, forgetting the least recently used beyond the budget.
fn remember(key: FileKey, pass: Arc<Done>) {
    let mut done = FINISHED.lock().expect("lock");
    done.retain(|(k, _)| *k != key);
    done.push((key, pass));
    while done.len() > 1 && done.iter().map(|(_, d)| d.cost).sum::<usize>() > BUDGET {
        done.remove(0);
    }
}

/// A gzip stream read through seek points.
pub(crate) struct Points {
    index: Arc<Index>,
    pass: Pass,
    /// Idle decoders, the most recently used last.
    decoders: Mutex<Vec<Decoder>>,
    /// Decoders started from a point.
    started: AtomicU64,
    /// Points read from disk ([`Points::keep_in`]), and the file they came from: they serve every read.
    loaded: std::sync::OnceLock<(Arc<Done>, std::path::PathBuf)>,
}

/// The pass in order.
enum Pass {
    /// Under way, or to start at the first read: the window of its most recent output.
    Running(Window),
    /// Done by an earlier view of the same file: the decompressed length.
    Done(u64),
}

impl std::fmt::Debug for Points {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Points")
            .field("path", &self.index.path)
            .field("points", &self.count())
            .field("started", &self.started.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Points {
    /// The view of the gzip stream in `source` (`len` compressed bytes); starts no thread.
    pub(crate) fn new(source: Source, len: u64, path: String) -> Points {
        Points::with_budget(source, len, path, BUDGET)
    }

    /// The view, its points taking at most `budget` bytes.
    fn with_budget(source: Source, len: u64, path: String, budget: usize) -> Points {
        let key = FileKey::of(&source, len);
        let done = key.as_ref().and_then(recall);
        let points = done.as_ref().map_or_else(Vec::new, |d| d.points.clone());
        let keep = Mutex::new(Keep { file: None, done: done.clone() });
        let index = Arc::new(Index { source, len, path, points: Mutex::new(points), budget, key, keep });
        let pass = match done {
            Some(d) => Pass::Done(d.len),
            None => {
                let theirs = index.clone();
                Pass::Running(Window::new(Box::new(move || Ok(Box::new(Indexer::new(theirs)?) as Box<dyn Fill>))))
            }
        };
        let loaded = Default::default();
        Points { index, pass, decoders: Mutex::new(Vec::new()), started: AtomicU64::new(0), loaded }
    }

    /// True when the points come from an earlier view's pass.
    pub(crate) fn reused(&self) -> bool {
        matches!(self.pass, Pass::Done(_))
    }

    /// The points found so far.
    pub(crate) fn count(&self) -> usize {
        match self.loaded.get() {
            Some((done, _)) => done.points.len(),
            None => self.index.points.lock().expect("lock").len(),
        }
    }

    /// Keeps the points in the file at `path`, for the content that `key` names: if the file holds the
    /// points of a pass over that content, they are used from now on (the decompressed length known at
    /// once, the pass not run); else the points are written there when the pass ends, or at once if it
    /// has. Call before reading much: a pass under way is given up for points read from the file.
    pub(crate) fn keep_in(&self, path: &std::path::Path, key: Vec<u8>) {
        let shown = &self.index.path;
        let ended = self.index.keep.lock().expect("lock").done.is_some();
        if !ended {
            match super::kept::load(path, &key, self.index.len) {
                Ok(Some(done)) => {
                    log::debug!("{shown}: {} seek points from {}", done.points.len(), path.display());
                    let done = Arc::new(done);
                    if let Some(k) = self.index.key {
                        remember(k, done.clone());
                    }
                    self.index.keep.lock().expect("lock").done = Some(done.clone());
                    let _ = self.loaded.set((done, path.to_path_buf()));
                    if let Pass::Running(window) = &self.pass {
                        window.give_up();
                    }
                    return;
                }
                Ok(None) => {}
                Err(why) => log::debug!("{shown}: ignoring the seek points in {}: {why}", path.display()),
            }
        }
        let mut keep = self.index.keep.lock().expect("lock");
        keep.file = Some((path.to_path_buf(), key));
        keep.write(shown, self.index.len);
    }

    /// The decompressed length, if it is known without waiting: from points read or remembered, or a
    /// pass that has ended.
    pub(crate) fn known_len(&self) -> Option<u64> {
        self.done_len().or_else(|| self.index.keep.lock().expect("lock").done.as_ref().map(|d| d.len))
    }

    /// The decompressed length when the points come from elsewhere (read from disk, or remembered from
    /// an earlier view), which then serve every read.
    fn done_len(&self) -> Option<u64> {
        match (self.loaded.get(), &self.pass) {
            (Some((done, _)), _) => Some(done.len),
            (None, Pass::Done(len)) => Some(*len),
            (None, Pass::Running(_)) => None,
        }
    }

    /// The decompressed length, once the thread has reached the end (one byte more than it decompressed
    /// if the stream is damaged, so that reading to the end meets the error).
    pub(crate) fn len(&self) -> u64 {
        match (self.done_len(), &self.pass) {
            (Some(len), _) => len,
            (None, Pass::Running(window)) => {
                if self.index.keep.lock().expect("lock").done.is_none() {
                    log::debug!("{}: decompressing to the end for the length", self.index.path);
                }
                let (done, error) = window.finish();
                done + u64::from(error.is_some())
            }
            (None, Pass::Done(len)) => *len,
        }
    }

    /// Reads up to `buf.len()` bytes at `offset` (fewer only at the end): from the window, waiting for the
    /// thread if they are ahead of it, or from the points if the window has moved past them.
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        if let Some(len) = self.done_len() {
            let n = len.saturating_sub(offset).min(buf.len() as u64) as usize;
            if n > 0 {
                self.decode(offset, &mut buf[..n])?;
            }
            return Ok(n);
        }
        let Pass::Running(window) = &self.pass else { unreachable!("a pass done has its length") };
        if let Some(n) = window.read(offset, buf)? {
            return Ok(n);
        }
        if self.loaded.get().is_some() {
            // Given up for points read meanwhile.
            return self.read_some(offset, buf);
        }
        // The window no longer holds `offset`, so the thread has passed it.
        let behind = window.front().saturating_sub(offset).min(buf.len() as u64) as usize;
        if behind == 0 {
            return Err(Error::internal(format!(
                "{}: decompressed byte {offset} is neither kept nor passed",
                self.index.path
            )));
        }
        self.decode(offset, &mut buf[..behind])?;
        if behind == buf.len() {
            return Ok(behind);
        }
        Ok(behind + self.read_some(offset + behind as u64, &mut buf[behind..])?)
    }

    /// Decompresses `dst.len()` bytes at `offset`, all of them behind the thread: one piece per point
    /// they cover, each decompressed from its point (the first from the point before `offset`).
    fn decode(&self, offset: u64, dst: &mut [u8]) -> Result<(), Error> {
        let end = offset + dst.len() as u64;
        let from = |points: &[Point]| -> Vec<Point> {
            let first = points.partition_point(|p| p.out <= offset).saturating_sub(1);
            points[first..].iter().take_while(|p| p.out < end).cloned().collect()
        };
        let starts = match self.loaded.get() {
            Some((done, _)) => from(&done.points),
            None => from(&self.index.points.lock().expect("lock")),
        };
        if starts.first().is_none_or(|p| p.out > offset) {
            return Err(Error::internal(format!(
                "{}: no seek point before decompressed byte {offset}",
                self.index.path
            )));
        }
        let mut pieces = Vec::with_capacity(starts.len());
        let (mut rest, mut at) = (dst, offset);
        for (k, p) in starts.iter().enumerate() {
            let to = starts.get(k + 1).map_or(end, |next| next.out);
            let (piece, tail) = rest.split_at_mut((to - at) as usize);
            pieces.push((p, at, piece));
            (rest, at) = (tail, to);
        }
        let run = |(p, at, piece): (&Point, u64, &mut [u8])| self.decode_piece(p, at, piece);
        if pieces.len() > 1 {
            pieces.into_par_iter().try_for_each(run)
        } else {
            pieces.into_iter().try_for_each(run)
        }
    }

    /// Decompresses the bytes at `at` into `dst`, from point `p` (at or before `at`) or from a kept decoder
    /// between the two.
    fn decode_piece(&self, p: &Point, at: u64, dst: &mut [u8]) -> Result<(), Error> {
        let mut d = match self.take(p.out, at) {
            Some(d) => d,
            None => {
                self.started.fetch_add(1, Ordering::Relaxed);
                Decoder::at(&self.index, p).map_err(|e| self.problem(e, p.out))?
            }
        };
        let read = d.skip_to(at).and_then(|()| d.read(dst));
        match read {
            Ok(n) if n == dst.len() => {
                self.put(d);
                Ok(())
            }
            Ok(_) => Err(self.problem(Problem::Truncated, d.out)),
            Err(e) => Err(self.problem(e, d.out)),
        }
    }

    /// The error of a read from a point `done` bytes into the stream, naming the file of points read
    /// from disk (a damaged one is more likely than a damaged input that passed its check).
    fn problem(&self, problem: Problem, done: u64) -> Error {
        let what = match (problem, self.loaded.get()) {
            (Problem::Truncated, Some(_)) => TRUNCATED.to_string(),
            (Problem::Damaged(what), Some(_)) => what,
            (problem, _) => return problem.error(&self.index.path, done),
        };
        let file = self.loaded.get().map(|(_, f)| f.display().to_string()).unwrap_or_default();
        let what = format!(
            "{what} (read from the seek points kept in {file}: remove that file to decompress the input again)"
        );
        damaged(Compression::Gzip, &self.index.path, done, &what)
    }

    /// The kept decoder nearest before `at` and not before `floor`, if any.
    fn take(&self, floor: u64, at: u64) -> Option<Decoder> {
        let mut kept = self.decoders.lock().expect("lock");
        let (k, _) =
            kept.iter().enumerate().filter(|(_, d)| (floor..=at).contains(&d.out)).max_by_key(|(_, d)| d.out)?;
        Some(kept.remove(k))
    }

    /// Keeps `d` for a later read, dropping the least recently used decoder if there are too many.
    fn put(&self, d: Decoder) {
        let mut kept = self.decoders.lock().expect("lock");
        kept.push(d);
        if kept.len() > DECODERS {
            kept.remove(0);
        }
    }
}

/// What went wrong reading a gzip stream.
#[derive(Debug)]
enum Problem {
    Io(std::io::Error),
    Truncated,
    Damaged(String),
}

impl From<std::io::Error> for Problem {
    fn from(e: std::io::Error) -> Problem {
        Problem::Io(e)
    }
}

impl Problem {
    /// The error, `done` bytes into the decompressed stream of `path`.
    fn error(self, path: &str, done: u64) -> Error {
        match self {
            Problem::Io(e) => Error::io(format!("cannot read {path}"), e),
            Problem::Truncated => damaged(Compression::Gzip, path, done, TRUNCATED),
            Problem::Damaged(what) => damaged(Compression::Gzip, path, done, &what),
        }
    }
}

/// Buffered reads of the compressed file from any offset.
struct Input {
    source: Source,
    /// The file's length.
    len: u64,
    /// `buf[..end]` holds the file's bytes from `next - end` to `next`; those before `start` are used.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    next: u64,
}

impl Input {
    fn new(source: Source, len: u64, at: u64) -> Input {
        Input { source, len, buf: Vec::new(), start: 0, end: 0, next: at }
    }

    /// The offset of the first unused byte.
    fn pos(&self) -> u64 {
        self.next - (self.end - self.start) as u64
    }

    /// The bytes read and not used yet.
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
    }

    /// Goes to offset `pos` (kept bytes are not read again).
    fn seek(&mut self, pos: u64) {
        let first = self.next - self.end as u64;
        if (first..=self.next).contains(&pos) {
            self.start = (pos - first) as usize;
        } else {
            (self.start, self.end, self.next) = (0, 0, pos);
        }
    }

    /// Makes at least `n` bytes available, reading more; false if the file ends first.
    fn need(&mut self, n: usize) -> std::io::Result<bool> {
        while self.end - self.start < n {
            if self.next >= self.len {
                return Ok(false);
            }
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
            let room = n.max(INPUT);
            if self.buf.len() < room {
                self.buf.resize(room, 0);
            }
            let k = ((self.buf.len() - self.end) as u64).min(self.len - self.next) as usize;
            self.source.read_exact_at(&mut self.buf[self.end..self.end + k], self.next)?;
            self.end += k;
            self.next += k as u64;
        }
        Ok(true)
    }
}

/// The length of the gzip member header that `b` starts with (RFC 1952, section 2.3): `Ok(None)` when `b`
/// ends first. flate2's checks and messages: the magic number, deflate, no reserved flag, a file name and
/// comment of at most [`MAX_FIELD`] bytes, the header's CRC-16 when it has one.
fn header_len(b: &[u8]) -> Result<Option<usize>, &'static str> {
    const FHCRC: u8 = 2;
    const FEXTRA: u8 = 4;
    const FNAME: u8 = 8;
    const FCOMMENT: u8 = 16;
    const BAD: &str = "invalid gzip header";
    let Some(fixed) = b.get(..10) else { return Ok(None) };
    let flags = fixed[3];
    if fixed[..3] != [0x1f, 0x8b, 8] || flags & 0xE0 != 0 {
        return Err(BAD);
    }
    let mut at = 10;
    if flags & FEXTRA != 0 {
        let Some(x) = b.get(at..at + 2) else { return Ok(None) };
        at += 2 + usize::from(u16::from_le_bytes([x[0], x[1]]));
    }
    for field in [FNAME, FCOMMENT] {
        if flags & field != 0 {
            let rest = b.get(at..).unwrap_or_default();
            match memchr::memchr(0, rest) {
                Some(k) if k < MAX_FIELD => at += k + 1,
                None if rest.len() < MAX_FIELD => return Ok(None),
                _ => return Err("gzip header field too long"),
            }
        }
    }
    if flags & FHCRC != 0 {
        let Some(c) = b.get(at..at + 2) else { return Ok(None) };
        if crc32fast::hash(&b[..at]) as u16 != u16::from_le_bytes([c[0], c[1]]) {
            return Err(CHECKSUM);
        }
        at += 2;
    }
    Ok((at <= b.len()).then_some(at))
}

/// flate2's message for a checksum that does not match.
const CHECKSUM: &str = "corrupt gzip stream does not have a matching checksum";

/// Steps over the header of the member that starts at `input`'s position; false at the end of the file
/// (no member follows).
fn member_header(input: &mut Input) -> Result<bool, Problem> {
    if !input.need(1)? {
        return Ok(false);
    }
    loop {
        match header_len(input.bytes()) {
            Ok(Some(n)) => {
                input.consume(n);
                return Ok(true);
            }
            Ok(None) if input.need(input.bytes().len() + 1)? => {}
            Ok(None) => return Err(Problem::Truncated),
            Err(what) => return Err(Problem::Damaged(what.into())),
        }
    }
}

/// Steps over the trailer (CRC-32 and length) that follows the deflate data `inflate` has just ended,
/// and returns it.
fn member_trailer(input: &mut Input, inflate: &Inflate) -> Result<[u8; 8], Problem> {
    // The decoder may have taken bytes beyond the deflate data; it tells how many (whole bytes).
    input.seek(input.pos() - inflate.pending_bits() / 8);
    if !input.need(8)? {
        return Err(Problem::Truncated);
    }
    let mut trailer = [0u8; 8];
    trailer.copy_from_slice(&input.bytes()[..8]);
    input.consume(8);
    Ok(trailer)
}

/// A point's window as it is kept: deflated.
fn pack_window(window: &[u8]) -> Arc<[u8]> {
    if window.is_empty() {
        return Arc::from([]);
    }
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(window).expect("writing to memory");
    e.finish().expect("writing to memory").into()
}

/// A point's window, inflated.
fn unpack_window(packed: &[u8]) -> Result<Vec<u8>, Problem> {
    let mut out = Vec::with_capacity(32 << 10);
    let mut d = flate2::Decompress::new(false);
    match d.decompress_vec(packed, &mut out, flate2::FlushDecompress::Finish) {
        Ok(flate2::Status::StreamEnd) => Ok(out),
        _ => Err(Problem::Damaged("a seek point's window is damaged".into())),
    }
}

/// The thread's decompressor: the stream in order, noting points and checking each member's trailer.
struct Indexer {
    index: Arc<Index>,
    input: Input,
    inflate: Inflate,
    phase: Phase,
    /// Bytes decompressed.
    out: u64,
    /// The current member's bytes, and their CRC-32.
    member_out: u64,
    crc: crc32fast::Hasher,
    /// Where the last point is.
    last_point: Option<u64>,
    /// Decompressed bytes from one point to the next, at least.
    span: u64,
    /// The memory the points take.
    cost: usize,
}

/// The memory a point takes, roughly.
pub(crate) fn cost(window: &[u8]) -> usize {
    window.len() + 64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A member's header is next (`first`: the file's first, which must be there).
    Header {
        first: bool,
    },
    Deflate,
    End,
}

impl Indexer {
    fn new(index: Arc<Index>) -> Result<Indexer, Error> {
        let inflate = Inflate::new().map_err(|e| Problem::Damaged(e).error(&index.path, 0))?;
        let input = Input::new(index.source.clone(), index.len, 0);
        Ok(Indexer {
            index,
            input,
            inflate,
            phase: Phase::Header { first: true },
            out: 0,
            member_out: 0,
            crc: crc32fast::Hasher::new(),
            last_point: None,
            span: SPAN,
            cost: 0,
        })
    }

    /// Notes a point here, if the last one is a span back. Past the budget, drops every other point and
    /// doubles the span.
    fn note(&mut self, bit: u64, window: impl FnOnce(&mut Inflate) -> Vec<u8>) {
        if self.last_point.is_some_and(|at| self.out - at < self.span) {
            return;
        }
        self.last_point = Some(self.out);
        let window = pack_window(&window(&mut self.inflate));
        let mut points = self.index.points.lock().expect("lock");
        self.cost += cost(&window);
        points.push(Point { out: self.out, bit, window });
        if self.cost > self.index.budget {
            let mut k = 0;
            points.retain(|_| {
                k += 1;
                k % 2 == 1
            });
            self.cost = points.iter().map(|p| cost(&p.window)).sum();
            self.span *= 2;
        }
    }

    /// One step: a header read, or one call of the decompressor, whose output goes to `buf`. Returns the
    /// bytes written.
    fn step(&mut self, buf: &mut [u8]) -> Result<usize, Problem> {
        match self.phase {
            Phase::Header { first } => {
                if !member_header(&mut self.input)? {
                    if first {
                        return Err(Problem::Truncated);
                    }
                    self.phase = Phase::End;
                    let points = self.index.points.lock().expect("lock").clone();
                    let windows: usize = points.iter().map(|p| p.window.len()).sum();
                    log::debug!(
                        "{}: {} decompressed bytes, {} seek points, their windows {windows} bytes",
                        self.index.path,
                        self.out,
                        points.len()
                    );
                    let done = Arc::new(Done { points, len: self.out, cost: self.cost });
                    if let Some(key) = self.index.key {
                        remember(key, done.clone());
                    }
                    let mut keep = self.index.keep.lock().expect("lock");
                    keep.done = Some(done);
                    keep.write(&self.index.path, self.index.len);
                    return Ok(0);
                }
                self.inflate.reset();
                (self.member_out, self.crc) = (0, crc32fast::Hasher::new());
                self.note(self.input.pos() * 8, |_| Vec::new());
                self.phase = Phase::Deflate;
                Ok(0)
            }
            Phase::Deflate => {
                if self.input.bytes().is_empty() && !self.input.need(1)? {
                    return Err(Problem::Truncated);
                }
                let step = self.inflate.run(self.input.bytes(), buf, Flush::Block).map_err(Problem::Damaged)?;
                self.input.consume(step.read);
                self.crc.update(&buf[..step.written]);
                self.out += step.written as u64;
                self.member_out += step.written as u64;
                match step.end {
                    Ending::Boundary => {
                        let bit = self.input.pos() * 8 - self.inflate.pending_bits();
                        self.note(bit, Inflate::window);
                    }
                    Ending::StreamEnd => {
                        let t = member_trailer(&mut self.input, &self.inflate)?;
                        let crc = std::mem::take(&mut self.crc).finalize();
                        if u32::from_le_bytes([t[0], t[1], t[2], t[3]]) != crc
                            || u32::from_le_bytes([t[4], t[5], t[6], t[7]]) != self.member_out as u32
                        {
                            return Err(Problem::Damaged(CHECKSUM.into()));
                        }
                        self.phase = Phase::Header { first: false };
                    }
                    Ending::More if step.read + step.written == 0 => return Err(stuck()),
                    Ending::More => {}
                }
                Ok(step.written)
            }
            Phase::End => Ok(0),
        }
    }
}

/// A decompressor that neither takes input nor gives output though it has both: a bug, not the data's
/// fault, reported rather than looped on.
fn stuck() -> Problem {
    Problem::Damaged("the deflate decompressor stopped making progress".into())
}

impl Fill for Indexer {
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        let mut n = 0;
        while n < buf.len() && self.phase != Phase::End {
            n += self.step(&mut buf[n..]).map_err(|e| e.error(&self.index.path, self.out))?;
        }
        Ok(n)
    }
}

/// A reader's decompressor, started at a point.
struct Decoder {
    inflate: Inflate,
    input: Input,
    /// The decompressed offset of the next byte.
    out: u64,
    /// Where skipped bytes go.
    scratch: Vec<u8>,
}

impl Decoder {
    fn at(index: &Index, p: &Point) -> Result<Decoder, Problem> {
        let mut inflate = Inflate::new().map_err(Problem::Damaged)?;
        let mut input = Input::new(index.source.clone(), index.len, p.bit / 8);
        let used = (p.bit % 8) as u8;
        if used > 0 {
            if !input.need(1)? {
                return Err(Problem::Truncated);
            }
            inflate.prime(8 - used, input.bytes()[0] >> used);
            input.consume(1);
        }
        if !p.window.is_empty() {
            inflate.set_dictionary(&unpack_window(&p.window)?);
        }
        Ok(Decoder { inflate, input, out: p.out, scratch: Vec::new() })
    }

    /// Fills `dst` with the bytes from `self.out` on, crossing into the next members; fewer only at the
    /// end of the file.
    fn read(&mut self, dst: &mut [u8]) -> Result<usize, Problem> {
        let mut n = 0;
        while n < dst.len() {
            if self.input.bytes().is_empty() && !self.input.need(1)? {
                return Err(Problem::Truncated);
            }
            let step = self.inflate.run(self.input.bytes(), &mut dst[n..], Flush::None).map_err(Problem::Damaged)?;
            self.input.consume(step.read);
            n += step.written;
            self.out += step.written as u64;
            match step.end {
                Ending::StreamEnd => {
                    member_trailer(&mut self.input, &self.inflate)?;
                    if !member_header(&mut self.input)? {
                        break;
                    }
                    self.inflate.reset();
                }
                Ending::More if step.read + step.written == 0 => return Err(stuck()),
                Ending::More | Ending::Boundary => {}
            }
        }
        Ok(n)
    }

    /// Decompresses and drops the bytes before `at`.
    fn skip_to(&mut self, at: u64) -> Result<(), Problem> {
        const SKIP: usize = 64 << 10;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(SKIP, 0);
        while self.out < at {
            let k = (at - self.out).min(SKIP as u64) as usize;
            if self.read(&mut scratch[..k])? < k {
                return Err(Problem::Truncated);
            }
        }
        self.scratch = scratch;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::inflate::tests::text;
    use super::super::window::BLOCK;
    use super::*;
    use std::io::Read;

    fn gzip(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// The view of `bytes` in a file.
    fn open(bytes: &[u8]) -> Points {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        Points::new(Source::File(Arc::new(f)), bytes.len() as u64, "data.gz".into())
    }

    /// What flate2 makes of `bytes`.
    fn flate2_reads(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut out).map(|_| out)
    }

    /// Reads `len` bytes at `at` and compares them with `data`'s (fewer past its end).
    fn check(p: &Points, data: &[u8], at: u64, len: usize) {
        let mut buf = vec![0xAAu8; len];
        let n = p.read_some(at, &mut buf).unwrap_or_else(|e| panic!("{len} bytes at {at}: {e}"));
        let want = data.get(at as usize..).map_or(&[][..], |d| &d[..d.len().min(len)]);
        assert_eq!(n, want.len(), "{len} bytes at {at}");
        assert!(buf[..n] == *want, "{len} bytes at {at} differ");
    }

    /// Offsets worth reading at: the ends of the data, each side of every point and of each of `edges`
    /// (member boundaries), and a spread of others; with lengths from one byte to several spans.
    fn reads(p: &Points, len: u64, edges: &[u64]) -> Vec<(u64, usize)> {
        let points: Vec<u64> = p.index.points.lock().unwrap().iter().map(|p| p.out).collect();
        let mut at: Vec<u64> = vec![0, 1, len.saturating_sub(1), len, len + 1, len + 1000];
        for &e in points.iter().chain(edges) {
            at.extend([e.saturating_sub(1), e, e + 1]);
        }
        let mut x = 12345u64;
        for _ in 0..40 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            at.push((x >> 20) % (len + 1));
        }
        let sizes = [1, 2, 7, 4093, 65536, 3 * SPAN as usize + 17];
        at.iter().enumerate().map(|(k, &a)| (a, sizes[k % sizes.len()])).collect()
    }

    /// Every read during the pass (in a scattered order) and after it (from points only, the window having
    /// moved on) gives the data's bytes.
    fn check_everywhere(bytes: &[u8], data: &[u8], edges: &[u64]) {
        let p = open(bytes);
        let mut plan = reads(&p, data.len() as u64, edges);
        // Middle first, then the start: the pass runs ahead and leaves the start to the points.
        plan.sort_by_key(|&(a, _)| (a < data.len() as u64 / 2, a));
        for &(at, len) in &plan {
            check(&p, data, at, len);
        }
        assert_eq!(p.len(), data.len() as u64);
        for (at, len) in reads(&p, data.len() as u64, edges) {
            check(&p, data, at, len);
        }
    }

    #[test]
    fn one_member_at_each_level_reads_the_same_everywhere() {
        let data = text(3 << 20);
        for level in [0, 1, 6, 9] {
            let bytes = gzip(&data, level);
            let p = open(&bytes);
            assert_eq!(p.len(), data.len() as u64, "level {level}");
            // zlib-rs's level 1 makes blocks of about a MiB, so points are as far apart.
            assert!(p.count() >= if level == 1 { 2 } else { 20 }, "level {level}: {} points", p.count());
            let points = p.index.points.lock().unwrap().clone();
            assert!(points.windows(2).all(|w| w[1].out - w[0].out >= SPAN), "level {level}");
            assert!(points[1..].iter().all(|p| !p.window.is_empty()), "level {level}: a window inside a member");
            check_everywhere(&bytes, &data, &[]);
        }
    }

    #[test]
    fn several_members_read_the_same_everywhere_and_across_their_boundaries() {
        let data = text(2 << 20);
        // Members: large ones, an empty one, tiny ones, stored ones, one a span long, then thousands of
        // 13 bytes each.
        let mut cuts = vec![0, 200_000, 200_000, 200_001, 200_013, 900_000, 900_000 + SPAN as usize];
        cuts.extend((1_500_000..1_600_000).step_by(13));
        cuts.push(data.len());
        let mut bytes = Vec::new();
        for (k, w) in cuts.windows(2).enumerate() {
            bytes.extend(gzip(&data[w[0]..w[1]], [1, 0, 9, 6][k % 4]));
        }
        assert_eq!(flate2_reads(&bytes).unwrap(), data);
        let edges: Vec<u64> = cuts[..10].iter().chain(cuts.iter().step_by(500)).map(|&e| e as u64).collect();
        check_everywhere(&bytes, &data, &edges);
        let p = open(&bytes);
        assert_eq!(p.len(), data.len() as u64);
        // A member that starts a span or more after the last point is a point, on a byte, with no window
        // (the tiny members have no blocks boundaries inside: a span of them makes one such point at
        // least). The points of the tiny members cost no window.
        let points = p.index.points.lock().unwrap().clone();
        let mut starts = 0;
        for &e in &cuts[1..cuts.len() - 1] {
            let before = points.iter().rev().find(|p| p.out < e as u64).unwrap();
            if e as u64 - before.out >= SPAN {
                let at = points.iter().find(|p| p.out == e as u64).unwrap_or_else(|| panic!("no point at {e}"));
                assert!(at.window.is_empty() && at.bit % 8 == 0, "the member at {e}");
                starts += 1;
            }
        }
        assert!(starts >= 1, "{:?}", points.iter().map(|p| (p.out, p.window.len())).collect::<Vec<_>>());
        assert!(points.len() < 40, "{} points", points.len());
    }

    #[test]
    fn headers_with_every_field_are_stepped_over() {
        let data = text(200_000);
        let mut bytes = flate2::GzBuilder::new()
            .filename("a.ctf")
            .comment("made by a test")
            .extra(vec![1, 2, 3, 4, 5])
            .write(Vec::new(), flate2::Compression::default());
        bytes.write_all(&data[..100_000]).unwrap();
        let mut bytes = bytes.finish().unwrap();
        // A member with a header CRC (FHCRC), which flate2 does not write.
        let mut member = gzip(&data[100_000..], 6);
        member[3] |= 2;
        let crc = (crc32fast::hash(&member[..10]) as u16).to_le_bytes();
        member.splice(10..10, crc);
        bytes.extend_from_slice(&member);
        assert_eq!(flate2_reads(&bytes).unwrap(), data);
        check_everywhere(&bytes, &data, &[100_000]);
    }

    /// Past the budget, every other point goes and the span doubles, as often as needed; reads are the
    /// same.
    #[test]
    fn the_points_stay_within_their_budget() {
        let data = text(4 << 20);
        let bytes = gzip(&data, 6);
        let full = open(&bytes);
        assert_eq!(full.len(), data.len() as u64);
        let all = full.index.points.lock().unwrap().clone();
        let budget = all.iter().map(|p| cost(&p.window)).sum::<usize>() / 5;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let p = Points::with_budget(Source::File(Arc::new(f)), bytes.len() as u64, "data.gz".into(), budget);
        assert_eq!(p.len(), data.len() as u64);
        let kept = p.index.points.lock().unwrap().clone();
        assert!(kept.iter().map(|p| cost(&p.window)).sum::<usize>() <= budget);
        assert!(kept.len() >= 3 && kept.len() < all.len() / 4, "{} of {} points", kept.len(), all.len());
        assert!(kept.windows(2).all(|w| w[1].out - w[0].out >= 8 * SPAN), "the span doubled three times");
        assert!(kept.iter().all(|k| all.contains(k)), "points are the same, fewer");
        for (at, len) in reads(&p, data.len() as u64, &[]) {
            check(&p, &data, at, len);
        }
    }

    /// A second view of a file (same device, inode, length, times, samples) has its points and length at
    /// once, and no pass; a file changed in place does not.
    #[test]
    fn a_later_view_of_a_file_starts_from_the_points_of_the_first_pass() {
        let data = text(4 << 20);
        let bytes = gzip(&data, 6);
        assert!(bytes.len() as u64 >= SHARE_MIN);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.gz");
        std::fs::write(&path, &bytes).unwrap();
        let view = || {
            let f = std::fs::File::open(&path).unwrap();
            Points::new(Source::File(Arc::new(f)), bytes.len() as u64, "data.gz".into())
        };
        let first = view();
        assert!(matches!(first.pass, Pass::Running(_)));
        check(&first, &data, 1000, 10);
        let early = view();
        assert!(matches!(early.pass, Pass::Running(_)), "the first pass is not done");
        assert_eq!(first.len(), data.len() as u64);
        let second = view();
        assert!(matches!(second.pass, Pass::Done(n) if n == data.len() as u64));
        assert_eq!(second.count(), first.count());
        for (at, len) in reads(&second, data.len() as u64, &[]) {
            check(&second, &data, at, len);
        }
        drop((first, early, second));
        // Changed in place, the same length: a byte of the first member's first block.
        let mut changed = bytes.clone();
        changed[20] ^= 1;
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all(&changed).unwrap();
        assert!(matches!(view().pass, Pass::Running(_)));
    }

    #[test]
    fn tiny_and_empty_streams() {
        for data in [&b""[..], b"|x 1\n"] {
            let bytes = gzip(data, 6);
            check_everywhere(&bytes, data, &[]);
            // Empty members around it.
            let bytes = [gzip(b"", 6), bytes, gzip(b"", 1)].concat();
            check_everywhere(&bytes, data, &[]);
        }
    }

    /// Damage gives an error (E0101 with the path) exactly when flate2's decoder gives one, and the data
    /// otherwise: a truncated file, flipped bytes, a wrong CRC, bytes after the last member.
    #[test]
    fn damage_is_an_error_when_flate2_finds_it() {
        let data = text(400_000);
        let good = [gzip(&data[..150_000], 6), gzip(&data[150_000..], 9)].concat();
        let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
        for cut in [1, 5, 11, 100, good.len() / 3, good.len() / 2, good.len() - 9, good.len() - 4, good.len() - 1] {
            cases.push((format!("cut at {cut}"), good[..cut].to_vec()));
        }
        let mut x = 7u64;
        for _ in 0..60 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let mut bad = good.clone();
            let at = (x >> 24) as usize % bad.len();
            bad[at] ^= 1 << ((x >> 8) % 8);
            cases.push((format!("bit flipped at {at}"), bad));
        }
        for tail in [&[0u8][..], &[0; 8], b"garbage", &[0x1f, 0x8b]] {
            cases.push((format!("followed by {tail:?}"), [&good[..], tail].concat()));
        }
        let mut errors = 0;
        for (name, bad) in cases {
            let p = open(&bad);
            let mut all = vec![0u8; data.len() + 10];
            let read = (|| {
                let len = p.len();
                let n = p.read_some(0, &mut all[..len as usize])?;
                Ok::<_, Error>(n)
            })();
            match (read, flate2_reads(&bad)) {
                (Ok(n), Ok(want)) => assert!(all[..n] == want, "{name}"),
                (Err(e), Err(_)) => {
                    assert_eq!(e.code(), "E0101", "{name}: {e}");
                    assert!(e.to_string().contains("data.gz"), "{name}: {e}");
                    errors += 1;
                }
                (ours, theirs) => panic!("{name}: cntkio {ours:?}, flate2 {theirs:?}"),
            }
        }
        assert!(errors > 20);
    }

    /// A view of the file at `path` (`len` bytes) that keeps its points in `kept`, for `key`.
    fn keeping(path: &std::path::Path, kept: &std::path::Path, key: &[u8]) -> Points {
        let f = std::fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len();
        let p = Points::new(Source::File(Arc::new(f)), len, "data.gz".into());
        p.keep_in(kept, key.to_vec());
        p
    }

    /// Points kept on disk when the pass ends serve a later view without a pass: its length known at
    /// once, every read the data's. A file for another key, damaged or cut short is not used, and is
    /// written again when the pass ends.
    #[test]
    fn points_kept_on_disk_serve_a_later_view_without_a_pass() {
        let data = text(2 << 20);
        let bytes = [gzip(&data[..1 << 20], 6), gzip(&data[1 << 20..], 9)].concat();
        // Smaller than what the process remembers, so that only the file can carry the points.
        assert!((bytes.len() as u64) < SHARE_MIN);
        let dir = tempfile::tempdir().unwrap();
        let (path, kept) = (dir.path().join("data.gz"), dir.path().join("data.gz.points"));
        std::fs::write(&path, &bytes).unwrap();

        let first = keeping(&path, &kept, b"key 1");
        assert!(first.loaded.get().is_none() && !kept.exists());
        assert_eq!(first.len(), data.len() as u64);
        let written = std::fs::read(&kept).unwrap();
        let points = first.index.points.lock().unwrap().clone();
        assert!(points.len() > 20, "{} points", points.len());

        let second = keeping(&path, &kept, b"key 1");
        let (done, from) = second.loaded.get().expect("the points were read from the file");
        assert_eq!((done.points.clone(), from.as_path()), (points, kept.as_path()));
        assert_eq!(second.len(), data.len() as u64);
        for (at, len) in reads(&second, data.len() as u64, &[1 << 20]) {
            check(&second, &data, at, len);
        }
        let Pass::Running(window) = &second.pass else { panic!("a pass") };
        assert_eq!(window.front(), 0, "the pass did not run");

        // Another key, a flipped byte, a cut: the pass runs, and the file is written again for the key.
        let mut flipped = written.clone();
        flipped[written.len() / 2] ^= 4;
        for (name, file, key) in [
            ("another key", written.clone(), &b"key 2"[..]),
            ("a flipped byte", flipped, b"key 1"),
            ("cut short", written[..written.len() - 100].to_vec(), b"key 1"),
            ("empty", Vec::new(), b"key 1"),
        ] {
            std::fs::write(&kept, &file).unwrap();
            let p = keeping(&path, &kept, key);
            assert!(p.loaded.get().is_none(), "{name}");
            assert_eq!(p.len(), data.len() as u64, "{name}");
            check(&p, &data, 12345, 100_000);
            let again = std::fs::read(&kept).unwrap();
            assert!(matches!(super::super::kept::load(&kept, key, bytes.len() as u64), Ok(Some(_))), "{name}");
            if key == b"key 1" {
                assert_eq!(again, written, "{name}");
            }
        }
    }

    /// Asked to keep its points after the pass has ended, a view writes them at once; a file already
    /// written for the content is left as it is.
    #[test]
    fn points_asked_for_after_the_pass_are_written_at_once() {
        let data = text(1 << 20);
        let dir = tempfile::tempdir().unwrap();
        let (path, kept) = (dir.path().join("data.gz"), dir.path().join("kept"));
        std::fs::write(&path, gzip(&data, 6)).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let len = f.metadata().unwrap().len();
        let p = Points::new(Source::File(Arc::new(f)), len, "data.gz".into());
        assert_eq!(p.len(), data.len() as u64);
        p.keep_in(&kept, b"k".to_vec());
        let written = std::fs::metadata(&kept).unwrap().modified().unwrap();
        let again = keeping(&path, &kept, b"k");
        assert!(again.loaded.get().is_some());
        check(&again, &data, 500_000, 300_000);
        p.keep_in(&kept, b"k".to_vec());
        assert_eq!(std::fs::metadata(&kept).unwrap().modified().unwrap(), written, "not written again");
    }

    /// A kept point that is wrong (its bit moved by one, the file's CRC-32 made right) gives an error that
    /// names the file of points, not silently other data.
    #[test]
    fn a_wrong_kept_point_is_an_error_that_names_the_kept_file() {
        let data = text(2 << 20);
        let bytes = gzip(&data, 6);
        let dir = tempfile::tempdir().unwrap();
        let (path, kept) = (dir.path().join("data.gz"), dir.path().join("kept"));
        std::fs::write(&path, &bytes).unwrap();
        let first = keeping(&path, &kept, b"k");
        assert_eq!(first.len(), data.len() as u64);
        let done = super::super::kept::load(&kept, b"k", bytes.len() as u64).unwrap().unwrap();
        let mut points = done.points.clone();
        let k = points.len() / 2;
        points[k].bit += 1;
        let wrong = Done { points: points.clone(), len: done.len, cost: done.cost };
        std::fs::remove_file(&kept).unwrap();
        super::super::kept::save(&kept, b"k", &wrong).unwrap();
        let p = keeping(&path, &kept, b"k");
        assert!(p.loaded.get().is_some());
        let at = points[k].out;
        let mut buf = vec![0u8; (points[k + 1].out - at) as usize];
        match p.read_some(at, &mut buf) {
            Err(e) => {
                assert_eq!(e.code(), "E0101", "{e}");
                assert!(e.to_string().contains(&kept.display().to_string()), "{e}");
            }
            // A bit off may still decode: then it must not pass for the data.
            Ok(n) => assert!(buf[..n] != data[at as usize..at as usize + n], "wrong data read as right"),
        }
    }

    #[test]
    fn a_truncated_stream_says_so_with_the_offset() {
        let data = text(300_000);
        let bytes = gzip(&data, 6);
        let p = open(&bytes[..bytes.len() / 2]);
        let len = p.len();
        let e = p.read_some(0, &mut vec![0u8; len as usize]).unwrap_err();
        // The offset of the damage, at or after what is delivered (a block of the window at a time).
        let shown = e.to_string();
        let after: u64 = shown.split("after ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
        assert!(shown.contains("ends early") && after >= len - 1 && after < len - 1 + BLOCK as u64, "{e}");
        // What was decompressed before the damage reads as it is.
        check(&p, &data, 0, (len - 1) as usize);
    }

    /// Threads reading at once, some in order behind the pass, some anywhere, during and after it.
    #[test]
    fn concurrent_readers_read_the_data() {
        let data = text(5 << 20);
        let bytes = gzip(&data, 6);
        let p = open(&bytes);
        let len = data.len() as u64;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (p, data) = (&p, &data);
                s.spawn(move || {
                    let mut x = t + 1;
                    for k in 0..60u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let (at, n) = if t % 2 == 0 {
                            ((k * 90_001) % len, BLOCK / 3)
                        } else {
                            ((x >> 20) % len, (x >> 8) as usize % (2 * SPAN as usize))
                        };
                        check(p, data, at, n);
                    }
                });
            }
        });
        assert_eq!(p.len(), len);
        assert!(p.decoders.lock().unwrap().len() <= DECODERS);
    }

    /// A reader that goes on where it stopped continues with its decoder rather than starting again from a
    /// point.
    #[test]
    fn reads_that_continue_each_other_reuse_a_decoder() {
        let data = text(3 << 20);
        let p = open(&gzip(&data, 6));
        assert_eq!(p.len(), data.len() as u64);
        let (from, piece, pieces) = (5000, 10_000, 50);
        for k in 0..pieces {
            check(&p, &data, from + k * piece, piece as usize);
        }
        // One decoder from the point before the first read, and at most one from each point the reads pass
        // (none when the piece before the point has ended there first).
        let passed = p
            .index
            .points
            .lock()
            .unwrap()
            .iter()
            .filter(|p| (from + 1..from + pieces * piece).contains(&p.out))
            .count();
        assert!(passed >= 3);
        assert!(p.started.load(Ordering::Relaxed) <= 1 + passed as u64);
        assert!(p.decoders.lock().unwrap().iter().any(|d| d.out == from + pieces * piece));
    }

    #[test]
    fn header_lengths() {
        let plain = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xAA];
        assert_eq!(header_len(&plain), Ok(Some(10)));
        assert_eq!(header_len(&plain[..9]), Ok(None));
        let mut named = plain[..10].to_vec();
        named[3] = 8;
        named.extend_from_slice(b"name");
        assert_eq!(header_len(&named), Ok(None));
        named.push(0);
        assert_eq!(header_len(&named), Ok(Some(15)));
        let mut long = named[..10].to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_FIELD + 1));
        assert_eq!(header_len(&long), Err("gzip header field too long"));
        let mut extra = plain[..10].to_vec();
        extra[3] = 4;
        extra.extend_from_slice(&[0xff, 0xff]);
        assert_eq!(header_len(&extra), Ok(None), "64 KiB of extra field not there yet");
        for bad in [[0x1f, 0x8b, 7, 0], [0x1f, 0x8c, 8, 0], [0x1f, 0x8b, 8, 0x20]] {
            let mut h = plain.to_vec();
            h[..4].copy_from_slice(&bad);
            assert_eq!(header_len(&h), Err("invalid gzip header"));
        }
    }
}
