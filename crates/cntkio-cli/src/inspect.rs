//! `cntkio inspect`: what a CTF file holds, without a schema.

use crate::args::InspectArgs;
use crate::output::Progress;
use crate::EXIT_OK;
use cntkio::ctf::{index_streaming, IndexConfig, IndexMode};
use cntkio::{Access, Error, InputFile};
use cntkio_core::ctf::infer::Inferrer;
use serde_json::{json, Value};
use std::path::Path;

/// What one pass over a CTF file found.
struct CtfStats {
    len: u64,
    mode: IndexMode,
    inf: Inferrer,
    /// Sorted sequence lengths (rows).
    lengths: Vec<u32>,
    chunks: u64,
}

/// The report of `inspect --json` (CTF or CBF, told apart by the magic number), as a JSON value.
pub fn inspect_json(path: &Path, skip_sequence_ids: bool) -> Result<Value, Error> {
    if cntkio::convert::detect_format(path)? == cntkio::convert::Format::Cbf {
        return crate::cbf_cmds::inspect_report(path).map(|(report, _)| report);
    }
    let s = ctf_stats(path, skip_sequence_ids, true)?;
    Ok(ctf_json(path, &s))
}

fn ctf_stats(path: &Path, skip_sequence_ids: bool, quiet: bool) -> Result<CtfStats, Error> {
    let file = InputFile::open(path, Access::Read)?;
    let progress = Progress::bytes(file.len(), "inspecting", quiet);
    let cfg = IndexConfig { skip_sequence_ids, main_alias: None, chunk_size: 32 << 20 };
    let mut inf = Inferrer::new();
    let mut lengths: Vec<u32> = Vec::new();
    let mut chunks = 0u64;
    let mut buf = Vec::new();
    let mode = index_streaming(
        &file,
        &cfg,
        1,
        |c| {
            chunks += 1;
            file.with_bytes(c.offset, c.len_bytes as usize, &mut buf, |bytes| {
                for s in &c.sequences {
                    let a = (s.offset - c.offset) as usize;
                    inf.add_sequence(&bytes[a..a + s.len_bytes as usize]);
                    lengths.push(s.num_samples);
                }
            })
        },
        &mut |b| progress.set(b),
    );
    progress.finish();
    let mode = mode.map_err(|e| cntkio::ctf::locate_index_error(e, &file))?;
    lengths.sort_unstable();
    Ok(CtfStats { len: file.len(), mode, inf, lengths, chunks })
}

/// The power-of-two histogram of sorted lengths: (upper bound, count).
fn histogram(lengths: &[u32]) -> Vec<(u32, u64)> {
    let mut hist: Vec<(u32, u64)> = Vec::new();
    for &l in lengths {
        let upper = l.next_power_of_two();
        match hist.last_mut() {
            Some((u, c)) if *u == upper => *c += 1,
            _ => hist.push((upper, 1)),
        }
    }
    hist
}

fn quantile(lengths: &[u32], f: f64) -> u32 {
    lengths.get(((lengths.len() as f64 - 1.0) * f).round() as usize).copied().unwrap_or(0)
}

fn mean(lengths: &[u32]) -> f64 {
    let n = lengths.len();
    if n > 0 {
        lengths.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64
    } else {
        0.0
    }
}

fn ctf_json(path: &Path, st: &CtfStats) -> Value {
    let (inf, lengths) = (&st.inf, &st.lengths);
    let q = |f: f64| quantile(lengths, f);
    let hist = histogram(lengths);
    let mode_name = match st.mode {
        IndexMode::Ids => "ids",
        IndexMode::Lines => "lines",
    };
    let streams: Vec<_> = inf
        .streams
        .iter()
        .map(|s| {
            json!({
                "alias": s.alias,
                "storage": if s.is_sparse() { "sparse" } else { "dense" },
                "min_dim": s.min_dim(),
                "samples": s.samples(),
                "nnz": if s.is_sparse() { json!(s.nnz) } else { json!(null) },
                "max_index": s.max_index,
                "values_per_sample": if s.is_sparse() { json!(null) } else { json!({"min": if s.min_values == u64::MAX { 0 } else { s.min_values }, "max": s.max_values}) },
                "empty_samples": s.empty_samples,
                "sequences": s.sequences,
                "max_samples_per_sequence": s.max_per_sequence,
            })
        })
        .collect();
    json!({
        "version": 1,
        "path": path.display().to_string(),
        "format": "ctf",
        "bytes": st.len,
        "mode": mode_name,
        "chunks_at_32MiB": st.chunks,
        "sequences": lengths.len(),
        "rows": inf.rows,
        "empty_rows": inf.empty_rows,
        "comments": inf.comments,
        "sequence_length": {
            "unit": "rows",
            "min": q(0.0), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0), "mean": mean(lengths),
            "histogram": hist.iter().map(|(u, c)| json!({"up_to": u, "sequences": c})).collect::<Vec<_>>(),
        },
        "streams": streams,
    })
}

/// Runs `inspect`.
pub fn run(a: &InspectArgs, quiet: bool) -> Result<u8, Error> {
    if cntkio::convert::detect_format(&a.file)? == cntkio::convert::Format::Cbf {
        crate::cbf_cmds::inspect(&a.file, a.json)?;
        return Ok(EXIT_OK);
    }
    let st = ctf_stats(&a.file, a.skip_sequence_ids, quiet)?;
    if a.json {
        out!("{}", serde_json::to_string_pretty(&ctf_json(&a.file, &st)).expect("json"))?;
        return Ok(EXIT_OK);
    }
    let (inf, lengths, mode, n) = (&st.inf, &st.lengths, st.mode, st.lengths.len());
    let q = |f: f64| quantile(lengths, f);
    let mean = mean(lengths);
    let hist = histogram(lengths);
    let file_len = st.len;
    out!("{}: CTF, {} bytes", a.file.display(), file_len)?;
    out!(
        "  sequences  {n} ({})   rows {}   blank or comment-only rows {}   comments {}",
        if mode == IndexMode::Ids { "grouped by sequence id" } else { "one per line" },
        inf.rows,
        inf.empty_rows,
        inf.comments
    )?;
    out!(
        "  sequence length (rows): min {}, median {}, p90 {}, p99 {}, max {}, mean {:.2}",
        q(0.0),
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0),
        mean
    )?;
    out!("  histogram: {}", hist.iter().map(|(u, c)| format!("≤{u}: {c}")).collect::<Vec<_>>().join(", "))?;
    out!("  streams (by the name written after '|'):")?;
    let mut flags = Vec::new();
    for s in &inf.streams {
        if s.is_sparse() {
            out!(
                "    {:<12} sparse  dim ≥ {:<8} samples {:<10} nnz {:<10} in {} sequences (≤ {} per sequence){}",
                s.alias,
                s.min_dim(),
                s.samples(),
                s.nnz,
                s.sequences,
                s.max_per_sequence,
                if s.empty_samples > 0 { format!(", {} empty samples", s.empty_samples) } else { String::new() }
            )?;
        } else {
            out!(
                "    {:<12} dense   dim ≥ {:<8} samples {:<10} values {}–{} in {} sequences (≤ {} per sequence){}",
                s.alias,
                s.min_dim(),
                s.samples(),
                if s.min_values == u64::MAX { 0 } else { s.min_values },
                s.max_values,
                s.sequences,
                s.max_per_sequence,
                if s.empty_samples > 0 { format!(", {} empty samples", s.empty_samples) } else { String::new() }
            )?;
        }
        flags.push(format!("--stream {}:{}:{}", s.alias, s.min_dim(), if s.is_sparse() { "sparse" } else { "dense" }));
    }
    out!("  a schema that fits (dims are lower bounds; use your model's): {}", flags.join(" "))?;
    Ok(EXIT_OK)
}
