//! Compressed input: gzip (one member or several, BGZF included) and zstd (one frame or several, the
//! seekable format included), told by their first bytes, never by the file's name.
//!
//! A compressed file is read through a *decompressed view* with the positional reads of
//! [`InputFile`](crate::InputFile): offsets and the length are those of the decompressed data. There are
//! four kinds of view:
//!
//! - **Frames** ([`frames`]): the file is a series of independently compressed pieces whose sizes are
//!   known without decompressing anything: BGZF blocks (their headers give each block's size, the last
//!   four bytes its decompressed size), seekable zstd (its seek table) and zstd frames that declare their
//!   content size (found by walking frame and block headers). Any byte range is read by decompressing
//!   the pieces that hold it, several at once on the rayon pool; recently used pieces are kept.
//! - **Points** ([`points`]): a plain gzip stream. A thread decompresses it once, in order, into a window
//!   of memory that the readers following it read from, and notes seek points on the way (every few MiB,
//!   where a deflate block ends: the compressed bit offset and the 32 KiB of data before it, which is how
//!   zlib's `zran` resumes); a read behind the window decompresses from the nearest point. Nothing is
//!   written to disk.
//! - **Spool** ([`spool`]): zstd frames without declared sizes or larger than [`FRAME_CAP`]. A zstd
//!   decoder's state cannot be saved and restored mid-frame, so the data is decompressed once, in order, by
//!   a thread of its own, into an unlinked temporary file that reads then use; a read waits until the
//!   thread has passed its end, so parsing overlaps decompression on the first pass, and later random
//!   reads cost what reads of a plain file cost.
//! - **Window** ([`window`]): a spooled stream of known length that its reader reads once, in order
//!   ([`InputFile::read_in_order`](crate::InputFile::read_in_order): a validation), is decompressed into a
//!   few blocks of memory instead, and no temporary file is written; a read that goes back past them is
//!   served by the spool, which then decompresses the stream again. (The points view keeps such a window
//!   of its own.)
//!
//! Memory does not grow with the decompressed size in any view but by the seek points of a gzip stream (a
//! deflated 32 KiB window every 4 MiB, some 0.5% of the data, 256 MiB at most, the points thinned out
//! beyond); a zstd decompression bomb fills at most the temporary directory, which is checked against its
//! free space.

mod frames;
mod inflate;
mod kept;
mod points;
mod spool;
mod walk;
mod window;
mod write;

use crate::remote::Remote;
use crate::Error;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

pub(crate) use frames::Frames;
pub(crate) use points::Points;
pub(crate) use spool::Spool;
use walk::{SEEKABLE_MAGIC, SEEK_TABLE_FRAME};
use window::Window;
pub(crate) use write::refuse as refuse_compressed_output;
pub use write::OutputCompression;

/// The largest decompressed piece (BGZF block, zstd frame) that the frames view decompresses whole on
/// demand; zstd files with larger frames are spooled.
pub(crate) const FRAME_CAP: u64 = 64 << 20;

/// How an input file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// gzip, one member or several (not BGZF).
    Gzip,
    /// BGZF: gzip members of at most 64 KiB each, with the block size in a `BC` extra field.
    Bgzf,
    /// zstd, one frame or several (not the seekable format).
    Zstd,
    /// The seekable zstd format: frames indexed by a seek table in a skippable frame at the end.
    SeekableZstd,
}

impl Compression {
    /// The name used in messages and reports: `gzip`, `BGZF`, `zstd`, `seekable zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bgzf => "BGZF",
            Compression::Zstd => "zstd",
            Compression::SeekableZstd => "seekable zstd",
        }
    }
    /// A stable number for keys (the index cache's).
    pub(crate) fn code(self) -> u8 {
        match self {
            Compression::Gzip => 1,
            Compression::Bgzf => 2,
            Compression::Zstd => 3,
            Compression::SeekableZstd => 4,
        }
    }
}

/// The codec family a file's first bytes announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Gzip,
    Zstd,
}

/// The zstd frame magic number.
pub(crate) const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// True for the magic numbers of zstd skippable frames (`0x184D2A50` to `0x184D2A5F`).
pub(crate) fn is_skippable(magic: u32) -> bool {
    magic & 0xFFFF_FFF0 == 0x184D_2A50
}

/// The codec of a file starting with `head` (its first 5 bytes, or 4 for a file that short), if it is
/// compressed: gzip's `1f 8b 08` (deflate, the only method gzip defines) with the header flags' reserved
/// bits clear, zstd's frame magic with the frame header descriptor's reserved bit clear, or a skippable
/// frame's magic. Bytes that break those rules cannot start a compressed file, so such a file is read as it
/// is (CNTK reads a CTF file that starts with any bytes when sequence ids are skipped); CBF has its own magic.
pub(crate) fn detect(head: &[u8]) -> Option<Codec> {
    if head.starts_with(&[0x1f, 0x8b, 0x08]) {
        return head.get(3).is_none_or(|flags| flags & 0xE0 == 0).then_some(Codec::Gzip);
    }
    let magic = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    let frame = magic == ZSTD_MAGIC && head.get(4).is_none_or(|descriptor| descriptor & 0x08 == 0);
    (frame || is_skippable(magic)).then_some(Codec::Zstd)
}

/// The compressed bytes: a local file or an object in an object store, read at any offset by any thread.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A local file.
    File(Arc<File>),
    /// An object, read by ranged GETs through its block cache.
    Object(Arc<Remote>),
}

impl Source {
    /// Reads exactly `buf.len()` bytes at `offset` (an object's errors come back as I/O errors that carry
    /// them).
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self {
            Source::File(f) => read_exact_at(f, buf, offset),
            Source::Object(o) => {
                let mut done = 0;
                while done < buf.len() {
                    let n = o.read_some(offset + done as u64, &mut buf[done..]).map_err(std::io::Error::other)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    done += n;
                }
                Ok(())
            }
        }
    }

    /// A reader of the bytes from the first, with a position of its own.
    fn reader(&self) -> SourceReader {
        SourceReader { source: self.clone(), pos: 0 }
    }
}

/// Sequential reads of a [`Source`] by positional reads.
struct SourceReader {
    source: Source,
    pos: u64,
}

impl std::io::Read for SourceReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = match &self.source {
            #[cfg(unix)]
            Source::File(f) => std::os::unix::fs::FileExt::read_at(&**f, buf, self.pos)?,
            #[cfg(windows)]
            Source::File(f) => std::os::windows::fs::FileExt::seek_read(&**f, buf, self.pos)?,
            Source::Object(o) => o.read_some(self.pos, buf).map_err(std::io::Error::other)?,
        };
        self.pos += n as u64;
        Ok(n)
    }
}

/// The decompressed view of a compressed file.
#[derive(Debug)]
pub(crate) struct Decompressed {
    compression: Compression,
    view: View,
    /// A spooled stream of known length: what a [window](Window) needs (the source, the path shown).
    stream: Option<(Source, String)>,
    /// The window, for a caller that reads once in order ([`Decompressed::read_in_order`]).
    window: std::sync::OnceLock<Window>,
    /// Set when a read missed the window: the spool serves every read from then on.
    missed: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
enum View {
    Frames(Frames),
    Points(Points),
    Spool(Spool),
}

impl Decompressed {
    /// Opens the view of `file` (`len` bytes, compressed with `codec`): walks its block or frame headers
    /// (reads of a few bytes each), or prepares seek points or a spool; decompresses nothing yet.
    pub(crate) fn open(file: Source, len: u64, codec: Codec, path: &Path) -> Result<Decompressed, Error> {
        let shown = path.display().to_string();
        let at = |e: Error| if e.position().path.is_none() { e.with_path(shown.clone()) } else { e };
        let (compression, layout) = match codec {
            Codec::Gzip => match walk::bgzf_blocks(&file, len).map_err(at)? {
                Some(blocks) => (Compression::Bgzf, walk::Layout::Frames(blocks)),
                None => (Compression::Gzip, walk::Layout::Stream { len: None }),
            },
            Codec::Zstd => match walk::seek_table(&file, len).map_err(at)? {
                Some(frames) => (Compression::SeekableZstd, walk::Layout::Frames(frames)),
                None => (Compression::Zstd, walk::zstd_frames(&file, len).map_err(at)?),
            },
        };
        let stream = match layout {
            walk::Layout::Stream { len: Some(_) } => Some((file.clone(), shown.clone())),
            _ => None,
        };
        let view = match layout {
            walk::Layout::Frames(list) => View::Frames(Frames::new(file, compression, list, shown)),
            walk::Layout::Stream { .. } if codec == Codec::Gzip => View::Points(Points::new(file, len, shown)),
            walk::Layout::Stream { len } => View::Spool(Spool::new(file, compression, len, shown)?),
        };
        log::debug!(
            "{}: {} ({})",
            path.display(),
            compression.name(),
            match &view {
                View::Frames(f) => format!("{} frames, read directly", f.count()),
                View::Points(p) if p.reused() => format!("{} seek points of an earlier pass over the file", p.count()),
                View::Points(_) => {
                    "decompressed in order into a window of memory, noting seek points that later reads start from"
                        .into()
                }
                View::Spool(_) => "decompressed in order, into a temporary file or a window of memory".into(),
            }
        );
        Ok(Decompressed { compression, view, stream, window: Default::default(), missed: Default::default() })
    }

    /// Says that the data will be read once, from front to back (give or take a few MiB): a stream that
    /// would be spooled, of known length and not read yet, is then decompressed into a window of memory
    /// instead, and no temporary file is written. Reads that go back further than the window keeps are
    /// served by the spool, which then decompresses the stream again from its start.
    pub(crate) fn read_in_order(&self) {
        let (View::Spool(spool), Some((file, path))) = (&self.view, &self.stream) else { return };
        if spool.started() || self.window.get().is_some() {
            return;
        }
        let (file, compression, path) = (file.clone(), self.compression, path.clone());
        let make: window::MakeFill =
            Box::new(move || Ok(Box::new(Stream::new(file, compression, &path)?) as Box<dyn window::Fill>));
        let _ = self.window.set(Window::new(make));
    }

    /// Keeps a plain gzip stream's seek points in the file at `path`, for the content that `key` names
    /// (see [`Points::keep_in`]); nothing for other views, which need no pass.
    pub(crate) fn keep_seek_points(&self, path: &Path, key: Vec<u8>) {
        if let View::Points(p) = &self.view {
            p.keep_in(path, key);
        }
    }

    /// The compression.
    pub(crate) fn compression(&self) -> Compression {
        self.compression
    }

    /// True when any byte range is read directly (BGZF, seekable zstd, zstd frames of known sizes); false
    /// when the data is first decompressed once, in order (gzip: to seek points; other zstd: into a
    /// temporary file).
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self.view, View::Frames(_))
    }

    /// The decompressed length. A stream that does not declare it (gzip, some zstd) is decompressed to its
    /// end first; if that fails, one byte more than was decompressed, so that reading to the end gives
    /// the error.
    pub(crate) fn len(&self) -> u64 {
        match &self.view {
            View::Frames(f) => f.len(),
            View::Points(p) => p.len(),
            View::Spool(s) => s.len(),
        }
    }

    /// The decompressed length, if it is known without waiting: `None` for a gzip stream whose pass has
    /// not ended (a spooled zstd stream's length is waited for, as [`len`](Self::len) does).
    pub(crate) fn known_len(&self) -> Option<u64> {
        match &self.view {
            View::Points(p) => p.known_len(),
            _ => Some(self.len()),
        }
    }

    /// Reads up to `buf.len()` bytes at decompressed offset `offset`; returns how many (0 at the end).
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        use std::sync::atomic::Ordering;
        if let Some(w) = self.window.get().filter(|_| !self.missed.load(Ordering::Relaxed)) {
            if let Some(n) = w.read(offset, buf)? {
                return Ok(n);
            }
            if !self.missed.swap(true, Ordering::Relaxed) {
                log::debug!("a read at {offset} went back past the window: decompressing the stream again into a file");
                w.give_up();
            }
        }
        match &self.view {
            View::Frames(f) => f.read_some(offset, buf),
            View::Points(p) => p.read_some(offset, buf),
            View::Spool(s) => s.read_some(offset, buf),
        }
    }
}

/// Runs `work` on a decompressing thread of its own, then `finish` with its result (or at once with the
/// error of starting the thread).
fn spawn(
    work: impl FnOnce() -> Result<(), Error> + Send + 'static,
    finish: impl Fn(Result<(), Error>) + Send + Sync + 'static,
) {
    let finish = Arc::new(finish);
    let after = finish.clone();
    let spawned = std::thread::Builder::new().name("cntkio-decompress".into()).spawn(move || after(work()));
    if let Err(e) = spawned {
        finish(Err(Error::io("cannot start the decompressing thread", e)));
    }
}

/// A zstd stream's decompressor, reading `file` from its start (gzip streams have [`points`]).
pub(crate) struct Stream {
    decoder: Box<dyn std::io::Read>,
    watch: IoWatch,
    compression: Compression,
    path: String,
    /// Bytes decompressed so far.
    done: u64,
}

impl Stream {
    pub(crate) fn new(file: Source, compression: Compression, path: &str) -> Result<Stream, Error> {
        let watch = IoWatch::default();
        let src = std::io::BufReader::with_capacity(1 << 20, Watched { inner: file.reader(), watch: watch.clone() });
        let decoder =
            zstd::stream::read::Decoder::with_buffer(src).map_err(|e| spool::bad(compression, path, 0, &e))?;
        Ok(Stream { decoder: Box::new(decoder), watch, compression, path: path.to_string(), done: 0 })
    }
}

impl window::Fill for Stream {
    /// Fills `buf` with the next bytes; fewer only at the end of the stream. A failed read of the file is
    /// an I/O error, damaged data a [`compressed`](Error::compressed) one.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        let mut n = 0;
        while n < buf.len() {
            match self.decoder.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(match self.watch.take() {
                        Some(io) => Error::io(format!("cannot read {}", self.path), io),
                        None => spool::bad(self.compression, &self.path, self.done + n as u64, &e),
                    })
                }
            }
        }
        self.done += n as u64;
        Ok(n)
    }
}

/// A shared, clonable record of the first real I/O error of a reader wrapped by [`Watched`], so that
/// a decoder's error can be told apart: damaged data (exit 1) or a failed read (exit 2).
#[derive(Debug, Clone, Default)]
pub(crate) struct IoWatch(Arc<std::sync::Mutex<Option<std::io::Error>>>);

impl IoWatch {
    /// The I/O error seen, if any.
    pub(crate) fn take(&self) -> Option<std::io::Error> {
        self.0.lock().expect("lock").take()
    }
}

/// A reader that records its I/O errors in an [`IoWatch`].
pub(crate) struct Watched<R> {
    pub(crate) inner: R,
    pub(crate) watch: IoWatch,
}

impl<R: std::io::Read> std::io::Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.kind() != std::io::ErrorKind::Interrupted {
                *self.watch.0.lock().expect("lock") = Some(std::io::Error::new(e.kind(), e.to_string()));
            }
        })
    }
}

/// Reads exactly `buf.len()` bytes of `file` at `offset`.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        let mut done = 0;
        while done < buf.len() {
            let n = std::os::windows::fs::FileExt::seek_read(file, &mut buf[done..], offset + done as u64)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zstd frame larger than [`FRAME_CAP`] that declares its size: spooled, or read through a window.
    fn big_frame() -> (Vec<u8>, File) {
        let data: Vec<u8> = (0..FRAME_CAP as usize + (3 << 20)).map(|i| (i % 251) as u8 ^ (i >> 20) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, &zstd::bulk::compress(&data, 1).unwrap()).unwrap();
        (data, f)
    }

    /// The view of a whole zstd file.
    fn open_zstd(f: File, name: &str) -> Decompressed {
        let len = f.metadata().unwrap().len();
        Decompressed::open(Source::File(Arc::new(f)), len, Codec::Zstd, Path::new(name)).unwrap()
    }

    #[test]
    fn a_stream_read_in_order_comes_through_the_window_and_a_read_behind_it_through_the_spool() {
        let (data, f) = big_frame();
        let d = open_zstd(f, "big.zst");
        assert!(!d.is_direct());
        d.read_in_order();
        assert!(d.window.get().is_some());
        assert_eq!(d.len(), data.len() as u64);
        // In order, as parallel parsing reads: pieces a little out of order.
        let piece = window::BLOCK;
        let mut buf = vec![0u8; piece];
        for k in 0..640usize {
            let at = (k ^ 1) * piece;
            assert_eq!(d.read_some(at as u64, &mut buf).unwrap(), piece);
            assert!(buf == data[at..at + piece], "piece {k}");
        }
        assert!(!d.missed.load(std::sync::atomic::Ordering::Relaxed), "no read went back past the window");
        // Back to the start: served by the spool, then every read, to the end.
        assert_eq!(d.read_some(5, &mut buf).unwrap(), piece);
        assert!(buf == data[5..5 + piece]);
        assert!(d.missed.load(std::sync::atomic::Ordering::Relaxed));
        let tail = data.len() - 100;
        assert_eq!(d.read_some(tail as u64, &mut buf).unwrap(), 100);
        assert!(buf[..100] == data[tail..]);
    }

    /// Threads reading pieces in turn, as parallel parsing does, each at its own pace: every read gives
    /// the stream's bytes, whether the window still holds them or the spool serves it.
    #[test]
    fn threads_reading_in_turn_through_the_window_read_the_stream() {
        let (data, f) = big_frame();
        let d = open_zstd(f, "big.zst");
        d.read_in_order();
        let piece = window::BLOCK / 2 + 123;
        let pieces = data.len() / piece;
        let threads = 3;
        std::thread::scope(|s| {
            for t in 0..threads {
                let (d, data) = (&d, &data);
                s.spawn(move || {
                    let mut buf = vec![0u8; piece];
                    for k in (t..pieces).step_by(threads) {
                        if k % 50 == t {
                            std::thread::yield_now();
                        }
                        // One thread goes back once, midway: the others go on through the spool.
                        if t == 1 && k == pieces / 2 {
                            assert_eq!(d.read_some(7, &mut buf).unwrap(), piece);
                            assert!(buf == data[7..7 + piece]);
                        }
                        assert_eq!(d.read_some((k * piece) as u64, &mut buf).unwrap(), piece);
                        assert!(buf == data[k * piece..(k + 1) * piece], "piece {k}");
                    }
                });
            }
        });
        assert!(d.missed.load(std::sync::atomic::Ordering::Relaxed));
    }

    #[test]
    fn the_window_reads_to_the_end_and_reports_damage() {
        let (data, f) = big_frame();
        let len = f.metadata().unwrap().len();
        let d =
            Decompressed::open(Source::File(Arc::new(f.try_clone().unwrap())), len, Codec::Zstd, Path::new("big.zst"))
                .unwrap();
        d.read_in_order();
        let mut buf = vec![0u8; 3 << 20];
        let mut at = 0usize;
        loop {
            let n = d.read_some(at as u64, &mut buf).unwrap();
            assert!(buf[..n] == data[at..at + n]);
            at += n;
            if n < buf.len() {
                break;
            }
        }
        assert_eq!(at, data.len());
        // Truncated: the window's reads meet the decompressor's error.
        f.set_len(len / 2).unwrap();
        let d = Decompressed::open(
            Source::File(Arc::new(f.try_clone().unwrap())),
            len / 2,
            Codec::Zstd,
            Path::new("cut.zst"),
        )
        .unwrap();
        d.read_in_order();
        let e = (0..).find_map(|k: u64| d.read_some(k * buf.len() as u64, &mut buf).err()).unwrap();
        assert_eq!(e.code(), "E0101", "{e}");
        assert!(e.to_string().contains("cut.zst"), "{e}");
    }

    #[test]
    fn detects_gzip_and_zstd_by_their_first_bytes_only() {
        assert_eq!(detect(&[0x1f, 0x8b, 0x08, 0]), Some(Codec::Gzip));
        assert_eq!(detect(&ZSTD_MAGIC.to_le_bytes()), Some(Codec::Zstd));
        assert_eq!(detect(&0x184D_2A5Eu32.to_le_bytes()), Some(Codec::Zstd));
        // Text, CBF's magic, a gzip header with another method, too few bytes.
        // A frame header descriptor or gzip flags with reserved bits set start no compressed file.
        let bad_frame = [0x28, 0xb5, 0x2f, 0xfd, 0x58];
        let bad_flags = [0x1f, 0x8b, 0x08, 0x20, 0];
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd, 0x50]), Some(Codec::Zstd));
        for plain in [
            &b"|x 1 2\n"[..],
            &cntkio_core::cbf::MAGIC.to_le_bytes(),
            &[0x1f, 0x8b, 0x07, 0],
            &[0x28, 0xb5],
            &bad_frame,
            &bad_flags,
        ] {
            assert_eq!(detect(plain), None, "{plain:?}");
        }
    }
}
