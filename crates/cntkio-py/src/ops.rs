//! Conversion, inspection and validation, for Python.

use crate::errors::{at_path, py_err, usage};
use crate::spec::{self, from_dict, Spec};
use cntkio::cbf::{CbfWriterOptions, EmptyStreams};
use cntkio::convert::{detect_format, Conversion, ConvertSummary, Format, Hooks, Target};
use cntkio::ctf::ScanOptions;
use cntkio::inspect::inspect;
use cntkio::validate::{validate_input, SummaryOptions, ValidateOptions};
use cntkio::{Access, CtfInput, CtfOptions, Error, InputSpec, StoredInput};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `"ctf"`, `"cbf"`, `"parquet"` or `"arrow"`, by the file's magic number.
#[pyfunction]
pub fn detect(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    Ok(py.detach(|| detect_format(&path)).map_err(|e| py_err(at_path(e, &path)))?.name())
}

/// The streams the rows in the first 4 MiB of the CTF file `path` suggest, `(name, dim, is_sparse)` each
/// (see `cntkio::ctf::suggest_schema`); None if it cannot be read or those rows name no input.
#[pyfunction]
pub fn suggest_streams(py: Python<'_>, path: PathBuf) -> Option<Vec<(String, usize, bool)>> {
    let schema = py.detach(|| cntkio::ctf::suggest_schema(&path))?;
    Some(schema.streams().iter().map(|s| (s.name.clone(), s.dim, s.format == cntkio::StorageFormat::Sparse)).collect())
}

/// The `stats --json` report (as JSON text) of the opened deserializers `readers`, read one after another;
/// the GIL is released while reading, and Ctrl-C stops it.
#[pyfunction]
#[pyo3(signature = (readers, threads = None))]
pub fn stats_json(
    py: Python<'_>,
    readers: Vec<PyRef<'_, crate::reader::Reader>>,
    threads: Option<usize>,
) -> PyResult<String> {
    let parts: Vec<_> = readers.iter().map(|r| r.deserializer()).collect();
    let threads = cntkio::threads_or_cores(threads);
    let run = move || -> Result<_, Error> {
        let source: std::sync::Arc<dyn cntkio::source::Deserializer> = match parts.len() {
            0 => return Err(Error::option("paths", "stats needs at least one file")),
            1 => parts.into_iter().next().expect("one part"),
            _ => std::sync::Arc::new(cntkio::source::MultiSource::new(parts)?),
        };
        cntkio::stats::stats(&*source, threads, &mut |_, _| {}, Some(python_signal_raised))
    };
    let report = interruptible(py, run, py_err)?;
    serde_json::to_string(&report).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

/// The `inspect --json` report as JSON text.
#[pyfunction]
#[pyo3(signature = (path, skip_sequence_ids = false))]
pub fn inspect_json(py: Python<'_>, path: PathBuf, skip_sequence_ids: bool) -> PyResult<String> {
    let report = py.detach(|| inspect(&path, skip_sequence_ids)).map_err(|e| py_err(at_path(e, &path)))?;
    serde_json::to_string(&report).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

thread_local! {
    /// The Python exception (`KeyboardInterrupt`, …) a conversion on this thread stopped for.
    static STOPPED_BY: RefCell<Option<PyErr>> = const { RefCell::new(None) };
    /// When Python's signal handlers last ran for a conversion on this thread.
    static CHECKED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How often a conversion lets Python run its signal handlers.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// [`Hooks::cancel`] of a conversion called from Python (which runs without the GIL): every
/// [`CHECK_EVERY`], takes the GIL and runs Python's signal handlers; if one raises (Ctrl-C's
/// `KeyboardInterrupt`), keeps the exception for [`convert`] to raise and stops the conversion.
fn python_signal_raised() -> bool {
    let now = Instant::now();
    if CHECKED.get().is_some_and(|t| now.duration_since(t) < CHECK_EVERY) {
        return false;
    }
    CHECKED.set(Some(now));
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            STOPPED_BY.set(Some(e));
            true
        }
    })
}

/// Runs a long pass without the GIL, a pass whose cancel hook is [`python_signal_raised`]: a signal
/// handler's exception (Ctrl-C's `KeyboardInterrupt`) is raised in place of the pass's result ("interrupted"
/// or, when it had finished, its output); other errors go through `err`.
fn interruptible<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, Error> + Send,
    err: impl FnOnce(Error) -> PyErr,
) -> PyResult<T> {
    STOPPED_BY.set(None);
    CHECKED.set(None);
    let r = py.detach(f);
    // A signal handler that raised is never dropped, even when the pass had finished when it was asked to
    // stop (the exception then comes as it would have right after the call).
    match (r, STOPPED_BY.take()) {
        (_, Some(raised)) => Err(raised),
        (r, None) => r.map_err(err),
    }
}

/// Converts CTF → CBF (`config`: the CTF deserializer) or CBF → CTF (`config` optional: a CBF
/// deserializer's renames; `aliases`: `(stream name, alias written after '|')` pairs); any of them to
/// Parquet or Arrow IPC when `output`'s extension names one (one row per sample when `flatten`; at most
/// `row_group_size` rows per Parquet row group or IPC record batch), and those
/// back to CBF (`.cbf`, `.bin`) or CTF. Returns a dict of totals.
#[pyfunction]
#[pyo3(signature = (input, output, config = None, aliases = None, chunk_size = None, ctf2bin_compatible = false, skip_bad_sequences = false, threads = None, flatten = false, row_group_size = None))]
#[allow(clippy::too_many_arguments)]
pub fn convert<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
    config: Option<&Bound<'py, PyDict>>,
    aliases: Option<Vec<(String, String)>>,
    chunk_size: Option<u64>,
    ctf2bin_compatible: bool,
    skip_bad_sequences: bool,
    threads: Option<usize>,
    flatten: bool,
    row_group_size: Option<usize>,
) -> PyResult<Bound<'py, PyDict>> {
    let spec = config.map(from_dict).transpose()?;
    let chunk_size = chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE);
    if chunk_size == 0 {
        return Err(usage("chunk_size must be > 0"));
    }
    if row_group_size == Some(0) {
        return Err(usage("row_group_size must be > 0"));
    }
    let mut c = py.detach(|| Conversion::new(&input, &output)).map_err(|e| py_err(at_path(e, &input)))?;
    let (format, to) = c.route();
    if (flatten || row_group_size.is_some()) && !matches!(to, Target::Arrow(_)) {
        let what = if flatten { "flatten" } else { "row_group_size" };
        return Err(usage(format!("{what} applies to Parquet and Arrow outputs (.parquet, .arrow)")));
    }
    c.flatten = flatten;
    c.rows_per_group = row_group_size;
    c.writer =
        if ctf2bin_compatible { CbfWriterOptions::ctf2bin(chunk_size) } else { CbfWriterOptions::new(chunk_size) };
    if skip_bad_sequences {
        c.writer.empty_streams = EmptyStreams::Drop;
    }
    c.aliases = aliases.unwrap_or_default();
    c.scan = ScanOptions { threads: cntkio::threads_or_cores(threads), skip_bad_sequences, ..ScanOptions::default() };
    c.hooks = Hooks { cancel: Some(python_signal_raised), ..Hooks::default() };
    match (format, spec) {
        (Format::Ctf, Some(Spec::Ctf { input, access })) => {
            c.ctf = Some(input);
            c.access = access;
        }
        (Format::Ctf, _) => {
            return Err(usage(format!(
                "{} is CTF: converting it needs its streams (a StreamDefs or a CTFDeserializer)",
                c.input.display()
            )))
        }
        (Format::Cbf, Some(Spec::Cbf { input, mmap })) => c.cbf = input.options.mmap(spec::mapped(mmap, true)),
        _ => {}
    }
    let summary = interruptible(py, || c.run(&mut |_| {}), py_err)?;
    totals(py, format, summary)
}

/// The totals of a conversion as a dict.
fn totals<'py>(py: Python<'py>, format: Format, summary: ConvertSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("input_format", format.name())?;
    d.set_item("sequences", summary.sequences)?;
    d.set_item("samples", summary.samples)?;
    d.set_item("chunks", summary.chunks)?;
    d.set_item("dropped_sequences", summary.dropped_sequences)?;
    d.set_item("tolerated_errors", summary.tolerated_errors)?;
    d.set_item("bytes_written", summary.bytes_written)?;
    Ok(d)
}

/// Reads everything and reports every error (not only the first): the JSON text of the library's
/// validation summary, the object `cntkio validate --json` prints for the file.
#[pyfunction]
#[pyo3(signature = (path, config = None, warnings = false, limit = 1000, threads = None))]
pub fn validate_json<'py>(
    py: Python<'py>,
    path: PathBuf,
    config: Option<&Bound<'py, PyDict>>,
    warnings: bool,
    limit: usize,
    threads: Option<usize>,
) -> PyResult<String> {
    let spec = config.map(from_dict).transpose()?;
    let vo = ValidateOptions {
        threads: cntkio::threads_or_cores(threads),
        limit,
        warnings,
        cancel: Some(python_signal_raised),
    };
    let err = |e| py_err(at_path(e, &path));
    let run = || -> Result<_, Error> {
        let map_or_read = |mapped: bool| if mapped { Access::Mmap } else { Access::Read };
        let stored = || StoredInput::new(&path);
        let (input, access, schema_inferred) = match (detect_format(&path)?, spec) {
            (Format::Ctf, Some(Spec::Ctf { input, access })) => {
                (InputSpec::Ctf(CtfInput { path: path.clone(), ..input }), access, false)
            }
            // Without streams: a CTF file is checked with the schema its rows suggest.
            (Format::Ctf, _) => (InputSpec::inferred(&path, &CtfOptions::default())?, Access::Read, true),
            (Format::Cbf, Some(Spec::Cbf { input, mmap })) => {
                (InputSpec::Cbf(input), map_or_read(spec::mapped(mmap, true)), false)
            }
            (Format::Cbf, _) => (InputSpec::Cbf(stored()), map_or_read(spec::mapped(None, true)), false),
            (Format::Parquet | Format::ArrowIpc, Some(Spec::Cbf { input, mmap })) => {
                (InputSpec::Arrow(input), map_or_read(spec::mapped(mmap, false)), false)
            }
            (Format::Parquet | Format::ArrowIpc, _) => (InputSpec::Arrow(stored()), Access::Read, false),
        };
        let r = validate_input(&input, access, &vo, &mut |_| {}, &mut |_| {})?;
        Ok((r, input, schema_inferred))
    };
    let (r, input, schema_inferred) = interruptible(py, run, err)?;
    let schema = match &input {
        InputSpec::Ctf(i) => Some(&i.schema),
        InputSpec::Cbf(_) | InputSpec::Arrow(_) => None,
    };
    let summary = r.summary(&SummaryOptions { schema, schema_inferred, limit });
    serde_json::to_string(&summary).map_err(|e| usage(format!("cannot encode the report: {e}")))
}

/// Rewrites `input` (plain or compressed) as seekable zstd (`output` ending in `.zst`) or BGZF (`.gz`);
/// returns the bytes written.
#[pyfunction]
#[pyo3(signature = (input, output, threads = None))]
pub fn recompress(py: Python<'_>, input: PathBuf, output: PathBuf, threads: Option<usize>) -> PyResult<u64> {
    let hooks = Hooks { cancel: Some(python_signal_raised), ..Hooks::default() };
    let nthreads = cntkio::threads_or_cores(threads);
    let run = || cntkio::convert::recompress(&input, &output, nthreads, hooks, &mut |_| {});
    Ok(interruptible(py, run, py_err)?.bytes_written)
}
