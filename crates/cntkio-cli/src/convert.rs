//! `cntkio convert`: CTF → CBF and CBF → CTF, chosen by the input's magic number; any of them → Parquet or
//! Arrow IPC, and those back to CTF or CBF, chosen by the output's extension.

use crate::args::{ConvertArgs, RecompressArgs};
use crate::output::Progress;
use crate::signals::{self, Task};
use crate::EXIT_OK;
use cntkio::arrow::ParquetCompression;
use cntkio::cbf::{CbfOptions, CbfWriterOptions, EmptyStreams, MetaCounts};
use cntkio::convert::{Conversion, Format, Target};
use cntkio::ctf::ScanOptions;
use cntkio::{Access, ElementType, Error, Schema, StorageFormat, StreamSpec};
use std::path::Path;
use std::time::Instant;

/// Runs `convert`.
pub fn run(a: &ConvertArgs, quiet: bool) -> Result<u8, Error> {
    let t = Instant::now();
    let in_len = std::fs::metadata(&a.input).map(|m| m.len()).unwrap_or(0);
    let mut c = Conversion::new(&a.input, &a.output)?;
    let (from, to) = c.route();
    if !matches!(to, Target::Arrow(_)) && (a.flatten || a.row_group_size.is_some()) {
        let flag = if a.flatten { "--flatten" } else { "--row-group-size" };
        return Err(Error::option(flag, "applies to Parquet and Arrow outputs (OUT.parquet, OUT.arrow)"));
    }
    c.parquet_compression = ParquetCompression::parse(&a.parquet_compression).ok_or_else(|| {
        Error::option_value("--parquet-compression", &a.parquet_compression, "must be zstd, snappy or none")
    })?;
    c.rows_per_group = a.row_group_size.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    c.flatten = a.flatten;
    c.writer = cbf_writer_options(a, a.read.chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE));
    if to == Target::Ctf {
        c.aliases = aliases(a)?;
    }
    c.scan = ScanOptions {
        threads: a.read.threads(),
        skip_bad_sequences: a.read.skip_bad_sequences,
        ..ScanOptions::default()
    };
    c.hooks = signals::hooks();
    match from {
        Format::Ctf => {
            let (input, access) = ctf_input(a)?;
            c.ctf = Some(input);
            c.access = access;
        }
        Format::Cbf => c.cbf = cbf_options(a),
        Format::Parquet | Format::ArrowIpc => {}
    }
    let progress = Progress::bytes(in_len, "converting", quiet);
    let s = converting(&a.output, || c.run(&mut |b| progress.set(b)))?;
    let what = format!("{} → {}", from.title(), to.title());
    progress.finish();
    if !quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{what}: {} → {}: {} sequences, {} samples{}, {} bytes written in {:.2} s ({:.1} MB/s of input){}{}",
            a.input.display(),
            a.output.display(),
            s.sequences,
            s.samples,
            if s.chunks > 0 { format!(", {} chunks", s.chunks) } else { String::new() },
            s.bytes_written,
            secs,
            in_len as f64 / secs.max(1e-9) / 1e6,
            if s.dropped_sequences > 0 {
                format!("; {} sequences dropped", s.dropped_sequences)
            } else {
                String::new()
            },
            if s.tolerated_errors > 0 { format!("; {} errors tolerated", s.tolerated_errors) } else { String::new() },
        );
    }
    Ok(EXIT_OK)
}

/// Runs `recompress`.
pub fn recompress(a: &RecompressArgs, quiet: bool) -> Result<u8, Error> {
    let t = Instant::now();
    let in_len = std::fs::metadata(&a.input).map(|m| m.len()).unwrap_or(0);
    let progress = Progress::bytes(in_len, "compressing", quiet);
    let threads = a.threads.unwrap_or(0);
    let s = converting(&a.output, || {
        cntkio::convert::recompress(&a.input, &a.output, threads, signals::hooks(), &mut |b| progress.set(b))
    })?;
    progress.finish();
    if !quiet {
        let secs = t.elapsed().as_secs_f64();
        eprintln!("{} → {}: {} bytes written in {:.2} s", a.input.display(), a.output.display(), s.bytes_written, secs);
    }
    Ok(EXIT_OK)
}

/// Aliases for CTF text: from a header file or --stream flags, matched by stream name.
fn aliases(a: &ConvertArgs) -> Result<Vec<(String, String)>, Error> {
    Ok(match &a.header {
        Some(h) => read_header(h, None)?.streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect(),
        None if !a.read.streams.is_empty() => {
            a.read.schema_and_options()?.0.streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect()
        }
        None => Vec::new(),
    })
}

/// How a CBF input is opened (mapped unless --no-mmap, its map guarded; its signals prepared).
fn cbf_options(a: &ConvertArgs) -> CbfOptions {
    let mapped = a.read.cbf_mapped();
    if mapped {
        signals::prepare_for_maps(Task::Conversion, &[(&a.input, "pass --no-mmap")]);
        signals::reading_mapped(Some(0));
    }
    CbfOptions::default().mmap(mapped)
}

/// The CBF writer's options from the flags.
fn cbf_writer_options(a: &ConvertArgs, chunk_size: u64) -> CbfWriterOptions {
    let mut writer =
        if a.ctf2bin_compatible { CbfWriterOptions::ctf2bin(chunk_size) } else { CbfWriterOptions::new(chunk_size) };
    if a.max_over_streams {
        writer.meta_counts = MetaCounts::MaxOverStreams;
    }
    if a.read.skip_bad_sequences {
        writer.empty_streams = EmptyStreams::Drop;
    }
    writer
}

/// A CTF input: its schema and options (from the flags, a header file or a config), and how it is read
/// (mapped unless --no-mmap, its signals prepared).
fn ctf_input(a: &ConvertArgs) -> Result<(cntkio::CtfInput, Access), Error> {
    let mut input = match &a.header {
        Some(h) => cntkio::CtfInput {
            path: a.input.clone(),
            schema: read_header(h, a.read.precision.as_deref())?,
            options: a.read.options(),
        },
        None => a.read.ctf_input(&a.input)?,
    };
    input.options.chunk_size = a.read.chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE);
    let access = a.read.access_mapped_by_default();
    if access != Access::Read {
        // A mapped input truncated meanwhile raises SIGBUS, which the binary's handler explains.
        signals::prepare_for_maps(Task::Conversion, &[(&a.input, a.read.no_map_hint())]);
        signals::reading_mapped(Some(0));
    }
    Ok((input, access))
}

/// Runs a conversion into `output`, during which the binary's signal handlers remove its temporary file
/// and say what happened (see `signals`).
fn converting<T>(output: &Path, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    signals::begin_conversion(output);
    let r = f();
    signals::end_conversion();
    signals::reading_mapped(None);
    r
}

/// Reads a `ctf2bin.py` header file: one line per stream, `name alias dense|sparse dim`.
pub fn read_header(path: &Path, precision: Option<&str>) -> Result<Schema, Error> {
    let t = match precision {
        None => ElementType::F32,
        Some(p) => crate::resolve::precision(p)?,
    };
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    let mut streams = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let err = |m: &str| {
            let mut e = Error::option("--header", format!("{m}; expected `name alias dense|sparse dim`"));
            let p = e.position_mut();
            p.path = Some(path.display().to_string());
            p.line = Some(n as u64 + 1);
            e
        };
        if f.len() != 4 {
            return Err(err(&format!("{} fields", f.len())));
        }
        let format = match f[2].to_ascii_lowercase().as_str() {
            "dense" => StorageFormat::Dense,
            "sparse" => StorageFormat::Sparse,
            other => return Err(err(&format!("unknown storage {other:?}"))),
        };
        let dim: usize = f[3].parse().map_err(|_| err(&format!("dim {:?} is not a number", f[3])))?;
        streams.push(StreamSpec::new(f[0], dim, format).alias(f[1]).element_type(t));
    }
    Schema::new(streams)
}
