//! Conversions: CTF → CBF (what CNTK's `ctf2bin.py` does, with the CTF reader's exact values) and
//! CBF → CTF. Outputs are written to a temporary file in the target folder and renamed when complete.

use crate::cbf::sink::Sink;
use crate::cbf::{CbfFile, CbfOptions, CbfWriter, CbfWriterOptions};
use crate::compress::OutputCompression;
use crate::ctf::{scan_file_owned, ScanOptions};
use crate::input::{Access, InputFile};
use crate::{ChunkData, CtfOptions, Error, ErrorKind, Schema};
use cntkio_core::ctf::write::CtfWriter;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

pub use crate::conversion::{Conversion, Target};

/// The input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CNTK Text Format.
    Ctf,
    /// CNTK Binary Format.
    Cbf,
    /// Apache Parquet, in cntkio's [Arrow mapping](crate::arrow).
    Parquet,
    /// The Arrow IPC file format, in cntkio's [Arrow mapping](crate::arrow).
    ArrowIpc,
}

impl Format {
    /// `ctf`, `cbf`, `parquet` or `arrow`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Ctf => "ctf",
            Format::Cbf => "cbf",
            Format::Parquet => "parquet",
            Format::ArrowIpc => "arrow",
        }
    }

    /// `CTF`, `CBF`, `Parquet` or `Arrow IPC`, for messages.
    pub fn title(self) -> &'static str {
        match self {
            Format::Ctf => "CTF",
            Format::Cbf => "CBF",
            Format::Parquet => "Parquet",
            Format::ArrowIpc => "Arrow IPC",
        }
    }
}

/// Tells the formats apart by their magic bytes, not by the file's name: CBF's magic in the first 8
/// bytes, `PAR1` at both ends (Parquet), `ARROW1` at both ends (Arrow IPC); any other file is CTF.
pub fn detect_format(path: &Path) -> Result<Format, Error> {
    let f = InputFile::open(path, Access::Read)?;
    let mut head = [0u8; 8];
    let n = f.read_some(0, &mut head)?;
    if n == 8 && u64::from_le_bytes(head) == cntkio_core::cbf::MAGIC {
        return Ok(Format::Cbf);
    }
    Ok(crate::arrow::detect(&f, &head[..n])?.unwrap_or(Format::Ctf))
}

/// Writing the output over the input would destroy it (the input is read while the output is written).
pub(crate) fn refuse_same_file(input: &Path, output: &Path) -> Result<(), Error> {
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        if a == b {
            let output = output.display().to_string();
            return Err(Error::option_value("output", output, "is the input file; writing it would destroy the input"));
        }
    }
    Ok(())
}

/// What a conversion did.
#[derive(Debug, Clone, Default)]
pub struct ConvertSummary {
    /// Sequences written.
    pub sequences: u64,
    /// Declared samples written.
    pub samples: u64,
    /// Chunks written (CBF output).
    pub chunks: u64,
    /// Sequences left out (empty streams, with the drop option).
    pub dropped_sequences: u64,
    /// Errors tolerated by `maxErrors` while reading CTF.
    pub tolerated_errors: u64,
    /// Bytes written.
    pub bytes_written: u64,
}

/// The CTF chunk size used while converting: the CBF writer regroups sequences by its own chunk size, so
/// reading in smaller pieces only bounds the memory in flight. It never changes the data.
pub(crate) const CONVERT_READ_CHUNK: u64 = 2 << 20;

/// How many bytes of CTF text the writer of a CBF → CTF conversion may hold on their way to the disk.
const CTF_OUT_PIECE: u64 = 8 << 20;

/// How a CTF → CBF conversion reads and writes.
#[derive(Debug, Clone)]
pub struct CtfToCbf {
    /// The CTF deserializer's options (`maxErrors`, `skipSequenceIds`, …).
    pub ctf: CtfOptions,
    /// The CBF writer's options (`chunk_size` is the CBF chunk size).
    pub writer: CbfWriterOptions,
    /// Parallelism and error handling of the read.
    pub scan: ScanOptions,
    /// File access.
    pub access: Access,
    /// Callbacks.
    pub hooks: Hooks,
}

/// Callbacks of a conversion, for a front end (plain functions, so that the hooks are `Copy` and `Debug`
/// and the options need no lifetime).
#[derive(Debug, Clone, Copy, Default)]
pub struct Hooks {
    /// Called with the path of the temporary output file right before it is created (again with the next
    /// name tried if that name is taken), before anything is read: for a caller that must be able to
    /// remove it when the process dies (say from a signal handler; removing a noted file that does not
    /// exist yet is harmless, as the process then ends before making it). The file is renamed over the
    /// output at the end, or removed when the conversion fails.
    pub on_temporary_file: Option<fn(&Path)>,
    /// Asked between chunks (every few milliseconds) whether to stop: `true` ends the conversion with the
    /// [`interrupted`](crate::interrupted) error, the temporary output removed and the target untouched
    /// (say when the user pressed Ctrl-C in a host that handles signals itself, such as Python).
    pub cancel: Option<fn() -> bool>,
}

/// Converts a CTF file to CBF. The values written are exactly those the CTF reader delivers; CBF streams
/// carry the stream names; sparse entries keep file order; each sequence's meta count is its declared
/// length. Memory stays bounded by a few chunks whatever the input size.
pub fn ctf_to_cbf(
    input: &Path,
    output: &Path,
    schema: &Schema,
    how: &CtfToCbf,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    refuse_same_file(input, output)?;
    let file = InputFile::open(input, how.access)?;
    let mut w = CbfWriter::with_hooks(output, schema, how.writer, how.hooks)?;
    let read_opts = CtfOptions { chunk_size: how.ctf.chunk_size.min(CONVERT_READ_CHUNK), ..how.ctf.clone() };
    let mut summary = ConvertSummary::default();
    let mut scan = |hand: &mut dyn FnMut(ChunkData) -> Result<Option<ChunkData>, Error>| {
        scan_file_owned(
            &file,
            schema,
            &read_opts,
            &how.scan,
            |p| {
                crate::check_cancel(how.hooks.cancel)?;
                summary.tolerated_errors += p.num_errors;
                summary.dropped_sequences += p.num_dropped;
                Ok((ControlFlow::Continue(()), hand(p.data)?))
            },
            progress,
        )
    };
    let w = if how.scan.threads > 1 {
        // The calling thread indexes and writes while the parsers work; parsed chunks the writer is done
        // with go back to them.
        scan(&mut |d| {
            w.write_parsed(d)?;
            Ok(w.take_spare())
        })?;
        w
    } else {
        // One parser, the calling thread: the writer checks and encodes on a thread of its own, so the
        // parse does nothing else. A writer's error concerns data before any the scan could have failed
        // on, so it comes first.
        let (tx, rx) = crossbeam_channel::bounded::<ChunkData>(2);
        let (spare_tx, spare_rx) = crossbeam_channel::unbounded::<ChunkData>();
        let (scanned, written) = std::thread::scope(|sc| {
            let writer = std::thread::Builder::new().name("cntkio-cbf-encode".into()).spawn_scoped(
                sc,
                move || -> Result<CbfWriter, Error> {
                    for d in rx {
                        w.write_parsed(d)?;
                        if let Some(spare) = w.take_spare() {
                            let _ = spare_tx.send(spare);
                        }
                    }
                    Ok(w)
                },
            );
            let writer = match writer {
                Ok(h) => h,
                Err(e) => return (Ok(Default::default()), Err(Error::io("start the CBF writer thread", e))),
            };
            let scanned = scan(&mut |d| {
                tx.send(d).map_err(|_| Error::internal("the CBF writer stopped without an error"))?;
                Ok(spare_rx.try_recv().ok())
            });
            drop(tx);
            let written = writer.join().unwrap_or_else(|_| Err(Error::internal("the CBF writer thread panicked")));
            (scanned, written)
        });
        let w = written?;
        scanned?;
        w
    };
    finish_cbf(w, input, summary)
}

/// Finishes a CBF output: `summary` completed with what the writer wrote. Errors: no sequence was
/// written ([`ErrorKind::NoSequences`], with the input's path), the writer's.
pub(crate) fn finish_cbf(w: CbfWriter, input: &Path, mut summary: ConvertSummary) -> Result<ConvertSummary, Error> {
    if w.sequences_written() == 0 {
        return Err(Error::new(ErrorKind::NoSequences).with_path(input.display().to_string()));
    }
    let s = w.finish()?;
    summary.sequences = s.sequences;
    summary.samples = s.samples;
    summary.chunks = s.chunks;
    summary.dropped_sequences += s.dropped_sequences;
    summary.bytes_written = s.bytes;
    Ok(summary)
}

/// About how many values each thread of a CBF → CTF conversion turns into text at a time (a few MB).
const TEXT_PART_VALUES: u64 = 1 << 19;

/// `data`'s sequences cut into consecutive ranges of about `values` values each (a sequence is never
/// cut; a range holds at least one).
fn parts(data: &ChunkData, values: u64) -> Vec<std::ops::Range<usize>> {
    let n = data.num_sequences();
    let mut out = Vec::new();
    let (mut from, mut acc) = (0, 0u64);
    for s in 0..n {
        acc += data.streams.iter().map(|d| sequence_values(d, s)).sum::<u64>().max(1);
        if acc >= values || s + 1 == n {
            out.push(from..s + 1);
            from = s + 1;
            acc = 0;
        }
    }
    out
}

/// How many values sequence `s` of a stream holds (0 if its offsets are inconsistent: the writer then
/// reports them).
fn sequence_values(d: &crate::StreamData, s: usize) -> u64 {
    let (Some(&a), Some(&b)) = (d.sequence_offsets.get(s), d.sequence_offsets.get(s + 1)) else { return 0 };
    match &d.layout {
        crate::Layout::Dense => b.saturating_sub(a).saturating_mul(d.dim as u64),
        crate::Layout::Sparse { sample_offsets, .. } => {
            let at = |k: u64| usize::try_from(k).ok().and_then(|k| sample_offsets.get(k).copied());
            match (at(a), at(b)) {
                (Some(x), Some(y)) => y.saturating_sub(x),
                _ => 0,
            }
        }
    }
}

/// How a CBF → CTF conversion reads and writes.
#[derive(Debug, Clone, Default)]
pub struct CbfToCtf {
    /// How the CBF file is opened.
    pub cbf: CbfOptions,
    /// `(stream name, alias)` pairs: each stream is written as `|alias`, else `|name`.
    pub aliases: Vec<(String, String)>,
    /// Threads turning chunks into text (0: one per core).
    pub threads: usize,
    /// Callbacks.
    pub hooks: Hooks,
}

/// Converts a CBF file to CTF text that CNTK's CTF reader reads as the same data. Each stream is written
/// as `|alias` with the alias given for its name, else its name; every value is written so that CNTK's
/// parser gives back its bits. Chunks become text on `threads` threads, in parts of a few MB written in
/// order; memory holds about two decoded chunks and a few parts per thread.
pub fn cbf_to_ctf(
    input: &Path,
    output: &Path,
    how: &CbfToCtf,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    refuse_same_file(input, output)?;
    let cbf = CbfFile::open_with(input, &how.cbf)?;
    let schema = with_aliases(cbf.schema()?, &how.aliases)?;
    let source = ChunkSource {
        count: cbf.chunk_count(),
        read: &mut |k| cbf.read_chunk(k),
        end_of: &|k| cbf.chunks().get(k + 1).map_or(0, |c| c.offset),
    };
    chunks_to_ctf(output, &schema, source, how.threads, how.hooks, progress)
}

/// `schema` with each stream named in `aliases` (`(name, alias)` pairs) given that alias.
pub(crate) fn with_aliases(schema: Schema, aliases: &[(String, String)]) -> Result<Schema, Error> {
    let mut streams = schema.streams().to_vec();
    for s in &mut streams {
        if let Some((_, a)) = aliases.iter().find(|(n, _)| *n == s.name) {
            s.alias = a.clone();
        }
    }
    Schema::new(streams)
}

/// Chunks read one after another, in order: how many, how to read chunk `k`, and the input's byte
/// offset where chunk `k` ends (for the progress bar).
pub(crate) struct ChunkSource<'a> {
    pub(crate) count: usize,
    pub(crate) read: &'a mut dyn FnMut(usize) -> Result<ChunkData, Error>,
    pub(crate) end_of: &'a dyn Fn(usize) -> u64,
}

/// Writes the chunks of `source` as CTF text (see [`cbf_to_ctf`]).
pub(crate) fn chunks_to_ctf(
    output: &Path,
    schema: &Schema,
    source: ChunkSource<'_>,
    threads: usize,
    hooks: Hooks,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    let ChunkSource { count, read, end_of } = source;
    let mut out = ByteOutput::create(output, hooks)?;
    let threads = crate::threads_or_cores(Some(threads));
    let mut summary = ConvertSummary::default();
    // Compressed output: each part's text is compressed as frames of its own.
    let packing = out.packing;
    // A part of a chunk (a range of its sequences, about `TEXT_PART_VALUES` values) as text. Each part
    // gets a writer of its own: CBF keys are sequence positions, so neighbouring parts never repeat one.
    type Part = (Arc<ChunkData>, std::ops::Range<usize>);
    let text_of = |(data, seqs): &Part, mut text: Vec<u8>| -> Result<Vec<u8>, Error> {
        text.clear();
        CtfWriter::new(schema).write_sequences(data, seqs.clone(), &mut text)?;
        Ok(text)
    };
    // Parts travel with their number in file order and the chunk they end, if they end one.
    std::thread::scope(|sc| -> Result<(), Error> {
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<(usize, Part, Option<usize>)>();
        type Packed = Result<(Vec<u8>, Vec<(u32, u32)>), Error>;
        let (res_tx, res_rx) = crossbeam_channel::unbounded::<(usize, Packed, Option<usize>)>();
        // Text buffers written out, for the threads to fill again.
        let (spare_tx, spare_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
        let mut started = 0;
        for _ in 0..threads {
            let (job_rx, res_tx, spare_rx, text_of) = (job_rx.clone(), res_tx.clone(), spare_rx.clone(), &text_of);
            let worker = move || {
                // The text of a part, when it is compressed into the buffer that goes out.
                let mut scratch = Vec::new();
                for (i, part, ends) in job_rx {
                    let mut out = spare_rx.try_recv().unwrap_or_default();
                    let packed = match packing {
                        None => text_of(&part, out).map(|text| (text, Vec::new())),
                        Some(c) => text_of(&part, std::mem::take(&mut scratch)).and_then(|text| {
                            out.clear();
                            let mut sizes = Vec::new();
                            let r = c.compress(&text, &mut out, &mut sizes);
                            scratch = text;
                            r.map(|()| (out, sizes))
                        }),
                    };
                    drop(part);
                    if res_tx.send((i, packed, ends)).is_err() {
                        break;
                    }
                }
            };
            // If some threads cannot be started, the others do the work.
            match std::thread::Builder::new().name("cntkio-ctf-text".into()).spawn_scoped(sc, worker) {
                Ok(_) => started += 1,
                Err(e) if started == 0 => return Err(Error::io("start a thread", e)),
                Err(_) => break,
            }
        }
        drop(res_tx);
        let stopped = || Error::internal("the text threads stopped");
        // Parts are handed out in file order and written in that order; at most `2 × started` are out
        // (being turned into text, or waiting for those before them).
        let limit = 2 * started;
        let mut chunks = 0..count;
        // The parts of the chunk being handed out.
        let mut queue = std::collections::VecDeque::new();
        let mut pending = std::collections::BTreeMap::new();
        let (mut sent, mut done) = (0usize, 0usize);
        // A chunk that could not be read: its error comes once the parts before it are written (an error
        // of theirs comes first, as it would one chunk at a time).
        let mut failed = None;
        loop {
            while sent - done < limit && failed.is_none() {
                if queue.is_empty() {
                    let Some(k) = chunks.next() else { break };
                    crate::check_cancel(hooks.cancel)?;
                    let data = match read(k) {
                        Ok(d) => Arc::new(d),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    };
                    summary.sequences += data.num_sequences() as u64;
                    summary.samples += data.num_samples.iter().map(u64::from).sum::<u64>();
                    let parts = parts(&data, TEXT_PART_VALUES);
                    if parts.is_empty() {
                        summary.chunks += 1;
                        continue;
                    }
                    let last = parts.len() - 1;
                    queue.extend(
                        parts
                            .into_iter()
                            .enumerate()
                            .map(|(j, seqs)| ((Arc::clone(&data), seqs), (j == last).then_some(k))),
                    );
                }
                let Some((part, ends)) = queue.pop_front() else { break };
                job_tx.send((sent, part, ends)).map_err(|_| stopped())?;
                sent += 1;
            }
            if done == sent {
                break;
            }
            let (i, r, ends) = res_rx.recv().map_err(|_| stopped())?;
            pending.insert(i, (r, ends));
            while let Some((r, ends)) = pending.remove(&done) {
                let (text, sizes) = r?;
                out.put(&text, &sizes)?;
                done += 1;
                if let Some(k) = ends {
                    summary.chunks += 1;
                    progress(end_of(k));
                }
                let _ = spare_tx.send(text);
            }
        }
        failed.map_or(Ok(()), Err)
    })?;
    summary.bytes_written = out.finish()?;
    Ok(summary)
}

/// Bytes written to a path through a temporary file beside it, renamed over the path when finished: as
/// they are, or as frames compressed by the caller (on its threads, with [`OutputCompression::compress`])
/// when the path's name asks for compression, the frames' sizes then making the file's end.
struct ByteOutput<'a> {
    path: &'a Path,
    tmp: tempfile::NamedTempFile,
    target: crate::output::Target,
    sink: Sink,
    /// How the bytes put are compressed, told by the path's name.
    packing: Option<OutputCompression>,
    frames: Vec<(u32, u32)>,
    /// Asked between the parts of an upload to an object store.
    cancel: Option<fn() -> bool>,
}

impl<'a> ByteOutput<'a> {
    fn create(path: &'a Path, hooks: Hooks) -> Result<ByteOutput<'a>, Error> {
        let tmp = crate::output::temporary_noted(path, hooks.on_temporary_file)?;
        let target = crate::output::Target::new(path, tmp.as_file());
        // Written as the CBF writer writes: direct I/O from a background thread where the file system
        // allows it (through the page cache, writing a GB cost several seconds of system time).
        let sink = Sink::new(tmp.as_file(), tmp.path(), true, CTF_OUT_PIECE).map_err(|e| target.error(e))?;
        let packing = OutputCompression::from_path(path);
        Ok(ByteOutput { path, tmp, target, sink, packing, frames: Vec::new(), cancel: hooks.cancel })
    }

    /// Writes `bytes`: compressed frames of `sizes` (compressed, data) when the output is compressed.
    fn put(&mut self, bytes: &[u8], sizes: &[(u32, u32)]) -> Result<(), Error> {
        self.sink.put(bytes).map_err(|e| self.target.error(e))?;
        self.frames.extend_from_slice(sizes);
        Ok(())
    }

    /// Ends the file (a compressed one with its trailer), renames it over the path; the bytes written.
    fn finish(mut self) -> Result<u64, Error> {
        if let Some(c) = self.packing {
            let trailer = c.trailer(&self.frames)?;
            self.put(&trailer, &[])?;
        }
        let io = |e| self.target.error(e);
        let len = self.sink.finish().map_err(io)?;
        self.tmp.as_file().set_len(len).map_err(io)?;
        crate::output::persist(self.tmp, self.path, self.cancel)?;
        Ok(len)
    }
}

/// The pieces of input that [`recompress`] compresses at a time, one per thread.
const RECOMPRESS_PIECE: usize = 4 << 20;

/// Rewrites `input` (plain, or compressed in any form cntkio reads) compressed as the name of `output`
/// says: seekable zstd (`.zst`) or BGZF (`.gz`), whose byte ranges are read directly, on `threads`
/// threads (0: every core). The bytes are copied as they are, whatever the format (CTF or CBF). The output
/// is written to a temporary file and renamed. `progress` receives the input bytes done.
pub fn recompress(
    input: &Path,
    output: &Path,
    threads: usize,
    hooks: Hooks,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    use rayon::prelude::*;
    refuse_same_file(input, output)?;
    let Some(packing) = OutputCompression::from_path(output) else {
        return Err(Error::option_value(
            "OUTPUT",
            output.display().to_string(),
            "must end in .zst (seekable zstd) or .gz (BGZF)",
        ));
    };
    let file = InputFile::open(input, Access::Read)?;
    file.read_in_order();
    let len = file.len();
    let mut out = ByteOutput::create(output, hooks)?;
    let threads = crate::threads_or_cores(Some(threads));
    let mut pieces: Vec<Piece> = Vec::new();
    let mut pos = 0u64;
    while pos < len {
        crate::check_cancel(hooks.cancel)?;
        let mut n = 0;
        while n < threads && pos < len {
            if pieces.len() == n {
                pieces.push(Piece { data: vec![0; RECOMPRESS_PIECE], ..Piece::default() });
            }
            let p = &mut pieces[n];
            p.used = (len - pos).min(RECOMPRESS_PIECE as u64) as usize;
            file.read_exact(pos, &mut p.data[..p.used])?;
            pos += p.used as u64;
            n += 1;
        }
        pieces[..n].par_iter_mut().try_for_each(|p| {
            p.packed.clear();
            p.sizes.clear();
            packing.compress(&p.data[..p.used], &mut p.packed, &mut p.sizes)
        })?;
        for p in &pieces[..n] {
            out.put(&p.packed, &p.sizes)?;
        }
        // In bytes of the file as stored (compressed), as a progress bar over its size counts.
        progress((u128::from(pos) * u128::from(file.stored_len()) / u128::from(len.max(1))) as u64);
    }
    Ok(ConvertSummary { bytes_written: out.finish()?, ..ConvertSummary::default() })
}

/// A piece of [`recompress`]'s input: its bytes (`used` of them), compressed, and its frames' sizes.
#[derive(Default)]
struct Piece {
    data: Vec<u8>,
    used: usize,
    packed: Vec<u8>,
    sizes: Vec<(u32, u32)>,
}
