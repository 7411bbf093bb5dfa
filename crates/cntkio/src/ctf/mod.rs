//! Reading CTF files: the index (streaming or whole, cached on request), chunk parsing, and an ordered
//! parallel pass over all chunks with CNTK's `maxErrors` budget.

pub mod cache;
pub mod index;
mod infer;
pub mod parse;
pub mod scan;

pub use cntkio_core::ctf::index::{ChunkDesc, IndexMode};
pub use cntkio_core::ctf::SequenceDesc;
use index::index_streaming_bytes;
pub use index::{build_index, index_streaming, CtfIndex, IndexConfig};
pub(crate) use infer::survey;
pub use infer::{infer_schema, suggest_schema};
pub(crate) use parse::{parse_chunk, parse_chunk_bytes};
pub use parse::{ParsePolicy, ParsedChunk};
pub(crate) use scan::scan_file_owned;
pub use scan::{scan_file, ScanOptions, ScanSummary};

use crate::input::{Access, InputFile};
use crate::randomize::{ChunkInfo, SequenceInfo, SequenceSource};
use crate::{CtfOptions, Error, Schema};
use cntkio_core::ctf::parse::CtfParser;
use cntkio_core::{ChunkData, ErrorKind};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The index configuration implied by a schema and options.
pub fn index_config(schema: &Schema, opts: &CtfOptions) -> IndexConfig {
    IndexConfig {
        skip_sequence_ids: opts.skip_sequence_ids,
        main_alias: schema.main_stream().map(|i| schema.streams()[i].alias.clone()),
        chunk_size: opts.chunk_size,
    }
}

/// A CTF file opened for random access by chunk: indexed (or loaded from its index cache) at open.
///
/// Memory does not grow with the number of sequences beyond [`SEQUENCE_TABLES_BUDGET`]: the index keeps
/// every chunk's sequences (24 bytes each) while they fit in it, and past it only each chunk's range,
/// counts and first line; a chunk's sequences are then found again in its bytes when they are needed
/// (when the chunk enters the randomization window, and when it is loaded), exactly as the index found
/// them.
#[derive(Debug)]
pub struct CtfReader {
    file: InputFile,
    parser: CtfParser,
    options: CtfOptions,
    /// The index; without its chunks' sequences when `compact`.
    index: CtfIndex,
    compact: bool,
    main_alias: Option<String>,
    budget: Mutex<Budget>,
    kept: Mutex<HashMap<u32, Arc<ChunkData>>>,
    chunk_infos: Vec<ChunkInfo>,
}

/// The bytes of per-sequence index entries a [`CtfReader`] keeps at most; beyond, it keeps none.
pub const SEQUENCE_TABLES_BUDGET: usize = 64 << 20;

/// The `maxErrors` budget of a reader: each chunk's errors count once, the first time it loads.
#[derive(Debug, Default)]
struct Budget {
    used: u64,
    counted: Vec<bool>,
    /// The chunks whose errors ran the budget out, and the error they gave: loaded again, they give it
    /// again (their parse stopped there, so what it holds is not the chunk).
    exceeded: HashMap<u32, Error>,
}

impl CtfReader {
    /// Opens and indexes `path` (using and refreshing the index cache if `options.cache_index`).
    pub fn open(path: impl AsRef<Path>, schema: &Schema, options: &CtfOptions) -> Result<CtfReader, Error> {
        Self::open_with(path.as_ref(), schema, options, Access::Read, rayon::current_num_threads())
    }

    /// Opens with a chosen file access and number of indexing threads.
    pub fn open_with(
        path: &Path,
        schema: &Schema,
        options: &CtfOptions,
        access: Access,
        threads: usize,
    ) -> Result<CtfReader, Error> {
        Self::open_with_budget(path, schema, options, access, threads, SEQUENCE_TABLES_BUDGET)
    }

    /// [`open_with`](Self::open_with), keeping per-sequence index entries while they take at most
    /// `budget` bytes.
    pub(crate) fn open_with_budget(
        path: &Path,
        schema: &Schema,
        options: &CtfOptions,
        access: Access,
        threads: usize,
        budget: usize,
    ) -> Result<CtfReader, Error> {
        let file = InputFile::open(path, access)?;
        let cfg = index_config(schema, options);
        let most = budget / std::mem::size_of::<SequenceDesc>();
        let mut chunk_infos = Vec::new();
        let mut kept = 0usize;
        let mut compact = false;
        let mut add = |chunks: &mut Vec<ChunkDesc>, mut c: ChunkDesc| {
            chunk_infos.push(ChunkInfo { num_samples: c.num_samples, num_sequences: c.sequences.len() as u32 });
            kept = kept.saturating_add(c.sequences.len());
            if !compact && kept > most {
                compact = true;
                chunks.iter_mut().for_each(|c| c.sequences = Vec::new());
            }
            if compact {
                c.sequences = Vec::new();
            }
            chunks.push(c);
        };
        let mut chunks = Vec::new();
        let on_chunk = |c, _: Option<&[u8]>| {
            add(&mut chunks, c);
            Ok(())
        };
        let mode = if options.cache_index {
            cache::index_cached(&file, &cfg, threads, false, on_chunk, &mut |_| {})?
        } else {
            index_streaming_bytes(&file, &cfg, threads, false, on_chunk, &mut |_| {})
        };
        let index = mode.map(|mode| CtfIndex { mode, chunks: Vec::new(), file_len: file.len() });
        let mut index = index.map_err(|e| locate_index_error(e, &file))?;
        index.chunks = chunks;
        let n = index.chunks.len();
        Ok(CtfReader {
            chunk_infos,
            file,
            parser: CtfParser::new(schema),
            options: options.clone(),
            index,
            compact,
            main_alias: cfg.main_alias,
            budget: Mutex::new(Budget { used: 0, counted: vec![false; n], exceeded: HashMap::new() }),
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// The index. Its chunks' `sequences` are empty when the file has more sequences than the reader
    /// keeps entries for ([`SEQUENCE_TABLES_BUDGET`]): [`chunk_sequences`](Self::chunk_sequences) gives
    /// them either way.
    pub fn index(&self) -> &CtfIndex {
        &self.index
    }

    /// Chunk `i`'s description with its sequences: as the index has it, or with its sequences found again
    /// in the file's bytes (see [`CtfReader`]).
    fn chunk_desc(&self, i: usize) -> Result<ChunkDesc, Error> {
        let desc =
            self.index.chunks.get(i).ok_or_else(|| Error::chunk_out_of_range(i as u64, self.index.chunks.len()))?;
        if !self.compact {
            return Ok(desc.clone());
        }
        let seqs =
            self.with_bytes(desc.offset, desc.len_bytes, &mut Vec::new(), |bytes| self.sequences_in(bytes, desc))??;
        Ok(ChunkDesc { sequences: seqs, ..desc.clone() })
    }

    /// Runs `f` on the `len` bytes of the file at `offset` (a chunk's): borrowed from the map, or read into
    /// `buf`.
    fn with_bytes<R>(&self, offset: u64, len: u64, buf: &mut Vec<u8>, f: impl FnOnce(&[u8]) -> R) -> Result<R, Error> {
        let len = usize::try_from(len).map_err(|_| Error::limit("chunk size in bytes", len, usize::MAX as u64))?;
        self.file.with_bytes(offset, len, buf, f)
    }

    /// The sequences of chunk `desc`, found in its `bytes` (see [`index::chunk_sequences`]).
    fn sequences_in(&self, bytes: &[u8], desc: &ChunkDesc) -> Result<Vec<SequenceDesc>, Error> {
        index::chunk_sequences(bytes, desc, self.index.mode, self.main_alias.as_deref(), self.file.len())
            .map_err(|e| locate_index_error(e, &self.file))
    }

    /// The sequences of chunk `i`, as the index found them.
    pub fn chunk_sequences(&self, i: usize) -> Result<Vec<SequenceDesc>, Error> {
        self.chunk_desc(i).map(|d| d.sequences)
    }
    /// The schema.
    pub fn schema(&self) -> &Schema {
        self.parser.schema()
    }
    /// The options.
    pub fn options(&self) -> &CtfOptions {
        &self.options
    }
    /// The input file.
    pub fn file(&self) -> &InputFile {
        &self.file
    }

    /// Loads and parses chunk `i`. Errors count against `maxErrors` once per chunk (the first time it
    /// is loaded; CNTK counts them again on every reload — a deliberate difference).
    pub fn load_chunk(&self, i: usize) -> Result<Arc<ChunkData>, Error> {
        if let Some(d) = self.kept.lock().expect("lock").get(&(i as u32)) {
            return Ok(d.clone());
        }
        let desc = self
            .index
            .chunks
            .get(i)
            .cloned()
            .ok_or_else(|| Error::chunk_out_of_range(i as u64, self.index.chunks.len()))?;
        let policy = ParsePolicy {
            stop_after: usize::try_from(self.options.max_errors).unwrap_or(usize::MAX).saturating_add(1),
            keep: 1000,
            warnings: false,
            skip_bad_sequences: false,
        };
        // The read buffer of this thread, reused from chunk to chunk (a fresh one costs a page fault per
        // 4 KiB, and its zero-filling); unused when the file is mapped.
        thread_local! {
            static READ_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let p = READ_BUFFER.with(|b| {
            let mut buf = b.take();
            let data = ChunkData::new(self.schema());
            let r = if self.compact {
                // The chunk's sequences found in the bytes the parser reads.
                let path = self.file.path().display().to_string();
                let (offset, len) = (desc.offset, desc.len_bytes);
                self.with_bytes(offset, len, &mut buf, |bytes| {
                    let desc = ChunkDesc { sequences: self.sequences_in(bytes, &desc)?, ..desc };
                    Ok(parse_chunk_bytes(bytes, &path, &self.parser, desc, policy, data))
                })
                .and_then(|r| r)
            } else {
                parse_chunk(&self.file, &self.parser, desc, policy, &mut buf, data)
            };
            b.replace(buf);
            r
        })?;
        {
            let mut b = self.budget.lock().expect("lock");
            if let Some(e) = b.exceeded.get(&(i as u32)) {
                return Err(e.clone());
            }
            if !b.counted[i] {
                b.counted[i] = true;
                if let Err(e) = apply_budget(&mut b.used, self.options.max_errors, &p) {
                    let e = explain(&self.file, self.schema(), &p.desc, e);
                    b.exceeded.insert(i as u32, e.clone());
                    return Err(e);
                }
            }
        }
        if let Some(f) = p.fatal {
            return Err(explain(&self.file, self.schema(), &p.desc, f));
        }
        let data = Arc::new(p.data);
        if self.options.keep_data_in_memory {
            self.kept.lock().expect("lock").insert(i as u32, data.clone());
        }
        Ok(data)
    }
}

/// `e`, the error chunk `desc` of `file` failed with, or, when no row of the chunk up to the error has an
/// input of `schema` while those rows have inputs the schema lacks, [`ErrorKind::MissingInput`] naming that
/// cause (and holding `e`). Costs one more pass over those rows (at most the first MiB of the chunk when the
/// error has no position), only on failure.
pub(crate) fn explain(file: &InputFile, schema: &Schema, desc: &ChunkDesc, e: Error) -> Error {
    if !matches!(e.kind(), ErrorKind::MaxErrorsReached { .. } | ErrorKind::EmptyStream { .. }) {
        return e;
    }
    let upto = e.position().byte.unwrap_or(desc.offset.saturating_add(1 << 20));
    let rows = desc.sequences.iter().take_while(|s| s.offset <= upto).count();
    let Some(last) = rows.checked_sub(1).map(|i| &desc.sequences[i]) else { return e };
    let Ok(len) = usize::try_from(last.offset - desc.offset + u64::from(last.len_bytes)) else { return e };
    let mut inf = cntkio_core::ctf::infer::Inferrer::new();
    let mut buf = Vec::new();
    let read = file.with_bytes(desc.offset, len, &mut buf, |bytes| {
        infer::add_sequences(&mut inf, bytes, desc.offset, &desc.sequences[..rows], &mut |_| {})
    });
    if read.is_err() {
        return e;
    }
    let streams = schema.streams();
    let found: Vec<String> =
        inf.streams.iter().filter(|s| !streams.iter().any(|t| t.alias == s.alias)).map(|s| s.alias.clone()).collect();
    match streams.iter().find(|s| !inf.streams.iter().any(|t| t.alias == s.alias)) {
        Some(s) if !found.is_empty() => {
            let suggestion = crate::suggest::closest(&s.alias, found.iter().map(String::as_str)).map(str::to_string);
            let pos = e.position().clone();
            let mut err =
                Error::new(ErrorKind::MissingInput { alias: s.alias.clone(), found, suggestion, caused: Box::new(e) });
            *err.position_mut() = pos;
            err
        }
        _ => e,
    }
}

impl SequenceSource for CtfReader {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunk_infos
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        let info = |s: &SequenceDesc| SequenceInfo { num_samples: s.num_samples, key: s.key };
        if self.compact {
            out.extend(self.chunk_desc(chunk as usize)?.sequences.iter().map(info));
            return Ok(());
        }
        let c = self
            .index
            .chunks
            .get(chunk as usize)
            .ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.index.chunks.len()))?;
        out.extend(c.sequences.iter().map(info));
        Ok(())
    }
}

/// Applies CNTK's `maxErrors` budget to a chunk's errors, in order. The error that exceeds it is returned
/// as `MaxErrorsReached`.
pub(crate) fn apply_budget(used: &mut u64, max_errors: u64, p: &ParsedChunk) -> Result<(), Error> {
    for e in p.errors.iter().filter(|e| !matches!(e.kind(), ErrorKind::EmptyStream { .. })) {
        *used += 1;
        if *used > max_errors {
            let pos = e.position().clone();
            let mut err = Error::new(ErrorKind::MaxErrorsReached { max_errors, last: Box::new(e.clone()) });
            *err.position_mut() = pos;
            return Err(err);
        }
    }
    // Errors beyond those kept (only when more than `keep` happened in one chunk).
    let kept = p.errors.iter().filter(|e| !matches!(e.kind(), ErrorKind::EmptyStream { .. })).count() as u64;
    let extra = p.num_errors - kept;
    *used += extra;
    if *used > max_errors {
        return Err(Error::new(ErrorKind::MaxErrorsReached {
            max_errors,
            last: Box::new(Error::new(ErrorKind::ChunkErrors { num_errors: p.num_errors, chunk: p.desc.index.into() })),
        }));
    }
    if let Some(f) = &p.fatal {
        return Err(f.clone());
    }
    Ok(())
}

/// Checks that `path` starts as CTF text does (CTF.md §2.1: after a UTF-8 BOM and whitespace, a sequence id
/// or `|`), without a schema: what a command reports about a file that has no CBF magic when it cannot read
/// it as CTF either.
///
/// Errors: the file cannot be read; it starts with a UTF-16 BOM, or with something else than an id or `|`
/// (`MissingSequenceId`, located at that byte); it is empty.
pub fn check_start(path: &Path) -> Result<(), Error> {
    let file = InputFile::open(path, Access::Read)?;
    index::find_start(&file, false).map(|_| ()).map_err(|e| locate_index_error(e, &file))
}

/// Index-level errors carry a byte offset; give them the file's path, a line and a column too.
pub(crate) fn locate_index_error(mut e: Error, file: &InputFile) -> Error {
    let path = file.path().display().to_string();
    if let Some(b) = e.position().byte {
        // Count lines up to the offset (index errors are rare and fatal, so a scan is fine).
        let mut line = 1u64;
        let mut col = b + 1;
        let mut off = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        while off < b {
            let want = ((b - off) as usize).min(buf.len());
            match file.read_some(off, &mut buf[..want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = &buf[..n];
                    line += memchr::memchr_iter(b'\n', chunk).count() as u64;
                    if let Some(k) = memchr::memrchr(b'\n', chunk) {
                        col = b - (off + k as u64 + 1) + 1;
                    }
                    off += n as u64;
                }
            }
        }
        let p = e.position_mut();
        p.line = Some(line);
        p.column = Some(col);
    }
    e.position_mut().path = Some(path);
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::randomize::Window;
    use crate::source::{MinibatchConfig, MinibatchSource, RunLength};
    use crate::{StorageFormat, StreamSpec};
    use proptest::prelude::*;

    /// Rows of a CTF file in id mode (`ids`) or line mode, with comments, blank lines and errors.
    fn text(rows: &[(u8, u8)], ids: bool, final_newline: bool) -> String {
        let mut t = String::new();
        let mut id = 0u64;
        for &(next, kind) in rows {
            if ids {
                id += u64::from(next % 3 == 0);
                t += &format!("{id} ");
            }
            t += match kind % 8 {
                0 => "|a 1 2 |b 3:1",
                1 => "|a 3 4",
                2 => "|b 0:1 |# comment",
                3 => "|a 5 x |b 1:1",
                4 => "|# only a comment",
                5 => "|a 1 2 |b 9:1",
                6 => "|c 7 |a 1 2 |b 2:2",
                _ => "|a 0 0 |b 0:0",
            };
            t.push('\n');
            if kind % 11 == 10 {
                t.push('\n');
            }
        }
        if !final_newline {
            t.pop();
        }
        t
    }

    /// A chunk of several scan blocks, in id mode with sequences across the blocks' boundaries: found again
    /// as the index found it.
    #[test]
    fn sequences_of_a_chunk_larger_than_a_scan_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.ctf");
        let mut t = String::new();
        for i in 0..1_000_000u64 {
            t += &format!("{} |a {} 2 |b 1:1\n", i / 7, i % 10);
        }
        assert!(t.len() > 2 * index::SCAN_BLOCK);
        std::fs::write(&path, &t).unwrap();
        let schema = Schema::new(vec![
            StreamSpec::new("a", 2, StorageFormat::Dense).defines_mb_size(true),
            StreamSpec::new("b", 4, StorageFormat::Sparse),
        ])
        .unwrap();
        let opts = CtfOptions { chunk_size: 64 << 20, ..CtfOptions::default() };
        let open = |budget| CtfReader::open_with_budget(&path, &schema, &opts, Access::Mmap, 2, budget).unwrap();
        let (full, compact) = (open(usize::MAX), open(0));
        assert_eq!(full.index().chunks.len(), 1);
        assert!(compact.compact && compact.index().chunks[0].sequences.is_empty());
        assert_eq!(compact.chunk_sequences(0).unwrap(), full.index().chunks[0].sequences);
        assert_eq!(compact.load_chunk(0).unwrap(), full.load_chunk(0).unwrap());
    }

    /// The index cache is written as the index is built and read back a chunk at a time, by readers with
    /// and without sequence tables: every chunk the same as without a cache, and so is a validation's
    /// count (the scan's path, which builds or reads the cache too). 40,000 sequences: more records than
    /// are read or written at once.
    #[test]
    fn the_index_cache_is_written_and_read_chunk_by_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.ctf");
        let rows: String = (0..40_000u32).map(|i| format!("{} |a {i} 1\n", i / 2 * 3)).collect();
        std::fs::write(&path, rows).unwrap();
        let schema = Schema::new(vec![StreamSpec::new("a", 2, StorageFormat::Dense)]).unwrap();
        let plain = CtfOptions { chunk_size: 4096, ..CtfOptions::default() };
        let cached = CtfOptions { cache_index: true, ..plain.clone() };
        let cache = cache::cache_path(&path, &index_config(&schema, &cached));
        let want = CtfReader::open(&path, &schema, &plain).unwrap();
        assert!(want.index().chunks.len() > 40 && want.index().num_sequences() == 20_000);
        for (budget, round) in [(usize::MAX, "written"), (usize::MAX, "read"), (0, "read, compact")] {
            let r = CtfReader::open_with_budget(&path, &schema, &cached, Access::Read, 2, budget).unwrap();
            assert!(cache.exists(), "{round}");
            assert_eq!(r.chunks(), want.chunks(), "{round}");
            for k in 0..want.index().chunks.len() {
                assert_eq!(r.chunk_sequences(k).unwrap(), want.index().chunks[k].sequences, "{round}, chunk {k}");
            }
        }
        let count = |opts: &CtfOptions| {
            let (file, vo) = (InputFile::open(&path, Access::Read).unwrap(), Default::default());
            crate::validate::validate_ctf(&file, &schema, opts, &vo, &mut |_| {}, &mut |_| {}).unwrap().sequences
        };
        let want = count(&plain);
        assert_eq!(count(&cached), want, "read from the cache");
        std::fs::remove_file(&cache).unwrap();
        assert_eq!(count(&cached), want, "the cache built and written");
        assert!(cache.exists());
        assert_eq!(count(&cached), want, "read from the cache again");
    }

    /// A file whose only row lacks the definesMBSize stream has no sequence: with or without sequence
    /// tables, the reader opens and the minibatch source refuses it with the same error.
    #[test]
    fn a_file_without_sequences_is_refused_alike_with_or_without_sequence_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.ctf");
        std::fs::write(&path, text(&[(0, 42)], false, true)).unwrap();
        let schema = Schema::new(vec![
            StreamSpec::new("a", 2, StorageFormat::Dense).defines_mb_size(true),
            StreamSpec::new("b", 4, StorageFormat::Sparse),
        ])
        .unwrap();
        let opts = CtfOptions { chunk_size: 16, ..CtfOptions::default() };
        let refused = |budget| {
            let r = CtfReader::open_with_budget(&path, &schema, &opts, Access::Read, 1, budget).unwrap();
            MinibatchSource::new(Arc::new(r), MinibatchConfig::default()).unwrap_err().to_string()
        };
        assert_eq!(refused(usize::MAX), refused(0));
    }

    #[test]
    fn a_chunk_that_ran_the_error_budget_out_fails_every_time_it_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.ctf");
        // Sequences with a bad second row (an error the budget tolerates), in chunks of about one: the fourth
        // error runs maxErrors 3 out.
        let text = (0..8).map(|i| format!("{i} |a 1 2\n{i} .\n")).collect::<String>();
        std::fs::write(&path, text).unwrap();
        let schema = Schema::new(vec![StreamSpec::new("a", 2, StorageFormat::Dense)]).unwrap();
        let opts = CtfOptions { chunk_size: 20, max_errors: 3, ..CtfOptions::default() };
        let r = CtfReader::open(&path, &schema, &opts).unwrap();
        let (k, first) = (0..r.index().chunks.len())
            .find_map(|k| r.load_chunk(k).err().map(|e| (k, e.to_string())))
            .expect("a chunk runs the budget out");
        assert!(first.contains("maxErrors = 3"), "{first}");
        for _ in 0..2 {
            assert_eq!(r.load_chunk(k).unwrap_err().to_string(), first);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A reader that keeps no per-sequence entries finds every chunk's sequences again exactly as the
        /// index did, loads the same chunks, and gives the same randomized minibatches.
        #[test]
        fn a_reader_without_sequence_tables_reads_as_one_with_them(
            rows in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..150),
            ids: bool,
            main: bool,
            final_newline: bool,
            chunk_size in 16u64..400,
            seed in 0u64..4,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f.ctf");
            std::fs::write(&path, text(&rows, ids, final_newline)).unwrap();
            let schema = Schema::new(vec![
                StreamSpec::new("a", 2, StorageFormat::Dense).defines_mb_size(main),
                StreamSpec::new("b", 4, StorageFormat::Sparse),
            ])
            .unwrap();
            let opts = CtfOptions { chunk_size, max_errors: 1000, ..CtfOptions::default() };
            let open = |budget| CtfReader::open_with_budget(&path, &schema, &opts, Access::Read, 1, budget);
            let (full, compact) = match (open(usize::MAX), open(0)) {
                (Ok(f), Ok(c)) => (f, c),
                (Err(a), Err(b)) => {
                    prop_assert_eq!(a.to_string(), b.to_string());
                    return Ok(());
                }
                (a, b) => panic!("one opened, the other did not: {:?} / {:?}", a.err(), b.err()),
            };
            prop_assert!(!full.compact);
            prop_assert!(compact.compact || full.index().chunks.iter().all(|c| c.sequences.is_empty()));
            prop_assert_eq!(full.chunks(), compact.chunks());
            for i in 0..full.index().chunks.len() {
                prop_assert_eq!(&compact.chunk_sequences(i).unwrap(), &full.index().chunks[i].sequences);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                full.sequences(i as u32, &mut a).unwrap();
                compact.sequences(i as u32, &mut b).unwrap();
                prop_assert_eq!(a, b);
                match (full.load_chunk(i), compact.load_chunk(i)) {
                    (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                    (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                    (a, b) => panic!("chunk {i}: {:?} / {:?}", a.map(|_| ()), b.map(|_| ())),
                }
            }
            let batches = |r: CtfReader| {
                let config = MinibatchConfig {
                    randomize: true,
                    window: Window::Chunks(2),
                    seed,
                    run_length: RunLength::Sweeps(2),
                    ..MinibatchConfig::default()
                };
                // A file without any sequence has no minibatch source (EmptyData): the same for both.
                let mut src = match MinibatchSource::new(Arc::new(r), config) {
                    Ok(s) => s,
                    Err(e) => return vec![e.to_string()],
                };
                let mut out = Vec::new();
                loop {
                    match src.next_minibatch(5) {
                        Ok(Some(b)) => out.push(format!("{:?}", b.data)),
                        Ok(None) => return out,
                        Err(e) => {
                            out.push(e.to_string());
                            return out;
                        }
                    }
                }
            };
            // Fresh readers: the maxErrors budget counts each chunk once per reader.
            let (full, compact) = (open(usize::MAX).unwrap(), open(0).unwrap());
            prop_assert_eq!(batches(full), batches(compact));
        }
    }
}
