//! [`CbfWriter`]: sequences in, a CBF file out.

use super::sink::{Records, Segment, Sink};
use crate::output::Target;
use cntkio_core::cbf::check_sequence;
use cntkio_core::cbf::{encode_header, encode_prefix};
use cntkio_core::cbf::{encode_trailer, ChunkEntry, StreamHeader};
use cntkio_core::internal::{
    check_chunk_fast, check_parsed_chunk_fast, encode_checked_record_to, encode_checked_records_to,
};
use cntkio_core::{ChunkData, Error, ErrorKind, Layout, Schema, StorageFormat, StreamData};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How sequences are grouped into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Chunking {
    /// A chunk's encoded size stays at most `chunk_size` bytes (a larger sequence sits alone).
    #[default]
    Exact,
    /// `ctf2bin.py`'s rule, bug included, for byte-identical output (CBF.md §7.5): a running estimate
    /// (`dim·size` per dense sample, `nnz·(size+4)+4` per sparse sample, record headers and meta counts
    /// not counted) grows with each sequence and is never reset; after a sequence is added, the chunk is
    /// closed when the estimate is at least `chunk_size`. So the first chunk is the shortest prefix
    /// reaching `chunk_size` and every later sequence gets its own chunk. An empty input gives one
    /// empty chunk.
    Ctf2binCompatible,
}

/// What each sequence's meta count (CBF.md §2) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MetaCounts {
    /// The sequence's declared length, [`ChunkData::num_samples`].
    #[default]
    Declared,
    /// The largest sample count over the streams (what `ctf2bin.py` writes).
    MaxOverStreams,
}

/// What to do with a sequence that has no sample of some stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EmptyStreams {
    /// Fail with [`ErrorKind::EmptyStream`].
    #[default]
    Refuse,
    /// Leave the sequence out (later sequences' keys shift down: CBF keys are positions).
    Drop,
}

/// Options of a [`CbfWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CbfWriterOptions {
    /// Chunk size in bytes (see [`Chunking`]).
    pub chunk_size: u64,
    /// The chunking rule.
    pub chunking: Chunking,
    /// The meta count rule.
    pub meta_counts: MetaCounts,
    /// The empty-stream rule.
    pub empty_streams: EmptyStreams,
}

impl CbfWriterOptions {
    /// Defaults with this chunk size: exact chunking, declared meta counts, refuse empty streams.
    pub fn new(chunk_size: u64) -> CbfWriterOptions {
        CbfWriterOptions {
            chunk_size,
            chunking: Chunking::Exact,
            meta_counts: MetaCounts::Declared,
            empty_streams: EmptyStreams::Refuse,
        }
    }
    /// `ctf2bin.py`'s chunking and meta counts (for byte-identical output).
    pub fn ctf2bin(chunk_size: u64) -> CbfWriterOptions {
        CbfWriterOptions {
            chunking: Chunking::Ctf2binCompatible,
            meta_counts: MetaCounts::MaxOverStreams,
            ..CbfWriterOptions::new(chunk_size)
        }
    }
}

/// What [`CbfWriter::finish`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CbfSummary {
    /// Chunks written.
    pub chunks: u64,
    /// Sequences written.
    pub sequences: u64,
    /// Sum of the meta counts.
    pub samples: u64,
    /// Sequences left out under [`EmptyStreams::Drop`].
    pub dropped_sequences: u64,
    /// File size in bytes.
    pub bytes: u64,
}

/// Writes a CBF file.
///
/// # What the writer puts on disk
///
/// Format version 1 exactly as CNTK reads it and `ctf2bin.py` writes it (CBF.md §1): prefix, chunks
/// from byte 12 on with no gaps, header, trailer. Within a chunk: one meta count per sequence, then
/// stream after stream (schema order), each sequence's record. Sparse entries are written in the order
/// they have in the [`ChunkData`] (not sorted, unlike `ctf2bin.py`); per-sample counts are the
/// differences of `sample_offsets`. Stream names are the schema's names (not the CTF aliases). Every
/// stream's element type is the schema's; the data written must already be of that type.
///
/// **Meta counts** ([`MetaCounts`]): by default each sequence's declared length,
/// [`ChunkData::num_samples`] — for data parsed from CTF that is what CNTK's CTF reader uses as the
/// sequence length (rows, or rows mentioning the `definesMBSize` stream), so minibatch sizes come out the
/// same from the CBF file as from the CTF file. `ctf2bin.py` writes the maximum over the streams of the
/// records' sample counts instead ([`MetaCounts::MaxOverStreams`]); the two agree unless a stream marked
/// `definesMBSize` is shorter than another stream. The chunk table's sample count is the sum of the
/// chunk's meta counts.
///
/// **Chunking** ([`Chunking`]): by default a chunk holds consecutive sequences as long as its encoded
/// size (meta counts plus records, in bytes) stays at most `chunk_size`; a sequence larger than
/// `chunk_size` gets a chunk of its own; sequences are never split. An empty input gives a file with
/// no chunks. [`Chunking::Ctf2binCompatible`] reproduces `ctf2bin.py`'s rule and its bug instead
/// (CBF.md §7.5). Either way a chunk is also closed before it would exceed 2^32 − 1 sequences or meta
/// samples (the table's 32-bit fields).
///
/// **Empty streams**: a sequence with no sample of some stream would be written as an `N = 0` record,
/// which CNTK reads and then refuses (`Sequences must be a least one frame long`). The writer refuses
/// such a sequence with [`cntkio_core::ErrorKind::EmptyStream`], or drops it when
/// [`EmptyStreams::Drop`] is set (counted in [`CbfSummary::dropped_sequences`]).
///
/// **Memory and I/O**: with [`CbfWriter::write`] each sequence is encoded as soon as it is written, into
/// per-stream segments of the current chunk; nothing of the caller's data is kept. Data handed over with
/// [`CbfWriter::write_owned`] are kept instead, and the records of their largest stream are encoded later
/// by the background thread, straight into the buffers that go to the disk (one copy of those bytes
/// instead of two, on the largest share of the file's bytes); the data then come back, cleared, through
/// [`CbfWriter::take_spare`]. When the chunk is complete its segments and records go, in file order, to
/// the background thread, which writes them to the file (with direct I/O on Linux, bypassing the page
/// cache, unless the file system refuses it or `CNTKIO_DIRECT_IO=0` is set) and frees them piece by
/// piece, so the memory in flight stays near one chunk (the module `sink` tells how).
///
/// **Atomicity**: everything is written to a temporary file in the target's directory, which is synced
/// and renamed over the target by [`CbfWriter::finish`]. Dropping the writer without `finish` deletes
/// the temporary file and leaves the target untouched; an existing target is never truncated (a
/// reader that mapped it keeps its bytes).
#[derive(Debug)]
pub struct CbfWriter {
    path: PathBuf,
    /// What its write errors say.
    target: Target,
    tmp: Option<tempfile::NamedTempFile>,
    /// Asked between the parts of an upload to an object store.
    cancel: Option<fn() -> bool>,
    sink: Option<Sink>,
    options: CbfWriterOptions,
    streams: Vec<StreamHeader>,
    /// Offset where the next chunk starts.
    pos: u64,
    table: Vec<ChunkEntry>,
    /// Meta counts of the current chunk's sequences.
    meta: Vec<u32>,
    /// Per stream, the current chunk's records: encoded into segments (the last one is being filled), or
    /// left for the write thread to encode.
    sections: Vec<Vec<Piece>>,
    /// Data handed over by [`CbfWriter::write_owned`], for [`CbfWriter::take_spare`]: kept here, or
    /// given back by the write thread once their records are written.
    spare: Vec<ChunkData>,
    spare_tx: Sender<(ChunkData, u64)>,
    spare_rx: Receiver<(ChunkData, u64)>,
    /// The sizes (their records' bytes) of the data waiting in `spare_rx`.
    spare_bytes: Arc<AtomicU64>,
    /// Bytes of the current chunk's records left for the write thread.
    deferred_bytes: u64,
    /// The current chunk's meta counts as bytes.
    scratch: Vec<u8>,
    /// Sequence sizes, reused by [`CbfWriter::append_checked`].
    sizes: Vec<u64>,
    pending_bytes: u64,
    pending_samples: u64,
    /// The current chunk's samples of each stream that is dense of dim 0 (0 for the others): such samples
    /// take no bytes, and readers allow at most one a byte of the chunk.
    pending_empty_samples: Vec<u64>,
    /// ctf2bin's never-reset estimate.
    estimate: u64,
    summary: CbfSummary,
    /// A chunk failed halfway: the file is unusable.
    broken: bool,
}

/// Spare data kept at most (a caller refilling them takes one back per write).
const MAX_SPARE: usize = 4;

/// Bytes of spare data given back by the write thread kept at least, whatever the chunk size (see
/// [`CbfWriter::write_owned`]).
const MIN_SPARE_BYTES: u64 = 32 << 20;

impl CbfWriter {
    /// A writer with default options and this chunk size in bytes.
    pub fn create(path: impl AsRef<Path>, schema: &Schema, chunk_size: u64) -> Result<CbfWriter, Error> {
        CbfWriter::with_options(path, schema, CbfWriterOptions::new(chunk_size))
    }

    /// A writer with options. Creates the temporary file next to `path` right away.
    pub fn with_options(
        path: impl AsRef<Path>,
        schema: &Schema,
        options: CbfWriterOptions,
    ) -> Result<CbfWriter, Error> {
        CbfWriter::with_hooks(path.as_ref(), schema, options, crate::convert::Hooks::default())
    }

    /// [`CbfWriter::with_options`] with a conversion's [`Hooks`](crate::convert::Hooks):
    /// `on_temporary_file` is called with the temporary file's path right before it is created, and
    /// `cancel` is asked between the parts of an upload to an object store.
    pub(crate) fn with_hooks(
        path: &Path,
        schema: &Schema,
        options: CbfWriterOptions,
        hooks: crate::convert::Hooks,
    ) -> Result<CbfWriter, Error> {
        crate::compress::refuse_compressed_output(path, "CBF")?;
        let path = path.to_path_buf();
        let streams = schema.streams().iter().map(StreamHeader::from_spec).collect::<Result<Vec<_>, Error>>()?;
        let tmp = crate::output::temporary_noted(&path, hooks.on_temporary_file)?;
        let target = Target::new(&path, tmp.as_file());
        let mut sink = Sink::new(tmp.as_file(), tmp.path(), true, options.chunk_size).map_err(|e| target.error(e))?;
        let (spare_tx, spare_rx) = unbounded();
        let mut prefix = Vec::with_capacity(12);
        encode_prefix(&mut prefix);
        sink.put(&prefix).map_err(|e| target.error(e))?;
        Ok(CbfWriter {
            path,
            target,
            tmp: Some(tmp),
            cancel: hooks.cancel,
            sink: Some(sink),
            options,
            sections: streams.iter().map(|_| Vec::new()).collect(),
            pending_empty_samples: vec![0; streams.len()],
            streams,
            pos: prefix.len() as u64,
            table: Vec::new(),
            meta: Vec::new(),
            spare: Vec::new(),
            spare_tx,
            spare_rx,
            spare_bytes: Arc::new(AtomicU64::new(0)),
            deferred_bytes: 0,
            scratch: Vec::new(),
            sizes: Vec::new(),
            pending_bytes: 0,
            pending_samples: 0,
            estimate: 0,
            summary: CbfSummary::default(),
            broken: false,
        })
    }

    /// The target path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends every sequence of `data` (keys are not stored: CBF keys are positions). The data must
    /// match the schema (stream count, storage, dim, element type). On error the sequences before the
    /// failing one are kept and the writer can go on. Nothing of `data` is kept: each sequence is
    /// encoded right away.
    pub fn write(&mut self, data: &ChunkData) -> Result<(), Error> {
        self.check(data)?;
        let valid = check_chunk_fast(data);
        self.append(data, 0..data.num_sequences(), valid, None)
    }

    /// [`CbfWriter::write`], taking `data` over: the records of its largest stream are then encoded by
    /// the write thread straight into its buffers (one copy of those bytes instead of two), and `data`
    /// comes back from [`CbfWriter::take_spare`], cleared for a parser to refill, once they are written
    /// (fresh allocations for every chunk would cost page faults).
    pub fn write_owned(&mut self, data: ChunkData) -> Result<(), Error> {
        self.write_owned_checking(data, check_chunk_fast)
    }

    /// [`CbfWriter::write_owned`] for data just made by the CTF parser (not changed since): their sparse
    /// indices were compared with the streams' dimensions as they were read, so that pass is not made
    /// again (see [`check_parsed_chunk_fast`]).
    pub(crate) fn write_parsed(&mut self, data: ChunkData) -> Result<(), Error> {
        self.write_owned_checking(data, check_parsed_chunk_fast)
    }

    fn write_owned_checking(&mut self, data: ChunkData, check: fn(&ChunkData) -> bool) -> Result<(), Error> {
        // Spares nobody takes are not hoarded: a chunk's worth is kept (a parser refilling them takes one
        // back per write, but they come back in bursts, as chunks are written; dropping those and
        // allocating new ones later cost 3,000-5,000 page faults and 13 MiB of peak memory per GB).
        let keep = self.options.chunk_size.max(MIN_SPARE_BYTES);
        while self.spare_bytes.load(Ordering::Relaxed) > keep {
            match self.spare_rx.try_recv() {
                Ok((_, bytes)) => {
                    self.spare_bytes.fetch_sub(bytes, Ordering::Relaxed);
                }
                Err(_) => break,
            }
        }
        if let Err(e) = self.check(&data) {
            self.keep_spare(data);
            return Err(e);
        }
        let valid = check(&data);
        let n = data.num_sequences();
        match if valid { largest_stream(&data) } else { None } {
            Some((stream, bytes)) => {
                // Bounded memory: the data whose records wait for the write thread, here and on their way,
                // stay within about a chunk (see `Sink::wait_for_records`).
                let sink = self.sink.as_mut().ok_or_else(finished)?;
                sink.wait_for_records(self.deferred_bytes.saturating_add(bytes)).map_err(|e| self.target.error(e))?;
                let shared = Arc::new(Shared {
                    data,
                    bytes,
                    back: self.spare_tx.clone(),
                    queued: Arc::clone(&self.spare_bytes),
                });
                self.append(&shared.data, 0..n, valid, Some((&shared, stream)))
            }
            None => {
                let r = self.append(&data, 0..n, valid, None);
                self.keep_spare(data);
                r
            }
        }
    }

    fn keep_spare(&mut self, data: ChunkData) {
        if self.spare.len() < MAX_SPARE {
            self.spare.push(data);
        }
    }

    /// Appends sequence `s` of `data`.
    pub fn write_sequence(&mut self, data: &ChunkData, s: usize) -> Result<(), Error> {
        self.check(data)?;
        if s >= data.num_sequences() {
            let num_sequences = data.num_sequences() as u64;
            return Err(Error::new(ErrorKind::SequenceOutOfRange { sequence: s as u64, num_sequences }));
        }
        self.append(data, s..s + 1, false, None)
    }

    /// Data handed over by [`CbfWriter::write_owned`], cleared, whose allocations can be reused (e.g.
    /// by a parser); `None` if there is none (yet: data whose records the write thread encodes come
    /// back once they are written).
    pub fn take_spare(&mut self) -> Option<ChunkData> {
        let mut d = match self.spare.pop() {
            Some(d) => d,
            None => {
                let (d, bytes) = self.spare_rx.try_recv().ok()?;
                self.spare_bytes.fetch_sub(bytes, Ordering::Relaxed);
                d
            }
        };
        d.clear();
        Some(d)
    }

    fn check(&self, data: &ChunkData) -> Result<(), Error> {
        if self.broken {
            return Err(Error::new(ErrorKind::WriterFailed));
        }
        if data.streams.len() != self.streams.len() {
            let problem = format!("{} streams, the schema {}", data.streams.len(), self.streams.len());
            return Err(Error::chunk_data(None, problem));
        }
        for (d, h) in data.streams.iter().zip(&self.streams) {
            if d.format() != h.format || d.dim != h.dim as usize || d.values.element_type() != h.element_type {
                return Err(Error::new(ErrorKind::InvalidStream {
                    stream: h.name.clone(),
                    reason: format!(
                        "the schema says {} {} dim {}, the data are {} {} dim {}",
                        h.format.name(),
                        h.element_type.cntk_name(),
                        h.dim,
                        d.format().name(),
                        d.values.element_type().cntk_name(),
                        d.dim
                    ),
                }));
            }
        }
        let n = data.keys.len();
        if data.num_samples.len() != n || data.streams.iter().any(|d| d.num_sequences() != n) {
            return Err(Error::chunk_data(None, "keys, sample counts and streams disagree on the number of sequences"));
        }
        Ok(())
    }

    /// Appends sequences `r` of `data` (checked against the schema; `valid`: every sequence passed
    /// [`check_chunk_fast`]), closing chunks as they fill. Stops at the first sequence that is refused.
    /// With `deferred` `Some((shared, k))` (`data` is `shared`'s), stream `k`'s records are left for the
    /// write thread to encode.
    fn append(
        &mut self,
        data: &ChunkData,
        r: Range<usize>,
        valid: bool,
        deferred: Option<(&Arc<Shared>, usize)>,
    ) -> Result<(), Error> {
        if valid && self.options.chunking == Chunking::Exact && self.options.meta_counts == MetaCounts::Declared {
            return self.append_checked(data, r, deferred);
        }
        self.append_each(data, r, valid, deferred)
    }

    /// [`CbfWriter::append`] one sequence at a time.
    fn append_each(
        &mut self,
        data: &ChunkData,
        r: Range<usize>,
        valid: bool,
        deferred: Option<(&Arc<Shared>, usize)>,
    ) -> Result<(), Error> {
        for s in r {
            match self.accept(data, s, valid)? {
                Accept::Take { meta, bytes } => {
                    let pending = (self.meta.len(), self.pending_samples, self.pending_bytes);
                    if self.closes_before(pending, u64::from(meta), bytes) {
                        self.flush_chunk()?;
                    }
                    self.encode_run(data, s..s + 1, deferred)?;
                    self.meta.push(meta);
                    self.pending_bytes += bytes;
                    self.pending_samples += u64::from(meta);
                    if self.options.chunking == Chunking::Ctf2binCompatible {
                        self.estimate += ctf2bin_estimate(data, s);
                        if self.estimate >= self.options.chunk_size {
                            self.flush_chunk()?;
                        }
                    }
                }
                Accept::Drop => self.summary.dropped_sequences += 1,
            }
        }
        Ok(())
    }

    /// [`CbfWriter::append`] for data that passed [`check_chunk_fast`], with exact chunking and declared
    /// meta counts: the sizes of all the sequences first, then each run of sequences that fits the current
    /// chunk taken at once (what one sequence at a time does, without its per-sequence checks and calls,
    /// which weigh on sparse data's many short sequences). A sequence with an empty stream is refused or
    /// dropped as one sequence at a time does it.
    fn append_checked(
        &mut self,
        data: &ChunkData,
        r: Range<usize>,
        deferred: Option<(&Arc<Shared>, usize)>,
    ) -> Result<(), Error> {
        // Each sequence's bytes in a chunk (its meta count and records), `EMPTY` for one with an empty
        // stream.
        const EMPTY: u64 = u64::MAX;
        let mut sizes = std::mem::take(&mut self.sizes);
        sizes.clear();
        sizes.resize(r.len(), 4);
        for d in &data.streams {
            for (size, s) in sizes.iter_mut().zip(r.clone()) {
                if d.sequence_offsets[s] == d.sequence_offsets[s + 1] {
                    *size = EMPTY;
                } else if *size != EMPTY {
                    *size += valid_record_len(d, s);
                }
            }
        }
        let mut s = r.start;
        let result = loop {
            if s == r.end {
                break Ok(());
            }
            if sizes[s - r.start] == EMPTY {
                if let Err(e) = self.append_each(data, s..s + 1, true, deferred) {
                    break Err(e);
                }
                s += 1;
                continue;
            }
            // The run of sequences from `s` on that fit the current chunk.
            let (start, mut bytes, mut samples, mut count) =
                (s, self.pending_bytes, self.pending_samples, self.meta.len());
            while s < r.end && sizes[s - r.start] != EMPTY {
                let (b, m) = (sizes[s - r.start], u64::from(data.num_samples.get(s)));
                if self.closes_before((count, samples, bytes), m, b) {
                    break;
                }
                (bytes, samples, count, s) = (bytes + b, samples + m, count + 1, s + 1);
            }
            if s > start {
                if let Err(e) = self.encode_run(data, start..s, deferred) {
                    break Err(e);
                }
                self.meta.extend(data.num_samples.range(start..s));
                (self.pending_bytes, self.pending_samples) = (bytes, samples);
            }
            if s < r.end && sizes[s - r.start] != EMPTY {
                // Sequence `s` does not fit: it starts the next chunk.
                if let Err(e) = self.flush_chunk() {
                    break Err(e);
                }
            }
        };
        self.sizes = sizes;
        result
    }

    /// Whether a chunk holding `(sequences, samples, bytes)` must be closed before a sequence of `meta`
    /// samples and `size` bytes joins it: the table's 32-bit counts would overflow, or (exact chunking)
    /// the chunk would outgrow its size. A sequence always joins an empty chunk.
    fn closes_before(&self, (count, samples, bytes): (usize, u64, u64), meta: u64, size: u64) -> bool {
        count > 0
            && (count == u32::MAX as usize
                || samples + meta > u64::from(u32::MAX)
                || (self.options.chunking == Chunking::Exact && bytes + size > self.options.chunk_size))
    }

    /// Decides about sequence `s` of `data`: its meta count and size, or drop it.
    fn accept(&self, data: &ChunkData, s: usize, valid: bool) -> Result<Accept, Error> {
        let key = data.keys.get(s);
        stream_lens(data, s).map_err(|e| e.with_sequence(key))?;
        let lens = || data.streams.iter().map(move |d| d.sequence_len(s));
        if has_empty(data, s) {
            return match self.options.empty_streams {
                EmptyStreams::Refuse => {
                    let empty: Vec<String> =
                        lens().zip(&self.streams).filter(|(n, _)| *n == 0).map(|(_, h)| h.name.clone()).collect();
                    Err(Error::new(ErrorKind::EmptyStream { sequence: key, streams: empty }).with_sequence(key))
                }
                EmptyStreams::Drop => Ok(Accept::Drop),
            };
        }
        let bytes = if valid {
            4 + data.streams.iter().map(|d| valid_record_len(d, s)).sum::<u64>()
        } else {
            check_sequence(data, s).map_err(|e| e.with_sequence(key))?
        };
        let meta = match self.options.meta_counts {
            MetaCounts::Declared => data.num_samples.get(s),
            MetaCounts::MaxOverStreams => {
                let m = lens().max().unwrap_or(0);
                u32::try_from(m).map_err(|_| {
                    Error::new(ErrorKind::SequenceTooLarge { sequence: key, len_bytes: m }).with_sequence(key)
                })?
            }
        };
        Ok(Accept::Take { meta, bytes })
    }

    /// Encodes the sequences `run` of `data` (accepted: checked) into the current chunk's sections. A
    /// failure here (the data changed after the checks, or the disk failed) leaves the sections
    /// inconsistent, so it breaks the writer.
    fn encode_run(
        &mut self,
        data: &ChunkData,
        run: Range<usize>,
        deferred: Option<(&Arc<Shared>, usize)>,
    ) -> Result<(), Error> {
        for (i, (d, h)) in data.streams.iter().zip(&self.streams).enumerate() {
            if h.dim == 0 && h.format == StorageFormat::Dense {
                self.pending_empty_samples[i] += d.sequence_offsets[run.end] - d.sequence_offsets[run.start];
            }
        }
        let r = self.encode_run_inner(data, run, deferred);
        self.break_on_error(r)
    }

    /// A failure halfway through a chunk leaves the file unusable: later writes are refused.
    fn break_on_error(&mut self, r: Result<(), Error>) -> Result<(), Error> {
        if r.is_err() {
            self.broken = true;
        }
        r
    }

    fn encode_run_inner(
        &mut self,
        data: &ChunkData,
        run: Range<usize>,
        deferred: Option<(&Arc<Shared>, usize)>,
    ) -> Result<(), Error> {
        let sink = self.sink.as_mut().ok_or_else(finished)?;
        for (i, (d, sec)) in data.streams.iter().zip(&mut self.sections).enumerate() {
            if let Some((shared, _)) = deferred.filter(|&(_, k)| k == i) {
                let bytes = valid_run_len(d, run.clone());
                if usize::try_from(bytes).is_err() {
                    return Err(Error::limit("records' size in bytes", bytes, usize::MAX as u64));
                }
                match sec.last_mut() {
                    Some(Piece::Records(r)) if Arc::ptr_eq(&r.data, shared) && r.seqs.end == run.start => {
                        r.seqs.end = run.end;
                        r.bytes += bytes;
                    }
                    _ => sec.push(Piece::Records(Deferred {
                        data: Arc::clone(shared),
                        stream: i,
                        seqs: run.clone(),
                        bytes,
                    })),
                }
                self.deferred_bytes += bytes;
                continue;
            }
            // Records into the last segment while they fit, then into a new one.
            let (mut s, mut fresh) = (run.start, false);
            while s < run.end {
                let k = match sec.last_mut() {
                    Some(Piece::Segment(g)) => g.append_fitting(|dst| encode_checked_records_to(d, s..run.end, dst))?,
                    _ => 0,
                };
                if k == 0 && fresh {
                    return Err(Error::internal("a record does not fit a segment made for it"));
                }
                s += k;
                fresh = k == 0;
                if fresh {
                    let len = valid_record_len(d, s);
                    let len = usize::try_from(len)
                        .map_err(|_| Error::limit("record size in bytes", len, usize::MAX as u64))?;
                    sec.push(Piece::Segment(sink.segment(len).map_err(|e| self.target.error(e))?));
                }
            }
        }
        Ok(())
    }

    /// Writes the current chunk: its meta counts, then stream after stream its records.
    fn flush_chunk(&mut self) -> Result<(), Error> {
        let r = self.check_empty_samples().and_then(|()| self.send_chunk());
        self.break_on_error(r)?;
        self.table.push(ChunkEntry {
            offset: self.pos,
            num_sequences: self.meta.len() as u32,
            num_samples: self.pending_samples as u32,
        });
        self.pos += self.pending_bytes;
        self.summary.chunks += 1;
        self.summary.sequences += self.meta.len() as u64;
        self.summary.samples += self.pending_samples;
        self.meta.clear();
        self.pending_bytes = 0;
        self.pending_samples = 0;
        Ok(())
    }

    /// Refuses a chunk whose samples of a dense stream of dim 0 outnumber its bytes: a reader could not tell
    /// it from a file whose counts ask for more samples than it holds (what cntkio's reader refuses).
    fn check_empty_samples(&mut self) -> Result<(), Error> {
        let bytes = self.pending_bytes;
        let over = self.pending_empty_samples.iter().position(|&n| n > bytes);
        let r = match over {
            None => Ok(()),
            Some(i) => Err(Error::limit(
                format!(
                    "samples of the dense stream \"{}\" of dim 0 (which take no bytes; CBF readers allow one a \
                     byte) in chunk {} of {bytes} bytes",
                    self.streams[i].name,
                    self.table.len()
                ),
                self.pending_empty_samples[i],
                bytes,
            )),
        };
        self.pending_empty_samples.iter_mut().for_each(|n| *n = 0);
        r
    }

    fn send_chunk(&mut self) -> Result<(), Error> {
        let sink = self.sink.as_mut().ok_or_else(finished)?;
        let io = |e| self.target.error(e);
        self.scratch.clear();
        self.scratch.extend(self.meta.iter().flat_map(|m| m.to_le_bytes()));
        sink.put(&self.scratch).map_err(io)?;
        for sec in &mut self.sections {
            for piece in sec.drain(..) {
                match piece {
                    Piece::Segment(g) => sink.pass(g).map_err(io)?,
                    Piece::Records(r) => sink.pass_records(Box::new(r)).map_err(io)?,
                }
            }
        }
        self.deferred_bytes = 0;
        if sink.position() != self.pos + self.pending_bytes {
            return Err(Error::internal(format!(
                "chunk {} has {} bytes, {} were expected",
                self.table.len(),
                sink.position().wrapping_sub(self.pos),
                self.pending_bytes
            )));
        }
        Ok(())
    }

    /// Sequences accepted so far (written or waiting in the current chunk).
    pub fn sequences_written(&self) -> u64 {
        self.summary.sequences + self.meta.len() as u64
    }

    /// Writes the last chunk, the header and the trailer, syncs the file and renames it over the
    /// target.
    pub fn finish(mut self) -> Result<CbfSummary, Error> {
        if self.broken {
            return Err(Error::new(ErrorKind::WriterFailed));
        }
        let last =
            !self.meta.is_empty() || (self.options.chunking == Chunking::Ctf2binCompatible && self.table.is_empty());
        if last {
            self.flush_chunk()?;
        }
        let header_offset = self.pos;
        let mut tail = Vec::new();
        encode_header(&self.streams, &self.table, &mut tail)?;
        encode_trailer(header_offset, &mut tail);
        let mut sink = self.sink.take().ok_or_else(finished)?;
        sink.put(&tail).map_err(|e| self.target.error(e))?;
        let len = sink.finish().map_err(|e| self.target.error(e))?;
        let tmp = self.tmp.take().ok_or_else(finished)?;
        tmp.as_file().set_len(len).map_err(|e| self.target.error(e))?;
        crate::output::persist(tmp, &self.path, self.cancel)?;
        self.summary.bytes = len;
        Ok(self.summary)
    }
}

/// A piece of a chunk's stream section.
#[derive(Debug)]
enum Piece {
    /// Records encoded.
    Segment(Segment),
    /// Records the write thread encodes.
    Records(Deferred),
}

/// Data taken over by [`CbfWriter::write_owned`] whose records the write thread encodes: dropped when the
/// last of them is written, it goes back to the writer for [`CbfWriter::take_spare`].
struct Shared {
    data: ChunkData,
    /// The bytes of its deferred records (a measure of its size).
    bytes: u64,
    back: Sender<(ChunkData, u64)>,
    /// [`CbfWriter::spare_bytes`].
    queued: Arc<AtomicU64>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.queued.fetch_add(self.bytes, Ordering::Relaxed);
        // The writer may be gone: the data are then freed.
        let _ = self.back.send((data, self.bytes));
    }
}

/// Sequences `seqs` of stream `stream` of checked shared data ([`check_chunk_fast`] passed), for the
/// write thread to encode.
struct Deferred {
    data: Arc<Shared>,
    stream: usize,
    seqs: Range<usize>,
    /// Bytes of their records.
    bytes: u64,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("stream", &self.stream)
            .field("seqs", &self.seqs)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Records for Deferred {
    fn count(&self) -> usize {
        self.seqs.len()
    }
    fn record_len(&self, i: usize) -> usize {
        // Each length was computed, and found to fit a `usize`, when the sequence was accepted.
        valid_record_len(&self.data.data.streams[self.stream], self.seqs.start + i) as usize
    }
    fn encode(&self, i: usize, dst: &mut [u8]) -> Result<(), String> {
        encode_checked_record_to(&self.data.data.streams[self.stream], self.seqs.start + i, dst)
            .map_err(|e| e.to_string())
    }
    fn encode_fitting(&self, i: usize, dst: &mut [u8]) -> Result<(usize, usize), String> {
        let from = self.seqs.start.saturating_add(i).min(self.seqs.end);
        encode_checked_records_to(&self.data.data.streams[self.stream], from..self.seqs.end, dst)
            .map_err(|e| e.to_string())
    }
    fn len(&self) -> u64 {
        self.bytes
    }
}

/// The stream with the most record bytes in data that passed [`check_chunk_fast`], and their number, if
/// any has some.
fn largest_stream(data: &ChunkData) -> Option<(usize, u64)> {
    let n = data.num_sequences();
    let (k, most) = data.streams.iter().map(|d| valid_run_len(d, 0..n)).enumerate().max_by_key(|&(_, b)| b)?;
    (n > 0 && most > 0).then_some((k, most))
}

/// [`record_len`](cntkio_core::cbf::record_len) of sequence `s` of a stream whose data passed
/// [`check_chunk_fast`] or, for this sequence, [`check_sequence`] (so the offsets read exist and the
/// products fit): the arithmetic without the checks, which the writer would otherwise repeat for every
/// record it sizes and encodes.
#[inline]
fn valid_record_len(d: &StreamData, s: usize) -> u64 {
    valid_run_len(d, s..s + 1)
}

/// The bytes of the records of the sequences `run`, one after the other, under the promise of
/// [`valid_record_len`]: from the offsets at the run's two ends.
#[inline]
fn valid_run_len(d: &StreamData, run: Range<usize>) -> u64 {
    let (a, b) = (d.sequence_offsets[run.start], d.sequence_offsets[run.end]);
    let (k, es) = (run.len() as u64, d.values.element_type().size_bytes() as u64);
    match &d.layout {
        Layout::Dense => 4 * k + (b - a) * d.dim as u64 * es,
        Layout::Sparse { sample_offsets, .. } => {
            8 * k + (sample_offsets[b as usize] - sample_offsets[a as usize]) * (es + 4) + 4 * (b - a)
        }
    }
}

/// The error for a writer whose sink or temporary file is gone: only `finish`, which consumes the
/// writer, takes them, so this is a bug.
fn finished() -> Error {
    Error::internal("the CBF writer's output is gone")
}

/// Checks that every stream's sequence offsets around sequence `s` exist and do not decrease.
fn stream_lens(data: &ChunkData, s: usize) -> Result<(), Error> {
    for d in &data.streams {
        match (d.sequence_offsets.get(s), d.sequence_offsets.get(s + 1)) {
            (Some(&a), Some(&b)) if a <= b => {}
            _ => return Err(Error::chunk_data(Some(s), "bad sequence offsets")),
        }
    }
    Ok(())
}

/// Some stream has no sample in sequence `s` (whose offsets [`stream_lens`] checked).
fn has_empty(data: &ChunkData, s: usize) -> bool {
    data.streams.iter().any(|d| d.sequence_offsets[s] == d.sequence_offsets[s + 1])
}

/// What to do with a sequence.
enum Accept {
    /// Write it with this meta count; it takes `bytes` in the chunk.
    Take { meta: u32, bytes: u64 },
    /// Leave it out ([`EmptyStreams::Drop`]).
    Drop,
}

/// `ctf2bin.py`'s size estimate of a sequence (CBF.md §7.5).
fn ctf2bin_estimate(data: &ChunkData, s: usize) -> u64 {
    let mut e = 0u64;
    for d in &data.streams {
        let es = d.values.element_type().size_bytes() as u64;
        let (a, b) = (d.sequence_offsets[s], d.sequence_offsets[s + 1]);
        e += match &d.layout {
            Layout::Dense => (b - a) * d.dim as u64 * es,
            Layout::Sparse { sample_offsets, .. } => {
                let nnz = sample_offsets[b as usize] - sample_offsets[a as usize];
                nnz * (es + 4) + 4 * (b - a)
            }
        };
    }
    e
}
