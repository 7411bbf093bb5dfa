//! `cntkio validate`.

use crate::args::ValidateArgs;
use crate::output::Progress;
use crate::render::render;
use crate::{EXIT_INVALID, EXIT_OK};
use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::{Error, InputFile};
use serde_json::json;
use std::ops::ControlFlow;

/// Runs `validate` on every file; exit 1 if any is invalid.
pub fn run(a: &ValidateArgs, quiet: bool) -> Result<u8, Error> {
    let jobs = a.read.jobs(&a.files)?;
    let mut reports = Vec::new();
    let mut any_invalid = false;
    for job in &jobs {
        let input = match job {
            crate::args::Job::Cbf(path) => {
                let progress =
                    Progress::bytes(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0), "validating", quiet);
                let r = crate::cbf_cmds::check(path, a.read.mmap, &progress);
                progress.finish();
                let (sequences, samples, findings, fatal) = match r {
                    Ok((q, s, f)) => (q, s, f, None),
                    Err(e) if e.is_io() => return Err(e),
                    Err(e) => (0, 0, Vec::new(), Some(e.with_path(path.display().to_string()))),
                };
                let errors = findings.iter().filter(|f| f.fatal).count() as u64 + u64::from(fatal.is_some());
                let valid = errors == 0;
                any_invalid |= !valid;
                let shown: Vec<Error> = fatal
                    .into_iter()
                    .chain(findings.iter().map(|f| crate::cbf_cmds::finding_error(path, f)))
                    .take(a.limit)
                    .collect();
                if a.json {
                    reports.push(json!({
                        "path": path.display().to_string(), "format": "cbf", "valid": valid,
                        "sequences": sequences, "samples": samples, "errors": errors,
                        "warnings": findings.iter().filter(|f| !f.fatal).count(),
                        "shown": shown.iter().map(error_json).collect::<Vec<_>>(),
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
            crate::args::Job::Ctf(input) => input,
        };
        let (path, schema, opts) = (&input.path, &input.schema, &input.options);
        let file = InputFile::open(path, a.read.access())?;
        let progress = Progress::bytes(file.len(), "validating", quiet);
        let scan = ScanOptions {
            threads: a.read.threads(),
            enforce_max_errors: false,
            keep: a.limit,
            warnings: a.warnings,
            skip_bad_sequences: true,
        };
        let mut shown = 0usize;
        let (mut sequences, mut samples, mut errors, mut dropped, mut warnings) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut stream_samples = vec![0u64; schema.len()];
        let mut shown_json = Vec::new();
        let mut show = |e: &Error, shown: &mut usize| {
            if *shown < a.limit {
                *shown += 1;
                if a.json {
                    shown_json.push(error_json(e));
                } else {
                    progress.finish();
                    eprint!("{}", render(e));
                }
            }
        };
        let r = scan_file(
            &file,
            schema,
            opts,
            &scan,
            |p| {
                sequences += p.data.num_sequences() as u64;
                samples += p.data.num_samples.iter().map(|&n| u64::from(n)).sum::<u64>();
                for (t, d) in stream_samples.iter_mut().zip(&p.data.streams) {
                    *t += d.num_samples();
                }
                errors += p.num_errors;
                dropped += p.num_dropped;
                warnings += p.num_warnings;
                for e in &p.errors {
                    show(e, &mut shown);
                }
                if !a.json && shown < a.limit {
                    for (w, pos) in &p.warnings {
                        eprintln!("{pos}: warning[{}]: {w}", w.code());
                    }
                }
                Ok(ControlFlow::Continue(()))
            },
            &mut |b| progress.set(b),
        );
        progress.finish();
        let fatal = match r {
            Ok(_) => None,
            Err(e) if e.is_io() => return Err(e),
            Err(e) => Some(e),
        };
        if let Some(e) = &fatal {
            show(e, &mut shown);
        }
        let tolerated = errors <= opts.max_errors;
        let empty = fatal.is_none() && sequences == 0 && dropped == 0;
        let valid = fatal.is_none() && dropped == 0 && tolerated && !empty;
        any_invalid |= !valid;
        let verdict = if valid && errors == 0 {
            "valid".to_string()
        } else if valid {
            format!("readable: {errors} error(s) tolerated by maxErrors = {}", opts.max_errors)
        } else if fatal.is_some() {
            "invalid: the file cannot be read".to_string()
        } else if empty {
            match schema.main_stream() {
                Some(m) => format!(
                    "invalid: no sequence found: no row mentions |{} (the definesMBSize stream); check the alias",
                    schema.streams()[m].alias
                ),
                None => "invalid: no sequence found".to_string(),
            }
        } else if dropped > 0 {
            format!("invalid: {dropped} sequence(s) lack a configured stream (always fatal in CNTK)")
        } else {
            format!("invalid: {errors} error(s), more than maxErrors = {}", opts.max_errors)
        };
        if a.json {
            reports.push(json!({
                "path": path.display().to_string(),
                "format": "ctf",
                "valid": valid,
                "verdict": verdict,
                "sequences": sequences,
                "samples": samples,
                "stream_samples": schema.streams().iter().zip(&stream_samples).map(|(s, n)| (s.name.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "errors": errors + dropped + u64::from(fatal.is_some()),
                "dropped_sequences": dropped,
                "warnings": warnings,
                "max_errors": opts.max_errors,
                "shown": shown_json,
            }));
        } else if !quiet || !valid {
            let more = (errors + dropped + u64::from(fatal.is_some())).saturating_sub(shown as u64);
            if more > 0 {
                eprintln!("… and {more} more error(s) not shown (raise --limit to see them)");
            }
            eprintln!(
                "{}: {} sequences, {} samples; {} error(s){}: {}",
                path.display(),
                sequences,
                samples,
                errors + dropped + u64::from(fatal.is_some()),
                if warnings > 0 { format!(", {warnings} warning(s)") } else { String::new() },
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
