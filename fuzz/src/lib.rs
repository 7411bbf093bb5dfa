//! The checks of cntkio's fuzz targets: one function per target, named after it
//! (`fuzz_targets/<target>.rs` only calls it).
//!
//! The same functions replay the committed corpora (`fuzz/corpus/<target>/`) as ordinary tests:
//! `crates/cntkio/tests/fuzz_corpus.rs` includes this file with `#[path]`, so it may use only what that
//! test can (`cntkio`, `cntkio_core`, `tempfile` and `std`). Each check asserts a property, not only the
//! absence of a panic; inputs a check cannot use (say a schema that `Schema::new` refuses) end it early.

use cntkio::arrow::{ArrowFile, ArrowSource};
use cntkio::cbf::{CbfFile, CbfOptions};
use cntkio::config::{brainscript, extract_reader, load_reader_config, reader_sections};
use cntkio::convert::{ctf_to_cbf, CtfToCbf};
use cntkio::ctf::cache::cache_path;
use cntkio::ctf::{index_config, ScanOptions};
use cntkio::randomize::Window;
use cntkio::source::{
    Batch, CbfSource, ChunkKeep, Deserializer, Feed, FeedConfig, MinibatchConfig, MinibatchSource, MultiSource,
    RunLength, SourceState,
};
use cntkio::{ChunkData, CtfOptions, CtfReader, Error, Schema, StorageFormat, StreamSpec};
use cntkio::{ElementType, ErrorKind, Layout};
use cntkio_core::cbf::{decode_file, encode_file, Header, Limits};
use cntkio_core::ctf::index::{index_bytes, IndexMode};
use cntkio_core::ctf::infer::Inferrer;
use cntkio_core::ctf::parse::{sequence_samples, vector_paths, Collect, CtfParser, ErrorSink};
use cntkio_core::internal::{bom_len, select_mode, skip_space};
use cntkio_core::WarningKind;
use std::path::Path;
use std::sync::Arc;

/// Bytes at the start of a CTF input that choose its schema and error policy ([`CtfCase::new`]).
pub const CTF_HEADER_LEN: usize = 5;

/// Dims a stream byte can ask for instead of the inferred one (index 0 means inferred).
const DIMS: [usize; 16] = [0, 1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 100, 128, 943, 1000, 65536];

/// A CTF text and the schema and error policy its first [`CTF_HEADER_LEN`] bytes choose.
///
/// Byte 0: bits 0–1 the number of streams − 1; bit 2 double precision; bit 3 `skipSequenceIds`; bit 4 the
/// first stream defines the sequence length; bits 5–6 the errors tolerated (0, 3, 1000, 1000 and
/// sequences with an empty stream dropped). Bytes 1–4, one per stream: bits 0–2 which alias the stream
/// reads, counted among those the text mentions (or `x`, `y`, `z`, `w` when it mentions none); bit 3 the
/// other storage format than the text suggests; bits 4–7 the dim ([`DIMS`]; 0: the smallest the text
/// allows). Aliases come from the text so that seeds from real files parse under the schema they
/// describe, and mutations move from there.
#[derive(Debug)]
pub struct CtfCase<'a> {
    /// The schema.
    pub schema: Schema,
    /// `skipSequenceIds`.
    pub skip_sequence_ids: bool,
    /// Errors recorded before the parse stops (1: the first error stops it).
    pub error_cap: usize,
    /// Sequences with an empty stream are dropped instead of stopping the parse.
    pub skip_bad_sequences: bool,
    /// The CTF text.
    pub text: &'a [u8],
}

impl<'a> CtfCase<'a> {
    /// The case of a fuzz input, or `None` when the input is too short or its schema is invalid.
    pub fn new(data: &'a [u8]) -> Option<CtfCase<'a>> {
        let (head, text) = data.split_at_checked(CTF_HEADER_LEN)?;
        let flags = head[0];
        let mut seen = Inferrer::new();
        seen.add_sequence(text);
        let mut streams = Vec::new();
        for (i, &b) in head[1..].iter().take(1 + usize::from(flags & 3)).enumerate() {
            let pick = usize::from(b & 7);
            let (alias, sparse, min_dim) = match seen.streams.get(pick % seen.streams.len().max(1)) {
                Some(st) => (st.alias.clone(), st.is_sparse(), st.min_dim()),
                None => (["x", "y", "z", "w"][pick % 4].to_string(), false, 1),
            };
            let format = if (b & 8 != 0) != sparse { StorageFormat::Sparse } else { StorageFormat::Dense };
            let dim = match DIMS[usize::from(b >> 4)] {
                0 => usize::try_from(min_dim).ok()?.clamp(1, 65536),
                d => d,
            };
            let t = if flags & 4 != 0 { ElementType::F64 } else { ElementType::F32 };
            let spec = StreamSpec::new(format!("s{i}"), dim, format).alias(alias).element_type(t);
            streams.push(spec.defines_mb_size(i == 0 && flags & 16 != 0));
        }
        let policy = (flags >> 5) & 3;
        Some(CtfCase {
            schema: Schema::new(streams).ok()?,
            skip_sequence_ids: flags & 8 != 0,
            error_cap: [1, 4, 1001, 1001][usize::from(policy)],
            skip_bad_sequences: policy == 3,
            text,
        })
    }

    /// The schema's main stream's alias (what the index groups rows by).
    fn main_alias(&self) -> Option<&str> {
        self.schema.main_stream().map(|i| self.schema.streams()[i].alias.as_str())
    }

    /// A parser of the schema with the vector paths on or off.
    fn parser(&self, vector: bool) -> CtfParser {
        let mut parser = CtfParser::new(&self.schema);
        parser.set_vector_paths(vector);
        parser
    }

    /// Indexes the whole text as one chunk and parses its sequences.
    fn parse(&self, vector: bool) -> Parsed {
        let parser = self.parser(vector);
        let mut out = ChunkData::new(&self.schema);
        let mut sink = Sink::new(self);
        let outcome = index_bytes(self.text, self.skip_sequence_ids, self.main_alias(), u64::MAX).and_then(|chunks| {
            for c in &chunks {
                parser.parse_sequences(self.text, 0, &c.sequences, &mut out, &mut sink)?;
            }
            Ok(chunks.iter().flat_map(|c| c.sequences.iter().map(|s| (s.key, s.offset, s.len_bytes))).collect())
        });
        assert!(sparse_indices_in_range(&out), "a sparse index out of range was kept");
        Parsed::new(outcome, out, sink)
    }

    /// In line mode without a main stream, what cntkio's reader does: the parser finds the rows itself
    /// ([`CtfParser::parse_rows`]) from the first row on. `None` in id mode or when the index fails.
    fn parse_rows(&self, vector: bool) -> Option<Parsed> {
        let bom = bom_len(self.text);
        let (ws, lines) = skip_space(self.text.get(bom..)?);
        let start = bom + ws;
        let first = *self.text.get(start)?;
        let mode = select_mode(first, self.skip_sequence_ids, start as u64).ok()?;
        if mode != IndexMode::Lines || self.schema.main_stream().is_some() {
            return None;
        }
        let parser = self.parser(vector);
        let mut out = ChunkData::new(&self.schema);
        let mut sink = Sink::new(self);
        let mut seqs = Vec::new();
        let outcome = parser.parse_rows(&self.text[start..], start as u64, lines, &mut seqs, &mut out, &mut sink);
        let outcome = outcome.map(|()| seqs.iter().map(|s| (s.key, s.offset, s.len_bytes)).collect());
        Some(Parsed::new(outcome, out, sink))
    }
}

/// What a parse gave, in a form compared exactly: the outcome (the sequences, or the error), the data,
/// the errors tolerated, the warnings and the sequences dropped. Data and errors are kept as their
/// `Debug` text, which tells every value apart but NaN payloads (and makes NaN equal to itself).
#[derive(Debug, PartialEq)]
struct Parsed {
    outcome: Result<Vec<(u64, u64, u32)>, String>,
    data: String,
    errors: Vec<String>,
    warnings: Vec<(WarningKind, u64)>,
    dropped: Vec<String>,
}

impl Parsed {
    fn new(outcome: Result<Vec<(u64, u64, u32)>, Error>, data: ChunkData, sink: Sink) -> Parsed {
        Parsed {
            outcome: outcome.map_err(|e| format!("{e:?}")),
            data: format!("{data:?}"),
            errors: sink.collect.errors.iter().map(|e| format!("{e:?}")).collect(),
            warnings: sink.collect.warnings,
            dropped: sink.dropped,
        }
    }
}

/// [`Collect`], which also drops sequences with an empty stream when asked to (cntkio's
/// `skip_bad_sequences`) and records them.
struct Sink {
    collect: Collect,
    skip_bad_sequences: bool,
    dropped: Vec<String>,
}

impl Sink {
    fn new(case: &CtfCase<'_>) -> Sink {
        Sink {
            collect: Collect::new(case.error_cap, true),
            skip_bad_sequences: case.skip_bad_sequences,
            dropped: Vec::new(),
        }
    }
}

impl ErrorSink for Sink {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        self.collect.error(e)
    }
    fn wants_warnings(&self) -> bool {
        true
    }
    fn warning(&mut self, w: WarningKind, byte: u64) {
        self.collect.warning(w, byte);
    }
    fn fatal(&mut self, e: Error) -> Result<(), Error> {
        if !self.skip_bad_sequences {
            return Err(e);
        }
        self.dropped.push(format!("{e:?}"));
        Ok(())
    }
}

/// `ctf_parse`: CTF text under a schema from its first bytes ([`CtfCase`]). The parser with its vector
/// (AVX-512) paths on and off gives the same sequences, values, errors, warnings and dropped sequences;
/// in line mode, the parser finding the rows itself gives what it gives on the index's sequences.
///
/// On a processor without the vector paths both parses take the scalar paths, and only the second
/// property tests anything.
pub fn ctf_parse(data: &[u8]) {
    // As in the parser's own tests: where `scripts/test.sh` found the extensions, the vector paths must be
    // on, or the comparison below would compare the scalar paths with themselves.
    if std::env::var_os("CNTKIO_EXPECT_SIMD").is_some() {
        assert!(vector_paths().is_some(), "AVX-512 is expected but the vector paths are not available");
    }
    let Some(case) = CtfCase::new(data) else { return };
    let scalar = case.parse(false);
    assert_eq!(case.parse(true), scalar, "vector paths on and off differ");
    if let Some(rows) = case.parse_rows(false) {
        assert_eq!(case.parse_rows(true).as_ref(), Some(&rows), "vector paths on and off differ on rows");
        // The rows are compared only where the parse went through (an error stops the two at the
        // same sequence, but `parse_rows` lists the rows after it all the same).
        if rows.outcome.is_ok() && scalar.outcome.is_ok() {
            assert_eq!(rows, scalar, "rows found by the parser differ from the index's");
        }
    }
}

/// Every sparse index the chunk's samples hold is below its stream's dim: what every reader promises (and
/// the CBF writer trusts in parsed data).
fn sparse_indices_in_range(c: &ChunkData) -> bool {
    c.streams.iter().all(|d| match &d.layout {
        Layout::Sparse { indices, sample_offsets } => {
            let used = sample_offsets.last().map_or(0, |&n| n as usize);
            indices.get(..used).is_some_and(|kept| kept.iter().all(|&i| i >= 0 && (i as usize) < d.dim))
        }
        Layout::Dense => true,
    })
}

/// One stream's samples in a sequence, each as `(index or position, value bits)` pairs.
type Samples = Vec<Vec<(usize, u64)>>;

/// Every sequence of `chunks` (in order) as its declared length and, per stream, its samples as
/// `(index or position, value bits)` lists, widened to f64: what must survive a conversion.
fn sequences(chunks: &[ChunkData]) -> Vec<(u32, Vec<Samples>)> {
    let mut out = Vec::new();
    for c in chunks {
        for (s, n) in c.num_samples.iter().enumerate() {
            let streams = c
                .streams
                .iter()
                .map(|d| {
                    let samples = sequence_samples(d, s);
                    samples.into_iter().map(|v| v.into_iter().map(|(i, x)| (i, x.to_bits())).collect()).collect()
                })
                .collect();
            out.push((n, streams));
        }
    }
    out
}

/// A file in a fresh temporary directory, kept while the directory lives.
fn temp_file(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("the temporary file is written");
    (dir, path)
}

/// Every chunk of a CBF file read through [`CbfFile`] (mapped or with positioned reads), as far as it
/// goes: the header's streams and the chunks, or the kind of the first error (less what the file reader adds
/// for a file that looks like CTF text, which the in-memory decoder cannot tell).
fn read_cbf_file(path: &Path, mmap: bool) -> Result<(String, Vec<ChunkData>), String> {
    let kind = |e: Error| format!("{:?}", e.kind()).replace(cntkio::cbf::CTF_TEXT_HINT, "");
    let file = CbfFile::open_with(path, &CbfOptions::default().mmap(mmap)).map_err(kind)?;
    let chunks = (0..file.chunk_count()).map(|k| file.read_chunk(k)).collect::<Result<Vec<_>, _>>().map_err(kind)?;
    Ok((format!("{:?}", file.streams()), chunks))
}

/// `cbf_read`: arbitrary bytes as a CBF file. Reading it never panics; the in-memory decoder and the
/// library's file reader (mapped and with positioned reads) agree; what is decoded is bounded by the file's
/// size (no number in the file makes more values or sequences than its bytes hold); and decoded chunks,
/// encoded again, decode to the same data.
pub fn cbf_read(data: &[u8]) {
    let limits = Limits::default();
    let decoded = decode_file(data, &limits);
    let (_dir, path) = temp_file("data.cbf", data);
    let in_memory = match Header::from_file_bytes(data, &limits).map(|mut h| h.rename(&[])) {
        // The file reader applies CNTK's reader rule that stream names are unique (`Header::rename`) when it
        // opens the file, before any chunk is read; the codec has no such rule.
        Ok(Err(e)) => Err(e),
        _ => decoded.as_ref().map(|(h, c)| (format!("{:?}", h.streams()), c.clone())).map_err(Clone::clone),
    };
    let in_memory = in_memory.map_err(|e| format!("{:?}", e.kind()));
    for mmap in [false, true] {
        let file = read_cbf_file(&path, mmap);
        assert_eq!(format!("{file:?}"), format!("{in_memory:?}"), "CbfFile (mmap {mmap}) and decode_file differ");
    }
    let Ok((header, chunks)) = decoded else { return };
    let values: usize = chunks.iter().flat_map(|c| &c.streams).map(|d| d.values.len()).sum();
    let sequences: usize = chunks.iter().map(|c| c.keys.len()).sum();
    assert!(4 * values <= data.len(), "{values} values decoded from {} bytes", data.len());
    assert!(4 * sequences <= data.len(), "{sequences} sequences decoded from {} bytes", data.len());
    assert!(chunks.iter().all(sparse_indices_in_range), "a sparse index out of range was decoded");
    let again = match encode_file(header.streams(), &chunks) {
        Ok(again) => again,
        // Meta counts summing past the chunk table's 32-bit sample count decode (CNTK does not check the
        // sum) but cannot be written again.
        Err(e) if matches!(e.kind(), ErrorKind::Limit { what, .. } if what.contains("meta counts")) => return,
        Err(e) => panic!("decoded chunks do not encode: {e:?}"),
    };
    let (header2, chunks2) = decode_file(&again, &limits).expect("an encoded file decodes");
    assert_eq!(header2.streams(), header.streams());
    assert_eq!(format!("{chunks2:?}"), format!("{chunks:?}"), "decode(encode(decoded)) differs");
}

/// `ctf_cbf_roundtrip`: CTF text under a schema from its first bytes ([`CtfCase`]), converted to CBF by the
/// library's converter (small chunks, one or two threads), reads back as the sequences, declared lengths
/// and values the CTF parser gives on the text directly; where the parse fails (or finds no sequence), so
/// does the conversion.
pub fn ctf_cbf_roundtrip(data: &[u8]) {
    let Some(case) = CtfCase::new(data) else { return };
    // CNTK's behaviour: the first error stops both (the converter's tolerance has its own tests).
    let direct = {
        let parser = case.parser(true);
        let mut out = ChunkData::new(&case.schema);
        let mut sink = cntkio_core::ctf::parse::FailFast;
        index_bytes(case.text, case.skip_sequence_ids, case.main_alias(), u64::MAX)
            .and_then(|chunks| {
                chunks.iter().try_for_each(|c| parser.parse_sequences(case.text, 0, &c.sequences, &mut out, &mut sink))
            })
            .map(|()| out)
    };
    let (dir, input) = temp_file("data.ctf", case.text);
    let output = dir.path().join("data.cbf");
    let how = CtfToCbf {
        ctf: CtfOptions { skip_sequence_ids: case.skip_sequence_ids, ..CtfOptions::default() },
        writer: cntkio::cbf::CbfWriterOptions::new(64 + 64 * u64::from(data[0] & 3)),
        scan: ScanOptions { threads: 1 + usize::from(data[1] & 1), ..ScanOptions::default() },
        access: cntkio::Access::Read,
        hooks: cntkio::convert::Hooks::default(),
    };
    let converted = ctf_to_cbf(&input, &output, &case.schema, &how, &mut |_| {});
    match (&direct, &converted) {
        (Ok(d), Ok(_)) => {
            let bytes = std::fs::read(&output).expect("the converted file is there");
            let (_, chunks) = decode_file(&bytes, &Limits::default()).expect("the converted file decodes");
            assert_eq!(sequences(&chunks), sequences(std::slice::from_ref(d)), "CTF → CBF changed the data");
        }
        (Err(_), Err(_)) => {}
        // A file with no sequence is refused rather than converted to an empty CBF file.
        (Ok(d), Err(_)) if d.keys.is_empty() => {}
        (d, c) => panic!("the parse and the conversion disagree: parse {d:?}, conversion {c:?}"),
    }
}

/// Asserts that a position in config `text` (not in an override) is where its line and column say.
fn check_config_position(text: &str, e: &Error) {
    let p = e.position();
    if p.path.is_some() {
        return;
    }
    let (Some(byte), Some(line), Some(column)) = (p.byte, p.line, p.column) else { return };
    let byte = usize::try_from(byte).expect("a byte offset in memory");
    assert!(byte <= text.len(), "error at byte {byte} of a {}-byte text: {e}", text.len());
    let before = &text.as_bytes()[..byte];
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |k| k + 1);
    let want = (1 + before.iter().filter(|&&b| b == b'\n').count() as u64, (byte - line_start) as u64 + 1);
    assert_eq!((line, column), want, "error at byte {byte} reports line:column {line}:{column}: {e}");
}

/// `config_parse`: BrainScript config text (before a NUL byte), then `name=value` overrides one a line
/// (after it). Parsing, applying the overrides and extracting every reader section never panic, and an
/// error in the text points at the line and column of its byte.
pub fn config_parse(data: &[u8]) {
    let Ok(all) = std::str::from_utf8(data) else { return };
    let (text, rest) = all.split_once('\0').unwrap_or((all, ""));
    let overrides: Vec<(String, String)> = rest.lines().filter_map(|l| brainscript::split_override(l).ok()).collect();
    let root = match brainscript::parse(text) {
        Ok(root) => root,
        Err(e) => return check_config_position(text, &e),
    };
    let mut root_with = root.clone();
    if let Err(e) = brainscript::apply_overrides(&mut root_with, &overrides) {
        check_config_position(text, &e);
    }
    for r in [&root, &root_with] {
        for section in reader_sections(r).iter().map(String::as_str).map(Some).chain([None]) {
            if let Err(e) = extract_reader(r, section, None) {
                check_config_position(text, &e);
                let _ = e.to_string();
            }
        }
    }
    if let Err(e) = load_reader_config(text, None, &overrides) {
        check_config_position(text, &e);
    }
}

/// The data the minibatch sources of `checkpoint_restore` read: sequences of 1–4 samples in 64-byte
/// chunks, a dense and a sparse stream.
const SOURCE_TEXT: &[u8] =
    b"0 |a 1 2 |b 0:1\n0 |a 3 4 |b 1:1\n1 |a 5 6 |b 4:2\n2 |a 7 8 |b 1:1 2:1\n2 |a 9 10 |b 3:1\n\
2 |a 11 12 |b 0:2\n3 |a 13 14 |b 3:1\n4 |a 15 16 |b 2:1\n4 |a 17 18 |b 2:2\n4 |a 19 20 |b 4:1\n4 |a 21 22 |b 0:1\n\
5 |a 23 24 |b 0:1\n6 |a 25 26 |b 1:3\n6 |a 27 28 |b 2:1\n7 |a 29 30 |b 4:1\n";

fn source_schema() -> Schema {
    Schema::new(vec![StreamSpec::new("a", 2, StorageFormat::Dense), StreamSpec::new("b", 5, StorageFormat::Sparse)])
        .expect("a valid schema")
}

/// `checkpoint_restore`: byte 0 chooses a minibatch source's configuration (bit 0 randomization, bit 1
/// truncated BPTT of 3 samples, bit 2 two workers, bit 3 rank 1, bit 4 CNTK's restore quirk, bit 5
/// balanced workers), the rest is a checkpoint state's JSON. Restoring gives an error or continues: the
/// source then hands out minibatches (or errors), never panics, and reports the state's minibatch count
/// and sweep size as its own.
pub fn checkpoint_restore(data: &[u8]) {
    let Some((&flags, json)) = data.split_first() else { return };
    let Ok(json) = std::str::from_utf8(json) else { return };
    let Ok(state) = SourceState::from_json(json) else { return };
    let (_dir, path) = temp_file("data.ctf", SOURCE_TEXT);
    let opts = CtfOptions { chunk_size: 64, ..CtfOptions::default() };
    let reader = CtfReader::open(&path, &source_schema(), &opts).expect("the source data opens");
    let workers = if flags & 4 != 0 { 2 } else { 1 };
    let config = MinibatchConfig {
        randomize: flags & 1 != 0,
        truncation_length: if flags & 2 != 0 { 3 } else { 0 },
        workers,
        rank: u32::from(flags >> 3 & 1) % workers,
        cntk_restore_quirk: flags & 16 != 0,
        balanced_workers: flags & 32 != 0,
        run_length: RunLength::Sweeps(3),
        threads: Some(0),
        ..MinibatchConfig::default()
    };
    let Ok(mut source) = MinibatchSource::new(Arc::new(reader), config) else { return };
    if source.restore(&state).is_err() {
        return;
    }
    let now = source.state();
    assert_eq!((now.minibatches, now.sweep_size), (state.minibatches, state.sweep_size), "restored from {json}");
    for _ in 0..4 {
        match source.next_minibatch(4) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
}

/// The CTF files of `index_cache`: one in id mode, one in line mode (every row valid in line mode too).
const CACHE_TEXTS: [&[u8]; 2] = [
    b"0 |a 1 2 |b 0:1\n0 |a 3 4 |b 1:1\n1 |a 5 6 |b 4:2\n2 |a 7 8 |b 1:1\n2 |a 9 10 |b 2:1\n3 |a 11 12 |b 2:1\n",
    b"|a 1 2 |b 0:1\n|a 3 4 |b 1:1\n|a 5 6 |b 4:2\n|a 7 8 |b 1:1\n",
];

/// `index_cache`: byte 0 chooses the CTF file (bit 0), `skipSequenceIds` (bit 1), a chunk size of 16
/// bytes or 32 MiB (bit 2) and how the rest becomes the index cache file: as it is (bit 3 clear), or as
/// the records of a cache whose header fits the file and whose CRC is right (bit 3 set: the rest is cut to
/// whole 32-byte records), which the loader then checks field by field. Opening the file with
/// `cacheIndex` never panics, and every chunk loads or fails with an error; the index is the one built
/// from the file unless the cache was used as it is (it is left in place then, not rewritten).
pub fn index_cache(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let (_dir, path) = temp_file("data.ctf", CACHE_TEXTS[usize::from(flags & 1)]);
    let opts = CtfOptions {
        skip_sequence_ids: flags & 2 != 0,
        chunk_size: if flags & 4 != 0 { 16 } else { cntkio::options::DEFAULT_CHUNK_SIZE },
        cache_index: true,
        ..CtfOptions::default()
    };
    let schema = source_schema();
    // The first open builds the index and writes the cache: the header a valid cache has.
    let built = CtfReader::open(&path, &schema, &opts).expect("the data indexes");
    let cache = cache_path(&path, &index_config(&schema, &opts));
    let valid = std::fs::read(&cache).expect("the index cache was written");
    let forged = if flags & 8 == 0 {
        rest.to_vec()
    } else {
        // Header, sequence count (u64), 32-byte records, CRC-32 (u32): the header is what is left.
        let records = built.index().num_sequences() as usize * 32;
        let head = valid.len().checked_sub(4 + records + 8).map(|n| &valid[..n]).expect("a cache holds its header");
        let count = rest.len() / 32;
        let mut v = head.to_vec();
        v.extend_from_slice(&(count as u64).to_le_bytes());
        v.extend_from_slice(&rest[..count * 32]);
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    };
    std::fs::write(&cache, &forged).expect("the forged cache is written");
    let reader = match CtfReader::open(&path, &schema, &opts) {
        Ok(r) => r,
        Err(e) => panic!("a file that indexes fails to open with an index cache: {e}"),
    };
    let index = reader.index();
    if index != built.index() {
        assert_eq!(std::fs::read(&cache).ok().as_ref(), Some(&forged), "an index of neither the file nor the cache");
    }
    let file_len = CACHE_TEXTS[usize::from(flags & 1)].len() as u64;
    assert!(index.chunks.iter().flat_map(|c| &c.sequences).all(|s| s.end() <= file_len), "a sequence past the end");
    for k in 0..index.chunks.len() {
        let chunk = reader.load_chunk(k);
        // The file's own index reads: its data are valid.
        assert!(chunk.is_ok() || index != built.index(), "chunk {k} of the file's index fails: {chunk:?}");
    }
}

/// Decompressed bytes read at most this far into a compressed input (a small input may expand a
/// thousandfold).
const DECOMPRESSED_CAP: usize = 16 << 20;

/// The `compressed_read` target: a compressed input (gzip, BGZF, zstd, seekable zstd; the first byte of
/// the fuzz input is not part of the file) reads the same whatever the order of the reads. One view of it
/// is read front to back in reads of a size that first byte chooses, as far as it goes (to its end, an
/// error, or [`DECOMPRESSED_CAP`]); another, opened afresh, at offsets drawn from the input, before and
/// after the end, so that reads land behind, inside and ahead of a decompression still under way. Every
/// read of the second that succeeds gives the first's bytes where the first has them.
pub fn compressed_read(data: &[u8]) {
    let Some((&flags, file)) = data.split_first() else { return };
    let (_dir, path) = temp_file("data", file);
    let open = || cntkio::InputFile::open(&path, cntkio::Access::Read);
    let Ok(ordered) = open() else { return };
    if ordered.compression().is_none() {
        return;
    }
    let step = [1usize, 7, 4096, 1 << 16][usize::from(flags & 3)];
    let (mut whole, mut buf) = (Vec::new(), vec![0u8; step]);
    let complete = loop {
        match ordered.read_some(whole.len() as u64, &mut buf) {
            Ok(0) => break true,
            Ok(n) => whole.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
        if whole.len() > DECOMPRESSED_CAP {
            return;
        }
    };
    if complete {
        assert_eq!(ordered.len(), whole.len() as u64, "the length of a stream read to its end");
    }
    let Ok(random) = open() else { return };
    let mut x = u64::from(crc32fast::hash(data)) | 1;
    for _ in 0..12 {
        // A xorshift: offsets spread over the data and a little past its end, reads of 1 byte to 64 KiB.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = x % (whole.len() as u64 + 3);
        let len = 1 + (x >> 32) as usize % (64 << 10);
        let mut got = vec![0u8; len];
        let Ok(n) = random.read_some(at, &mut got) else { continue };
        let have = whole.get(at as usize..).unwrap_or_default();
        let shared = n.min(have.len());
        assert!(got[..shared] == have[..shared], "a read at {at} of {n} bytes differs from the read in order");
        if complete {
            assert!(n <= have.len(), "a read at {at} gave {n} bytes past the end of a stream of {}", whole.len());
            assert!(n > 0 || have.is_empty(), "a read at {at} gave nothing before the end");
        }
    }
}

/// The minibatches a source hands out until its end (each with the checkpoint after it), and the error that
/// stopped it, if one did.
fn minibatches(source: &mut MinibatchSource, size: u64) -> (Vec<(Batch, SourceState)>, Option<String>) {
    let mut out = Vec::new();
    loop {
        match source.next_minibatch(size) {
            Ok(Some(b)) => out.push((b, source.state())),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e.to_string())),
        }
        assert!(out.len() <= 1 << 20, "a run of two sweeps over a small file does not end");
    }
}

/// The keys and the sequences (declared lengths and samples) of `batches`, one after another.
fn contents<'a>(batches: impl IntoIterator<Item = &'a Batch>) -> (Vec<u64>, Vec<(u32, Vec<Samples>)>) {
    let mut keys = Vec::new();
    let mut seqs = Vec::new();
    for b in batches {
        keys.extend(b.data.keys.iter());
        seqs.extend(sequences(std::slice::from_ref(&b.data)));
    }
    (keys, seqs)
}

/// What [`minibatches`] gave, compared exactly (values as bits, so NaN is equal to itself).
type Outline = (Vec<(Vec<u64>, Vec<(u32, Vec<Samples>)>, bool, bool, String, SourceState)>, Option<String>);

fn outline((batches, error): (Vec<(Batch, SourceState)>, Option<String>)) -> Outline {
    let each = batches.into_iter().map(|(b, state)| {
        let (keys, seqs) = contents([&b]);
        (keys, seqs, b.end_of_sweep, b.end_of_run, format!("{:?}", b.bptt), state)
    });
    (each.collect(), error)
}

/// `feed`: CTF text under a schema from the input's fourth byte on ([`CtfCase`]), or that text converted to
/// CBF (alone, or after the text as a second file), read over two sweeps by a minibatch source whose
/// configuration the first three bytes choose. A [`Feed`] of that source hands out exactly the source's minibatches, checkpoints and error, whatever its
/// threads, batches ahead and minibatches per batch; a source restored from the checkpoint after any
/// minibatch gives the minibatches after it; and sources that share a [`ChunkKeep`] (a loader's epochs: one
/// sweep each, with seeds one apart) give the minibatches of sources without one.
///
/// Byte 0: bit 0 randomization, bit 1 frame mode, bit 2 truncated BPTT of 3 samples, bit 3 two workers,
/// bit 4 rank 1, bit 5 balanced workers, bit 6 a window of 2 chunks (else one covering the data), bit 7
/// two loading threads (else chunks load on the planning thread). Byte 1: bits 0–3 the minibatch size − 1,
/// bits 4–5 the feed's threads − 1, bits 6–7 its minibatches per batch − 1. Byte 2: bits 0–2 its batches
/// ahead − 1, bit 3 the text converted to CBF and read from there (mapped), bit 4 (with bit 3) the text and
/// its conversion read one after the other as one source, bits 5–7 the seed.
pub fn feed(data: &[u8]) {
    let Some((&[b0, b1, b2], rest)) = data.split_first_chunk::<3>() else { return };
    let Some(case) = CtfCase::new(rest) else { return };
    let (_dir, path) = temp_file("data.ctf", case.text);
    let ctf = CtfOptions {
        chunk_size: 64,
        skip_sequence_ids: case.skip_sequence_ids,
        max_errors: case.error_cap as u64 - 1,
        ..CtfOptions::default()
    };
    let Ok(reader) = CtfReader::open(&path, &case.schema, &ctf) else { return };
    let mut reader: Arc<dyn Deserializer> = Arc::new(reader);
    if b2 & 8 != 0 {
        // The text converted to CBF (chunks of one or two sequences), read from the mapped file.
        let output = path.with_extension("cbf");
        let how = CtfToCbf {
            ctf: CtfOptions { skip_sequence_ids: case.skip_sequence_ids, ..CtfOptions::default() },
            writer: cntkio::cbf::CbfWriterOptions::new(64),
            scan: ScanOptions::default(),
            access: cntkio::Access::Read,
            hooks: cntkio::convert::Hooks::default(),
        };
        if ctf_to_cbf(&path, &output, &case.schema, &how, &mut |_| {}).is_err() {
            return;
        }
        let options = CbfOptions::default().mmap(true);
        let cbf: Arc<dyn Deserializer> =
            Arc::new(CbfSource::open_with(&output, &options).expect("a converted file opens"));
        reader = if b2 & 16 != 0 {
            // The text and its conversion one after the other, as the files of one source.
            Arc::new(MultiSource::new(vec![reader, cbf]).expect("a file and its conversion have the same streams"))
        } else {
            cbf
        };
    }
    check_feed(&reader, [b0, b1, b2]);
}

/// `cbf_feed`: the input's fourth byte on as a CBF file, read mapped or with positioned reads (bit 3 of
/// byte 2), by the minibatch sources and feeds of [`feed`], whose first three bytes it shares: whatever the
/// file holds, they never panic, and they agree as [`feed`] says (checkpoints resume exactly where the
/// chunk table's sample counts are the sums of the sequences').
pub fn cbf_feed(data: &[u8]) {
    let Some((&[b0, b1, b2], file)) = data.split_first_chunk::<3>() else { return };
    let (_dir, path) = temp_file("data.cbf", file);
    let options = CbfOptions::default().mmap(b2 & 8 != 0);
    let Ok(reader) = CbfSource::open_with(&path, &options) else { return };
    check_feed(&(Arc::new(reader) as Arc<dyn Deserializer>), [b0, b1, b2]);
}

/// The checks of [`feed`] on `reader`, configured by `[b0, b1, b2]` as [`feed`] says (bits 3–4 of `b2`
/// excepted).
fn check_feed(reader: &Arc<dyn Deserializer>, [b0, b1, b2]: [u8; 3]) {
    // Truncated BPTT delivers streams dense, up to 2^30 values a minibatch: wide sparse streams would make
    // each run take gigabytes (the limit itself has its test in tests/minibatch.rs).
    if b0 & 4 != 0 && reader.streams().iter().map(|s| s.dim).sum::<usize>() > 1 << 16 {
        return;
    }
    let workers = if b0 & 8 != 0 { 2 } else { 1 };
    let config = |seed: u64, sweeps: u64| MinibatchConfig {
        randomize: b0 & 1 != 0,
        frame_mode: b0 & 2 != 0,
        truncation_length: if b0 & 4 != 0 { 3 } else { 0 },
        workers,
        rank: u32::from(b0 >> 4 & 1) % workers,
        balanced_workers: b0 & 32 != 0,
        window: if b0 & 64 != 0 { Window::Chunks(2) } else { Window::Chunks(1 << 20) },
        threads: Some(if b0 & 128 != 0 { 2 } else { 0 }),
        seed,
        run_length: RunLength::Sweeps(sweeps),
        ..MinibatchConfig::default()
    };
    let source = |seed: u64, sweeps: u64| MinibatchSource::new(reader.clone(), config(seed, sweeps));
    let size = 1 + u64::from(b1 & 15);
    let seed = u64::from(b2 >> 5);
    let Ok(mut first) = source(seed, 2) else { return };
    let (want, error) = minibatches(&mut first, size);

    let how = FeedConfig {
        size,
        threads: 1 + usize::from(b1 >> 4 & 3),
        ahead: 1 + usize::from(b2 & 7),
        group: 1 + usize::from(b1 >> 6),
    };
    let mut feed = Feed::start(source(seed, 2).expect("the same configuration"), how).expect("a feed starts");
    let mut next = 0;
    let fed_error = loop {
        match feed.next_batch() {
            Ok(Some(f)) => {
                assert_eq!(f.index, next as u64, "{how:?}");
                let n = f.parts.len();
                assert!(n >= 1 && n <= how.group && next + n <= want.len(), "{n} minibatches at {next}, {how:?}");
                let parts = &want[next..next + n];
                assert_eq!(contents([&f.batch]), contents(parts.iter().map(|(b, _)| b)), "at {next}, {how:?}");
                let last = &parts[n - 1].0;
                assert_eq!((f.batch.end_of_sweep, f.batch.end_of_run), (last.end_of_sweep, last.end_of_run));
                assert!(n == 1 || f.batch.bptt.is_none(), "a BPTT minibatch shares a batch");
                assert_eq!(f.batch.bptt, last.bptt, "the BPTT layout of minibatch {next}");
                for (p, (b, state)) in f.parts.iter().zip(parts) {
                    assert_eq!(
                        (p.sequences, p.end_of_sweep, p.end_of_run),
                        (b.num_sequences(), b.end_of_sweep, b.end_of_run)
                    );
                    assert_eq!(&p.state, state, "the checkpoint after minibatch {next}");
                }
                next += n;
                if next % 2 == 0 {
                    feed.recycle(f.batch);
                }
            }
            Ok(None) => break None,
            Err(e) => break Some(e.to_string()),
        }
    };
    assert_eq!((next, &fed_error), (want.len(), &error), "{how:?}");

    // A checkpoint taken after any minibatch resumes with the minibatches after it: where every chunk's
    // sample count is the sum of its sequences' (a checkpoint is a sample position, and a CBF file whose
    // chunk table says otherwise, which CNTK reads and `cntkio validate` reports, has no consistent ones).
    let consistent = reader.chunks().iter().enumerate().all(|(k, c)| {
        let mut seqs = Vec::new();
        reader.sequences(k as u32, &mut seqs).is_ok()
            && seqs.iter().map(|s| u64::from(s.num_samples)).sum::<u64>() == c.num_samples
    });
    if consistent && !want.is_empty() {
        let m = (usize::from(b1) * 31 + usize::from(b2)) % want.len();
        let mut resumed = source(seed, 2).expect("the same configuration");
        resumed.restore(&want[m].1).expect("a source restores its own checkpoint");
        let rest = outline(minibatches(&mut resumed, size));
        assert!(rest == outline((want[m + 1..].to_vec(), error.clone())), "resumed after minibatch {m}");
    }

    // Epochs of a loader: one sweep each, the chunks kept from one to the next.
    let keep = ChunkKeep::new();
    for epoch in 0..2 {
        let Ok(mut plain) = source(seed + epoch, 1) else { return };
        let want = outline(minibatches(&mut plain, size));
        let mut kept = source(seed + epoch, 1).expect("the same configuration");
        kept.keep_chunks(keep.clone());
        let got = outline(minibatches(&mut kept, size));
        assert!(got == want, "epoch {epoch} over kept chunks differs");
        drop(kept);
        assert!(keep.bytes() <= keep.peak(), "the keep holds more than a source held at once");
    }
}

/// Every chunk of an Parquet or Arrow IPC file, read in the order `order` gives: its data and its sequences,
/// or the kind of the error, chunk by chunk.
fn read_arrow_chunks(file: &ArrowFile, order: impl Iterator<Item = usize>) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = order
        .map(|k| {
            let data = file.read_chunk(k).map_err(|e| format!("{:?}", e.kind()));
            let mut seqs = Vec::new();
            let seqs = file.read_sequences(k, &mut seqs).map(|()| seqs).map_err(|e| format!("{:?}", e.kind()));
            if let Ok(d) = &data {
                assert!(sparse_indices_in_range(d), "chunk {k}: a sparse index out of range was decoded");
            }
            (k, format!("{data:?} {seqs:?}"))
        })
        .collect();
    out.sort_by_key(|(k, _)| *k);
    out
}

/// `arrow_read`: arbitrary bytes as a Parquet or Arrow IPC file in cntkio's mapping (told apart by their
/// magic). Opening and reading it never panics outside the decoders' guard (a panic inside those other
/// crates becomes an error naming the file); each chunk reads the same front to back and back to front;
/// what a chunk decodes keeps its sparse indices in range; and the file opens as a deserializer exactly
/// when its chunks' sequences all read.
pub fn arrow_read(data: &[u8]) {
    let (_dir, path) = temp_file("data.bin", data);
    let Ok(file) = ArrowFile::open(&path) else { return };
    let n = file.chunk_count();
    let forward = read_arrow_chunks(&file, 0..n);
    let backward = read_arrow_chunks(&file, (0..n).rev());
    assert_eq!(forward, backward, "chunks read in another order differ");
    let all_sequences = (0..n).all(|k| file.read_sequences(k, &mut Vec::new()).is_ok());
    if let (Ok(_), false) = (ArrowSource::open(&path), all_sequences) {
        panic!("the file opens as a deserializer although a chunk's sequences do not read");
    }
}
