//! Conversions: CTF → CBF (what CNTK's `ctf2bin.py` does, with the CTF reader's exact values) and
//! CBF → CTF. Outputs are written to a temporary file in the target folder and renamed when complete.

use crate::cbf::{CbfFile, CbfOptions, CbfWriter, CbfWriterOptions};
use crate::ctf::{scan_file_owned, ScanOptions};
use crate::input::{Access, InputFile};
use crate::{ChunkData, CtfOptions, Error, Schema};
use cntkio_core::ctf::write::CtfWriter;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

/// The two formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CNTK Text Format.
    Ctf,
    /// CNTK Binary Format.
    Cbf,
}

/// Tells CTF from CBF by the file's first 8 bytes (the CBF magic), not by its name.
pub fn detect_format(path: &Path) -> Result<Format, Error> {
    let f = InputFile::open(path, Access::Read)?;
    let mut head = [0u8; 8];
    let n = f.read_some(0, &mut head)?;
    Ok(if n == 8 && u64::from_le_bytes(head) == cntkio_core::cbf::MAGIC { Format::Cbf } else { Format::Ctf })
}

/// Writing the output over the input would destroy it (the input is read while the output is written).
fn refuse_same_file(input: &Path, output: &Path) -> Result<(), Error> {
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        if a == b {
            return Err(Error::config(format!("the output {} is the input file", output.display())));
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
const CONVERT_READ_CHUNK: u64 = 2 << 20;

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
    /// Called with the path of the temporary output file right after it is created, before anything is
    /// read: for a caller that must be able to remove it when the process dies (say from a signal
    /// handler). The file is renamed over the output at the end, or removed when the conversion fails.
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
    let mut w = CbfWriter::with_temporary_hook(output, schema, how.writer, how.hooks.on_temporary_file)?;
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
            w.write_owned(d)?;
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
                        w.write_owned(d)?;
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
                tx.send(d).map_err(|_| Error::config("the CBF writer stopped"))?;
                Ok(spare_rx.try_recv().ok())
            });
            drop(tx);
            let written = writer.join().unwrap_or_else(|_| Err(Error::config("the CBF writer thread panicked")));
            (scanned, written)
        });
        let w = written?;
        scanned?;
        w
    };
    if w.sequences_written() == 0 {
        return Err(Error::config(format!(
            "{} holds no sequence for this schema (no row mentions the definesMBSize stream?); no output written",
            input.display()
        )));
    }
    let s = w.finish()?;
    summary.sequences = s.sequences;
    summary.samples = s.samples;
    summary.chunks = s.chunks;
    summary.dropped_sequences += s.dropped_sequences;
    summary.bytes_written = s.bytes;
    Ok(summary)
}

/// Converts a CBF file to CTF text that CNTK's CTF reader reads as the same data. Each stream is written
/// as `|alias` with the alias given for its name in `aliases` (`(name, alias)` pairs), else its name;
/// every value is written so that CNTK's parser gives back its bits.
pub fn cbf_to_ctf(
    input: &Path,
    output: &Path,
    options: &CbfOptions,
    aliases: &[(String, String)],
    hooks: &Hooks,
    progress: &mut dyn FnMut(u64),
) -> Result<ConvertSummary, Error> {
    refuse_same_file(input, output)?;
    let cbf = CbfFile::open_with(input, options)?;
    let mut streams = cbf.schema()?.streams().to_vec();
    for s in &mut streams {
        if let Some((_, a)) = aliases.iter().find(|(n, _)| *n == s.name) {
            s.alias = a.clone();
        }
    }
    let schema = Schema::new(streams)?;
    let dir = output.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let shown = output.display().to_string();
    let tmp = tempfile::Builder::new()
        .prefix(".cntkio-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| Error::io(format!("cannot create a temporary file beside {shown}"), e))?;
    if let Some(f) = hooks.on_temporary_file {
        f(tmp.path());
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp);
    let mut writer = CtfWriter::new(&schema);
    let mut text = Vec::new();
    let mut summary = ConvertSummary::default();
    for k in 0..cbf.chunk_count() {
        crate::check_cancel(hooks.cancel)?;
        let data = cbf.read_chunk(k)?;
        text.clear();
        writer.write_chunk(&data, &mut text)?;
        out.write_all(&text).map_err(|e| Error::io(format!("cannot write {shown}"), e))?;
        summary.sequences += data.num_sequences() as u64;
        summary.samples += data.num_samples.iter().map(|&n| u64::from(n)).sum::<u64>();
        summary.bytes_written += text.len() as u64;
        summary.chunks += 1;
        progress(cbf.chunks().get(k + 1).map_or(0, |c| c.offset));
    }
    let tmp = out.into_inner().map_err(|e| Error::io(format!("cannot write {shown}"), e.into_error()))?;
    crate::output::persist(tmp, output)?;
    Ok(summary)
}
