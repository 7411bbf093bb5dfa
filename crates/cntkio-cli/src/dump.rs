//! `cntkio dump`: JSON Lines, one object per sequence, in file order.

use crate::args::DumpArgs;
use crate::output::{push_dump_records, write_stdout, Progress};
use crate::EXIT_OK;
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::{Error, InputFile, InputSpec, StoredInput};
use std::io::Write;
use std::ops::ControlFlow;

/// Runs `dump`.
pub fn run(a: &DumpArgs, quiet: bool) -> Result<u8, Error> {
    let jobs = a.read.jobs(&a.files)?;
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut buf = ryu::Buffer::new();
    let mut out = Vec::with_capacity(1 << 20);
    for job in &jobs {
        let input = match job {
            InputSpec::Cbf(StoredInput { path, options, .. }) => {
                let progress = Progress::bytes(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0), "dumping", quiet);
                let r = crate::cbf_cmds::dump(path, &options.clone().mmap(a.read.cbf_mapped()), &mut w, &progress);
                progress.finish();
                w.flush().map_err(crate::output::stdout_error)?;
                r?;
                continue;
            }
            InputSpec::Arrow(StoredInput { path, .. }) => {
                let r = dump_arrow(path, &mut w, quiet);
                w.flush().map_err(crate::output::stdout_error)?;
                r?;
                continue;
            }
            InputSpec::Ctf(input) => input,
        };
        let (path, schema, opts) = (&input.path, &input.schema, &input.options);
        let file = InputFile::open(path, a.read.access())?;
        let progress = Progress::bytes(file.known_len().unwrap_or(0), "dumping", quiet);
        let scan = ScanOptions {
            threads: a.read.threads(),
            skip_bad_sequences: a.read.skip_bad_sequences,
            ..ScanOptions::default()
        };
        let r = scan_file(
            &file,
            schema,
            opts,
            &scan,
            |p| {
                out.clear();
                push_dump_records(&mut out, schema, &p.data, p.data.num_sequences(), &mut buf);
                write_stdout(&mut w, &out)?;
                Ok(ControlFlow::Continue(()))
            },
            &mut |b| progress.set(b),
        );
        progress.finish();
        // Records already written stay complete: flush them before reporting an error.
        w.flush().map_err(crate::output::stdout_error)?;
        r?;
    }
    Ok(EXIT_OK)
}

/// `dump` of a Parquet or Arrow IPC file: every sequence of every chunk, in file order.
fn dump_arrow(path: &std::path::Path, w: &mut impl Write, quiet: bool) -> Result<(), Error> {
    let f = cntkio::arrow::ArrowFile::open(path)?;
    let progress = Progress::bytes(f.chunk_count() as u64, "dumping", quiet);
    let mut data = cntkio::ChunkData::new(f.schema());
    let mut buf = ryu::Buffer::new();
    let mut out = Vec::with_capacity(1 << 20);
    for k in 0..f.chunk_count() {
        f.for_each_batch(k, &mut data, &mut |d| {
            out.clear();
            push_dump_records(&mut out, f.schema(), d, d.num_sequences(), &mut buf);
            write_stdout(w, &out)
        })?;
        progress.set(k as u64 + 1);
    }
    progress.finish();
    Ok(())
}
