//! `cntkio inspect`: what a file holds, without a schema ([`cntkio::inspect`]'s report, as text or JSON).

use crate::args::InspectArgs;
use crate::output::Progress;
use crate::EXIT_OK;
use cntkio::convert::{detect_format, Format};
use cntkio::ctf::IndexMode;
use cntkio::inspect::ValueRange;
use cntkio::inspect::{
    inspect_arrow, inspect_cbf, inspect_ctf, ArrowReport, CbfLengths, CbfReport, CbfStream, CtfReport,
};
use cntkio::validate::stream_arg;
use cntkio::{Access, Error, InputFile, StreamSpec};
use std::path::Path;

/// Runs `inspect`.
pub fn run(a: &InspectArgs, quiet: bool) -> Result<u8, Error> {
    let format = detect_format(&a.file)?;
    if matches!(format, Format::Parquet | Format::ArrowIpc) {
        let report = inspect_arrow(&a.file)?;
        if a.json {
            out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
        } else {
            arrow_text(&a.file, &report)?;
        }
        return Ok(EXIT_OK);
    }
    if format == Format::Cbf {
        let report = inspect_cbf(&a.file)?;
        if a.json {
            out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
        } else {
            cbf_text(&a.file, &report)?;
        }
        return Ok(EXIT_OK);
    }
    let file = InputFile::open(&a.file, Access::Read)?;
    let progress = Progress::bytes(file.known_len().unwrap_or(0), "inspecting", quiet);
    let report = inspect_ctf(&file, a.skip_sequence_ids, &mut |b| progress.set(b));
    progress.finish();
    let report = report?;
    if a.json {
        out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
    } else {
        ctf_text(&a.file, &report)?;
    }
    Ok(EXIT_OK)
}

/// What the text report adds to quantiles that are not exact.
fn approximate(exact: bool) -> &'static str {
    if exact {
        ""
    } else {
        " (quantiles within 0.8 %: more than 65,536 distinct lengths of 4,096 or more)"
    }
}

fn ctf_text(path: &Path, r: &CtfReport) -> Result<(), Error> {
    let l = &r.sequence_length;
    out!("{}: CTF, {} bytes", path.display(), r.bytes)?;
    out!(
        "  sequences  {} ({})   rows {}   blank or comment-only rows {}   comments {}",
        r.sequences,
        if r.mode == IndexMode::Ids { "grouped by sequence id" } else { "one per line" },
        r.rows,
        r.empty_rows,
        r.comments
    )?;
    out!(
        "  sequence length (rows): min {}, median {}, p90 {}, p99 {}, max {}, mean {:.2}{}",
        l.min,
        l.p50,
        l.p90,
        l.p99,
        l.max,
        l.mean,
        approximate(l.exact)
    )?;
    let hist: Vec<String> = l.histogram.iter().map(|c| format!("≤{}: {}", c.up_to, c.sequences)).collect();
    out!("  histogram: {}", hist.join(", "))?;
    out!("  streams (by the name written after '|'):")?;
    let mut flags = Vec::new();
    for s in &r.streams {
        let empty = if s.empty_samples > 0 { format!(", {} empty samples", s.empty_samples) } else { String::new() };
        match (s.nnz, s.values_per_sample) {
            (Some(nnz), _) => out!(
                "    {:<12} sparse  dim ≥ {:<8} samples {:<10} nnz {:<10} in {} sequences (≤ {} per sequence){}",
                s.alias,
                s.min_dim,
                s.samples,
                nnz,
                s.sequences,
                s.max_samples_per_sequence,
                empty
            )?,
            (None, values) => {
                let v = values.unwrap_or(ValueRange { max: 0, min: 0 });
                out!(
                    "    {:<12} dense   dim ≥ {:<8} samples {:<10} values {}–{} in {} sequences (≤ {} per sequence){}",
                    s.alias,
                    s.min_dim,
                    s.samples,
                    v.min,
                    v.max,
                    s.sequences,
                    s.max_samples_per_sequence,
                    empty
                )?
            }
        }
        let dim = usize::try_from(s.min_dim).unwrap_or(usize::MAX);
        flags.push(stream_arg(&StreamSpec::new(&s.alias, dim, s.storage)));
    }
    out!("  a schema that fits (dims are lower bounds; use your model's): {}", flags.join(" "))?;
    Ok(())
}

fn cbf_text(path: &Path, r: &CbfReport) -> Result<(), Error> {
    let l = &r.sequence_length;
    out!("{}: CBF version {}, {} bytes, header at byte {}", path.display(), r.cbf_version, r.bytes, r.header_offset)?;
    summary_text(r.sequences, r.samples, "chunks", r.chunks.len(), l, &r.streams)?;
    out!("  chunks:")?;
    for (k, c) in r.chunks.iter().enumerate().take(20) {
        // No widths on the chunk's numbers: the text of version 1 printed them unpadded.
        out!("    {k:<5} at byte {} {} bytes  {} sequences  {} samples", c.offset, c.bytes, c.sequences, c.samples)?;
    }
    if r.chunks.len() > 20 {
        out!("    … {} more (see --json)", r.chunks.len() - 20)?;
    }
    Ok(())
}

fn arrow_text(path: &Path, r: &ArrowReport) -> Result<(), Error> {
    let l = &r.sequence_length;
    let (format, chunk) =
        if r.format == Format::Parquet { ("Parquet", "row group") } else { ("Arrow IPC", "record batch") };
    out!(
        "{}: {format} in cntkio's Arrow mapping version {}, {} bytes, a row per {}",
        path.display(),
        r.mapping_version,
        r.bytes,
        if r.rows == cntkio::arrow::Rows::Sequences { "sequence" } else { "sample" }
    )?;
    summary_text(r.sequences, r.samples, &format!("{chunk}s"), r.chunks.len(), l, &r.streams)?;
    Ok(())
}

/// The counts, sequence lengths and streams of a CBF, Parquet or Arrow IPC file.
fn summary_text(
    sequences: u64,
    samples: u64,
    chunks: &str,
    num_chunks: usize,
    l: &CbfLengths,
    streams: &[CbfStream],
) -> Result<(), Error> {
    out!(
        "  sequences {sequences}   samples {samples}   {chunks} {num_chunks}   sequence length: min {}, median {}, p90 {}, max {}{}",
        l.min,
        l.p50,
        l.p90,
        l.max,
        approximate(l.exact)
    )?;
    out!("  streams:")?;
    for s in streams {
        out!(
            "    {:<14} {:<6} {:<6} dim {:<9} samples {:<10}{}",
            s.name,
            s.storage.name(),
            s.element_type.cntk_name(),
            s.dim,
            s.samples,
            s.nnz.map_or(String::new(), |nnz| format!(" nnz {nnz}"))
        )?;
    }
    Ok(())
}
