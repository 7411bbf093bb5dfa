//! Compressed output in the two forms whose every byte range can be read without decompressing what
//! comes before it (the [frames view](super::frames)): seekable zstd (zstd frames that record their sizes,
//! then a seek table in a skippable frame) and BGZF (gzip members of at most 64 KiB with their size in a
//! `BC` extra field, then an empty end-of-file member). Both are read by the standard tools as plain zstd
//! and gzip. Pieces are compressed independently, so threads compress them in parallel and the writer
//! puts them out in order.

use crate::Error;
use std::io::Write;
use std::path::Path;

/// The zstd frames written hold at most this many bytes of data each.
const ZSTD_FRAME: usize = 4 << 20;
/// The data bytes of a BGZF block (as `bgzip` cuts them: its compressed form then fits in 64 KiB).
const BGZF_BLOCK: usize = 0xff00;
/// The zstd level (the `zstd` tool's default).
const ZSTD_LEVEL: i32 = 3;
/// The empty BGZF block that ends a BGZF file.
const BGZF_EOF: [u8; 28] =
    [0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 6, 0, b'B', b'C', 2, 0, 0x1b, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// How an output file is compressed, told by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputCompression {
    /// Seekable zstd (`.zst`, `.zstd`).
    SeekableZstd,
    /// BGZF (`.gz`, `.bgz`, `.bgzf`).
    Bgzf,
}

impl OutputCompression {
    /// The compression the name of `path` asks for: its last extension.
    pub fn from_path(path: &Path) -> Option<OutputCompression> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "zst" | "zstd" => Some(OutputCompression::SeekableZstd),
            "gz" | "bgz" | "bgzf" => Some(OutputCompression::Bgzf),
            _ => None,
        }
    }

    /// `seekable zstd` or `BGZF`.
    pub fn name(self) -> &'static str {
        match self {
            OutputCompression::SeekableZstd => "seekable zstd",
            OutputCompression::Bgzf => "BGZF",
        }
    }

    /// Appends `data` to `out` compressed as frames or blocks of their own, and their sizes
    /// (compressed, data) to `sizes`.
    pub(crate) fn compress(self, data: &[u8], out: &mut Vec<u8>, sizes: &mut Vec<(u32, u32)>) -> Result<(), Error> {
        let failed = |e: std::io::Error| Error::io(format!("cannot compress the output as {}", self.name()), e);
        match self {
            OutputCompression::SeekableZstd => {
                let mut z = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(failed)?;
                z.include_checksum(true).map_err(failed)?;
                for piece in data.chunks(ZSTD_FRAME) {
                    let at = out.len();
                    out.reserve(zstd::zstd_safe::compress_bound(piece.len()));
                    let frame = z.compress(piece).map_err(failed)?;
                    out.extend_from_slice(&frame);
                    sizes.push(((out.len() - at) as u32, piece.len() as u32));
                }
            }
            OutputCompression::Bgzf => {
                for piece in data.chunks(BGZF_BLOCK) {
                    let at = out.len();
                    out.extend_from_slice(&[0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 6, 0, b'B', b'C', 2, 0, 0, 0]);
                    let mut e = flate2::write::DeflateEncoder::new(&mut *out, flate2::Compression::default());
                    e.write_all(piece).map_err(failed)?;
                    e.finish().map_err(failed)?;
                    out.extend_from_slice(&crc32fast::hash(piece).to_le_bytes());
                    out.extend_from_slice(&(piece.len() as u32).to_le_bytes());
                    let size = out.len() - at;
                    // Data that does not compress grows by a few bytes only: a block stays within 64 KiB.
                    let bsize = u16::try_from(size - 1).map_err(|_| Error::internal("a BGZF block over 64 KiB"))?;
                    out[at + 16..at + 18].copy_from_slice(&bsize.to_le_bytes());
                    sizes.push((size as u32, piece.len() as u32));
                }
            }
        }
        Ok(())
    }

    /// What ends the file, given the sizes of every frame or block written: the seek table, or BGZF's
    /// end-of-file block.
    pub(crate) fn trailer(self, sizes: &[(u32, u32)]) -> Result<Vec<u8>, Error> {
        Ok(match self {
            OutputCompression::SeekableZstd => {
                let count = u32::try_from(sizes.len())
                    .ok()
                    .filter(|&n| n <= (u32::MAX - 17) / 8)
                    .ok_or_else(|| Error::internal("too many frames for a seek table"))?;
                let mut t = Vec::with_capacity(17 + 8 * sizes.len());
                t.extend_from_slice(&super::SEEK_TABLE_FRAME.to_le_bytes());
                t.extend_from_slice(&(8 * count + 9).to_le_bytes());
                for (c, d) in sizes {
                    t.extend_from_slice(&c.to_le_bytes());
                    t.extend_from_slice(&d.to_le_bytes());
                }
                t.extend_from_slice(&count.to_le_bytes());
                t.push(0); // no checksums in the table (the frames carry theirs)
                t.extend_from_slice(&super::SEEKABLE_MAGIC.to_le_bytes());
                t
            }
            OutputCompression::Bgzf => BGZF_EOF.to_vec(),
        })
    }
}

/// An error for an output named as compressed in a format that is not written compressed.
pub(crate) fn refuse(output: &Path, format: &str) -> Result<(), Error> {
    match OutputCompression::from_path(output) {
        None => Ok(()),
        Some(c) => Err(Error::option_value(
            "OUTPUT",
            output.display().to_string(),
            format!(
                "names {} output, which cntkio writes for CTF text only (OUT.ctf.zst, OUT.ctf.gz); write {format} \
                 uncompressed, or compress the file afterwards with `cntkio recompress`",
                c.name()
            ),
        )),
    }
}
