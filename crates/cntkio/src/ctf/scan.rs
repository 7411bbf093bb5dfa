//! One ordered pass over every chunk of a CTF file: index streaming in the calling thread, chunks parsed
//! on worker threads, results delivered in file order with CNTK's `maxErrors` budget applied.
//! Memory is bounded by the chunks in flight (`2 × threads`), not by the file size.

use super::index::{index_line_chunks, index_streaming_bytes, ChunkBytes};
use super::parse::{parse_bytes, parse_chunk, parse_chunk_bytes, parse_file_chunk, ParsePolicy, ParsedChunk};
use super::{apply_budget, index_config, locate_index_error};
use crate::input::InputFile;
use crate::{CtfOptions, Error, Schema};
use cntkio_core::ctf::index::{ChunkDesc, IndexMode};
use cntkio_core::ctf::parse::CtfParser;
use cntkio_core::{ChunkData, Sizes};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// What receives each chunk of the index, with its bytes when the indexer has them.
type OnChunk<'a> = dyn FnMut(ChunkDesc, Option<ChunkBytes<'_>>) -> Result<(), Error> + 'a;

/// Options of a pass.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Parser threads (1: everything in the calling thread).
    pub threads: usize,
    /// Apply CNTK's `maxErrors` budget and stop at the error that exceeds it (or a fatal one). When
    /// false (validation), every chunk is parsed and delivered with its errors.
    pub enforce_max_errors: bool,
    /// Errors and warnings kept per chunk.
    pub keep: usize,
    /// Collect warnings.
    pub warnings: bool,
    /// Drop sequences with an empty stream instead of failing.
    pub skip_bad_sequences: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions { threads: 1, enforce_max_errors: true, keep: 1000, warnings: false, skip_bad_sequences: false }
    }
}

/// Totals of a pass.
#[derive(Debug, Clone, Default)]
pub struct ScanSummary {
    /// Id or line mode (None if the file could not be indexed).
    pub mode: Option<IndexMode>,
    /// Chunks delivered.
    pub chunks: u64,
    /// Counted errors seen (tolerated ones when the budget is enforced).
    pub errors: u64,
}

/// Reads every chunk of `file` in order and hands each to `consumer`, which may stop the pass.
pub fn scan_file(
    file: &InputFile,
    schema: &Schema,
    opts: &CtfOptions,
    scan: &ScanOptions,
    mut consumer: impl FnMut(&ParsedChunk) -> Result<ControlFlow<()>, Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<ScanSummary, Error> {
    scan_file_owned(
        file,
        schema,
        opts,
        scan,
        |p| {
            let flow = consumer(&p)?;
            Ok((flow, Some(p.data)))
        },
        progress,
    )
}

/// How far back before the last released end a streaming pass releases a mapped file's pages again
/// (see `deliver` in [`scan_file_owned`]).
const RELEASE_OVERLAP: u64 = 4 << 20;

/// [`scan_file`] handing each chunk over: `consumer` keeps what it wants and may give back a
/// [`ChunkData`] whose allocations the parsers reuse (fresh buffers for every chunk cost page faults).
pub(crate) fn scan_file_owned(
    file: &InputFile,
    schema: &Schema,
    opts: &CtfOptions,
    scan: &ScanOptions,
    mut consumer: impl FnMut(ParsedChunk) -> Result<(ControlFlow<()>, Option<ChunkData>), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<ScanSummary, Error> {
    let parser = CtfParser::new(schema);
    let cfg = index_config(schema, opts);
    let policy = ParsePolicy {
        stop_after: if scan.enforce_max_errors {
            usize::try_from(opts.max_errors).unwrap_or(usize::MAX).saturating_add(1)
        } else {
            usize::MAX
        },
        keep: scan.keep,
        warnings: scan.warnings,
        skip_bad_sequences: scan.skip_bad_sequences,
    };
    const STOPPED: &str = "\u{0}cntkio: consumer stopped";
    let is_stop = |e: &Error| matches!(e.kind(), cntkio_core::ErrorKind::Internal { problem } if problem == STOPPED);
    let mut summary = ScanSummary::default();
    let mut used = 0u64;
    let mut released_to = 0u64;
    // Hands a chunk to the consumer and returns its buffers for reuse (fresh allocations of every chunk
    // would cost page faults). Returns Err(stop marker) when the consumer asks to stop.
    let mut deliver = |p: ParsedChunk, summary: &mut ScanSummary| -> Result<Option<ChunkData>, Error> {
        summary.chunks += 1;
        summary.errors += p.num_errors;
        if scan.enforce_max_errors {
            apply_budget(&mut used, opts.max_errors, &p)?;
        }
        let end = p.desc.offset.saturating_add(p.desc.len_bytes);
        let (flow, spare) = consumer(p)?;
        // A mapped file's pages before the end of this chunk are not needed again in this pass (chunks
        // are delivered in order). The range starts a little before the last one's end: a fault may map
        // a whole large folio of the page cache, pages of a chunk already released included, and the page
        // shared by two chunks is only whole once both are done. Zapping page tables that are already
        // empty costs next to nothing.
        let from = released_to.saturating_sub(RELEASE_OVERLAP);
        file.release(from, end.saturating_sub(from));
        released_to = released_to.max(end);
        if flow.is_break() {
            return Err(Error::internal(STOPPED));
        }
        Ok(spare)
    };

    // With `cacheIndex` the index comes from the cache (or is built and written to it as it goes).
    let cached = opts.cache_index;
    let threads = scan.threads.max(1);
    // Each chunk with its bytes when the indexer has them: it keeps them for the parsers, so that the
    // file is read once.
    let for_each_desc = |f: &mut OnChunk<'_>, progress: &mut dyn FnMut(u64)| -> Result<IndexMode, Error> {
        let each = |c, b: Option<&[u8]>| f(c, b.map(ChunkBytes::Borrowed));
        if cached {
            super::cache::index_cached(file, &cfg, 1, true, each, progress)?
        } else {
            index_streaming_bytes(file, &cfg, 1, true, each, progress)
        }
    };
    // Line mode without a definesMBSize stream and without a cached index: chunks are only cut and the
    // parsers find the rows (the index then does no work per row, and no one thread reads every byte
    // before the parsers). Such a chunk comes with no sequences and the first line of the file's first
    // row; the pass moves it to its true first line (see `with_first_line`).
    // `lend` gives vectors to read chunks into when the file is read (see `index_line_chunks`).
    let for_each_row_chunk = |f: &mut OnChunk<'_>,
                              lend: &mut dyn FnMut() -> Vec<u8>,
                              progress: &mut dyn FnMut(u64)|
     -> Result<IndexMode, Error> {
        if !cached {
            if let Some(mode) = index_line_chunks(
                file,
                &cfg,
                Some(lend),
                |c, b| {
                    f(c, Some(b))?;
                    Ok(0)
                },
                progress,
            )? {
                return Ok(mode);
            }
        }
        for_each_desc(f, progress)
    };
    let result = if threads == 1 {
        let mut buf = Vec::new();
        let mut spare = Some(ChunkData::new(schema));
        let mut like = Like::default();
        let path = file.path().display().to_string();
        // Line mode without a definesMBSize stream: the parser finds the rows as it goes, so each byte
        // is read once (the indexer only cuts chunks); other files take the index.
        let lines = match cached {
            true => Ok(None),
            false => index_line_chunks(
                file,
                &cfg,
                None,
                |desc, bytes| {
                    let data = like.room(spare.take(), schema, desc.len_bytes);
                    let p = parse_bytes(bytes.bytes(), &path, &parser, desc, policy, data, true);
                    like.learn(&p);
                    let rows = p.desc.sequences.len() as u64;
                    spare = deliver(p, &mut summary)?;
                    Ok(rows)
                },
                progress,
            ),
        };
        match lines {
            Ok(Some(mode)) => Ok(mode),
            Err(e) => Err(e),
            Ok(None) => for_each_desc(
                &mut |desc, bytes| {
                    let data = like.room(spare.take(), schema, desc.len_bytes);
                    let p = match bytes {
                        Some(b) => parse_chunk_bytes(b.bytes(), &path, &parser, desc, policy, data),
                        None => parse_chunk(file, &parser, desc, policy, &mut buf, data)?,
                    };
                    like.learn(&p);
                    spare = deliver(p, &mut summary)?;
                    Ok(())
                },
                progress,
            ),
        }
    } else {
        let in_flight_max = 2 * threads;
        // A job: a chunk, with its bytes when the indexer read them (in a vector of their own, or a copy
        // of bytes it just scanned, still in cache, which costs less than the parser reading them from
        // the page cache again); parsers of a mapped file borrow the map instead. Parsers give the
        // vectors back for the indexer to read into again.
        let (job_tx, job_rx) = crossbeam_channel::bounded::<(ChunkDesc, Option<Vec<u8>>)>(in_flight_max);
        // Results carry whether the parser found the rows (see `for_each_row_chunk`).
        let (res_tx, res_rx) = crossbeam_channel::unbounded::<(u32, bool, Result<ParsedChunk, Error>)>();
        let (spare_tx, spare_rx) = crossbeam_channel::unbounded::<ChunkData>();
        let (buf_tx, buf_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
        let path = file.path().display().to_string();
        std::thread::scope(|s| {
            // Named threads (`top`, `perf`); if some cannot be started, the others do the work.
            let (mut started, mut failed) = (0usize, None);
            for _ in 0..threads {
                let job_rx = job_rx.clone();
                let res_tx = res_tx.clone();
                let spare_rx = spare_rx.clone();
                let buf_tx = buf_tx.clone();
                let (parser, path) = (&parser, &path);
                let worker = move || {
                    let mut buf = Vec::new();
                    let mut like = Like::default();
                    for (desc, bytes) in job_rx {
                        let idx = desc.index;
                        let data = like.room(spare_rx.try_recv().ok(), schema, desc.len_bytes);
                        // A chunk without sequences is one of `index_line_chunks`: the rows are found here.
                        let rows = desc.sequences.is_empty();
                        let r = match bytes {
                            Some(b) => {
                                let p = parse_bytes(&b, path, parser, desc, policy, data, rows);
                                let _ = buf_tx.send(b);
                                Ok(p)
                            }
                            None => parse_file_chunk(file, parser, desc, policy, &mut buf, data, rows),
                        };
                        if let Ok(p) = &r {
                            like.learn(p);
                        }
                        if res_tx.send((idx, rows, r)).is_err() {
                            break;
                        }
                    }
                };
                match std::thread::Builder::new().name("cntkio-parse".into()).spawn_scoped(s, worker) {
                    Ok(_) => started += 1,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if started == 0 {
                return Err(match failed {
                    Some(e) => Error::io("start a parser thread", e),
                    None => Error::internal("no parser thread was started"),
                });
            }
            drop(buf_tx);
            drop(res_tx);
            let mut pending: BTreeMap<u32, (bool, Result<ParsedChunk, Error>)> = BTreeMap::new();
            let mut next = 0u32;
            let mut in_flight = 0usize;
            // The first line of the next chunk whose rows a parser found (see `for_each_row_chunk`).
            let mut next_line: Option<u64> = None;
            let mut drain = |pending: &mut BTreeMap<u32, (bool, Result<ParsedChunk, Error>)>,
                             next: &mut u32,
                             in_flight: &mut usize,
                             summary: &mut ScanSummary|
             -> Result<(), Error> {
                while let Some((rows, r)) = pending.remove(next) {
                    *next += 1;
                    *in_flight -= 1;
                    let mut p = r?;
                    if rows {
                        p = with_first_line(p, &mut next_line)?;
                    }
                    if let Some(d) = deliver(p, summary)? {
                        let _ = spare_tx.send(d);
                    }
                }
                Ok(())
            };
            let r = for_each_row_chunk(
                &mut |desc, bytes| {
                    while in_flight >= in_flight_max {
                        let (i, rows, r) = res_rx.recv().map_err(|_| Error::internal("a parser thread stopped"))?;
                        pending.insert(i, (rows, r));
                        drain(&mut pending, &mut next, &mut in_flight, &mut summary)?;
                    }
                    let copy = match bytes {
                        Some(ChunkBytes::Owned(v)) => Some(v),
                        Some(ChunkBytes::Borrowed(b)) if !file.is_mapped() => {
                            let mut v = buf_rx.try_recv().unwrap_or_default();
                            v.clear();
                            v.extend_from_slice(b);
                            Some(v)
                        }
                        _ => None,
                    };
                    job_tx.send((desc, copy)).map_err(|_| Error::internal("the parser threads stopped"))?;
                    in_flight += 1;
                    while let Ok((i, rows, r)) = res_rx.try_recv() {
                        pending.insert(i, (rows, r));
                    }
                    drain(&mut pending, &mut next, &mut in_flight, &mut summary)
                },
                &mut || buf_rx.try_recv().unwrap_or_default(),
                progress,
            );
            drop(job_tx);
            let r = r.and_then(|mode| {
                while in_flight > 0 {
                    let (i, rows, r) = res_rx.recv().map_err(|_| Error::internal("a parser thread stopped"))?;
                    pending.insert(i, (rows, r));
                    drain(&mut pending, &mut next, &mut in_flight, &mut summary)?;
                }
                Ok(mode)
            });
            // Let the workers finish what is queued (at most `in_flight_max` chunks) and exit.
            while res_rx.recv().is_ok() {}
            r
        })
    };
    match result {
        Ok(mode) => {
            summary.mode = Some(mode);
            Ok(summary)
        }
        Err(e) if is_stop(&e) => Ok(summary),
        Err(e) => Err(if e.position().line.is_none() && e.position().byte.is_some() {
            locate_index_error(e, file)
        } else {
            e
        }),
    }
}

/// The sizes of the last chunk a parser filled, to make room in the next one at once (see
/// [`ChunkData::reserve_like`]): the first chunks of a pass get fresh vectors (the consumer gives none
/// back yet), and growing them step by step copied them and cost twice the page faults.
#[derive(Default)]
struct Like {
    sizes: Sizes,
    bytes: u64,
}

impl Like {
    /// `spare` as it is (growing a vector given back would copy it and its capacity is usually enough), or
    /// new chunk data with room for a chunk of `bytes` bytes.
    fn room(&self, spare: Option<ChunkData>, schema: &Schema, bytes: u64) -> ChunkData {
        spare.unwrap_or_else(|| {
            let mut d = ChunkData::new(schema);
            if self.bytes > 0 {
                d.reserve_like(&self.sizes.scaled(bytes, self.bytes));
            }
            d
        })
    }
    /// Remembers the sizes of a parsed chunk.
    fn learn(&mut self, p: &ParsedChunk) {
        if p.desc.len_bytes > 0 {
            self.sizes = p.data.sizes();
            self.bytes = p.desc.len_bytes;
        }
    }
}

/// Gives a chunk whose rows a parser found its true first line: the line after the rows of the chunks
/// before it (`next_line`, from the first such chunk's, which is right). The parser counted the lines
/// and keys from the first line of the file's first row, which every such chunk carries: they are moved
/// down, in the chunk's sequences and data and in its errors and warnings (their lines, and the keys
/// they name: a line-mode sequence's key is its line).
fn with_first_line(mut p: ParsedChunk, next_line: &mut Option<u64>) -> Result<ParsedChunk, Error> {
    let line = *next_line.get_or_insert(p.desc.first_line);
    let shift = line.checked_sub(p.desc.first_line).ok_or_else(|| Error::internal("a chunk's rows out of order"))?;
    if shift > 0 {
        p.shift_lines(shift);
    }
    *next_line = Some(line + p.desc.sequences.len() as u64);
    Ok(p)
}
