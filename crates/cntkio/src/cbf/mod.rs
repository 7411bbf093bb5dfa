//! CBF files: [`CbfFile`] reads them (header once, chunks on demand), [`CbfWriter`] writes them.
//!
//! ```
//! use cntkio::cbf::{CbfFile, CbfWriter};
//! use cntkio_core::{ctf::parse::{parse_bytes, FailFast}, Schema, StreamSpec, StorageFormat};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("data.bin");
//! let schema = Schema::new(vec![
//!     StreamSpec::new("features", 2, StorageFormat::Dense).alias("x"),
//!     StreamSpec::new("labels", 3, StorageFormat::Sparse).alias("y"),
//! ]).unwrap();
//! let data = parse_bytes(b"0 |x 1 2 |y 0:1\n1 |x 3 4 |y 2:1\n", &schema, false, &mut FailFast).unwrap();
//!
//! let mut w = CbfWriter::create(&path, &schema, 32 << 20).unwrap();
//! w.write(&data).unwrap();
//! let summary = w.finish().unwrap();
//! assert_eq!((summary.chunks, summary.sequences), (1, 2));
//!
//! let f = CbfFile::open(&path).unwrap();
//! assert_eq!(f.chunk_count(), 1);
//! assert_eq!(f.streams()[1].name, "labels");
//! assert_eq!(f.read_chunk(0).unwrap().streams, data.streams);
//! ```

mod delivery;
pub(crate) mod sink;
mod writer;

pub use cntkio_core::cbf::{ChunkEntry, DecodeSummary, Header, Limits, StreamHeader};
pub use delivery::Delivery;
pub use writer::{CbfSummary, CbfWriter, CbfWriterOptions, Chunking, EmptyStreams, MetaCounts};

use crate::input::{Access, InputFile};
use cntkio_core::cbf::{self as codec, ChunkDecoder};
use cntkio_core::{ChunkData, ElementType, Error, ErrorKind, Schema};
use std::path::{Path, PathBuf};

/// How a [`CbfFile`] is opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CbfOptions {
    /// Read chunks through a read-only memory map instead of positional reads (a compressed file, and
    /// one the system will not map, is read).
    ///
    /// The map is guarded (on Linux): if the file becomes shorter while it is mapped, every read of the
    /// map from then on fails with an I/O error naming the file, instead of the `SIGBUS` that would end
    /// the process. By setting this you promise that the file is not rewritten in place (same length,
    /// other bytes) while the [`CbfFile`] is alive: its bytes would change under the reader. Files
    /// written by [`CbfWriter`] are replaced by rename, which is safe.
    pub mmap: bool,
    /// Caps on what the file may ask for.
    pub limits: Limits,
    /// Stream renames, `(name in the file, new name)` — CNTK's
    /// `input = [ newName = [ alias = "nameInFile" ] ]` (CBF.md §5). A name that matches no stream is
    /// ignored, as in CNTK (a warning is logged).
    pub renames: Vec<(String, String)>,
    /// For a plain gzip file: keep its seek points in a file beside it (`<file>.cntkio-points.idx`; for an
    /// object, in the index cache directory) and start from them later, instead of decompressing the whole
    /// file to find its trailer. A CBF file carries its own index, so nothing else is cached.
    pub cache_index: bool,
}

impl CbfOptions {
    /// Opts in to memory mapping (see the field's promise).
    pub fn mmap(mut self, yes: bool) -> Self {
        self.mmap = yes;
        self
    }
    /// Keeps a plain gzip file's seek points (see the field).
    pub fn cache_index(mut self, yes: bool) -> Self {
        self.cache_index = yes;
        self
    }
    /// Sets the limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
    /// Adds a rename of the file's stream `name_in_file` to `new_name`.
    pub fn rename(mut self, name_in_file: impl Into<String>, new_name: impl Into<String>) -> Self {
        self.renames.push((name_in_file.into(), new_name.into()));
        self
    }
}

/// An open CBF file: its validated header, and chunks read on demand.
///
/// Chunk `k` of the file is chunk `k` of the reader; sequence keys are global sequence indices;
/// [`ChunkData::num_samples`] holds the file's per-sequence meta counts (CBF.md §4). A gzip or zstd
/// compressed CBF file is read through its decompressed view (offsets are those of the decompressed file).
#[derive(Debug)]
pub struct CbfFile {
    path: PathBuf,
    file: InputFile,
    header: Header,
}

/// A chunk range outside the map: the header's ranges were checked against the length the file was
/// mapped with, so this is a bug.
fn outside_map(k: usize, r: &std::ops::Range<u64>) -> Error {
    Error::internal(format!("chunk {k}'s bytes {}..{} lie outside the mapped file", r.start, r.end))
}

/// What an error opening a CTF file as CBF ends with (see [`CbfFile::open_with`]).
pub const CTF_TEXT_HINT: &str =
    "; it starts as CTF text does: read it as CTF (a CTFDeserializer with its streams, or a command given its \
     --stream schema)";

/// `e`, an error opening `path` as CBF: where it is the file's start (its length or magic) and the file starts
/// as CTF text does (an id or `|`, and rows naming inputs), it says so and what reads it
/// ([`CTF_TEXT_HINT`]): a CTF file read as CBF by mistake.
fn ctf_read_as_cbf(path: &Path, mut e: Error) -> Error {
    let at_start = matches!(e.kind(), ErrorKind::CbfFormat { field, .. } if field == "magic" || field == "file length");
    if at_start && crate::ctf::check_start(path).is_ok() && crate::ctf::suggest_schema(path).is_some() {
        if let ErrorKind::CbfFormat { problem, .. } = e.kind_mut() {
            problem.push_str(CTF_TEXT_HINT);
        }
    }
    e
}

impl CbfFile {
    /// Opens a file with default options (positional reads, default limits, no renames).
    pub fn open(path: impl AsRef<Path>) -> Result<CbfFile, Error> {
        CbfFile::open_with(path, &CbfOptions::default())
    }

    /// Opens a file: reads and validates the prefix, trailer and header with plain reads (the header's
    /// size is checked against the limits before it is read), applies renames, and maps the file if
    /// asked to. Errors carry the path.
    pub fn open_with(path: impl AsRef<Path>, options: &CbfOptions) -> Result<CbfFile, Error> {
        let path = path.as_ref();
        let p = path.display().to_string();
        let with_path = |e: Error| if e.position().path.is_none() { e.with_path(p.clone()) } else { e };
        // A file the system will not map (a special file, some network or FUSE file systems) is read.
        let access = if options.mmap { Access::Auto } else { Access::Read };
        let mut file = InputFile::open(path, access).map_err(with_path)?;
        // Every read of the map is checked (here, or by the callers of `chunk_bytes` and `mapped_bytes`).
        file.guard_map();
        if options.cache_index {
            crate::ctf::cache::keep_seek_points(&file).map_err(with_path)?;
        }
        let len = file.len();
        let mut buf = Vec::new();
        let header = (|| {
            if len < codec::MIN_FILE_LEN {
                return Err(Error::cbf_value(
                    "file length",
                    0,
                    Some(len),
                    codec::MIN_FILE_LEN..=u64::MAX,
                    format!("the file has {len} bytes; a CBF file has at least {}", codec::MIN_FILE_LEN),
                ));
            }
            file.read_into(0, 12, &mut buf)?;
            codec::check_prefix(buf[..12].try_into().expect("12 bytes"))?;
            file.read_into(len - codec::TRAILER_LEN, 8, &mut buf)?;
            let header_offset = codec::read_trailer(buf[..8].try_into().expect("8 bytes"));
            let range = Header::byte_range(header_offset, len, &options.limits)?;
            file.read_into(range.start, (range.end - range.start) as usize, &mut buf)?;
            let mut header = Header::parse(&buf, header_offset, len, &options.limits)?;
            for (from, to) in header.rename(&options.renames)? {
                log::warn!("{p}: rename of stream \"{from}\" to \"{to}\" ignored: the file has no stream \"{from}\"");
            }
            Ok(header)
        })()
        .map_err(|e| with_path(ctf_read_as_cbf(path, e)))?;
        Ok(CbfFile { path: path.to_path_buf(), file, header })
    }

    /// The path given to `open`.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The validated header (streams after renames).
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The streams in file order, after renames.
    pub fn streams(&self) -> &[StreamHeader] {
        self.header.streams()
    }
    /// A schema of the streams (names double as CTF aliases); fails for names that cannot be aliases.
    pub fn schema(&self) -> Result<Schema, Error> {
        self.header.schema()
    }
    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.header.chunks().len()
    }
    /// The chunk table.
    pub fn chunks(&self) -> &[ChunkEntry] {
        self.header.chunks()
    }
    /// Whether chunks are read through a memory map.
    pub fn is_mapped(&self) -> bool {
        self.file.is_mapped()
    }
    /// The input file (its compression, for one).
    pub fn input(&self) -> &InputFile {
        &self.file
    }
    /// CNTK's rule that every stream's element type equals the reader precision (CBF.md §3).
    pub fn check_precision(&self, precision: ElementType) -> Result<(), Error> {
        self.header.check_precision(precision).map_err(|e| e.with_path(self.path.display().to_string()))
    }

    /// Reads and decodes chunk `k`, with each stream in the file's element type.
    pub fn read_chunk(&self, k: usize) -> Result<ChunkData, Error> {
        let mut out = ChunkData::default();
        self.read_chunk_into(k, &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    /// Reads chunk `k` and converts every stream to `t` (the lenient alternative to
    /// [`CbfFile::check_precision`]).
    pub fn read_chunk_as(&self, k: usize, t: ElementType) -> Result<ChunkData, Error> {
        let mut d = self.read_chunk(k)?;
        codec::convert_element_type(&mut d, t);
        Ok(d)
    }

    /// The undecoded bytes of chunk `k` (its meta counts and records, exactly its byte range): borrowed
    /// from the map when the file is mapped (its pages prefaulted; check [`CbfFile::check_map`] after
    /// copying from them), else read into `buf`, which keeps its allocation across calls. Errors: no such
    /// chunk, a chunk over the size limit, I/O.
    pub fn chunk_bytes<'a>(&'a self, k: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8], Error> {
        let p = || self.path.display().to_string();
        let dec = ChunkDecoder::new(&self.header, k).map_err(|e| e.with_path(p()))?;
        let r = dec.byte_range();
        match self.file.mapped() {
            Some(m) => {
                self.file.prefault(r.start, (r.end - r.start) as usize);
                m.get(r.start as usize..r.end as usize).ok_or_else(|| outside_map(k, &r).with_path(p()))
            }
            None => {
                self.file.read_into(r.start, (r.end - r.start) as usize, buf).map_err(|e| self.at_path(e))?;
                Ok(&buf[..])
            }
        }
    }

    /// Appends the meta counts of chunk `k`'s sequences (its first 4 × sequences bytes) to `out`: what
    /// the randomizer needs of a chunk before it is loaded, read when it is asked for, so that nothing is
    /// kept per sequence of the file. Errors: no such chunk, a chunk too short for its sequence count, I/O.
    pub fn meta_counts(&self, k: usize, out: &mut Vec<u32>) -> Result<(), Error> {
        let (start, need) = self.meta_range(k)?;
        let mut buf = Vec::new();
        self.file
            .with_bytes(start, need, &mut buf, |bytes| {
                out.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            })
            .map_err(|e| self.at_path(e))
    }

    /// The meta count of every sequence of chunk `k` when they are all the same (and the chunk has
    /// sequences), read piece by piece as [`CbfFile::meta_counts`] would read them whole, so that no list is
    /// made. Errors: those of [`CbfFile::meta_counts`].
    pub fn uniform_meta_count(&self, k: usize) -> Result<Option<u32>, Error> {
        /// Bytes read at a time: the reads stop at the first count that differs.
        const PIECE: usize = 64 << 10;
        let (start, need) = self.meta_range(k)?;
        let (mut buf, mut first, mut done) = (Vec::new(), None, 0);
        while done < need {
            let n = PIECE.min(need - done);
            let same = self
                .file
                .with_bytes(start + done as u64, n, &mut buf, |bytes| {
                    bytes.chunks_exact(4).all(|b| {
                        let count = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        *first.get_or_insert(count) == count
                    })
                })
                .map_err(|e| self.at_path(e))?;
            if !same {
                return Ok(None);
            }
            done += n;
        }
        Ok(first)
    }

    /// Where chunk `k`'s meta counts lie: `(offset, bytes)`, checked against the chunk's byte range.
    fn meta_range(&self, k: usize) -> Result<(u64, usize), Error> {
        let dec = ChunkDecoder::new(&self.header, k).map_err(|e| self.at_path(e))?;
        let r = dec.byte_range();
        let sequences = u64::from(self.header.chunks()[k].num_sequences);
        let need = 4 * sequences;
        if need > r.end - r.start {
            let problem = format!(
                "chunk {k} has {sequences} sequences, whose meta counts need {need} bytes, but it has {} bytes",
                r.end - r.start
            );
            return Err(self.at_path(Error::cbf_value(
                "meta counts",
                r.start,
                Some(need),
                0..=r.end - r.start,
                problem,
            )));
        }
        Ok((r.start, need as usize))
    }

    /// The size in bytes of chunk `k`'s byte range (what [`CbfFile::chunk_bytes`] returns). Errors: no such
    /// chunk, a chunk over the size limit.
    pub fn chunk_len(&self, k: usize) -> Result<usize, Error> {
        let dec = ChunkDecoder::new(&self.header, k).map_err(|e| e.with_path(self.path.display().to_string()))?;
        let r = dec.byte_range();
        usize::try_from(r.end - r.start)
            .map_err(|_| Error::limit(format!("chunk {k} size in bytes"), r.end - r.start, usize::MAX as u64))
    }

    /// Reads the undecoded bytes of chunk `k` into `dst`, whose length must be [`CbfFile::chunk_len`] (a
    /// caller-provided, reusable buffer). Errors: no such chunk, a chunk over the size limit, a `dst` of
    /// another length, I/O.
    pub fn read_chunk_bytes(&self, k: usize, dst: &mut [u8]) -> Result<(), Error> {
        let dec = ChunkDecoder::new(&self.header, k).map_err(|e| e.with_path(self.path.display().to_string()))?;
        let r = dec.byte_range();
        if dst.len() as u64 != r.end - r.start {
            return Err(Error::option("dst", format!("chunk {k} has {} bytes, not {}", r.end - r.start, dst.len())));
        }
        match self.file.mapped() {
            Some(m) => {
                let src = m.get(r.start as usize..r.end as usize).ok_or_else(|| outside_map(k, &r))?;
                dst.copy_from_slice(src);
                self.check_map()
            }
            None => self.file.read_exact(r.start, dst).map_err(|e| self.at_path(e)),
        }
    }

    /// The whole file as mapped bytes, when it is mapped (for readers that locate records themselves,
    /// e.g. in the ranges [`CbfFile::chunk_bytes`] validated). Check [`CbfFile::check_map`] after copying
    /// from them, before using the copy.
    pub fn mapped_bytes(&self) -> Option<&[u8]> {
        self.file.mapped()
    }

    /// Takes the mapped pages of `range` out of the process's resident set, for a reader done with them
    /// (the page cache keeps them; nothing happens for a file that is read).
    pub(crate) fn release(&self, range: std::ops::Range<usize>) {
        self.file.release(range.start as u64, range.len() as u64);
    }

    /// An error if the file became shorter (or unreadable) while it was read through its map: bytes read
    /// from the map ([`CbfFile::chunk_bytes`], [`CbfFile::mapped_bytes`]) since then are zeros, not data.
    pub fn check_map(&self) -> Result<(), Error> {
        self.file.check_map()
    }

    /// `e` with this file's path, unless it has one.
    fn at_path(&self, e: Error) -> Error {
        if e.position().path.is_none() {
            e.with_path(self.path.display().to_string())
        } else {
            e
        }
    }

    /// Reads chunk `k` into `out`, using `buf` for the raw bytes when the file is not mapped (both keep
    /// their allocations across calls). On error `out`'s contents are unspecified.
    pub fn read_chunk_into(&self, k: usize, buf: &mut Vec<u8>, out: &mut ChunkData) -> Result<DecodeSummary, Error> {
        let p = || self.path.display().to_string();
        let dec = ChunkDecoder::new(&self.header, k).map_err(|e| e.with_path(p()))?;
        let r = dec.byte_range();
        let res = match self.file.mapped() {
            Some(m) => {
                // No prefault here: the decoder reads the bytes once, in order, and faults (with the
                // kernel's fault-around) cost no more than populating; on later passes the pages are
                // mapped and populating them again was a measurable loss.
                let bytes = m.get(r.start as usize..r.end as usize).ok_or_else(|| outside_map(k, &r))?;
                let decoded = dec.decode_into(bytes, out);
                self.check_map()?;
                decoded
            }
            None => {
                self.file.read_into(r.start, (r.end - r.start) as usize, buf).map_err(|e| self.at_path(e))?;
                dec.decode_into(buf, out)
            }
        };
        res.map_err(|e| if e.position().path.is_none() { e.with_path(p()) } else { e })
    }
}
