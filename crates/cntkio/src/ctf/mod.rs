//! Reading CTF files: the index (streaming or whole, cached on request), chunk parsing, and an ordered
//! parallel pass over all chunks with CNTK's `maxErrors` budget.

pub mod cache;
pub mod index;
mod infer;
pub mod parse;
pub mod scan;

pub use cntkio_core::ctf::index::{ChunkDesc, IndexMode};
pub use cntkio_core::ctf::SequenceDesc;
pub use index::{build_index, index_streaming, CtfIndex, IndexConfig};
pub use infer::infer_schema;
pub(crate) use infer::survey;
pub(crate) use parse::parse_chunk;
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
#[derive(Debug)]
pub struct CtfReader {
    file: InputFile,
    parser: CtfParser,
    options: CtfOptions,
    index: CtfIndex,
    budget: Mutex<Budget>,
    kept: Mutex<HashMap<u32, Arc<ChunkData>>>,
    chunk_infos: Vec<ChunkInfo>,
}

#[derive(Debug, Default)]
struct Budget {
    used: u64,
    counted: Vec<bool>,
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
        let file = InputFile::open(path, access)?;
        let cfg = index_config(schema, options);
        let index = if options.cache_index {
            cache::load_or_build(&file, &cfg, threads)?
        } else {
            build_index(&file, &cfg, threads, &mut |_| {})
        }
        .map_err(|e| locate_index_error(e, &file))?;
        let n = index.chunks.len();
        let chunk_infos = index
            .chunks
            .iter()
            .map(|c| ChunkInfo { num_samples: c.num_samples, num_sequences: c.sequences.len() as u32 })
            .collect();
        Ok(CtfReader {
            chunk_infos,
            file,
            parser: CtfParser::new(schema),
            options: options.clone(),
            index,
            budget: Mutex::new(Budget { used: 0, counted: vec![false; n] }),
            kept: Mutex::new(HashMap::new()),
        })
    }

    /// The index.
    pub fn index(&self) -> &CtfIndex {
        &self.index
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
            let r =
                parse_chunk(&self.file, &self.parser, desc.clone(), policy, &mut buf, ChunkData::new(self.schema()));
            b.replace(buf);
            r
        })?;
        {
            let mut b = self.budget.lock().expect("lock");
            if !b.counted[i] {
                b.counted[i] = true;
                apply_budget(&mut b.used, self.options.max_errors, &p)
                    .map_err(|e| explain(&self.file, self.schema(), &desc, e))?;
            }
        }
        if let Some(f) = p.fatal {
            return Err(explain(&self.file, self.schema(), &desc, f));
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
        let c = self
            .index
            .chunks
            .get(chunk as usize)
            .ok_or_else(|| Error::chunk_out_of_range(chunk.into(), self.index.chunks.len()))?;
        out.extend(c.sequences.iter().map(|s| SequenceInfo { num_samples: s.num_samples, key: s.key }));
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
