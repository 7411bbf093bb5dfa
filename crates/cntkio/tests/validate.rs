//! `cntkio::validate`: the verdicts, counts and findings the command line and Python render.

mod common;

use cntkio::cbf::CbfOptions;
use cntkio::convert::Format;
use cntkio::validate::{validate_cbf, validate_ctf, Finding, ValidateOptions};
use cntkio::{Access, CtfOptions, InputFile, Schema, StorageFormat, StreamSpec};
use std::path::Path;

fn schema() -> Schema {
    Schema::new(vec![
        StreamSpec::new("x", 2, StorageFormat::Dense),
        StreamSpec::new("y", 3, StorageFormat::Sparse).defines_mb_size(true),
    ])
    .unwrap()
}

fn ctf(dir: &Path, text: &str, max_errors: u64, vo: ValidateOptions) -> (cntkio::validate::Report, Vec<String>) {
    let p = dir.join("v.ctf");
    std::fs::write(&p, text).unwrap();
    let file = InputFile::open(&p, Access::Read).unwrap();
    let opts = CtfOptions { max_errors, ..CtfOptions::default() };
    let mut seen = Vec::new();
    let mut each = |f: Finding<'_>| {
        seen.push(match f {
            Finding::Error(e) => format!("E {} {:?}", e.code(), e.position().line),
            Finding::Warning(w, p) => format!("W {} {:?}", w.code(), p.line),
        })
    };
    let r = validate_ctf(&file, &schema(), &opts, &vo, &mut |_| {}, &mut each).unwrap();
    (r, seen)
}

#[test]
fn ctf_verdicts_and_counts() {
    let d = tempfile::tempdir().unwrap();
    let vo = ValidateOptions::default();
    let (r, seen) = ctf(d.path(), "0 |x 1 2 |y 0:1\n0 |x 3 4\n1 |x 5 6 |y 2:1\n", 0, vo);
    assert_eq!((r.format, r.sequences, r.samples, r.stream_samples.clone()), (Format::Ctf, 2, 2, vec![3, 2]));
    assert!(r.valid() && r.verdict() == "valid" && seen.is_empty() && r.total_errors() == 0);
    // two bad samples and a sequence with fewer samples than rows: invalid with maxErrors 1, readable with 3;
    // every error counted, shown in order
    let bad = "0 |x 1 a |y 0:1\n0 |x 1 2\n1 |x 5 6 |y 9:1\n1 |y 1:1\n2 |x 1 1 |y 1:1\n";
    let (r, seen) = ctf(d.path(), bad, 1, vo);
    assert_eq!((r.errors, r.valid()), (3, false));
    assert_eq!(r.verdict(), "invalid: 3 error(s), more than maxErrors = 1");
    assert_eq!(seen, ["E E0008 Some(1)", "E E0015 Some(3)", "E E0020 Some(3)"]);
    assert_eq!(r.shown.iter().map(|e| e.code()).collect::<Vec<_>>(), ["E0008", "E0015", "E0020"]);
    let (r, _) = ctf(d.path(), bad, 3, ValidateOptions { limit: 1, ..vo });
    assert!(r.valid() && r.shown.len() == 1 && r.errors == 3);
    assert_eq!(r.verdict(), "readable: 3 error(s) tolerated by maxErrors = 3");
    // a sequence without its y (the bad sample leaves it empty): always fatal
    let (r, _) = ctf(d.path(), "0 |x 1 2 |y 7:1\n1 |x 1 2 |y 1:1\n", 10, vo);
    assert_eq!((r.dropped, r.valid(), r.total_errors()), (1, false, 2));
    // The verdict names the cause (the index out of range, and the dim it needs) before the consequence.
    assert_eq!(
        r.verdict(),
        "invalid: [E0015] sparse index 7 >= dim 3 in stream \"y\" (the largest index found: the dim must be at least \
         8) dropped samples, so 1 sequence(s) lack a configured stream (always fatal in CNTK)"
    );
    assert_eq!(r.tally.drop_causes.iter().map(|(e, n)| (e.code(), *n)).collect::<Vec<_>>(), [("E0015", 1)]);
    // Some dropped sequences without an error of their own: the cause is named for those it explains.
    let (r, _) = ctf(d.path(), "0 |x 1 2 |y 7:1\n1 |y 2:1\n2 |x 1 2 |y 1:1\n", 10, vo);
    assert_eq!(
        r.verdict(),
        "invalid: 2 sequence(s) lack a configured stream (always fatal in CNTK); in 1 of them, [E0015] sparse index 7 \
         >= dim 3 in stream \"y\" (the largest index found: the dim must be at least 8) dropped samples"
    );
    // A stream of the schema no row has: named once, with the inputs the file has and the closest.
    let (r, _) = ctf(d.path(), "0 |X 1 2 |y 0:1\n1 |X 1 2 |y 1:1 |z 3\n", 10, vo);
    let m = r.missing_inputs();
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].alias.as_str(), m[0].suggestion.as_deref()), ("x", Some("X")));
    assert_eq!(m[0].found, [("X".to_string(), 2), ("z".to_string(), 1)]);
    assert!(r.verdict().starts_with("invalid: input |x of the schema never appears in the file (did you mean |X?)"));
    // The main stream misspelled: no sequence at all.
    let (r, _) = ctf(d.path(), "0 |x 1 2 |yy 0:1\n1 |x 1 2 |yy 1:1\n", 10, vo);
    assert_eq!(r.missing_inputs().iter().map(|m| m.alias.as_str()).collect::<Vec<_>>(), ["y"]);
    assert_eq!(
        r.verdict(),
        "invalid: no sequence found: no row mentions |y (the definesMBSize stream): did you mean |yy?"
    );
    // Warnings are counted by class whether shown or not, and explained.
    let (r, seen) = ctf(d.path(), "0 |x 1 |y 0:1\n1 |x 2 |y 1:1 |w 1\n", 0, vo);
    assert!(r.valid() && seen.is_empty() && r.shown_warnings.is_empty());
    let notes: Vec<(&str, u64)> = r.warning_notes().iter().map(|n| (n.code, n.count)).collect();
    assert_eq!(notes, [("W0001", 2), ("W0003", 1)]);
    assert!(r.warning_notes()[0]
        .text
        .starts_with("2 sample(s) of stream \"x\" had fewer than 2 values (the first: 1)"));
    // no row mentions the main stream
    let (r, _) = ctf(d.path(), "0 |x 1 2\n", 0, vo);
    assert!(r.is_empty() && !r.valid());
    assert_eq!(
        r.verdict(),
        "invalid: no sequence found: no row mentions |y (the definesMBSize stream); check the alias"
    );
    // a fatal error: reported, not returned
    let (r, _) = ctf(d.path(), "", 0, vo);
    assert_eq!(r.fatal.as_ref().map(|e| e.code()), Some("E0002"));
    assert_eq!((r.verdict().as_str(), r.total_errors()), ("invalid: the file cannot be read", 1));
    // warnings, when asked for: found after the chunk's errors
    let (r, seen) = ctf(d.path(), "0 |x 1 |y 0:1\n0 |x 1 b\n", 5, ValidateOptions { warnings: true, ..vo });
    assert!(r.warnings >= 1 && !r.shown_warnings.is_empty());
    assert!(seen[0].starts_with("E ") && seen.last().unwrap().starts_with("W "), "{seen:?}");
}

#[test]
fn cbf_valid_and_damaged() {
    let real = common::testdata::real_dir().join("cbf");
    let r =
        validate_cbf(&real.join("Simple_dense.bin"), &CbfOptions::default(), &ValidateOptions::default(), &mut |_| {})
            .unwrap();
    assert_eq!((r.format, r.sequences, r.samples, r.valid()), (Format::Cbf, 10000, 10000, true));
    assert!(r.problems.is_empty() && r.verdict() == "valid");
    let d = tempfile::tempdir().unwrap();
    let mut bytes = common::testdata::read(&real.join("10x10_dense.bin"));
    bytes[52..56].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let p = d.path().join("n.bin");
    std::fs::write(&p, &bytes).unwrap();
    let r = validate_cbf(&p, &CbfOptions::default(), &ValidateOptions::default(), &mut |_| {}).unwrap();
    let fatal = r.fatal.as_ref().expect("a damaged chunk is fatal");
    assert_eq!((fatal.code(), fatal.position().path.as_deref()), ("E0100", Some(p.display().to_string().as_str())));
    assert_eq!((r.valid(), r.total_errors(), r.verdict().as_str()), (false, 1, "invalid: the file cannot be read"));
    // I/O errors are returned
    assert!(validate_cbf(
        &d.path().join("missing.bin"),
        &CbfOptions::default(),
        &ValidateOptions::default(),
        &mut |_| {}
    )
    .unwrap_err()
    .is_io());
}

/// A validation asked to stop (its `cancel` hook, asked before each chunk) ends with the "interrupted" error.
#[test]
fn validations_stop_when_asked() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static ASKED: AtomicUsize = AtomicUsize::new(0);
    // Stops when asked the second time: after the first chunk.
    fn second_time() -> bool {
        ASKED.fetch_add(1, Ordering::SeqCst) == 1
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("v.ctf");
    let text: String = (0..1000).map(|i| format!("{i} |x 1 2 |y 0:1\n")).collect();
    std::fs::write(&p, text).unwrap();
    let opts = CtfOptions { chunk_size: 1000, ..CtfOptions::default() };
    let file = InputFile::open(&p, Access::Read).unwrap();
    let vo = ValidateOptions { cancel: Some(second_time), ..ValidateOptions::default() };
    let e = validate_ctf(&file, &schema(), &opts, &vo, &mut |_| {}, &mut |_| {}).expect_err("stopped");
    assert_eq!(e.to_string(), cntkio::interrupted().to_string());
    assert_eq!(ASKED.swap(0, Ordering::SeqCst), 2, "asked once per chunk until it said stop");

    // A CBF file of several chunks.
    let cbf = d.path().join("v.cbf");
    let how = cntkio::convert::CtfToCbf {
        ctf: CtfOptions::default(),
        writer: cntkio::cbf::CbfWriterOptions::new(1000),
        scan: Default::default(),
        access: Access::Read,
        hooks: Default::default(),
    };
    let s = cntkio::convert::ctf_to_cbf(&p, &cbf, &schema(), &how, &mut |_| {}).unwrap();
    assert!(s.chunks > 2);
    let e = validate_cbf(&cbf, &CbfOptions::default(), &vo, &mut |_| {}).expect_err("stopped");
    assert_eq!(e.to_string(), cntkio::interrupted().to_string());
    assert_eq!(ASKED.load(Ordering::SeqCst), 2);
}

mod threads {
    use super::*;
    use proptest::prelude::*;

    /// Rows of a line-mode file (no sequence ids, no `definesMBSize` stream): valid ones, and ones with
    /// each kind of problem a validation reports.
    fn row() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "|x 1 2 |y 0:1",
            "|x 3 4 |y 2:0.5 1:1",
            "|x 1 a |y 0:1",
            "|x 1 2",
            "|y 9:1 |x 1 2",
            "|z 1 |x 1 2 |y 1:1",
            "|x 1 2 3 |y 1:1",
            "|x 1 |y 1:1",
            "",
            "|# a comment",
            "|x 1 2 |y 0:1 |# and a comment",
            "|x 1e400 2 |y 0:1",
            "|y 1:",
        ])
    }

    fn findings(path: &Path, threads: usize, chunk_size: u64, limit: usize, warnings: bool) -> (String, Vec<String>) {
        let schema = Schema::new(vec![
            StreamSpec::new("x", 2, StorageFormat::Dense),
            StreamSpec::new("y", 3, StorageFormat::Sparse),
        ])
        .unwrap();
        let file = InputFile::open(path, Access::Read).unwrap();
        let opts = CtfOptions { max_errors: 5, chunk_size, ..CtfOptions::default() };
        let vo = ValidateOptions { threads, limit, warnings, cancel: None };
        let mut seen = Vec::new();
        let mut each = |f: Finding<'_>| {
            seen.push(match f {
                Finding::Error(e) => format!("E {e}"),
                Finding::Warning(w, p) => format!("W {w} at {p}"),
            })
        };
        let r = validate_ctf(&file, &schema, &opts, &vo, &mut |_| {}, &mut each).unwrap();
        (format!("{r:?}"), seen)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// A validation's report and findings (every error and warning with its line, column and sequence)
        /// do not depend on the number of parser threads, with chunks cut anywhere.
        #[test]
        fn line_mode_findings_do_not_depend_on_threads(
            rows in proptest::collection::vec(row(), 1..120),
            final_newline: bool,
            chunk_size in 8u64..300,
            limit in 1usize..5,
            warnings: bool,
        ) {
            let d = tempfile::tempdir().unwrap();
            let p = d.path().join("v.ctf");
            let mut text = rows.join("\n");
            if final_newline {
                text.push('\n');
            }
            std::fs::write(&p, &text).unwrap();
            let one = findings(&p, 1, chunk_size, limit, warnings);
            for threads in [2, 3] {
                prop_assert_eq!(&findings(&p, threads, chunk_size, limit, warnings), &one, "{} threads", threads);
            }
        }
    }
}
