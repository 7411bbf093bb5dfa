//! Finding the independently compressed pieces of a file without decompressing it: BGZF block headers,
//! the seekable zstd seek table, zstd frame and block headers.
//!
//! A walk that meets anything unexpected gives up (`None`, or a stream layout) rather than failing: the
//! file is then decompressed as a stream, whose decoder checks everything and reports the damage.

use super::{is_skippable, Source, FRAME_CAP, ZSTD_MAGIC};
use crate::Error;

/// One independently decompressible piece: a BGZF block or a zstd frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Offset in the compressed file of what the decoder gets (a BGZF block's deflate data, a zstd frame).
    pub comp_off: u64,
    /// Its length: for BGZF the deflate data and the 8-byte trailer (CRC-32, size).
    pub comp_len: u64,
    /// Offset in the decompressed data.
    pub out_off: u64,
    /// Decompressed length (at most [`FRAME_CAP`]).
    pub out_len: u64,
}

/// How a file is read.
#[derive(Debug)]
pub(crate) enum Layout {
    /// Pieces of known sizes.
    Frames(Vec<Frame>),
    /// A stream decompressed in order; its decompressed length when every frame declares its size.
    Stream { len: Option<u64> },
}

/// Positional reads of small pieces of the compressed file through a small window (a walk reads a few
/// bytes per block, blocks being tens of KiB apart).
struct Peek<'a> {
    file: &'a Source,
    len: u64,
    buf: Vec<u8>,
    buf_off: u64,
}

const PEEK_WINDOW: usize = 4096;

impl<'a> Peek<'a> {
    fn new(file: &'a Source, len: u64) -> Self {
        Peek { file, len, buf: Vec::new(), buf_off: 0 }
    }
    /// The `n` bytes at `off`, or `None` past the end of the file.
    fn get(&mut self, off: u64, n: usize) -> Result<Option<&[u8]>, Error> {
        let end = match off.checked_add(n as u64) {
            Some(e) if e <= self.len => e,
            _ => return Ok(None),
        };
        if off < self.buf_off || end > self.buf_off + self.buf.len() as u64 {
            let want = (n.max(PEEK_WINDOW) as u64).min(self.len - off) as usize;
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, off)
                .map_err(|e| Error::io(format!("cannot read {want} bytes at byte {off}"), e))?;
            self.buf_off = off;
        }
        let a = (off - self.buf_off) as usize;
        Ok(Some(&self.buf[a..a + n]))
    }
    fn u32_at(&mut self, off: u64) -> Result<Option<u32>, Error> {
        Ok(self.get(off, 4)?.map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    }
}

/// The blocks of a BGZF file, or `None` if some member is not a BGZF block (plain or multi-member gzip,
/// or damage that the stream decoder will report).
pub(crate) fn bgzf_blocks(file: &Source, len: u64) -> Result<Option<Vec<Frame>>, Error> {
    const FEXTRA: u8 = 4;
    let mut peek = Peek::new(file, len);
    let mut blocks = Vec::new();
    let (mut off, mut out) = (0u64, 0u64);
    while off < len {
        let Some(h) = peek.get(off, 12)? else { return Ok(None) };
        // BGZF: deflate, FLG exactly FEXTRA (no name, comment or header CRC).
        if h[..4] != [0x1f, 0x8b, 0x08, FEXTRA] {
            return Ok(None);
        }
        let xlen = u16::from_le_bytes([h[10], h[11]]) as usize;
        let Some(extra) = peek.get(off + 12, xlen)? else { return Ok(None) };
        let mut bsize = None;
        let mut x = extra;
        while x.len() >= 4 {
            let slen = u16::from_le_bytes([x[2], x[3]]) as usize;
            let Some(data) = x.get(4..4 + slen) else { return Ok(None) };
            if x[..2] == *b"BC" && slen == 2 {
                bsize = Some(u64::from(u16::from_le_bytes([data[0], data[1]])) + 1);
            }
            x = &x[4 + slen..];
        }
        let Some(bsize) = bsize else { return Ok(None) };
        let head = 12 + xlen as u64;
        if bsize < head + 8 {
            return Ok(None);
        }
        let Some(isize) = peek.u32_at(off + bsize - 4)? else { return Ok(None) };
        if isize > 65536 {
            return Ok(None);
        }
        if isize > 0 {
            blocks.push(Frame {
                comp_off: off + head,
                comp_len: bsize - head,
                out_off: out,
                out_len: u64::from(isize),
            });
        }
        out += u64::from(isize);
        off += bsize;
    }
    Ok(Some(blocks))
}

/// The seekable zstd format's magic number, at the very end of the file.
pub(super) const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// The magic number of the skippable frame holding the seek table.
pub(super) const SEEK_TABLE_FRAME: u32 = 0x184D_2A5E;

/// The frames listed by a seekable zstd file's seek table, or `None` if the file has no (valid) seek
/// table or a frame is larger than [`FRAME_CAP`]. The table is checked against the file before anything
/// is allocated for it: its entries must fit in the file and their compressed sizes must add up to the
/// offset of the table's frame.
pub(crate) fn seek_table(file: &Source, len: u64) -> Result<Option<Vec<Frame>>, Error> {
    const FOOTER: u64 = 9;
    let mut peek = Peek::new(file, len);
    if len < 8 + FOOTER {
        return Ok(None);
    }
    let Some(f) = peek.get(len - FOOTER, FOOTER as usize)? else { return Ok(None) };
    let count = u64::from(u32::from_le_bytes([f[0], f[1], f[2], f[3]]));
    let descriptor = f[4];
    if u32::from_le_bytes([f[5], f[6], f[7], f[8]]) != SEEKABLE_MAGIC || descriptor & 0x7C != 0 {
        return Ok(None);
    }
    let entry = if descriptor & 0x80 != 0 { 12 } else { 8 };
    let Some(table_len) = count.checked_mul(entry).filter(|&t| t + 8 + FOOTER <= len) else { return Ok(None) };
    let table_off = len - FOOTER - table_len;
    let frame_off = table_off - 8;
    if peek.u32_at(frame_off)? != Some(SEEK_TABLE_FRAME)
        || peek.u32_at(frame_off + 4)? != Some((table_len + FOOTER) as u32)
    {
        return Ok(None);
    }
    let mut table = vec![0u8; table_len as usize];
    file.read_exact_at(&mut table, table_off).map_err(|e| Error::io("cannot read the seek table", e))?;
    let mut frames = Vec::with_capacity(count as usize);
    let (mut off, mut out) = (0u64, 0u64);
    for e in table.chunks_exact(entry as usize) {
        let comp = u64::from(u32::from_le_bytes([e[0], e[1], e[2], e[3]]));
        let size = u64::from(u32::from_le_bytes([e[4], e[5], e[6], e[7]]));
        if size > FRAME_CAP {
            return Ok(None);
        }
        if size > 0 {
            frames.push(Frame { comp_off: off, comp_len: comp, out_off: out, out_len: size });
        }
        off += comp;
        out += size;
    }
    Ok((off == frame_off).then_some(frames))
}

/// The frames of a zstd file found by walking frame and block headers: frames, when every frame declares
/// its content size and none is larger than [`FRAME_CAP`]; else a stream (with its length when every
/// frame declares its size). Skippable frames are stepped over.
pub(crate) fn zstd_frames(file: &Source, len: u64) -> Result<Layout, Error> {
    let mut peek = Peek::new(file, len);
    let mut frames = Vec::new();
    let (mut off, mut out) = (0u64, 0u64);
    let mut all_known = true;
    let stream = |known: bool, out: u64| Layout::Stream { len: known.then_some(out) };
    while off < len {
        let Some(magic) = peek.u32_at(off)? else { return Ok(stream(false, 0)) };
        if is_skippable(magic) {
            let Some(size) = peek.u32_at(off + 4)? else { return Ok(stream(false, 0)) };
            off += 8 + u64::from(size);
            continue;
        }
        if magic != ZSTD_MAGIC {
            return Ok(stream(false, 0));
        }
        let Some(&[fhd]) = peek.get(off + 4, 1)? else { return Ok(stream(false, 0)) };
        let (fcs_flag, single_segment, checksum, dict_flag) = (fhd >> 6, fhd & 0x20 != 0, fhd & 4 != 0, fhd & 3);
        if fhd & 0x08 != 0 {
            return Ok(stream(false, 0)); // a reserved bit: damaged; the decoder says so
        }
        let did_len = [0u64, 1, 2, 4][dict_flag as usize];
        let fcs_len = match fcs_flag {
            0 => u64::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let fcs_at = off + 5 + u64::from(!single_segment) + did_len;
        let size = match fcs_len {
            0 => None,
            n => {
                let Some(b) = peek.get(fcs_at, n as usize)? else { return Ok(stream(false, 0)) };
                let mut v = [0u8; 8];
                v[..b.len()].copy_from_slice(b);
                let v = u64::from_le_bytes(v);
                Some(if n == 2 { v + 256 } else { v })
            }
        };
        // Blocks: a 3-byte header each (last flag, type, size); raw and compressed blocks carry `size`
        // bytes, RLE blocks one.
        let mut b = fcs_at + fcs_len;
        loop {
            let Some(h) = peek.get(b, 3)? else { return Ok(stream(false, 0)) };
            let h = u32::from_le_bytes([h[0], h[1], h[2], 0]);
            let (last, kind, size) = (h & 1 != 0, (h >> 1) & 3, u64::from(h >> 3));
            b += 3 + match kind {
                0 | 2 => size,
                1 => 1,
                _ => return Ok(stream(false, 0)),
            };
            if last {
                break;
            }
        }
        let end = b + if checksum { 4 } else { 0 };
        if end > len {
            return Ok(stream(false, 0));
        }
        match size {
            Some(s) => {
                if s > 0 {
                    frames.push(super::walk::Frame { comp_off: off, comp_len: end - off, out_off: out, out_len: s });
                }
                out = out.saturating_add(s);
            }
            None => all_known = false,
        }
        off = end;
    }
    if all_known && frames.iter().all(|f| f.out_len <= FRAME_CAP) {
        Ok(Layout::Frames(frames))
    } else {
        Ok(stream(all_known, out))
    }
}
