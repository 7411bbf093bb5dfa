//! `cntkio validate`: the library's [`cntkio::validate`] rendered as text or JSON.

use crate::args::ValidateArgs;
use crate::output::Progress;
use crate::render::render;
use crate::signals::{self, Task};
use crate::{EXIT_INVALID, EXIT_OK};
use cntkio::cbf::CbfOptions;
use cntkio::validate::{validate_arrow, validate_cbf, validate_ctf, Finding, ValidateOptions};
use cntkio::{Error, InputFile};
use serde_json::json;
use std::path::Path;

/// Runs `validate` on every file; exit 1 if any is invalid.
pub fn run(a: &ValidateArgs, quiet: bool) -> Result<u8, Error> {
    // Without a schema, a CTF file is checked with the one its rows suggest.
    let (jobs, inferred) = match a.read.jobs(&a.files) {
        Err(e) if matches!(e.kind(), cntkio::ErrorKind::NoStreams) => (a.read.inferred_jobs(&a.files)?, true),
        r => (r?, false),
    };
    let mut reports = Vec::new();
    let mut any_invalid = false;
    let vo = ValidateOptions { threads: a.read.threads(), limit: a.limit, warnings: a.warnings, cancel: None };
    // CTF inputs are mapped unless --no-mmap: a file truncated meanwhile raises SIGBUS, which the binary's
    // handler explains.
    let access = a.read.access_mapped_by_default(a.no_mmap);
    let inputs: Vec<(&Path, &str)> = jobs
        .iter()
        .map(|j| match j {
            crate::args::Job::Cbf(p) | crate::args::Job::Arrow(p) => (p.as_path(), "leave out --mmap"),
            crate::args::Job::Ctf(i) => (i.path.as_path(), a.read.no_map_hint()),
        })
        .collect();
    signals::prepare_for_maps(Task::Validation, &inputs);
    for (i, job) in jobs.iter().enumerate() {
        let input = match job {
            crate::args::Job::Cbf(path) => {
                let progress =
                    Progress::bytes(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0), "validating", quiet);
                signals::reading_mapped(a.read.mmap.then_some(i));
                let r = validate_cbf(path, &CbfOptions::default().mmap(a.read.mmap), &vo, &mut |b| progress.set(b));
                signals::reading_mapped(None);
                progress.finish();
                let r = r?;
                // A file that cannot be read is reported without what was found before the failure.
                let (sequences, samples, problems) = match &r.fatal {
                    None => (r.sequences, r.samples, &r.problems[..]),
                    Some(_) => (0, 0, &[][..]),
                };
                let errors = problems.iter().filter(|p| p.fatal).count() as u64 + u64::from(r.fatal.is_some());
                let valid = errors == 0;
                any_invalid |= !valid;
                let shown: Vec<&Error> =
                    r.fatal.iter().chain(problems.iter().map(|p| &p.error)).take(a.limit).collect();
                if a.json {
                    reports.push(json!({
                        "path": path.display().to_string(), "format": "cbf", "valid": valid,
                        "sequences": sequences, "samples": samples, "errors": errors,
                        "warnings": problems.iter().filter(|p| !p.fatal).count(),
                        "shown": shown.iter().map(|e| error_json(e)).collect::<Vec<_>>(),
                    }));
                } else {
                    for e in &shown {
                        eprint!("{}", render(e));
                    }
                    if !quiet || !valid {
                        eprintln!(
                            "{}: CBF, {sequences} sequences, {samples} samples; {errors} error(s): {}",
                            path.display(),
                            if valid { "valid" } else { "invalid: CNTK cannot read this file" }
                        );
                    }
                }
                continue;
            }
            crate::args::Job::Arrow(path) => {
                let progress = Progress::bytes(0, "validating", quiet);
                let r = validate_arrow(path, &vo, &mut |k| progress.set(k));
                progress.finish();
                let r = r?;
                let valid = r.valid();
                any_invalid |= !valid;
                let format = r.format.name();
                if a.json {
                    reports.push(json!({
                        "path": path.display().to_string(), "format": format, "valid": valid,
                        "sequences": r.sequences, "samples": r.samples, "errors": r.total_errors(), "warnings": 0,
                        "shown": r.fatal.iter().map(error_json).collect::<Vec<_>>(),
                    }));
                } else {
                    if let Some(e) = &r.fatal {
                        eprint!("{}", render(e));
                    }
                    if !quiet || !valid {
                        eprintln!(
                            "{}: {}, {} sequences, {} samples; {} error(s): {}",
                            path.display(),
                            if r.format == cntkio::convert::Format::Parquet { "Parquet" } else { "Arrow IPC" },
                            r.sequences,
                            r.samples,
                            r.total_errors(),
                            if valid { "valid" } else { "invalid: the file cannot be read" }
                        );
                    }
                }
                continue;
            }
            crate::args::Job::Ctf(input) => input,
        };
        let (path, schema, opts) = (&input.path, &input.schema, &input.options);
        if inferred && !quiet && !a.json {
            let flags: Vec<String> = schema.streams().iter().map(|s| format!("--stream {}", stream_flag(s))).collect();
            eprintln!(
                "{}: no schema given; checking with the one its rows suggest: {}",
                path.display(),
                flags.join(" ")
            );
        }
        let file = InputFile::open(path, access)?;
        signals::reading_mapped(file.is_mapped().then_some(i));
        let progress = Progress::bytes(file.len(), "validating", quiet);
        // Errors are printed as they are found (warnings while no more than --limit errors were).
        let mut shown = 0usize;
        let mut print = |f: Finding<'_>| match f {
            Finding::Error(e) if shown < a.limit => {
                shown += 1;
                if !a.json {
                    progress.finish();
                    eprint!("{}", render(e));
                }
            }
            Finding::Warning(w, pos) if !a.json && shown < a.limit => eprintln!("{pos}: warning[{}]: {w}", w.code()),
            _ => {}
        };
        let r = validate_ctf(&file, schema, opts, &vo, &mut |b| progress.set(b), &mut print);
        signals::reading_mapped(None);
        progress.finish();
        let r = r?;
        let mut shown_json: Vec<serde_json::Value> = r.shown.iter().map(error_json).collect();
        if let Some(e) = &r.fatal {
            if shown < a.limit {
                shown += 1;
                if a.json {
                    shown_json.push(error_json(e));
                } else {
                    eprint!("{}", render(e));
                }
            }
        }
        let valid = r.valid();
        any_invalid |= !valid;
        let verdict = r.verdict();
        let total = r.total_errors();
        if a.json {
            reports.push(json!({
                "path": path.display().to_string(),
                "format": "ctf",
                "schema_inferred": inferred,
                "schema": schema.streams().iter().map(stream_flag).collect::<Vec<_>>(),
                "valid": valid,
                "verdict": verdict,
                "sequences": r.sequences,
                "samples": r.samples,
                "stream_samples": schema.streams().iter().zip(&r.stream_samples).map(|(s, n)| (s.name.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "errors": total,
                "dropped_sequences": r.dropped,
                "warnings": r.warnings,
                "max_errors": opts.max_errors,
                "missing_inputs": r.missing_inputs().iter().map(|m| json!({
                    "stream": m.stream, "alias": m.alias, "suggestion": m.suggestion,
                    "found": m.found.iter().map(|(n, c)| json!({"name": n, "samples": c})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "warning_notes": r.warning_notes().iter().map(|n| json!({
                    "code": n.code, "count": n.count, "text": n.text,
                })).collect::<Vec<_>>(),
                "shown": shown_json,
            }));
        } else if !quiet || !valid {
            let more = total.saturating_sub(shown as u64);
            if more > 0 {
                eprintln!("… and {more} more error(s) not shown (raise --limit to see them)");
            }
            for m in r.missing_inputs() {
                eprintln!("{}: {m}", path.display());
            }
            let lists = if a.warnings { "" } else { " (--warnings lists them)" };
            for n in r.warning_notes() {
                eprintln!("{}: note[{}]: {}{lists}", path.display(), n.code, n.text);
            }
            eprintln!(
                "{}: {} sequences, {} samples; {} error(s){}: {}",
                path.display(),
                r.sequences,
                r.samples,
                total,
                if r.warnings > 0 { format!(", {} warning(s)", r.warnings) } else { String::new() },
                verdict
            );
        }
    }
    if a.json {
        out!("{}", serde_json::to_string_pretty(&json!({ "version": 1, "files": reports })).expect("json"))?;
    }
    Ok(if any_invalid { EXIT_INVALID } else { EXIT_OK })
}

/// One error as JSON.
pub fn error_json(e: &Error) -> serde_json::Value {
    let p = e.position();
    json!({
        "code": e.code(),
        "message": e.kind().to_string(),
        "path": p.path,
        "line": p.line,
        "column": p.column,
        "byte": p.byte,
        "sequence": p.sequence_id,
    })
}

/// A stream as `--stream` writes it: `NAME:DIM:dense|sparse[:ALIAS]`.
fn stream_flag(s: &cntkio::StreamSpec) -> String {
    let alias = if s.alias == s.name { String::new() } else { format!(":{}", s.alias) };
    format!("{}:{}:{}{alias}", s.name, s.dim, s.format.name())
}
