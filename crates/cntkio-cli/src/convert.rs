//! `cntkio convert`: CTF → CBF and CBF → CTF, chosen by the input's magic number.

use crate::args::ConvertArgs;
use crate::output::Progress;
use crate::signals::{self, Task};
use crate::EXIT_OK;
use cntkio::cbf::{CbfOptions, CbfWriterOptions, EmptyStreams, MetaCounts};
use cntkio::convert::{cbf_to_ctf, ctf_to_cbf, detect_format, CbfToCtf, CtfToCbf, Format};
use cntkio::ctf::ScanOptions;
use cntkio::{Access, ElementType, Error, Schema, StorageFormat, StreamSpec};
use std::path::Path;
use std::time::Instant;

/// Runs `convert`.
pub fn run(a: &ConvertArgs, quiet: bool) -> Result<u8, Error> {
    let t = Instant::now();
    let in_len = std::fs::metadata(&a.input).map(|m| m.len()).unwrap_or(0);
    let progress = Progress::bytes(in_len, "converting", quiet);
    let (what, s) = match detect_format(&a.input)? {
        Format::Cbf => {
            // Aliases for the CTF text: from a header file or --stream flags, matched by stream name.
            let aliases: Vec<(String, String)> = match &a.header {
                Some(h) => read_header(h, None)?.streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect(),
                None if !a.read.streams.is_empty() => {
                    a.read.schema_and_options()?.0.streams().iter().map(|s| (s.name.clone(), s.alias.clone())).collect()
                }
                None => Vec::new(),
            };
            let opts = CbfOptions::default().mmap(a.read.mmap);
            if a.read.mmap {
                signals::prepare_for_maps(Task::Conversion, &[(&a.input, "leave out --mmap")]);
                signals::reading_mapped(Some(0));
            }
            let how = CbfToCtf { cbf: opts, aliases, threads: a.read.threads(), hooks: signals::hooks() };
            let s = converting(&a.output, || cbf_to_ctf(&a.input, &a.output, &how, &mut |b| progress.set(b)))?;
            ("CBF → CTF", s)
        }
        Format::Ctf => {
            let mut input = match &a.header {
                Some(h) => crate::args::Input {
                    path: a.input.clone(),
                    schema: read_header(h, a.read.precision.as_deref())?,
                    options: a.read.options(),
                },
                None => a.read.inputs(std::slice::from_ref(&a.input))?.remove(0),
            };
            let chunk_size = a.read.chunk_size.unwrap_or(cntkio::options::DEFAULT_CHUNK_SIZE);
            input.options.chunk_size = chunk_size;
            let mut writer = if a.ctf2bin_compatible {
                CbfWriterOptions::ctf2bin(chunk_size)
            } else {
                CbfWriterOptions::new(chunk_size)
            };
            if a.max_over_streams {
                writer.meta_counts = MetaCounts::MaxOverStreams;
            }
            if a.read.skip_bad_sequences {
                writer.empty_streams = EmptyStreams::Drop;
            }
            let how = CtfToCbf {
                ctf: input.options.clone(),
                writer,
                scan: ScanOptions {
                    threads: a.read.threads(),
                    skip_bad_sequences: a.read.skip_bad_sequences,
                    ..ScanOptions::default()
                },
                access: a.read.access_mapped_by_default(a.no_mmap),
                hooks: signals::hooks(),
            };
            if how.access != Access::Read {
                // A mapped input truncated meanwhile raises SIGBUS, which the binary's handler explains.
                signals::prepare_for_maps(Task::Conversion, &[(&a.input, a.read.no_map_hint())]);
                signals::reading_mapped(Some(0));
            }
            let s = converting(&a.output, || {
                ctf_to_cbf(&a.input, &a.output, &input.schema, &how, &mut |b| progress.set(b))
            })?;
            ("CTF → CBF", s)
        }
    };
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
        Some(p) => crate::args::precision(p)?,
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
