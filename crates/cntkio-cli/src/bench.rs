//! `cntkio bench`: index and parse throughput.

use crate::args::BenchArgs;
use crate::EXIT_OK;
use cntkio::ctf::{index_config, index_streaming, scan_file, ScanOptions};
use cntkio::{Error, InputFile, InputSpec, StoredInput};
use cntkio_core::ctf::parse::vector_paths;
use serde_json::json;
use std::ops::ControlFlow;
use std::time::Instant;

/// Runs `bench`.
pub fn run(a: &BenchArgs, quiet: bool) -> Result<u8, Error> {
    let jobs = a.read.jobs(&a.files)?;
    let threads = a.read.threads();
    let mut reports = Vec::new();
    for job in &jobs {
        let input = match job {
            InputSpec::Cbf(StoredInput { path, .. }) => {
                let mapped = a.read.cbf_mapped();
                let r = crate::cbf_cmds::bench(path, mapped, threads, a.repeat)?;
                let (secs, bytes, samples) = (r.best_secs, r.bytes, r.samples);
                let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                if a.json {
                    reports.push(json!({
                        "path": path.display().to_string(), "format": "cbf", "bytes": len, "threads": threads,
                        "mmap": mapped,
                        "decode_seconds": secs, "decoded_bytes": bytes, "decoded_gb_per_s": bytes as f64 / secs / 1e9,
                        "file_gb_per_s": len as f64 / secs / 1e9, "samples": samples, "samples_per_s": samples as f64 / secs,
                        "first_pass_seconds": r.first_secs, "first_pass_decoded_gb_per_s": bytes as f64 / r.first_secs / 1e9,
                    }));
                } else {
                    out!(
                        "{}: CBF, {:.1} MB, {} thread(s){}",
                        path.display(),
                        len as f64 / 1e6,
                        threads,
                        if mapped { ", mmap" } else { "" }
                    )?;
                    out!(
                        "  decode  {:.2} GB/s of decoded data ({:.2} GB/s of file, {:.3} s)  {:.2} M samples/s",
                        bytes as f64 / secs / 1e9,
                        len as f64 / secs / 1e9,
                        secs,
                        samples as f64 / secs / 1e6
                    )?;
                    if !quiet {
                        out!(
                            "  {bytes} bytes decoded (values, indices, offsets) per pass; best of {}; the first pass \
                             (fresh buffers) {:.2} GB/s ({:.3} s)",
                            a.repeat.max(1),
                            bytes as f64 / r.first_secs / 1e9,
                            r.first_secs
                        )?;
                    }
                }
                continue;
            }
            InputSpec::Arrow(StoredInput { path, .. }) => {
                return Err(Error::option_value(
                    "FILE",
                    path.display().to_string(),
                    "is a Parquet or Arrow IPC file; bench measures the CTF and CBF readers",
                ))
            }
            InputSpec::Ctf(input) => input,
        };
        let (path, schema, opts) = (&input.path, &input.schema, &input.options);
        let file = InputFile::open(path, a.read.access())?;
        let bytes = file.len() as f64;
        let cfg = index_config(schema, opts);
        let mut best_index = f64::INFINITY;
        let mut best_parse = f64::INFINITY;
        let (mut sequences, mut samples, mut values) = (0u64, 0u64, 0u64);
        for _ in 0..a.repeat.max(1) {
            let t = Instant::now();
            index_streaming(&file, &cfg, threads, |_| Ok(()), &mut |_| {})?;
            best_index = best_index.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let (mut sq, mut sm, mut vl) = (0u64, 0u64, 0u64);
            scan_file(
                &file,
                schema,
                opts,
                &ScanOptions { threads, ..ScanOptions::default() },
                |p| {
                    sq += p.data.num_sequences() as u64;
                    sm += p.data.num_samples.iter().map(u64::from).sum::<u64>();
                    vl += p.data.streams.iter().map(|d| d.num_values() as u64).sum::<u64>();
                    Ok(ControlFlow::Continue(()))
                },
                &mut |_| {},
            )?;
            best_parse = best_parse.min(t.elapsed().as_secs_f64());
            (sequences, samples, values) = (sq, sm, vl);
        }
        let mbs = |s: f64| bytes / s / 1e6;
        if a.json {
            reports.push(json!({
                "path": path.display().to_string(), "bytes": file.len(), "threads": threads,
                "mmap": file.is_mapped(), "vector_paths": vector_paths(),
                "index_seconds": best_index, "index_mb_per_s": mbs(best_index),
                "parse_seconds": best_parse, "parse_mb_per_s": mbs(best_parse),
                "sequences": sequences, "samples": samples, "values": values,
                "samples_per_s": samples as f64 / best_parse,
            }));
        } else {
            out!(
                "{}: {:.1} MB, {} thread(s){}{}",
                path.display(),
                bytes / 1e6,
                threads,
                if file.is_mapped() { ", mmap" } else { "" },
                vector_paths().map(|v| format!(", {v}")).unwrap_or_default()
            )?;
            out!("  index          {:>9.1} MB/s  ({:.3} s)", mbs(best_index), best_index)?;
            out!(
                "  index + parse  {:>9.1} MB/s  ({:.3} s)  {:.2} M samples/s  {:.1} M values/s",
                mbs(best_parse),
                best_parse,
                samples as f64 / best_parse / 1e6,
                values as f64 / best_parse / 1e6
            )?;
            if !quiet {
                out!("  {sequences} sequences, {samples} samples, {values} values (best of {})", a.repeat.max(1))?;
            }
        }
    }
    if a.json {
        out!("{}", serde_json::to_string_pretty(&json!({"version": 1, "results": reports})).expect("json"))?;
    }
    Ok(EXIT_OK)
}
