//! The CNTK Binary Format (CBF, `shared/spec/CBF.md`): a pure codec. Bytes in, [`ChunkData`] out, and
//! back. No files: the caller fetches the byte ranges (pread, mmap, range GET) this module asks for.
//!
//! Reading starts from the end of the file:
//!
//! 1. [`check_prefix`] on bytes `0..12` (magic, version) and [`read_trailer`] on the last 8 bytes, which
//!    give the header offset;
//! 2. [`Header::byte_range`] tells which bytes hold the header, [`Header::parse`] reads and validates
//!    them (stream headers, chunk table, every offset against the file length and [`Limits`]);
//! 3. [`ChunkDecoder::new`] for a chunk gives its [`ChunkDecoder::byte_range`]; [`ChunkDecoder::decode`]
//!    turns those bytes into [`ChunkData`], validating every record.
//!
//! Every size read from a file goes through checked arithmetic and is compared with the bytes that are
//! actually there (and with [`Limits`]) before anything is allocated, so a damaged or hostile file gives
//! an [`Error`] (kind [`ErrorKind::CbfFormat`] naming the field and its absolute byte offset, or
//! [`ErrorKind::Limit`]) and never a panic or a huge allocation.
//!
//! ```
//! use cntkio_core::cbf::{self, ChunkDecoder, Header, Limits, StreamHeader};
//! use cntkio_core::{ctf::parse::{parse_bytes, FailFast}, Schema, StreamSpec, StorageFormat};
//!
//! let schema = Schema::new(vec![StreamSpec::new("x", 3, StorageFormat::Dense)]).unwrap();
//! let data = parse_bytes(b"0 |x 1 2 3\n0 |x 4 5 6\n", &schema, false, &mut FailFast).unwrap();
//! let file = cbf::encode_file(&StreamHeader::from_schema(&schema), &[data.clone()]).unwrap();
//!
//! let (header, chunks) = cbf::decode_file(&file, &Limits::default()).unwrap();
//! assert_eq!(header.chunks().len(), 1);
//! assert_eq!(chunks[0].streams, data.streams);
//! ```

mod decode;
mod encode;

pub use decode::{convert_element_type, ChunkDecoder, DecodeSummary};
pub use encode::{
    check_chunk_fast, check_parsed_chunk_fast, check_sequence, encode_checked_record_to, encode_checked_records_to,
    encode_chunk, encode_file, encode_header, encode_prefix, encode_record, encode_trailer, record_len,
    sequence_len_bytes,
};

use crate::data::ChunkData;
use crate::error::{Error, ErrorKind};
use crate::schema::{ElementType, Schema, StorageFormat, StreamSpec};
use std::ops::Range;

/// The magic number at byte 0 and at the start of the header (`"nib_ktnc"` on disk).
pub const MAGIC: u64 = 0x636e_746b_5f62_696e;
/// The only format version CNTK reads.
pub const VERSION: u32 = 1;
/// Bytes before the first chunk: magic and version.
pub const PREFIX_LEN: u64 = 12;
/// Bytes of the trailer (the header offset).
pub const TRAILER_LEN: u64 = 8;
/// Fixed part of the header: sentinel, chunk count, stream count.
pub const HEADER_FIXED_LEN: u64 = 16;
/// Fixed part of a stream header (without its name).
pub const STREAM_HEADER_FIXED_LEN: u64 = 10;
/// Size of one chunk table entry.
pub const CHUNK_ENTRY_LEN: u64 = 16;
/// The smallest well-formed file: prefix, a header with no streams and no chunks, trailer.
pub const MIN_FILE_LEN: u64 = PREFIX_LEN + HEADER_FIXED_LEN + TRAILER_LEN;

/// Caps on what a file may ask for. A file exceeding one is rejected with [`ErrorKind::Limit`] before
/// any allocation it would cause. The defaults accept every file CNTK's tests and tools produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Most streams in a file (default 4096).
    pub max_streams: u32,
    /// Longest stream name, in bytes (default 4096).
    pub max_name_len: u32,
    /// Most chunks in a file (default 2^24).
    pub max_chunks: u32,
    /// Largest sample dimension (default 2^31 − 1, CNTK's sparse limit, applied to dense streams too).
    pub max_dim: u32,
    /// Largest header (stream headers plus chunk table), in bytes (default 1 GiB).
    pub max_header_bytes: u64,
    /// Largest chunk, in bytes (default 4 GiB): a chunk is read into memory whole.
    pub max_chunk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 4096,
            max_name_len: 4096,
            max_chunks: 1 << 24,
            max_dim: i32::MAX as u32,
            max_header_bytes: 1 << 30,
            max_chunk_bytes: 1 << 32,
        }
    }
}

fn limit(what: impl Into<String>, value: u64, limit: u64, at: u64) -> Error {
    Error::at(ErrorKind::Limit { what: what.into(), value, limit }, at)
}

/// One stream as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamHeader {
    /// The stream's name (after renames, when the caller applied any).
    pub name: String,
    /// Dense (`0` on disk) or sparse (`1`).
    pub format: StorageFormat,
    /// float32 (`0` on disk) or float64 (`1`).
    pub element_type: ElementType,
    /// Values per dense sample, index range of a sparse sample.
    pub dim: u32,
}

impl StreamHeader {
    /// The header of a schema stream (its name, not its CTF alias, is what CBF stores).
    pub fn from_spec(s: &StreamSpec) -> Result<StreamHeader, Error> {
        let dim = u32::try_from(s.dim).map_err(|_| {
            Error::new(ErrorKind::InvalidStream {
                stream: s.name.clone(),
                reason: format!("dim {} does not fit the 32-bit field of a CBF stream header", s.dim),
            })
        })?;
        Ok(StreamHeader { name: s.name.clone(), format: s.format, element_type: s.element_type, dim })
    }
    /// The headers of every stream of a schema. Panics never: a schema's dims are at most `u32::MAX`.
    pub fn from_schema(schema: &Schema) -> Vec<StreamHeader> {
        schema
            .streams()
            .iter()
            .map(|s| StreamHeader {
                name: s.name.clone(),
                format: s.format,
                element_type: s.element_type,
                dim: u32::try_from(s.dim).unwrap_or(u32::MAX),
            })
            .collect()
    }
    /// A schema stream with this name as both name and CTF alias.
    pub fn to_spec(&self) -> StreamSpec {
        StreamSpec::new(self.name.clone(), self.dim as usize, self.format).element_type(self.element_type)
    }
    /// Size of one value in bytes.
    pub fn elem_size(&self) -> u64 {
        self.element_type.size_bytes() as u64
    }
}

/// One chunk table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkEntry {
    /// Absolute offset of the chunk's first byte (its meta counts).
    pub offset: u64,
    /// Number of sequences.
    pub num_sequences: u32,
    /// Sum of the chunk's per-sequence meta counts (what CNTK's randomizer counts; not checked by CNTK).
    pub num_samples: u32,
}

/// Checks the first 12 bytes: the magic number and version 1.
pub fn check_prefix(prefix: [u8; 12]) -> Result<(), Error> {
    let magic = le_u64(&prefix[0..8]);
    if magic != MAGIC {
        return Err(Error::cbf_value(
            "magic",
            0,
            Some(magic),
            MAGIC..=MAGIC,
            format!("found 0x{magic:016x}, expected 0x{MAGIC:016x}: not a CNTK binary format file"),
        ));
    }
    let version = le_u32(&prefix[8..12]);
    if version != VERSION {
        return Err(Error::cbf_value(
            "version",
            8,
            Some(version.into()),
            VERSION.into()..=VERSION.into(),
            format!("the reader version is {VERSION}, but the data file was created for version {version}"),
        ));
    }
    Ok(())
}

/// Reads the trailer (the last 8 bytes): the header offset, a little-endian `i64` returned as its bits.
/// [`Header::byte_range`] checks it against the file length (a negative offset is a huge `u64`).
pub fn read_trailer(trailer: [u8; 8]) -> u64 {
    u64::from_le_bytes(trailer)
}

/// A validated header: streams, chunk table, and where everything lies in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    streams: Vec<StreamHeader>,
    chunks: Vec<ChunkEntry>,
    first_sequence: Vec<u64>,
    header_offset: u64,
    file_len: u64,
    header_end: u64,
    limits: Limits,
}

impl Header {
    /// Where the header lies: `header_offset .. file_len − 8`. Checks that the file can hold a prefix,
    /// a header and a trailer, that the offset lies in `[12, file_len − 24]`, and that the header is no
    /// larger than `limits.max_header_bytes` (so the caller may allocate the range).
    pub fn byte_range(header_offset: u64, file_len: u64, limits: &Limits) -> Result<Range<u64>, Error> {
        if file_len < MIN_FILE_LEN {
            return Err(Error::cbf_value(
                "file length",
                0,
                Some(file_len),
                MIN_FILE_LEN..=u64::MAX,
                format!("the file has {file_len} bytes; a CBF file has at least {MIN_FILE_LEN}"),
            ));
        }
        let trailer_at = file_len - TRAILER_LEN;
        let max = trailer_at - HEADER_FIXED_LEN;
        if header_offset < PREFIX_LEN || header_offset > max {
            return Err(Error::cbf_value(
                "header offset",
                trailer_at,
                Some(header_offset),
                PREFIX_LEN..=max,
                format!(
                    "the trailer points to byte {} but the header must start in [{PREFIX_LEN}, {max}] in a file of {file_len} bytes",
                    header_offset as i64
                ),
            ));
        }
        let len = trailer_at - header_offset;
        if len > limits.max_header_bytes {
            return Err(limit("header size in bytes", len, limits.max_header_bytes, header_offset));
        }
        Ok(header_offset..trailer_at)
    }

    /// Parses and validates the header. `bytes` are the file's bytes from `header_offset` to the trailer
    /// (the range [`Header::byte_range`] returned; fewer bytes read as a truncated header).
    ///
    /// Checked: the sentinel; stream and chunk counts against `limits` and against the bytes present;
    /// each stream's storage type (0/1), name length, element type (0/1) and dim (sparse dims fit an
    /// `i32`, as CNTK requires; every dim at most `limits.max_dim`); each chunk's offset lies in
    /// `[12, header_offset]`, offsets do not decrease, and each chunk has room for its meta counts before
    /// the next chunk (or the header) starts. Bytes after the chunk table are ignored, as CNTK does.
    /// Stream names: a NUL ends the name (CNTK's conversion); bytes that are not UTF-8 are replaced
    /// with U+FFFD.
    pub fn parse(bytes: &[u8], header_offset: u64, file_len: u64, limits: &Limits) -> Result<Header, Error> {
        let range = Header::byte_range(header_offset, file_len, limits)?;
        let avail = (range.end - range.start).min(bytes.len() as u64) as usize;
        let mut r = Cursor { bytes: &bytes[..avail], pos: 0, base: header_offset, what: "the header" };
        let sentinel = r.u64("header sentinel")?;
        if sentinel != MAGIC {
            return Err(Error::cbf_value(
                "header sentinel",
                header_offset,
                Some(sentinel),
                MAGIC..=MAGIC,
                format!("found 0x{sentinel:016x}, expected the magic number 0x{MAGIC:016x} (wrong header offset?)"),
            ));
        }
        let c_at = r.abs();
        let num_chunks = r.u32("chunk count")?;
        let i_at = r.abs();
        let num_streams = r.u32("stream count")?;
        if num_streams > limits.max_streams {
            return Err(limit("stream count", num_streams.into(), limits.max_streams.into(), i_at));
        }
        if u64::from(num_streams) * STREAM_HEADER_FIXED_LEN > r.remaining() {
            return Err(Error::cbf_value(
                "stream count",
                i_at,
                Some(num_streams.into()),
                0..=r.remaining() / STREAM_HEADER_FIXED_LEN,
                format!(
                    "{num_streams} streams need at least {} bytes of stream headers, but the header has {} bytes left",
                    u64::from(num_streams) * STREAM_HEADER_FIXED_LEN,
                    r.remaining()
                ),
            ));
        }
        if num_chunks > limits.max_chunks {
            return Err(limit("chunk count", num_chunks.into(), limits.max_chunks.into(), c_at));
        }
        // The chunk table follows the (variable-size) stream headers; check the lower bound now so
        // nothing is allocated for a count the header cannot hold.
        let min_rest = u64::from(num_streams) * STREAM_HEADER_FIXED_LEN + u64::from(num_chunks) * CHUNK_ENTRY_LEN;
        if min_rest > r.remaining() {
            return Err(Error::cbf_value(
                "chunk count",
                c_at,
                Some(num_chunks.into()),
                0..=(r.remaining() - u64::from(num_streams) * STREAM_HEADER_FIXED_LEN) / CHUNK_ENTRY_LEN,
                format!(
                    "{num_chunks} chunks need {} bytes of chunk table, but the header has only {} bytes after the stream count",
                    u64::from(num_chunks) * CHUNK_ENTRY_LEN,
                    r.remaining()
                ),
            ));
        }
        let mut streams = Vec::with_capacity(num_streams as usize);
        for i in 0..num_streams {
            streams.push(parse_stream_header(&mut r, i, limits)?);
        }
        let table_at = r.abs();
        if u64::from(num_chunks) * CHUNK_ENTRY_LEN > r.remaining() {
            return Err(Error::cbf_value(
                "chunk count",
                c_at,
                Some(num_chunks.into()),
                0..=r.remaining() / CHUNK_ENTRY_LEN,
                format!(
                    "{num_chunks} chunks need {} bytes of chunk table at byte {table_at}, but only {} bytes are left before the trailer",
                    u64::from(num_chunks) * CHUNK_ENTRY_LEN,
                    r.remaining()
                ),
            ));
        }
        let mut chunks = Vec::with_capacity(num_chunks as usize);
        let mut first_sequence = Vec::with_capacity(num_chunks as usize + 1);
        let mut total = 0u64;
        for k in 0..num_chunks {
            let at = r.abs();
            let offset = r.u64("chunk offset")?;
            let num_sequences = r.u32("sequence count")?;
            let num_samples = r.u32("sample count")?;
            let prev = chunks.last().map_or(PREFIX_LEN, |c: &ChunkEntry| c.offset);
            if offset < prev || offset > header_offset {
                return Err(Error::cbf_value(
                    format!("chunk {k} offset"),
                    at,
                    Some(offset),
                    prev..=header_offset,
                    format!(
                        "chunk {k} starts at byte {}, but chunks must lie in [{PREFIX_LEN}, {header_offset}] (the header's offset) in file order, and the previous chunk starts at byte {prev}",
                        offset as i64
                    ),
                ));
            }
            chunks.push(ChunkEntry { offset, num_sequences, num_samples });
            first_sequence.push(total);
            total += u64::from(num_sequences);
        }
        first_sequence.push(total);
        // Each chunk must hold its meta counts before the next chunk (or the header) starts.
        for k in 0..chunks.len() {
            let end = chunks.get(k + 1).map_or(header_offset, |c| c.offset);
            let c = chunks[k];
            let need = 4 * u64::from(c.num_sequences);
            if end - c.offset < need {
                return Err(Error::cbf_value(
                    format!("chunk {k} sequence count"),
                    table_at + k as u64 * CHUNK_ENTRY_LEN + 8,
                    Some(c.num_sequences.into()),
                    0..=(end - c.offset) / 4,
                    format!(
                        "{} sequences need {need} bytes of meta counts at byte {}, but the chunk ends at byte {end}",
                        c.num_sequences, c.offset
                    ),
                ));
            }
        }
        Ok(Header { streams, chunks, first_sequence, header_offset, file_len, header_end: r.abs(), limits: *limits })
    }

    /// Reads a whole in-memory file's prefix, trailer and header.
    pub fn from_file_bytes(file: &[u8], limits: &Limits) -> Result<Header, Error> {
        let n = file.len() as u64;
        if n < MIN_FILE_LEN {
            return Err(Error::cbf_value(
                "file length",
                0,
                Some(n),
                MIN_FILE_LEN..=u64::MAX,
                format!("the file has {n} bytes; a CBF file has at least {MIN_FILE_LEN}"),
            ));
        }
        let mut prefix = [0u8; 12];
        prefix.copy_from_slice(&file[..12]);
        check_prefix(prefix)?;
        let mut trailer = [0u8; 8];
        trailer.copy_from_slice(&file[file.len() - 8..]);
        let header_offset = read_trailer(trailer);
        let range = Header::byte_range(header_offset, n, limits)?;
        let bytes = file.get(range.start as usize..range.end as usize).unwrap_or(&[]);
        Header::parse(bytes, header_offset, n, limits)
    }

    /// The streams, in file order (the order of their records in each chunk).
    pub fn streams(&self) -> &[StreamHeader] {
        &self.streams
    }
    /// Renames streams (CNTK's `input = [ newName = [ alias = "nameInFile" ] ]`, CBF.md §5): each
    /// `(name_in_file, new_name)` pair renames every stream called `name_in_file`. Returns the pairs whose
    /// `name_in_file` matches no stream (CNTK ignores them silently). The resulting names must be unique:
    /// CNTK refuses two streams with one name when it builds its packer.
    pub fn rename(&mut self, renames: &[(String, String)]) -> Result<Vec<(String, String)>, Error> {
        crate::schema::rename_streams(self.streams.iter_mut().map(|s| &mut s.name).collect(), renames)
    }
    /// A schema of the streams (names as CTF aliases too). Fails when a name is not a valid alias
    /// (empty, or with spaces or `|`) or two streams share a name.
    pub fn schema(&self) -> Result<Schema, Error> {
        Schema::new(self.streams.iter().map(StreamHeader::to_spec).collect())
    }
    /// The chunk table.
    pub fn chunks(&self) -> &[ChunkEntry] {
        &self.chunks
    }
    /// Absolute offset of the header.
    pub fn header_offset(&self) -> u64 {
        self.header_offset
    }
    /// The file length the header was validated against.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
    /// Absolute offset just after the chunk table (the trailer starts here in files cntkio and ctf2bin
    /// write).
    pub fn header_end(&self) -> u64 {
        self.header_end
    }
    /// The limits the header was parsed with (chunk decoding uses them too).
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
    /// Chunk `k`'s bytes: from its offset to the next chunk's offset (the header's, for the last chunk).
    /// `None` if there is no such chunk.
    pub fn chunk_range(&self, k: usize) -> Option<Range<u64>> {
        let c = self.chunks.get(k)?;
        let end = self.chunks.get(k + 1).map_or(self.header_offset, |n| n.offset);
        Some(c.offset..end)
    }
    /// Global index of chunk `k`'s first sequence (= its key), or the total for `k = chunk count`.
    pub fn first_sequence(&self, k: usize) -> Option<u64> {
        self.first_sequence.get(k).copied()
    }
    /// Number of sequences in the file.
    pub fn num_sequences(&self) -> u64 {
        self.first_sequence.last().copied().unwrap_or(0)
    }
    /// Sum of the chunk table's sample counts.
    pub fn num_samples(&self) -> u64 {
        self.chunks.iter().map(|c| u64::from(c.num_samples)).sum()
    }
    /// CNTK's precision rule (CBF.md §3 item 5): every stream's element type must equal the reader
    /// precision. Errors name the first stream that differs.
    pub fn check_precision(&self, precision: ElementType) -> Result<(), Error> {
        match self.streams.iter().find(|s| s.element_type != precision) {
            None => Ok(()),
            Some(s) => Err(Error::new(ErrorKind::InvalidStream {
                stream: s.name.clone(),
                reason: format!(
                    "the stream holds {} values but the reader precision is {}; CNTK requires both to match (read with conversion to accept the file)",
                    s.element_type.cntk_name(),
                    precision.cntk_name()
                ),
            })),
        }
    }
}

fn parse_stream_header(r: &mut Cursor<'_>, i: u32, limits: &Limits) -> Result<StreamHeader, Error> {
    let at = r.abs();
    let storage = r.u8(&format!("stream {i} storage type"))?;
    let format = match storage {
        0 => StorageFormat::Dense,
        1 => StorageFormat::Sparse,
        t => {
            return Err(Error::cbf_value(
                format!("stream {i} storage type"),
                at,
                Some(t.into()),
                0..=1,
                format!("unknown encoding type {t} (0 = dense, 1 = sparse)"),
            ))
        }
    };
    let len_at = r.abs();
    let name_len = r.u32(&format!("stream {i} name length"))?;
    if u64::from(name_len) > r.remaining() {
        return Err(Error::cbf_value(
            format!("stream {i} name length"),
            len_at,
            Some(name_len.into()),
            0..=r.remaining(),
            format!("a name of {name_len} bytes runs past the end of the header ({} bytes left)", r.remaining()),
        ));
    }
    if name_len > limits.max_name_len {
        return Err(limit(format!("stream {i} name length"), name_len.into(), limits.max_name_len.into(), len_at));
    }
    let raw = r.take(name_len as usize, &format!("stream {i} name"))?;
    let raw = raw.split(|&b| b == 0).next().unwrap_or(&[]);
    let name = String::from_utf8_lossy(raw).into_owned();
    let et_at = r.abs();
    let element_type = match r.u8(&format!("stream {i} element type"))? {
        0 => ElementType::F32,
        1 => ElementType::F64,
        t => {
            return Err(Error::cbf_value(
                format!("stream {i} element type"),
                et_at,
                Some(t.into()),
                0..=1,
                format!("unsupported input data type {t} (0 = float32, 1 = float64)"),
            ))
        }
    };
    let dim_at = r.abs();
    let dim = r.u32(&format!("stream {i} dim"))?;
    if format == StorageFormat::Sparse && dim > i32::MAX as u32 {
        return Err(Error::cbf_value(
            format!("stream {i} dim"),
            dim_at,
            Some(dim.into()),
            0..=i32::MAX as u64,
            format!("sparse dim {dim} is too large for a 32-bit signed index (at most {})", i32::MAX),
        ));
    }
    if dim > limits.max_dim {
        return Err(limit(format!("stream {i} dim"), dim.into(), limits.max_dim.into(), dim_at));
    }
    Ok(StreamHeader { name, format, element_type, dim })
}

/// Reads a whole in-memory file: header and every chunk, decoded (tests, small files, fuzzing).
pub fn decode_file(file: &[u8], limits: &Limits) -> Result<(Header, Vec<ChunkData>), Error> {
    let header = Header::from_file_bytes(file, limits)?;
    let mut out = Vec::with_capacity(header.chunks().len());
    for k in 0..header.chunks().len() {
        let d = ChunkDecoder::new(&header, k)?;
        let r = d.byte_range();
        let bytes = file.get(r.start as usize..r.end as usize).unwrap_or(&[]);
        out.push(d.decode(bytes)?);
    }
    Ok((header, out))
}

/// A little-endian reader over untrusted bytes that starts at absolute offset `base`.
pub(crate) struct Cursor<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
    pub(crate) base: u64,
    /// What the bytes are, for "runs past the end of …" messages.
    pub(crate) what: &'static str,
}

impl<'a> Cursor<'a> {
    #[inline]
    pub(crate) fn abs(&self) -> u64 {
        self.base + self.pos as u64
    }
    #[inline]
    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }
    #[inline]
    pub(crate) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], Error> {
        match self.pos.checked_add(n).and_then(|end| self.bytes.get(self.pos..end)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(Error::cbf_value(
                field,
                self.abs(),
                Some(n as u64),
                0..=self.remaining(),
                format!(
                    "needs {n} bytes but {} ends at byte {} ({} bytes left)",
                    self.what,
                    self.base + self.bytes.len() as u64,
                    self.remaining()
                ),
            )),
        }
    }
    #[inline]
    pub(crate) fn u8(&mut self, field: &str) -> Result<u8, Error> {
        Ok(self.take(1, field)?[0])
    }
    #[inline]
    pub(crate) fn u32(&mut self, field: &str) -> Result<u32, Error> {
        Ok(le_u32(self.take(4, field)?))
    }
    #[inline]
    pub(crate) fn u64(&mut self, field: &str) -> Result<u64, Error> {
        Ok(le_u64(self.take(8, field)?))
    }
}

#[inline]
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

#[inline]
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests;
