//! `cntkio inspect`: what a CTF file holds, without a schema.

use crate::args::InspectArgs;
use crate::output::Progress;
use crate::EXIT_OK;
use cntkio::ctf::{index_streaming, IndexConfig, IndexMode};
use cntkio::{Access, Error, InputFile};
use cntkio_core::ctf::infer::Inferrer;
use serde_json::json;

/// Runs `inspect`.
pub fn run(a: &InspectArgs, quiet: bool) -> Result<u8, Error> {
    if cntkio::convert::detect_format(&a.file)? == cntkio::convert::Format::Cbf {
        crate::cbf_cmds::inspect(&a.file, a.json)?;
        return Ok(EXIT_OK);
    }
    let file = InputFile::open(&a.file, Access::Read)?;
    let progress = Progress::bytes(file.len(), "inspecting", quiet);
    let cfg = IndexConfig { skip_sequence_ids: a.skip_sequence_ids, main_alias: None, chunk_size: 32 << 20 };
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
    let n = lengths.len();
    let q = |f: f64| -> u32 { lengths.get(((n as f64 - 1.0) * f).round() as usize).copied().unwrap_or(0) };
    let mean = if n > 0 { lengths.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64 } else { 0.0 };
    let mut hist: Vec<(u32, u64)> = Vec::new();
    for &l in &lengths {
        let upper = l.next_power_of_two();
        match hist.last_mut() {
            Some((u, c)) if *u == upper => *c += 1,
            _ => hist.push((upper, 1)),
        }
    }
    let mode_name = match mode {
        IndexMode::Ids => "ids",
        IndexMode::Lines => "lines",
    };
    if a.json {
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
        let report = json!({
            "version": 1,
            "path": a.file.display().to_string(),
            "format": "ctf",
            "bytes": file.len(),
            "mode": mode_name,
            "chunks_at_32MiB": chunks,
            "sequences": n,
            "rows": inf.rows,
            "empty_rows": inf.empty_rows,
            "comments": inf.comments,
            "sequence_length": {
                "unit": "rows",
                "min": q(0.0), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": q(1.0), "mean": mean,
                "histogram": hist.iter().map(|(u, c)| json!({"up_to": u, "sequences": c})).collect::<Vec<_>>(),
            },
            "streams": streams,
        });
        out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
        return Ok(EXIT_OK);
    }
    out!("{}: CTF, {} bytes", a.file.display(), file.len())?;
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
