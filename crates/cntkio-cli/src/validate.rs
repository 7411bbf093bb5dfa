//! `cntkio validate`: the library's [`cntkio::validate`] rendered as text or JSON.

use crate::args::ValidateArgs;
use crate::output::Progress;
use crate::render::render;
use crate::signals::{self, Task};
use crate::{EXIT_INVALID, EXIT_OK};
use cntkio::validate::{
    stream_arg, validate_arrow, validate_cbf, validate_ctf, Finding, Summary, SummaryOptions, ValidateOptions,
    SHAPE_VERSION,
};
use cntkio::{Error, InputFile, InputSpec, StoredInput};
use serde_json::json;
use std::path::Path;

/// Runs `validate` on every file; exit 1 if any is invalid.
pub fn run(a: &ValidateArgs, quiet: bool) -> Result<u8, Error> {
    // Without a schema, a CTF file is checked with the one its rows suggest.
    let (jobs, inferred) = match a.read.jobs(&a.files) {
        Err(e) if matches!(e.kind(), cntkio::ErrorKind::NoStreams { .. }) => (a.read.inferred_jobs(&a.files)?, true),
        r => (r?, false),
    };
    let mut reports: Vec<Summary> = Vec::new();
    let mut any_invalid = false;
    let vo = ValidateOptions { threads: a.read.threads(), limit: a.limit, warnings: a.warnings, cancel: None };
    // CTF and CBF inputs are mapped unless --no-mmap: a CTF file truncated meanwhile raises SIGBUS, which the
    // binary's handler explains (a CBF map's guard turns it into an error).
    let access = a.read.access_mapped_by_default();
    let cbf_mapped = a.read.cbf_mapped();
    let inputs: Vec<(&Path, &str)> = jobs
        .iter()
        .map(|j| match j {
            InputSpec::Cbf(s) if cbf_mapped => (s.path.as_path(), "pass --no-mmap"),
            InputSpec::Cbf(s) | InputSpec::Arrow(s) => (s.path.as_path(), "leave out --mmap"),
            InputSpec::Ctf(i) => (i.path.as_path(), a.read.no_map_hint()),
        })
        .collect();
    signals::prepare_for_maps(Task::Validation, &inputs);
    for (i, job) in jobs.iter().enumerate() {
        let input = match job {
            InputSpec::Cbf(StoredInput { path, options, .. }) => {
                let progress =
                    Progress::bytes(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0), "validating", quiet);
                signals::reading_mapped(cbf_mapped.then_some(i));
                let r = validate_cbf(path, &options.clone().mmap(cbf_mapped), &vo, &mut |b| progress.set(b));
                signals::reading_mapped(None);
                progress.finish();
                let r = r?;
                let summary = r.summary(&SummaryOptions { schema: None, schema_inferred: false, limit: a.limit });
                any_invalid |= !summary.valid;
                if a.json {
                    reports.push(summary);
                } else {
                    // A file that cannot be read is reported without what was found before the failure.
                    let shown = r.fatal.iter().chain(r.problems.iter().filter(|_| r.fatal.is_none()).map(|p| &p.error));
                    for e in shown.take(a.limit) {
                        eprint!("{}", render(e));
                    }
                    if !quiet || !summary.valid {
                        eprintln!(
                            "{}: CBF, {} sequences, {} samples; {} error(s): {}",
                            path.display(),
                            summary.sequences,
                            summary.samples,
                            summary.num_errors,
                            if summary.valid { "valid" } else { "invalid: CNTK cannot read this file" }
                        );
                    }
                }
                continue;
            }
            InputSpec::Arrow(StoredInput { path, .. }) => {
                let progress = Progress::bytes(0, "validating", quiet);
                let r = validate_arrow(path, &vo, &mut |k| progress.set(k));
                progress.finish();
                let r = r?;
                let summary = r.summary(&SummaryOptions { schema: None, schema_inferred: false, limit: a.limit });
                any_invalid |= !summary.valid;
                if a.json {
                    reports.push(summary);
                } else {
                    if let Some(e) = &r.fatal {
                        eprint!("{}", render(e));
                    }
                    if !quiet || !summary.valid {
                        eprintln!(
                            "{}: {}, {} sequences, {} samples; {} error(s): {}",
                            path.display(),
                            if r.format == cntkio::convert::Format::Parquet { "Parquet" } else { "Arrow IPC" },
                            summary.sequences,
                            summary.samples,
                            summary.num_errors,
                            if summary.valid { "valid" } else { "invalid: the file cannot be read" }
                        );
                    }
                }
                continue;
            }
            InputSpec::Ctf(input) => input,
        };
        let (path, schema, opts) = (&input.path, &input.schema, &input.options);
        if inferred && !quiet && !a.json {
            let flags: Vec<String> = schema.streams().iter().map(stream_arg).collect();
            eprintln!(
                "{}: no schema given; checking with the one its rows suggest: {}",
                path.display(),
                flags.join(" ")
            );
        }
        let file = InputFile::open(path, access)?;
        signals::reading_mapped(file.is_mapped().then_some(i));
        let progress = Progress::bytes(file.known_len().unwrap_or(0), "validating", quiet);
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
        if let Some(e) = r.fatal.as_ref().filter(|_| shown < a.limit) {
            shown += 1;
            if !a.json {
                eprint!("{}", render(e));
            }
        }
        let summary = r.summary(&SummaryOptions { schema: Some(schema), schema_inferred: inferred, limit: a.limit });
        any_invalid |= !summary.valid;
        if a.json {
            reports.push(summary);
        } else if !quiet || !summary.valid {
            let more = summary.num_errors.saturating_sub(shown as u64);
            if more > 0 {
                eprintln!("… and {more} more error(s) not shown (raise --limit to see them)");
            }
            for m in &summary.missing_inputs {
                eprintln!("{}: {m}", path.display());
            }
            let lists = if a.warnings { "" } else { " (--warnings lists them)" };
            for n in &summary.warning_notes {
                eprintln!("{}: note[{}]: {}{lists}", path.display(), n.code, n.text);
            }
            eprintln!(
                "{}: {} sequences, {} samples; {} error(s){}: {}",
                path.display(),
                summary.sequences,
                summary.samples,
                summary.num_errors,
                if summary.num_warnings > 0 { format!(", {} warning(s)", summary.num_warnings) } else { String::new() },
                summary.verdict
            );
        }
    }
    if a.json {
        let doc = json!({ "version": SHAPE_VERSION, "files": reports });
        out!("{}", serde_json::to_string_pretty(&doc).expect("a summary is plain data"))?;
    }
    Ok(if any_invalid { EXIT_INVALID } else { EXIT_OK })
}
