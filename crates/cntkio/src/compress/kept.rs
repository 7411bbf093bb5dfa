//! Seek points kept on disk (`cacheIndex` over a plain gzip input): a later process starts from them,
//! the decompressed length known at once, instead of decompressing the whole stream first.
//!
//! **Format, version 1** (little-endian): magic `CNTKIOGZ`, `u32` version = 1, `u32` key length and the
//! key (the caller's bytes naming the compressed file's content: for cntkio's commands, the identity
//! fields of the index cache), `u64` decompressed length, `u64` point count, then per point `u64`
//! decompressed offset, `u64` compressed bit offset, `u32` window length and the window (deflated, as
//! [`Point::window`]), then a `u32` CRC-32 of everything before it. A file is used only if its key is
//! the caller's, its CRC-32 is right and its points are consistent (the first at offset 0, offsets and
//! bits increasing, inside the streams, windows of at most [`MAX_WINDOW`] bytes, [`BUDGET`] in all);
//! anything else is ignored, and written again when the pass ends. This format changes only with a new
//! version number.

use super::points::{Done, Point, BUDGET};
use crate::Error;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 8] = b"CNTKIOGZ";
const VERSION: u32 = 1;
/// The longest deflated window: 32 KiB stored, with the few bytes of the blocks' headers.
pub(crate) const MAX_WINDOW: usize = 33 << 10;
/// The longest key.
const MAX_KEY: usize = 4096;

/// The points of a finished pass over a stream of `len` compressed bytes, read from `path`, if the file
/// is valid for `key`; `Err` names what is wrong with a file that is there.
pub(crate) fn load(path: &Path, key: &[u8], len: u64) -> Result<Option<Done>, String> {
    use std::io::Read;
    let Ok(f) = std::fs::File::open(path) else { return Ok(None) };
    let size = f.metadata().map_err(|e| e.to_string())?.len();
    // The points cost at most `BUDGET` in memory, and a point's record is smaller than its cost.
    if size > (BUDGET + MAX_KEY + 64) as u64 {
        return Err(format!("{size} bytes is more than seek points take"));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    f.take(size).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    let Some(body_len) = bytes.len().checked_sub(4) else { return Err("truncated".into()) };
    let (body, crc) = bytes.split_at(body_len);
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(8)? != MAGIC || r.u32()? != VERSION {
        return Err("not a seek point file of this version".into());
    }
    let key_len = r.u32()? as usize;
    if key_len > MAX_KEY || r.take(key_len)? != key {
        return Ok(None);
    }
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err("its CRC-32 does not match".into());
    }
    let out_len = r.u64()?;
    let count = r.u64()?;
    let mut points: Vec<Point> = Vec::new();
    let mut cost = 0usize;
    for _ in 0..count {
        let (out, bit, window_len) = (r.u64()?, r.u64()?, r.u32()? as usize);
        if window_len > MAX_WINDOW {
            return Err(format!("a window of {window_len} bytes"));
        }
        let window = r.take(window_len)?;
        let ordered = match points.last() {
            None => out == 0,
            Some(p) => out > p.out && bit > p.bit,
        };
        if !ordered || out > out_len || bit / 8 >= len {
            return Err(format!("a point at decompressed byte {out}, compressed bit {bit} is out of place"));
        }
        cost += super::points::cost(window);
        if cost > BUDGET {
            return Err("its points take more than the budget".into());
        }
        points.push(Point { out, bit, window: window.into() });
    }
    if r.at != body.len() {
        return Err("bytes after the last point".into());
    }
    if points.is_empty() && out_len > 0 {
        return Err("no points".into());
    }
    Ok(Some(Done { points, len: out_len, cost }))
}

/// Writes the points of `done` to `path` for `key`: to a temporary file, renamed into place.
pub(crate) fn save(path: &Path, key: &[u8], done: &Done) -> Result<(), Error> {
    let mut v = Vec::with_capacity(64 + key.len() + done.cost);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&(key.len() as u32).to_le_bytes());
    v.extend_from_slice(key);
    v.extend_from_slice(&done.len.to_le_bytes());
    v.extend_from_slice(&(done.points.len() as u64).to_le_bytes());
    for p in &done.points {
        v.extend_from_slice(&p.out.to_le_bytes());
        v.extend_from_slice(&p.bit.to_le_bytes());
        v.extend_from_slice(&(p.window.len() as u32).to_le_bytes());
        v.extend_from_slice(&p.window);
    }
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    let mut tmp = crate::output::temporary(path)?;
    let target = crate::output::Target::new(path, tmp.as_file());
    tmp.write_all(&v).map_err(|e| target.error(e))?;
    crate::output::persist(tmp, path, None)
}

/// Reads the fields of a file in memory, failing at its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or("truncated")?;
        let b = &self.bytes[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn point(out: u64, bit: u64, window: &[u8]) -> Point {
        Point { out, bit, window: Arc::from(window) }
    }

    fn done(points: Vec<Point>, len: u64) -> Done {
        let cost = points.iter().map(|p| super::super::points::cost(&p.window)).sum();
        Done { points, len, cost }
    }

    /// What a file written for `d` loads as (for key `k`, a stream of 1,000 compressed bytes).
    fn round_trip(d: &Done) -> Result<Option<Done>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        save(&path, b"k", d).unwrap();
        load(&path, b"k", 1000)
    }

    #[test]
    fn points_written_read_back_the_same() {
        let d = done(vec![point(0, 80, b""), point(5000, 2001, b"window"), point(9000, 7999, &[7; 100])], 12_000);
        let back = round_trip(&d).unwrap().unwrap();
        assert_eq!((back.points, back.len, back.cost), (d.points, d.len, d.cost));
        let empty = done(Vec::new(), 0);
        assert_eq!(round_trip(&empty).unwrap().unwrap().points, vec![]);
    }

    /// Points that cannot come from a pass over the stream are refused, though the CRC-32 is right.
    #[test]
    fn inconsistent_points_are_refused() {
        let cases = [
            ("the first not at 0", vec![point(10, 80, b"")], 100),
            ("offsets not increasing", vec![point(0, 80, b""), point(50, 200, b""), point(50, 300, b"")], 100),
            ("bits not increasing", vec![point(0, 80, b""), point(50, 80, b"")], 100),
            ("a bit past the file", vec![point(0, 80, b""), point(50, 8000, b"")], 100),
            ("an offset past the end", vec![point(0, 80, b""), point(150, 800, b"")], 100),
            ("a window too long", vec![point(0, 80, b""), point(50, 800, &[0; MAX_WINDOW + 1])], 100),
            ("no point in a stream", vec![], 100),
        ];
        for (name, points, len) in cases {
            assert!(round_trip(&done(points, len)).is_err(), "{name}");
        }
    }

    /// A cut anywhere, a flipped bit anywhere, bytes added, a count far beyond the file, another key:
    /// refused or not for this key, never a panic or a large allocation.
    #[test]
    fn damaged_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let d = done(vec![point(0, 80, b""), point(5000, 2001, b"window")], 12_000);
        save(&path, b"k", &d).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut cases: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            cases.push(bad);
        }
        cases.push([&good[..], b"more"].concat());
        // The count set to 2^60, the CRC-32 made right.
        let mut huge = good[..good.len() - 4].to_vec();
        let at = 8 + 4 + 4 + 1 + 8;
        huge[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let crc = crc32fast::hash(&huge);
        huge.extend_from_slice(&crc.to_le_bytes());
        cases.push(huge);
        for bad in cases {
            std::fs::write(&path, &bad).unwrap();
            assert!(!matches!(load(&path, b"k", 1000), Ok(Some(_))), "{bad:?}");
        }
        std::fs::write(&path, &good).unwrap();
        assert!(matches!(load(&path, b"other", 1000), Ok(None)));
        assert!(matches!(load(&dir.path().join("none"), b"k", 1000), Ok(None)));
    }
}
