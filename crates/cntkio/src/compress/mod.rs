//! Compressed input: gzip (one member or several, BGZF included) and zstd (one frame or several, the
//! seekable format included), told by their first bytes, never by the file's name.
//!
//! A compressed file is read through a *decompressed view* with the positional reads of
//! [`InputFile`](crate::InputFile): offsets and the length are those of the decompressed data. There are
//! two kinds of view:
//!
//! - **Frames** ([`frames`]): the file is a series of independently compressed pieces whose sizes are
//!   known without decompressing anything: BGZF blocks (their headers give each block's size, the last
//!   four bytes its decompressed size), seekable zstd (its seek table) and zstd frames that declare their
//!   content size (found by walking frame and block headers). Any byte range is read by decompressing
//!   the pieces that hold it, several at once on the rayon pool; recently used pieces are kept.
//! - **Spool** ([`spool`]): a plain gzip stream, or zstd frames without declared sizes or larger than
//!   [`FRAME_CAP`]. Their state cannot be saved and restored with the decompressors the crates expose
//!   (zlib's `inflatePrime`/zstd's window are not reachable), so the data is decompressed once, in order,
//!   by a thread of its own, into an unlinked temporary file that reads then use; a read waits until the
//!   thread has passed its end, so parsing overlaps decompression on the first pass, and later random
//!   reads cost what reads of a plain file cost.
//!
//! Memory does not grow with the decompressed size in either view (a decompression bomb fills at most
//! the temporary directory, which is checked against its free space).

mod frames;
mod spool;
mod walk;

use crate::Error;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

pub(crate) use frames::Frames;
pub(crate) use spool::Spool;

/// The largest decompressed piece (BGZF block, zstd frame) that the frames view decompresses whole on
/// demand; files with larger frames are spooled.
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

/// The decompressed view of a compressed file.
#[derive(Debug)]
pub(crate) struct Decompressed {
    compression: Compression,
    view: View,
}

#[derive(Debug)]
enum View {
    Frames(Frames),
    Spool(Spool),
}

impl Decompressed {
    /// Opens the view of `file` (`len` bytes, compressed with `codec`): walks its block or frame headers
    /// (reads of a few bytes each) or prepares a spool; decompresses nothing yet.
    pub(crate) fn open(file: &File, len: u64, codec: Codec, path: &Path) -> Result<Decompressed, Error> {
        let shown = path.display().to_string();
        let at = |e: Error| if e.position().path.is_none() { e.with_path(shown.clone()) } else { e };
        let (compression, layout) = match codec {
            Codec::Gzip => match walk::bgzf_blocks(file, len).map_err(at)? {
                Some(blocks) => (Compression::Bgzf, walk::Layout::Frames(blocks)),
                None => (Compression::Gzip, walk::Layout::Stream { len: None }),
            },
            Codec::Zstd => match walk::seek_table(file, len).map_err(at)? {
                Some(frames) => (Compression::SeekableZstd, walk::Layout::Frames(frames)),
                None => (Compression::Zstd, walk::zstd_frames(file, len).map_err(at)?),
            },
        };
        let file = file.try_clone().map_err(|e| Error::io(format!("cannot open {shown}"), e))?;
        let view = match layout {
            walk::Layout::Frames(list) => View::Frames(Frames::new(file, compression, list, shown)),
            walk::Layout::Stream { len } => View::Spool(Spool::new(file, codec, compression, len, shown)?),
        };
        log::debug!(
            "{}: {} ({})",
            path.display(),
            compression.name(),
            match &view {
                View::Frames(f) => format!("{} frames, read directly", f.count()),
                View::Spool(_) => "decompressed into a temporary file".into(),
            }
        );
        Ok(Decompressed { compression, view })
    }

    /// The compression.
    pub(crate) fn compression(&self) -> Compression {
        self.compression
    }

    /// True when any byte range is read directly (BGZF, seekable zstd, zstd frames of known sizes); false
    /// when the data is decompressed once into a temporary file.
    pub(crate) fn is_direct(&self) -> bool {
        matches!(self.view, View::Frames(_))
    }

    /// The decompressed length. A spooled stream that does not declare it (gzip) is decompressed to its
    /// end first; if that fails, one byte more than was decompressed, so that reading to the end gives
    /// the error.
    pub(crate) fn len(&self) -> u64 {
        match &self.view {
            View::Frames(f) => f.len(),
            View::Spool(s) => s.len(),
        }
    }

    /// Reads up to `buf.len()` bytes at decompressed offset `offset`; returns how many (0 at the end).
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        match &self.view {
            View::Frames(f) => f.read_some(offset, buf),
            View::Spool(s) => s.read_some(offset, buf),
        }
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
