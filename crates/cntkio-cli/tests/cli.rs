//! Integration tests of the `cntkio` command line: exit codes, error text, JSON shapes and round trips,
//! run on the real CNTK data in `testdata/` and on variants made here in temporary directories.

#[path = "../../cntkio/tests/common/testdata.rs"]
mod testdata;
#[macro_use]
mod common;

use cntkio::cbf::CbfFile;
use cntkio::{ChunkData, CtfOptions, CtfReader, ElementType, Layout, Schema, StorageFormat, StreamSpec, Values};
use common::*;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use testdata::read;

// ---------------------------------------------------------------------------------------------------
// Running the binary
// ---------------------------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn real(rel: &str) -> PathBuf {
    testdata::real_dir().join(rel)
}

fn conf(rel: &str) -> PathBuf {
    testdata::cntk_dir().join(rel)
}

fn example(rel: &str) -> PathBuf {
    repo().join("examples/data").join(rel)
}

// Schemas of the real files (testdata/real/README.md).
const ATIS: [&str; 6] = [
    "--stream",
    "query:943:sparse:S0",
    "--stream",
    "intentLabels:26:sparse:S1",
    "--stream",
    "slotLabels:129:sparse:S2",
];
const CMUDICT: [&str; 6] =
    ["--stream", "rawInput:69:sparse:S0", "--stream", "rawLabels:69:sparse:S1", "--defines-mb-size", "rawInput"];
const SEQCLA: [&str; 4] = ["--stream", "features:2000:sparse:x", "--stream", "labels:5:dense:y"];
const MNIST: [&str; 4] = ["--stream", "features:784:dense:F", "--stream", "labels:10:dense:L"];
const LOGREG: [&str; 4] = ["--stream", "features:2:dense", "--stream", "labels:1:dense"];

// ---------------------------------------------------------------------------------------------------
// A small JSON reader that keeps numbers as written (to check their exact bits) and object key order
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn parse(s: &str) -> J {
        let b = s.as_bytes();
        let mut i = 0;
        let v = parse_value(b, &mut i);
        skip_ws(b, &mut i);
        assert_eq!(i, b.len(), "trailing bytes after JSON value in {s:?}");
        v
    }
    fn get(&self, key: &str) -> &J {
        match self {
            J::Obj(kv) => &kv.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no key {key:?} in {self:?}")).1,
            _ => panic!("not an object: {self:?}"),
        }
    }
    fn keys(&self) -> Vec<&str> {
        match self {
            J::Obj(kv) => kv.iter().map(|(k, _)| k.as_str()).collect(),
            _ => panic!("not an object: {self:?}"),
        }
    }
    fn arr(&self) -> &[J] {
        match self {
            J::Arr(a) => a,
            _ => panic!("not an array: {self:?}"),
        }
    }
    fn u64(&self) -> u64 {
        match self {
            J::Num(n) => n.parse().unwrap_or_else(|_| panic!("not an unsigned integer: {n}")),
            _ => panic!("not a number: {self:?}"),
        }
    }
}

fn skip_ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && matches!(b[*i], b' ' | b'\n' | b'\r' | b'\t') {
        *i += 1;
    }
}

fn parse_value(b: &[u8], i: &mut usize) -> J {
    skip_ws(b, i);
    match b[*i] {
        b'{' => {
            *i += 1;
            let mut kv = Vec::new();
            skip_ws(b, i);
            if b[*i] == b'}' {
                *i += 1;
                return J::Obj(kv);
            }
            loop {
                skip_ws(b, i);
                let J::Str(k) = parse_value(b, i) else { panic!("object key must be a string") };
                skip_ws(b, i);
                assert_eq!(b[*i], b':');
                *i += 1;
                let v = parse_value(b, i);
                kv.push((k, v));
                skip_ws(b, i);
                *i += 1;
                match b[*i - 1] {
                    b',' => continue,
                    b'}' => return J::Obj(kv),
                    c => panic!("unexpected {:?} in object", c as char),
                }
            }
        }
        b'[' => {
            *i += 1;
            let mut a = Vec::new();
            skip_ws(b, i);
            if b[*i] == b']' {
                *i += 1;
                return J::Arr(a);
            }
            loop {
                a.push(parse_value(b, i));
                skip_ws(b, i);
                *i += 1;
                match b[*i - 1] {
                    b',' => continue,
                    b']' => return J::Arr(a),
                    c => panic!("unexpected {:?} in array", c as char),
                }
            }
        }
        b'"' => {
            // serde_json checks escapes; here the strings are names and "inf"/"nan".
            let v: serde_json::Value = {
                let start = *i;
                *i += 1;
                while b[*i] != b'"' {
                    *i += if b[*i] == b'\\' { 2 } else { 1 };
                }
                *i += 1;
                serde_json::from_slice(&b[start..*i]).expect("a JSON string")
            };
            J::Str(v.as_str().unwrap().to_string())
        }
        b't' if b[*i..].starts_with(b"true") => {
            *i += 4;
            J::Bool(true)
        }
        b'f' if b[*i..].starts_with(b"false") => {
            *i += 5;
            J::Bool(false)
        }
        b'n' if b[*i..].starts_with(b"null") => {
            *i += 4;
            J::Null
        }
        _ => {
            let start = *i;
            while *i < b.len() && matches!(b[*i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                *i += 1;
            }
            assert!(*i > start, "unexpected byte {:?} at {start}", b[start] as char);
            J::Num(std::str::from_utf8(&b[start..*i]).unwrap().to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Records: dump output and library data in one comparable form (values by bits, NaN as one value)
// ---------------------------------------------------------------------------------------------------

const NAN_BITS: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq)]
enum Sample {
    Dense(Vec<u64>),
    Sparse(Vec<(u64, u64)>),
}

#[derive(Debug, Clone, PartialEq)]
struct Record {
    key: u64,
    streams: Vec<(String, Vec<Sample>)>,
}

fn bits_of_token(j: &J, t: ElementType) -> u64 {
    let special = |s: &str| match s {
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        "nan" => f64::NAN,
        other => panic!("unexpected string value {other:?}"),
    };
    let x: f64 = match (j, t) {
        (J::Num(n), ElementType::F32) => {
            let v: f32 = n.parse().unwrap_or_else(|_| panic!("not a number: {n}"));
            assert!(v.is_finite(), "finite numbers only as JSON numbers: {n}");
            return u64::from(v.to_bits());
        }
        (J::Num(n), _) => {
            let v: f64 = n.parse().unwrap_or_else(|_| panic!("not a number: {n}"));
            assert!(v.is_finite(), "finite numbers only as JSON numbers: {n}");
            return v.to_bits();
        }
        (J::Str(s), _) => special(s),
        _ => panic!("not a value: {j:?}"),
    };
    match t {
        _ if x.is_nan() => NAN_BITS,
        ElementType::F32 => u64::from((x as f32).to_bits()),
        _ => x.to_bits(),
    }
}

/// Parses a dump's stdout, given each stream's (name, storage, element type) in schema order.
fn parse_dump(stdout: &str, streams: &[(String, StorageFormat, ElementType)]) -> Vec<Record> {
    assert!(stdout.is_empty() || stdout.ends_with('\n'), "dump output must end with a complete line");
    stdout
        .lines()
        .map(|line| {
            let _: serde_json::Value = serde_json::from_str(line).expect("each dump line is valid JSON");
            let j = J::parse(line);
            assert_eq!(j.keys(), ["key", "streams"], "record keys in {line}");
            let s = j.get("streams");
            let names: Vec<&str> = streams.iter().map(|(n, _, _)| n.as_str()).collect();
            assert_eq!(s.keys(), names, "every configured stream, by name, in schema order");
            let mut out = Vec::new();
            for (name, format, t) in streams {
                let samples = s
                    .get(name)
                    .arr()
                    .iter()
                    .map(|sample| match format {
                        StorageFormat::Dense => {
                            Sample::Dense(sample.arr().iter().map(|v| bits_of_token(v, *t)).collect())
                        }
                        StorageFormat::Sparse => Sample::Sparse(
                            sample
                                .arr()
                                .iter()
                                .map(|p| {
                                    let p = p.arr();
                                    assert_eq!(p.len(), 2, "sparse entries are [index, value] pairs");
                                    (p[0].u64(), bits_of_token(&p[1], *t))
                                })
                                .collect(),
                        ),
                    })
                    .collect();
                out.push((name.clone(), samples));
            }
            Record { key: j.get("key").u64(), streams: out }
        })
        .collect()
}

fn value_bits(v: &Values, i: usize) -> u64 {
    match v {
        Values::F32(a) if a[i].is_nan() => NAN_BITS,
        Values::F64(a) if a[i].is_nan() => NAN_BITS,
        Values::F32(a) => u64::from(a[i].to_bits()),
        Values::F64(a) => a[i].to_bits(),
    }
}

fn records_of(data: &ChunkData, names: &[String], out: &mut Vec<Record>) {
    for q in 0..data.num_sequences() {
        let mut streams = Vec::new();
        for (d, name) in data.streams.iter().zip(names) {
            let samples = d
                .sequence_samples(q)
                .map(|k| {
                    let r = d.sample_value_range(k);
                    match &d.layout {
                        Layout::Dense => Sample::Dense(r.map(|i| value_bits(&d.values, i)).collect()),
                        Layout::Sparse { indices, .. } => Sample::Sparse(
                            r.map(|i| (u64::try_from(indices[i]).unwrap(), value_bits(&d.values, i))).collect(),
                        ),
                    }
                })
                .collect();
            streams.push((name.clone(), samples));
        }
        out.push(Record { key: data.keys.get(q), streams });
    }
}

/// A schema from `--stream`-style specs, for the library.
fn lib_schema(specs: &[&str], t: ElementType, main: Option<&str>) -> Schema {
    let streams = specs
        .iter()
        .map(|s| {
            let p: Vec<&str> = s.split(':').collect();
            let format = if p[2] == "sparse" { StorageFormat::Sparse } else { StorageFormat::Dense };
            StreamSpec::new(p[0], p[1].parse().unwrap(), format)
                .alias(*p.get(3).unwrap_or(&p[0]))
                .element_type(t)
                .defines_mb_size(main == Some(p[0]))
        })
        .collect();
    Schema::new(streams).unwrap()
}

fn stream_types(schema: &Schema) -> Vec<(String, StorageFormat, ElementType)> {
    schema.streams().iter().map(|s| (s.name.clone(), s.format, s.element_type)).collect()
}

/// Every sequence of a CTF file as the library reads it.
fn library_ctf(path: &Path, schema: &Schema) -> Vec<Record> {
    let r = CtfReader::open(path, schema, &CtfOptions::default()).expect("library opens the file");
    let names: Vec<String> = schema.streams().iter().map(|s| s.name.clone()).collect();
    let mut out = Vec::new();
    for i in 0..r.index().chunks.len() {
        records_of(&r.load_chunk(i).expect("library reads the chunk"), &names, &mut out);
    }
    out
}

/// Every sequence of a CBF file as the library reads it, with its stream types.
fn library_cbf(path: &Path) -> (Vec<Record>, Vec<(String, StorageFormat, ElementType)>) {
    let f = CbfFile::open(path).expect("library opens the CBF file");
    let types: Vec<_> = f.streams().iter().map(|s| (s.name.clone(), s.format, s.element_type)).collect();
    let names: Vec<String> = types.iter().map(|t| t.0.clone()).collect();
    let mut out = Vec::new();
    for k in 0..f.chunk_count() {
        records_of(&f.read_chunk(k).expect("library decodes the chunk"), &names, &mut out);
    }
    (out, types)
}

/// The `--stream` values of an argument list.
fn stream_specs<'a>(args: &[&'a str]) -> Vec<&'a str> {
    args.windows(2).filter(|w| w[0] == "--stream").map(|w| w[1]).collect()
}

// ---------------------------------------------------------------------------------------------------
// Rendered errors: `path:line:col: error[EXXXX]: message`, the line, a caret under the bad bytes
// ---------------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Rendered {
    path: String,
    line: u64,
    col: u64,
    code: String,
    message: String,
    /// The snippet's text line (after `N | `) and caret line (after `  | `), when shown.
    snippet: Option<(String, String)>,
    help: Option<String>,
}

/// Parses every located error (and its snippet and help) out of stderr.
fn rendered_errors(stderr: &str) -> Vec<Rendered> {
    let lines: Vec<&str> = stderr.lines().collect();
    let mut out = Vec::new();
    for (n, l) in lines.iter().enumerate() {
        let Some(at) = l.find(": error[") else { continue };
        let head = &l[..at];
        let mut parts = head.rsplitn(3, ':');
        let (Some(col), Some(line), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let (Ok(col), Ok(line)) = (col.parse::<u64>(), line.parse::<u64>()) else { continue };
        let rest = &l[at + ": error[".len()..];
        let code = rest[..5].to_string();
        assert_eq!(&rest[5..8], "]: ", "error header format in {l:?}");
        let message = rest[8..].to_string();
        let gutter = line.to_string();
        let pad = " ".repeat(gutter.len());
        let mut k = n + 1;
        let mut snippet = None;
        if lines.get(k) == Some(&format!("{pad} |").as_str()) {
            let text = lines[k + 1].strip_prefix(&format!("{gutter} | ")).expect("snippet line with its number");
            let caret = lines[k + 2].strip_prefix(&format!("{pad} | ")).expect("caret line");
            snippet = Some((text.to_string(), caret.to_string()));
            k += 3;
        }
        let help = lines.get(k).and_then(|h| h.strip_prefix("  = help: ")).map(str::to_string);
        out.push(Rendered { path: path.to_string(), line, col, code, message, snippet, help });
    }
    out
}

/// Line and column (1-based, bytes) of a byte offset, computed from the file.
fn line_col(bytes: &[u8], byte: u64) -> (u64, u64) {
    let before = &bytes[..byte as usize];
    let line = before.iter().filter(|&&c| c == b'\n').count() as u64 + 1;
    let col = byte - before.iter().rposition(|&c| c == b'\n').map_or(0, |p| p as u64 + 1) + 1;
    (line, col)
}

/// Checks a rendered error's snippet against the file: the text is the file's line `line` (a window
/// of 100 bytes around the column, with `…` where cut), and the caret starts under column `col`.
fn check_snippet(e: &Rendered, file: &[u8]) {
    let (text, caret) = e.snippet.as_ref().unwrap_or_else(|| panic!("no snippet for {e:?}"));
    let line_bytes: &[u8] = file.split(|&c| c == b'\n').nth(e.line as usize - 1).expect("the line exists");
    let rel = (e.col - 1) as usize;
    let from = rel.saturating_sub(50);
    let shown = &line_bytes[from.min(line_bytes.len())..line_bytes.len().min(from + 100)];
    let mut expected: String = if from > 0 { "…".into() } else { String::new() };
    expected.extend(shown.iter().map(|&c| match c {
        b'\t' => ' ',
        0x20..=0x7e => c as char,
        _ => '·',
    }));
    if line_bytes.len() > from + 100 {
        expected.push('…');
    }
    assert_eq!(text, &expected, "snippet text of {e:?}");
    let lead = caret.chars().take_while(|&c| c == ' ').count();
    let expected_lead = rel - from + usize::from(from > 0);
    assert_eq!(lead, expected_lead, "caret position of {e:?}");
    let carets = &caret[lead..];
    assert!(!carets.is_empty() && carets.chars().all(|c| c == '^'), "caret line {caret:?}");
}

/// The summary line of one CTF file.
fn summary_line<'a>(stderr: &'a str, path: &str) -> &'a str {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with(&format!("{path}: ")) && !l.contains(": error[") && !l.contains(": warning["))
        .unwrap_or_else(|| panic!("no summary line for {path} in:\n{stderr}"))
}

// ===================================================================================================
// Help, version, usage errors
// ===================================================================================================

#[test]
fn help_and_version_exit_0() {
    let o = run(["--version"]);
    o.code(0);
    assert_eq!(o.stdout(), format!("cntkio {}\n", env!("CARGO_PKG_VERSION")));
    assert_eq!(o.stderr, "");
    for a in [
        &["--help"][..],
        &["-h"][..],
        &["help"][..],
        &["validate", "--help"][..],
        &["help", "convert"][..],
        &["dump", "-h"][..],
    ] {
        let o = run(a);
        o.code(0).out_has("Usage: cntkio");
        assert_eq!(o.stderr, "", "{a:?}");
    }
    let o = run(["--help"]);
    for c in ["validate", "inspect", "dump", "bench", "convert"] {
        o.out_has(&format!("  {c} "));
    }
    run(["convert", "--help"]).code(0).out_has("--ctf2bin-compatible").out_has("--header <FILE>");
    run(["validate", "--version"]).code(0).out_has(env!("CARGO_PKG_VERSION"));
}

#[test]
fn usage_errors_exit_2_with_a_message_and_no_output() {
    let d = tmp();
    let f = write(d.path(), "one.ctf", "|x 1\n");
    let atis = real("atis/atis.test.ctf");
    let dense = conf("Config/CNTKTextFormatReader/dense.cntk");
    let header = write(d.path(), "h.txt", "features F0 dense 5\n");
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (args!["dump", &f], "error[E1001]: no streams configured; give at least one --stream"),
        (args!["dump", &f], "error[E1001]"),
        (
            args!["validate", &f, "--stream", "x:1"],
            "error[E1006]: --stream \"x:1\": expected NAME:DIM:dense|sparse[:ALIAS]",
        ),
        (args!["validate", &f, "--stream", "x:a:dense"], "DIM must be a non-negative integer, found \"a\""),
        (args!["validate", &f, "--stream", "x:-1:dense"], "DIM must be a non-negative integer"),
        (args!["validate", &f, "--stream", "x:1:dens"], "format must be dense or sparse, found \"dens\""),
        (
            args!["validate", &atis, &ATIS, "--defines-mb-size", "S0"],
            "--defines-mb-size \"S0\": no stream has this name (\"S0\" is the alias of stream \"query\"; give the \
             name); streams: query, intentLabels, slotLabels",
        ),
        (
            args!["dump", &atis, &ATIS, "--defines-mb-size", "nope"],
            "--defines-mb-size \"nope\": no stream has this name",
        ),
        (
            args![
                "convert",
                real("cbf/10x10_dense.ctf").as_path(),
                d.path().join("o.cbf").as_path(),
                "--header",
                &header,
                "--stream",
                "x:1:dense"
            ],
            "the argument '--header <FILE>' cannot be used with '--stream",
        ),
        (args!["validate", "--config", &dense], "the config has several reader sections (1x1, 1x2, 1x10,"),
        (
            args!["validate", "--config", &dense, "--section", "nosuch"],
            "no section \"nosuch\" in the config; sections with a reader: 1x1,",
        ),
        (args!["validate", &f, "--section", "1x1"], "required arguments were not provided"),
        (
            args!["validate", d.path().join("missing.ctf").as_path(), "--stream", "x:1:dense"],
            "error[E2001]: cannot open",
        ),
        (args!["dump", d.path().join("missing.ctf").as_path(), "--stream", "x:1:dense"], "error[E2001]: cannot open"),
        (args!["inspect", d.path().join("missing.ctf").as_path()], "error[E2001]: cannot open"),
        (
            args![
                "convert",
                d.path().join("missing.ctf").as_path(),
                d.path().join("o.cbf").as_path(),
                "--stream",
                "x:1:dense"
            ],
            "error[E2001]: cannot open",
        ),
        (args!["bench", d.path().join("missing.ctf").as_path(), "--stream", "x:1:dense"], "error[E2001]: cannot open"),
        (args!["validate", d.path(), "--stream", "x:1:dense"], "error[E2001]: cannot read"),
        (args!["dump", d.path(), "--stream", "x:1:dense"], "it is a directory"),
        (args!["inspect", d.path()], "it is a directory"),
        (args!["validate"], "error[E1005]: no input file given (give FILE arguments or --config FILE.cntk)"),
        (args!["bench"], "no input file given"),
        (args!["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (Vec::new(), "Usage: cntkio"),
        (args!["validate", &f, "--stream", "x:1:dense", "--limit", "abc"], "invalid value 'abc' for '--limit <N>'"),
        (
            args!["validate", &f, "--stream", "x:1:dense", "--precision", "half"],
            "error[E1006]: --precision \"half\": must be float or double",
        ),
        (args!["validate", &f, "--stream", "x:1:dense", "--chunk-size", "12x"], "unknown size unit in \"12x\""),
        (args!["validate", &f, "--stream", "x:1:dense", "--no-such-flag"], "unexpected argument '--no-such-flag'"),
        (
            args!["validate", &f, "--stream", "x:4294967296:dense"],
            "error[E1002]: stream \"x\": dense dim 4294967296 exceeds 4294967295",
        ),
        (args!["dump", &f, "--stream", "x:18446744073709551615:sparse"], "error[E1002]"),
        (args!["validate", &f, "--stream", "x:4294967295:sparse"], "sparse dim 4294967295 exceeds 2147483647"),
        (
            args!["validate", &f, "--stream", "x:1:dense", "--stream", "y:1:dense:x"],
            "error[E1003]: alias \"x\" is used by both stream \"x\" and stream \"y\"",
        ),
        (
            args!["validate", "--config", example("logreg.cntk").as_path(), "--set", "x"],
            "error[E1006]: config override \"x\": must have the form name=value",
        ),
    ];
    for (a, needle) in cases {
        let o = run(&a);
        assert_eq!(o.code, 2, "{a:?}: stderr {}", o.stderr);
        assert!(o.stderr.contains(needle), "{a:?}: stderr lacks {needle:?}:\n{}", o.stderr);
        assert!(o.stdout.is_empty(), "{a:?}: stdout {:?}", o.stdout());
        assert!(!o.stderr.contains("panicked"), "{a:?}");
    }
}

/// Each class of error exits with its status: the input's fault 1 (`E0xxx`), the caller's 2 (`E1xxx`), and a
/// bug in cntkio 70 (`E9001`, which no input can cause, so checked through the mapping itself).
#[test]
fn error_classes_exit_with_their_status() {
    let d = tmp();
    // A CTF file with no row of the definesMBSize stream: nothing to convert, the input's fault.
    let f = write(d.path(), "other.ctf", "0 |y 1\n");
    let out = d.path().join("o.cbf");
    run(args!["convert", &f, &out, "--stream", "x:1:dense", "--stream", "y:1:dense", "--defines-mb-size", "x"])
        .code(1)
        .err_has("error[E0029]: the input holds no sequence for this schema");
    assert!(!out.exists());
    // A --restore file that is no state: the caller's fault, with the file as position.
    let f = write(d.path(), "one.ctf", "0 |x 1\n");
    let bad = write(d.path(), "state.json", "{\"state\": {\"version\": 99}}\n");
    run(args!["batches", &f, "--stream", "x:1:dense", "--mb-size", "1", "--restore", &bad])
        .code(2)
        .err_has("state.json: error[E1007]: not a minibatch source state");
    run(args!["batches", &f, "--stream", "x:1:dense", "--mb-size", "0"])
        .code(2)
        .err_has("error[E1006]: --mb-size: must be > 0");
    // A bad line of a ctf2bin header file: the option, and the file and line as position.
    let h = write(d.path(), "h.txt", "x x dense 1\nx x\n");
    run(args!["convert", &f, &out, "--header", &h]).code(2).err_has("h.txt:2: error[E1006]: --header: 2 fields");
    let bug = cntkio::Error::internal("a test");
    assert_eq!((cntkio_cli::exit_code(&bug), bug.code()), (70, "E9001"));
    assert_eq!(cntkio_cli::exit_code(&cntkio::Error::limit("x", 2, 1)), 1);
}

// ===================================================================================================
// validate
// ===================================================================================================

#[test]
fn validate_real_files_valid_with_summary() {
    let cases: Vec<(PathBuf, Vec<&str>, &str)> = vec![
        (real("atis/atis.train.ctf"), ATIS.to_vec(), "4978 sequences, 66547 samples; 0 error(s): valid"),
        (real("atis/atis.test.ctf"), ATIS.to_vec(), "893 sequences, 10984 samples; 0 error(s): valid"),
        (
            real("cmudict/cmudict-0.7b.train-dev-1-21.ctf"),
            CMUDICT.to_vec(),
            "5447 sequences, 51704 samples; 0 error(s): valid",
        ),
        (real("cmudict/tiny.ctf"), CMUDICT.to_vec(), "1 sequences, 7 samples; 0 error(s): valid"),
        (real("seqcla/Train.ctf"), SEQCLA.to_vec(), "1247 sequences, 5433 samples; 0 error(s): valid"),
        (real("mnist/MNIST_dense.ctf"), MNIST.to_vec(), "1000 sequences, 1000 samples; 0 error(s): valid"),
        (real("logreg/Train_cntk_text.ctf"), LOGREG.to_vec(), "1000 sequences, 1000 samples; 0 error(s): valid"),
        (real("logreg/Train_cntk_text.crlf.ctf"), LOGREG.to_vec(), "1000 sequences, 1000 samples; 0 error(s): valid"),
        (
            real("cbf/Simple_dense.ctf"),
            vec!["--stream", "features:2:dense:F", "--stream", "labels:2:dense:L"],
            "10000 sequences, 10000 samples; 0 error(s): valid",
        ),
        (
            real("cbf/10x10_sparse.ctf"),
            vec!["--stream", "features:100:sparse:F0"],
            "10 sequences, 100 samples; 0 error(s): valid",
        ),
    ];
    for (path, schema, summary) in cases {
        let o = run(args!["validate", &path, &schema[..]]);
        o.code(0);
        assert_eq!(o.stderr, format!("{}: {summary}\n", path.display()));
        assert!(o.stdout.is_empty());
        // Read instead of mapped: the same report.
        assert_eq!(run(args!["validate", &path, &schema[..], "--no-mmap"]).code(0).stderr, o.stderr);
        // --quiet: nothing at all for a valid file.
        let q = run(args!["-q", "validate", &path, &schema[..]]);
        q.code(0);
        assert_eq!((q.stderr.as_str(), q.stdout.len()), ("", 0));
    }
}

#[test]
fn readme_console_examples_run_as_shown() {
    // Every `$ cntkio …` line of the README's console blocks, run from a directory holding a copy of the
    // repository's examples/ (files it writes land there): it succeeds — or, where the output shown ends in an
    // invalid verdict, exits 1 — and prints exactly the lines shown after it (stdout, then stderr; the first
    // N with `| head -n N`).
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let d = tmp();
    std::fs::create_dir_all(d.path().join("examples/data")).unwrap();
    for e in std::fs::read_dir(repo().join("examples/data")).unwrap() {
        let e = e.unwrap().path();
        std::fs::copy(&e, d.path().join("examples/data").join(e.file_name().unwrap())).unwrap();
    }
    let mut ran = 0;
    for block in readme.split("```console\n").skip(1) {
        let block = &block[..block.find("```").unwrap()];
        let lines: Vec<&str> = block.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(cmd) = line.strip_prefix("$ cntkio ") else { continue };
            let cmd = cmd.split("  #").next().unwrap().trim();
            let (cmd, head) = match cmd.split_once(" | head -n ") {
                Some((c, n)) => (c, Some(n.parse::<usize>().unwrap())),
                None => (cmd, None),
            };
            let shown: Vec<&str> =
                lines[i + 1..].iter().take_while(|l| !l.is_empty() && !l.starts_with("$ ")).copied().collect();
            let o = run_in(d.path(), cmd.split_whitespace());
            let invalid = shown.last().is_some_and(|l| l.contains(": invalid: "));
            assert_eq!(o.code, if invalid { 1 } else { 0 }, "{cmd}: {}", o.stderr);
            if !shown.is_empty() {
                let printed = format!("{}{}", o.stdout(), o.stderr);
                let printed: Vec<&str> = printed.lines().take(head.unwrap_or(usize::MAX)).collect();
                assert_eq!(printed, shown, "{cmd}");
            }
            ran += 1;
        }
    }
    assert!(ran >= 7, "{ran} commands found in the README's console blocks");
}

#[test]
fn validate_messages_point_at_the_bad_bytes() {
    /// (row, code, column of the error on line 2, caret width, message part, help part)
    type Case<'a> = (&'a str, &'a str, u64, usize, &'a str, Option<&'a str>);
    let cases: &[Case] = &[
        (
            "0 |x a",
            "E0008",
            6,
            1,
            "unexpected 'a' in a number of stream \"x\"; expected a digit, '+' or '-'",
            Some("numbers are written like 1, -0.5"),
        ),
        ("0 |x .5", "E0008", 6, 2, "unexpected '.'", Some("no leading '.'")),
        ("0 |x nan", "E0008", 6, 3, "unexpected 'n'", None),
        ("0 |x inf", "E0008", 6, 3, "unexpected 'i'", None),
        ("0 |x 1,5", "E0008", 7, 2, "unexpected ','", None),
        ("0 |x 1.2.3", "E0008", 9, 2, "unexpected '.'", None),
        ("0 |x 0x10", "E0008", 7, 3, "unexpected 'x'", None),
        (
            "0 |x +",
            "E0009",
            7,
            1,
            "a sign in a number of stream \"x\" is followed by end of line; expected a digit",
            None,
        ),
        ("0 |x --1", "E0009", 7, 2, "is followed by '-'", None),
        ("0 |x 1e", "E0010", 8, 1, "an exponent mark in a number of stream \"x\" is followed by end of line", None),
        ("0 |x 1e+", "E0010", 9, 1, "exponent mark", None),
        ("0 |y 1:1 |x 1", "E0015", 6, 1, "sparse index 1 >= dim 1 in stream \"y\"", Some("sparse indices are 0-based")),
        (
            "0 |y 99999999999999999999:1 |x 1",
            "E0014",
            25,
            1,
            "sparse index in stream \"y\" overflows a 64-bit unsigned integer",
            None,
        ),
        (
            "0 |y 0,1 |x 1",
            "E0016",
            7,
            2,
            "expected ':' after sparse index 0 in stream \"y\", found ','",
            Some("index:value"),
        ),
        ("0 |y a:1 |x 1", "E0013", 6, 1, "expected a sparse index (digits) in stream \"y\", found 'a'", None),
        ("0 | x 1", "E0006", 4, 2, "input name prefix '|' is followed by space; expected an input name", None),
        ("0 x 1", "E0005", 3, 1, "unexpected 'x' where a sample should start", Some("each sample is written as |name")),
    ];
    let d = tmp();
    for (i, &(row, code, col, width, msg, help)) in cases.iter().enumerate() {
        let name = format!("case{i}.ctf");
        let text = format!("0 |x 1 |y 0:1\n{row}\n");
        let path = write(d.path(), &name, &text);
        let o = run_in(
            d.path(),
            ["validate", name.as_str(), "--stream", "x:1:dense", "--stream", "y:1:sparse", "--limit", "1"],
        );
        o.code(1);
        let errs = rendered_errors(&o.stderr);
        assert_eq!(errs.len(), 1, "{row:?}: --limit 1 shows one error:\n{}", o.stderr);
        let e = &errs[0];
        assert_eq!(
            (e.path.as_str(), e.line, e.col, e.code.as_str()),
            (name.as_str(), 2, col, code),
            "{row:?}:\n{}",
            o.stderr
        );
        assert!(e.message.contains(msg), "{row:?}: message {:?}", e.message);
        check_snippet(e, &read(&path));
        let caret = &e.snippet.as_ref().unwrap().1;
        assert_eq!(caret.trim_start().len(), width, "{row:?}: caret {caret:?}");
        if let Some(h) = help {
            assert!(e.help.as_deref().unwrap_or("").contains(h), "{row:?}: help {:?}", e.help);
        }
        assert!(summary_line(&o.stderr, &name).contains(": invalid: "), "{row:?}:\n{}", o.stderr);
    }
}

#[test]
fn validate_every_snippet_of_invalid_inputs_matches_the_file() {
    // CNTK's invalid_inputs test file: every error shown has a line:col that matches its byte (from
    // --json), and a snippet that is the file's line with the caret at the column.
    let path = real("edge/invalid_inputs.ctf");
    let bytes = read(&path);
    let schema = ["--stream", "A:1:dense", "--stream", "B:10:sparse", "--max-errors", "99999"];
    let o = run(args!["validate", &path, &schema]);
    o.code(0);
    let errs = rendered_errors(&o.stderr);
    assert_eq!(errs.len(), 28);
    for e in &errs {
        assert_eq!(e.path, path.display().to_string());
        check_snippet(e, &bytes);
    }
    assert_eq!(
        summary_line(&o.stderr, &path.display().to_string()),
        format!(
            "{}: 7 sequences, 42 samples; 28 error(s), 3 warning(s): readable: 28 error(s) tolerated by maxErrors = 99999",
            path.display()
        )
    );
    let j: serde_json::Value =
        serde_json::from_slice(&run(args!["validate", &path, &schema, "--json"]).code(0).stdout).unwrap();
    let shown = j["files"][0]["errors"].as_array().unwrap();
    assert_eq!(shown.len(), 28);
    for (s, e) in shown.iter().zip(&errs) {
        let (line, col) = line_col(&bytes, s["byte"].as_u64().unwrap());
        assert_eq!((s["line"].as_u64().unwrap(), s["column"].as_u64().unwrap()), (line, col), "{s}");
        assert_eq!((e.line, e.col, e.code.as_str()), (line, col, s["code"].as_str().unwrap()), "text and JSON agree");
        assert_eq!(e.message, s["message"].as_str().unwrap());
    }
}

#[test]
fn validate_limit_counts_all_but_shows_n() {
    let path = real("edge/invalid_inputs.ctf");
    let p = path.display().to_string();
    let base = ["--stream", "A:1:dense", "--stream", "B:10:sparse", "--max-errors", "99999"];
    for (limit, shown) in [(0usize, 0usize), (1, 1), (2, 2), (27, 27), (28, 28), (1000, 28)] {
        let o = run(args!["validate", &path, &base, "--limit", &limit.to_string()]);
        o.code(0);
        assert_eq!(o.stderr.matches(": error[").count(), shown, "--limit {limit}");
        let read = run(args!["validate", &path, &base, "--limit", &limit.to_string(), "--no-mmap"]);
        assert_eq!(read.code(0).stderr, o.stderr, "read instead of mapped: the same report");
        if shown < 28 {
            o.err_has(&format!("… and {} more error(s) not shown (raise --limit to see them)\n", 28 - shown));
        } else {
            assert!(!o.stderr.contains("more error(s) not shown"));
        }
        assert!(summary_line(&o.stderr, &p)
            .ends_with("28 error(s), 3 warning(s): readable: 28 error(s) tolerated by maxErrors = 99999"));
        let j: serde_json::Value = serde_json::from_slice(
            &run(args!["validate", &path, &base, "--limit", &limit.to_string(), "--json"]).code(0).stdout,
        )
        .unwrap();
        assert_eq!(j["files"][0]["errors"].as_array().unwrap().len(), shown);
        assert_eq!(j["files"][0]["num_errors"], 28);
    }
}

#[test]
fn validate_json_shape() {
    let d = tmp();
    let bad = write(d.path(), "t.ctf", "0 |features 1 2 |labels 0\n0 |features 1 a\n1 |features 3 4 |labels 1\n");
    let good = real("logreg/Train_cntk_text.ctf");
    let o =
        run(args!["validate", &good, &bad, "--stream", "x:2:dense:features", "--stream", "labels:1:dense", "--json"]);
    o.code(1);
    assert_eq!(o.stderr, "", "--json prints nothing but the JSON");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(j["version"], 2);
    let files = j["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    let expected: BTreeSet<String> = [
        "path",
        "format",
        "valid",
        "verdict",
        "sequences",
        "samples",
        "stream_samples",
        "missing_inputs",
        "warning_notes",
        "schema_inferred",
        "schema",
        "num_errors",
        "dropped_sequences",
        "num_warnings",
        "max_errors",
        "errors",
        "warnings",
    ]
    .map(String::from)
    .into();
    for f in files {
        assert_eq!(keys(f), expected);
    }
    let (g, b) = (&files[0], &files[1]);
    assert_eq!(g["path"], good.display().to_string());
    assert_eq!((g["valid"].as_bool(), g["verdict"].as_str()), (Some(true), Some("valid")));
    assert_eq!(
        (g["sequences"].as_u64(), g["samples"].as_u64(), g["num_errors"].as_u64()),
        (Some(1000), Some(1000), Some(0))
    );
    assert_eq!(g["stream_samples"], serde_json::json!({"x": 1000, "labels": 1000}));
    assert_eq!((&g["errors"], &g["warnings"]), (&serde_json::json!([]), &serde_json::json!([])));
    assert_eq!(g["max_errors"], 0);
    assert_eq!(b["valid"], false);
    assert_eq!(b["verdict"], "invalid: 3 error(s), more than maxErrors = 0");
    let shown = b["errors"].as_array().unwrap();
    assert_eq!(shown.len(), 3);
    let e_keys: BTreeSet<String> = [
        "severity",
        "category",
        "code",
        "kind",
        "message",
        "display",
        "help",
        "path",
        "line",
        "column",
        "byte",
        "sequence_id",
    ]
    .map(String::from)
    .into();
    for e in shown {
        assert_eq!(keys(e), e_keys);
        assert_eq!(e["path"], bad.display().to_string());
    }
    assert_eq!(shown[0]["code"], "E0008");
    assert_eq!(
        (shown[0]["line"].as_u64(), shown[0]["column"].as_u64(), shown[0]["byte"].as_u64()),
        (Some(2), Some(15), Some(40))
    );
    assert_eq!((shown[0]["sequence_id"].as_u64(), shown[0]["severity"].as_str()), (Some(0), Some("error")));
    assert_eq!(shown[0]["kind"], "InvalidNumber");
    assert!(shown[0]["display"].as_str().unwrap().starts_with(&format!("{}:2:15", bad.display())), "{}", shown[0]);
    let codes: Vec<&str> = shown.iter().map(|e| e["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["E0008", "E0018", "E0020"]);
}

#[test]
fn validate_max_errors_tolerance() {
    // One bad number: the bad sample (E0008), the row left without a sample (E0018) and the sequence
    // shorter than its rows (E0020) are three errors, as CNTK counts them.
    let d = tmp();
    let p = write(d.path(), "t.ctf", "0 |x 1 2\n0 |x 1 a\n1 |x 3 4\n");
    let base = args!["validate", &p, "--stream", "x:2:dense"];
    for (max, code, verdict) in [
        ("0", 1, "invalid: 3 error(s), more than maxErrors = 0"),
        ("2", 1, "invalid: 3 error(s), more than maxErrors = 2"),
        ("3", 0, "readable: 3 error(s) tolerated by maxErrors = 3"),
        ("100", 0, "readable: 3 error(s) tolerated by maxErrors = 100"),
    ] {
        let mut a = base.clone();
        a.extend(args!["--max-errors", max]);
        let o = run(&a);
        o.code(code);
        assert_eq!(
            summary_line(&o.stderr, &p.display().to_string()),
            format!("{}: 2 sequences, 3 samples; 3 error(s): {verdict}", p.display())
        );
        assert_eq!(rendered_errors(&o.stderr).len(), 3, "the errors are shown even when tolerated");
        // -q still reports an invalid file, and says nothing about a readable one.
        let mut q = args!["-q"];
        q.extend(a);
        let o = run(&q);
        o.code(code);
        assert_eq!(o.stderr.contains(verdict), code == 1, "-q --max-errors {max}:\n{}", o.stderr);
    }
    // A sequence left without a configured stream is fatal whatever maxErrors says.
    let p = write(d.path(), "e.ctf", "0 |x 1 2\n1 |x 1 a\n");
    let o = run(args!["validate", &p, "--stream", "x:2:dense", "--max-errors", "1000"]);
    o.code(1).err_has("error[E0021]").err_has(
        "invalid: [E0008] errors (such as: unexpected 'a' in a number of stream \"x\"; expected a digit, '+' or '-') \
         dropped samples, so 1 sequence(s) lack a configured stream (always fatal in CNTK)",
    );
}

#[test]
fn validate_warnings() {
    let e = real("edge/empty_samples.ctf");
    let schema = ["--stream", "F0:10:dense", "--stream", "F1:10:sparse"];
    let o = run(args!["validate", &e, &schema]);
    o.code(0);
    // Without --warnings: not listed, but counted and explained.
    assert!(!o.stderr.contains("warning["), "no warnings listed without --warnings:\n{}", o.stderr);
    o.err_has("note[W0001]: 3 sample(s) of stream \"F0\" had fewer than 10 values (the first: 0) and were zero-filled")
        .err_has("(--warnings lists them)")
        .err_has("0 error(s), 3 warning(s): valid");
    let o = run(args!["validate", &e, &schema, "--warnings"]);
    o.code(0);
    let p = e.display();
    assert_eq!(
        o.stderr,
        format!(
            "{p}:1:7: warning[W0001]: dense sample of stream \"F0\" has 0 of 10 values; the rest are zeros\n\
             {p}:2:52: warning[W0001]: dense sample of stream \"F0\" has 5 of 10 values; the rest are zeros\n\
             {p}:6:14: warning[W0001]: dense sample of stream \"F0\" has 1 of 10 values; the rest are zeros\n\
             {p}: note[W0001]: 3 sample(s) of stream \"F0\" had fewer than 10 values (the first: 0) and were \
             zero-filled, as CNTK does; check the stream's dim\n\
             {p}: 3 sequences, 6 samples; 0 error(s), 3 warning(s): valid\n"
        )
    );
    let m = real("edge/missing_trailing_newline.ctf");
    let o = run(args!["validate", &m, "--stream", "features:1:dense", "--warnings"]);
    o.code(0).err_has("warning[W0004]: the file does not end with a newline").err_has("1 warning(s): valid");
    let j: serde_json::Value = serde_json::from_slice(
        &run(args!["validate", &m, "--stream", "features:1:dense", "--warnings", "--json"]).code(0).stdout,
    )
    .unwrap();
    assert_eq!((j["files"][0]["num_warnings"].as_u64(), j["files"][0]["valid"].as_bool()), (Some(1), Some(true)));
    assert_eq!(j["files"][0]["warnings"][0]["code"], "W0004");
    let i = real("edge/invalid_inputs.ctf");
    let o = run(args![
        "validate",
        &i,
        "--stream",
        "A:1:dense",
        "--stream",
        "B:10:sparse",
        "--max-errors",
        "99999",
        "--warnings"
    ]);
    o.code(0)
        .err_has(":26:2: warning[W0003]: input \"C\" is not in the schema; its sample is skipped")
        .err_has(":42:14: warning[W0004]")
        .err_has("28 error(s), 3 warning(s): readable");
}

#[test]
fn validate_crlf_files_are_valid_and_read_the_same() {
    let d = tmp();
    // The real Windows-edited file.
    run(args!["validate", real("logreg/Train_cntk_text.crlf.ctf").as_path(), &LOGREG]).code(0);
    // ATIS and MNIST with CRLF line ends: valid, same counts, same dump.
    for (name, schema) in [("atis/atis.test.ctf", &ATIS[..]), ("mnist/MNIST_dense.ctf", &MNIST[..])] {
        let lf = real(name);
        let text = read(&lf);
        let mut crlf = Vec::with_capacity(text.len() * 11 / 10);
        for &c in &text {
            if c == b'\n' {
                crlf.push(b'\r');
            }
            crlf.push(c);
        }
        let cr = write(d.path(), "crlf.ctf", &crlf);
        let a = run(args!["validate", &lf, schema]);
        let b = run(args!["validate", &cr, schema]);
        a.code(0);
        b.code(0);
        assert_eq!(a.stderr.replace(&lf.display().to_string(), "F"), b.stderr.replace(&cr.display().to_string(), "F"));
        let (da, db) = (run(args!["dump", &lf, schema]), run(args!["dump", &cr, schema]));
        da.code(0);
        db.code(0);
        assert!(da.stdout == db.stdout, "{name}: CRLF dump differs");
    }
}

#[test]
fn validate_variants_bom_utf16_empty_whitespace_digits() {
    let d = tmp();
    let x = ["--stream", "x:1:dense"];
    // UTF-8 BOM: skipped, as CNTK does.
    let p = write(d.path(), "bom.ctf", b"\xef\xbb\xbf0 |x 1\n0 |x 2\n1 |x 3\n");
    run(args!["validate", &p, &x]).code(0).err_has("2 sequences, 3 samples; 0 error(s): valid");
    let o = run(args!["dump", &p, &x]);
    assert_eq!(
        o.code(0).stdout(),
        "{\"key\":0,\"streams\":{\"x\":[[1],[2]]}}\n{\"key\":1,\"streams\":{\"x\":[[3]]}}\n"
    );
    // (file, bytes, code, line, col)
    let fatal: &[(&str, &[u8], &str)] = &[
        ("u16.ctf", b"\xff\xfe|\0x\0 \x001\0\n\0", "E0001"),
        ("empty.ctf", b"", "E0002"),
        ("ws.ctf", b"  \n\t\n   \r\n", "E0002"),
        ("bomonly.ctf", b"\xef\xbb\xbf\n", "E0002"),
        ("sym.ctf", b"abc |x 1\n", "E0003"),
    ];
    for &(name, bytes, code) in fatal {
        write(d.path(), name, bytes);
        let o = run_in(d.path(), args!["validate", name, &x]);
        o.code(1);
        let errs = rendered_errors(&o.stderr);
        assert_eq!(errs.len(), 1, "{name}:\n{}", o.stderr);
        assert_eq!((errs[0].line, errs[0].col, errs[0].code.as_str()), (1, 1, code), "{name}");
        assert_eq!(
            summary_line(&o.stderr, name),
            format!("{name}: 0 sequences, 0 samples; 1 error(s): invalid: the file cannot be read")
        );
        // dump and inspect fail the same way, with nothing on stdout.
        let o = run_in(d.path(), args!["dump", name, &x]);
        o.code(1).err_has(&format!("error[{code}]"));
        assert!(o.stdout.is_empty());
        run_in(d.path(), args!["inspect", name]).code(1).err_has(&format!("error[{code}]"));
    }
    run_in(d.path(), ["validate", "u16.ctf", "--stream", "x:1:dense"])
        .err_has("UTF-16 encoding is not supported (CTF is read as bytes, save the file as UTF-8 or ASCII)");
    run_in(d.path(), ["validate", "empty.ctf", "--stream", "x:1:dense"]).err_has("error[E0002]: input file is empty");
    // Digits only: ids without samples.
    write(d.path(), "digits.ctf", "0\n1\n2\n");
    let o = run_in(d.path(), args!["validate", "digits.ctf", &x]);
    o.code(1);
    let codes: Vec<String> = rendered_errors(&o.stderr).into_iter().map(|e| e.code).collect();
    assert!(codes.iter().all(|c| c == "E0018" || c == "E0021") && codes.contains(&"E0021".to_string()), "{codes:?}");
    o.err_has("invalid: input |x of the schema never appears in the file, so 3 sequence(s) lack stream \"x\"");
    // A sequence id too large for 64 bits: fatal, at the digit that overflows.
    write(d.path(), "ovf.ctf", "0 |x 1\n1 |x 2\n99999999999999999999999 |x 3\n");
    let o = run_in(d.path(), args!["validate", "ovf.ctf", &x]);
    o.code(1).err_has("ovf.ctf:3:20: error[E0004]: sequence id overflows a 64-bit unsigned integer");
    check_snippet(&rendered_errors(&o.stderr)[0], &read(&d.path().join("ovf.ctf")));
    // Numbers CNTK accepts.
    write(d.path(), "ok.ctf", "|x 45.\n|x -123\n|x 6.78\n|x 9.10e-11\n|x 1E3\n|x +2\n|x 1e+2\n");
    run_in(d.path(), args!["validate", "ok.ctf", &x]).code(0).err_has("7 sequences, 7 samples; 0 error(s): valid");
}

#[test]
fn validate_huge_dims_and_long_lines() {
    let d = tmp();
    // The largest dim allowed: a sparse index far out is still checked, without allocating the dim.
    let p = write(d.path(), "s.ctf", "|s 2147483646:1\n|s 2147483647:1\n");
    let o = run(args!["validate", &p, "--stream", "s:2147483647:sparse"]);
    o.code(1).err_has(":2:4: error[E0015]: sparse index 2147483647 >= dim 2147483647");
    let o = run(args!["dump", &p, "--stream", "s:2147483647:sparse", "--max-errors", "2", "--skip-bad-sequences"]);
    assert_eq!(o.code(0).stdout(), "{\"key\":0,\"streams\":{\"s\":[[[2147483646,1]]]}}\n");
    // A long line: the snippet is a window around the column, with '…' where it is cut.
    let mut line = String::from("|x");
    for i in 0..300 {
        line.push_str(&format!(" {i}"));
    }
    line.push_str(" bad");
    for i in 0..100 {
        line.push_str(&format!(" {i}"));
    }
    let p = write(d.path(), "long.ctf", format!("{line}\n"));
    let o = run(args!["validate", &p, "--stream", "x:400:dense", "--limit", "1"]);
    o.code(1);
    let e = &rendered_errors(&o.stderr)[0];
    assert_eq!(e.code, "E0008");
    let (text, _) = e.snippet.as_ref().unwrap();
    assert!(text.starts_with('…') && text.ends_with('…'), "{text}");
    check_snippet(e, &read(&p));
}

#[test]
fn validate_cbf_files() {
    let mut bins: Vec<PathBuf> = std::fs::read_dir(real("cbf")).unwrap().map(|e| e.unwrap().path()).collect();
    bins.extend(std::fs::read_dir(conf("Data/CNTKBinaryReader")).unwrap().map(|e| e.unwrap().path()));
    bins.retain(|p| p.extension().is_some_and(|e| e == "bin"));
    assert_eq!(bins.len(), 11);
    for b in &bins {
        let o = run(args!["validate", b]);
        o.code(0);
        let s = summary_line(&o.stderr, &b.display().to_string());
        assert!(s.contains(": CBF, ") && s.ends_with("; 0 error(s): valid"), "{s}");
    }
    let o = run(args!["validate", real("cbf/Simple_dense.bin").as_path()]);
    assert_eq!(
        o.stderr,
        format!("{}: CBF, 10000 sequences, 10000 samples; 0 error(s): valid\n", real("cbf/Simple_dense.bin").display())
    );
    let o = run(args!["validate", conf("Data/CNTKBinaryReader/Simple_jagged_sequence.bin").as_path(), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.code(0).stdout).unwrap();
    let f = &j["files"][0];
    assert_eq!((f["format"].as_str(), f["valid"].as_bool()), (Some("cbf"), Some(true)));
    assert_eq!(
        (f["sequences"].as_u64(), f["samples"].as_u64(), f["num_errors"].as_u64()),
        (Some(101), Some(14239), Some(0))
    );
    // CBF and CTF files in one run; one invalid file makes the exit code 1.
    let d = tmp();
    let bad = write(d.path(), "bad.ctf", "|features 1 2 |labels x\n");
    let o = run(args![
        "validate",
        real("cbf/Simple_dense.bin").as_path(),
        real("logreg/Train_cntk_text.ctf").as_path(),
        &bad,
        &LOGREG
    ]);
    o.code(1);
    o.err_has("Simple_dense.bin: CBF, 10000 sequences")
        .err_has("Train_cntk_text.ctf: 1000 sequences, 1000 samples; 0 error(s): valid")
        .err_has("bad.ctf:1:23: error[E0008]");
}

#[test]
fn validate_damaged_cbf_names_the_field() {
    let d = tmp();
    let good = read(&real("cbf/Simple_dense.bin"));
    let n = good.len();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    cases.push(("truncated.bin", good[..n / 2].to_vec(), "header offset"));
    let mut c = good.clone();
    c[n - 8..].copy_from_slice(&1_000_000_000i64.to_le_bytes());
    cases.push(("offset.bin", c, "header offset at byte 280078: the trailer points to byte 1000000000"));
    let mut c = good.clone();
    c[..8].copy_from_slice(b"notmagic");
    cases.push(("magic.bin", c, ""));
    let mut c = read(&real("cbf/10x10_dense.bin"));
    c[52..56].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    cases.push((
        "n.bin",
        c,
        "stream \"features\" sequence 0 N at byte 52: 2147483647 samples × dim 5 × 4 bytes do not fit",
    ));
    cases.push((
        "tiny.bin",
        good[..20].to_vec(),
        "file length at byte 0: the file has 20 bytes; a CBF file has at least 36",
    ));
    for (name, bytes, field) in cases {
        let p = write(d.path(), name, &bytes);
        let o = run(args!["validate", &p]);
        if name == "magic.bin" {
            // Without the magic number the file is not CBF, and not CTF text either: the input's fault.
            o.code(1).err_has("error[E0003]").err_has("found 'n'");
            run(args!["validate", &p, "--stream", "x:1:dense"]).code(1);
            continue;
        }
        o.code(1).err_has("error[E0100]: invalid CBF file: ").err_has(field);
        assert!(summary_line(&o.stderr, &p.display().to_string()).ends_with("invalid: CNTK cannot read this file"));
        let j: serde_json::Value =
            serde_json::from_slice(&run(args!["validate", &p, "--json"]).code(1).stdout).unwrap();
        let f = &j["files"][0];
        assert_eq!(
            (f["valid"].as_bool(), f["format"].as_str(), f["num_errors"].as_u64()),
            (Some(false), Some("cbf"), Some(1))
        );
        assert_eq!(f["errors"][0]["code"], "E0100");
        assert!(f["errors"][0]["message"].as_str().unwrap().contains(field));
        // dump and inspect refuse it too.
        run(args!["dump", &p]).code(1).err_has("E0100");
        run(args!["inspect", &p]).code(1).err_has("E0100");
    }
    let o = run(args!["validate", d.path().join("n.bin").as_path(), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["files"][0]["errors"][0]["byte"], 52);
}

// ===================================================================================================
// dump
// ===================================================================================================

#[test]
fn dump_known_numbers_exact_text_and_bits() {
    let d = tmp();
    let p = write(d.path(), "n.ctf", "|x 0.1 -0 1e400 0e400 -1e400 3 1e-400 123456789\n");
    let o = run(args!["dump", &p, "--stream", "x:8:dense"]);
    assert_eq!(
        o.code(0).stdout(),
        "{\"key\":0,\"streams\":{\"x\":[[0.1,-0.0,\"inf\",\"nan\",\"-inf\",3,0,123456790]]}}\n"
    );
    assert_eq!(o.stderr, "");
    let rec = &parse_dump(&o.stdout(), &[("x".into(), StorageFormat::Dense, ElementType::F32)])[0];
    let Sample::Dense(v) = &rec.streams[0].1[0] else { panic!() };
    // Computed here, independently of the library.
    let expected: Vec<u64> = vec![
        0x3dcc_cccd,                         // 0.1f32
        0x8000_0000,                         // -0.0f32
        0x7f80_0000,                         // +inf
        NAN_BITS,                            // 0 × 10^400 = 0 × inf
        0xff80_0000,                         // -inf
        0x4040_0000,                         // 3.0f32
        0,                                   // +0
        u64::from(123_456_792f32.to_bits()), // the float nearest to 123456789
    ];
    assert_eq!(v, &expected);
    assert_eq!(0.1f32.to_bits(), 0x3dcc_cccd);
    // Doubles: every digit kept.
    let o = run(args!["dump", &p, "--stream", "x:8:dense", "--precision", "double"]);
    assert_eq!(
        o.code(0).stdout(),
        "{\"key\":0,\"streams\":{\"x\":[[0.1,-0.0,\"inf\",\"nan\",\"-inf\",3,0,123456789]]}}\n"
    );
    let rec = &parse_dump(&o.stdout(), &[("x".into(), StorageFormat::Dense, ElementType::F64)])[0];
    let Sample::Dense(v) = &rec.streams[0].1[0] else { panic!() };
    assert_eq!(v[0], 0.1f64.to_bits());
    assert_eq!(v[1], (-0.0f64).to_bits());
    assert_eq!(v[7], 123_456_789f64.to_bits());
}

#[test]
fn dump_sparse_pairs_in_file_order_and_dense_padding() {
    let d = tmp();
    let p = write(d.path(), "s.ctf", "0 |s 5:0.1 2:-0 7:1e400 |d 1\n0 |s\n1 |s 1:1 1:2 |d 1 2 3\n");
    let o = run(args!["dump", &p, "--stream", "s:8:sparse", "--stream", "d:3:dense", "--max-errors", "5"]);
    assert_eq!(
        o.code(0).stdout(),
        "{\"key\":0,\"streams\":{\"s\":[[[5,0.1],[2,-0.0],[7,\"inf\"]],[]],\"d\":[[1,0,0]]}}\n\
         {\"key\":1,\"streams\":{\"s\":[[[1,1],[1,2]]],\"d\":[[1,2,3]]}}\n"
    );
    // CNTK's empty_samples test: empty dense samples are zeros, short ones are zero-padded.
    let e = real("edge/empty_samples.ctf");
    let o = run(args!["dump", &e, "--stream", "F0:10:dense", "--stream", "F1:10:sparse"]);
    let recs = parse_dump(
        &o.code(0).stdout(),
        &[
            ("F0".into(), StorageFormat::Dense, ElementType::F32),
            ("F1".into(), StorageFormat::Sparse, ElementType::F32),
        ],
    );
    assert_eq!(recs.len(), 3);
    for r in &recs {
        for s in &r.streams[0].1 {
            let Sample::Dense(v) = s else { panic!() };
            assert_eq!(v.len(), 10, "dense samples have dim numbers");
        }
    }
    let Sample::Dense(first) = &recs[0].streams[0].1[0] else { panic!() };
    assert_eq!(first, &vec![0u64; 10]);
}

#[test]
fn dump_matches_the_library_bit_for_bit() {
    // (file, streams, precision, main stream)
    let cases: Vec<(PathBuf, Vec<&str>, ElementType, Option<&str>)> = vec![
        (real("atis/atis.test.ctf"), ATIS.to_vec(), ElementType::F32, None),
        (real("cmudict/cmudict-0.7b.train-dev-1-21.ctf"), CMUDICT.to_vec(), ElementType::F32, Some("rawInput")),
        (real("seqcla/Train.ctf"), SEQCLA.to_vec(), ElementType::F32, None),
        (real("mnist/MNIST_dense.ctf"), MNIST.to_vec(), ElementType::F64, None),
        (real("logreg/Train_cntk_text.ctf"), LOGREG.to_vec(), ElementType::F64, None),
        (
            real("edge/space_separated.ctf"),
            vec!["--stream", "F1:15:dense", "--stream", "F2:12:dense", "--stream", "F3:1:dense"],
            ElementType::F64,
            None,
        ),
        (real("cbf/10x10_sparse.ctf"), vec!["--stream", "features:100:sparse:F0"], ElementType::F64, None),
        (real("cbf/10x10_sparse.ctf"), vec!["--stream", "features:100:sparse:F0"], ElementType::F32, None),
        (real("cbf/50x20_jagged_sequences_dense.ctf"), vec!["--stream", "features:3:dense:F0"], ElementType::F64, None),
        (
            real("cbf/50x20_jagged_sequences_sparse.ctf"),
            vec!["--stream", "features:100:sparse:F0"],
            ElementType::F32,
            None,
        ),
    ];
    for (path, flags, t, main) in cases {
        let schema = lib_schema(&stream_specs(&flags), t, main);
        let precision = if t == ElementType::F64 { "double" } else { "float" };
        let o = run(args!["dump", &path, &flags[..], "--precision", precision]);
        let got = parse_dump(&o.code(0).stdout(), &stream_types(&schema));
        let expected = library_ctf(&path, &schema);
        assert!(!expected.is_empty());
        assert_eq!(got.len(), expected.len(), "{}", path.display());
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g, e, "{} ({precision})", path.display());
        }
    }
    // CBF input: the streams and values the library decodes.
    for name in
        ["10x10_dense", "10x10_sparse", "50x20_jagged_sequences_dense", "50x20_jagged_sequences_sparse", "Simple_dense"]
    {
        let path = real(&format!("cbf/{name}.bin"));
        let (expected, types) = library_cbf(&path);
        let got = parse_dump(&run(args!["dump", &path]).code(0).stdout(), &types);
        assert_eq!(got, expected, "{name}");
    }
    let path = conf("Data/CNTKBinaryReader/Simple_jagged_sequence.bin");
    let (expected, types) = library_cbf(&path);
    assert_eq!(parse_dump(&run(args!["dump", &path]).code(0).stdout(), &types), expected);
}

#[test]
fn dump_shapes_on_real_files() {
    // Every configured stream by name; dense samples of dim numbers; keys are the sequence ids (ATIS)
    // or line numbers (MNIST, no ids).
    let o = run(args!["dump", real("mnist/MNIST_dense.ctf").as_path(), &MNIST]);
    let recs = parse_dump(
        &o.code(0).stdout(),
        &[
            ("features".into(), StorageFormat::Dense, ElementType::F32),
            ("labels".into(), StorageFormat::Dense, ElementType::F32),
        ],
    );
    assert_eq!(recs.len(), 1000);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.key, i as u64);
        assert!(matches!(&r.streams[0].1[..], [Sample::Dense(v)] if v.len() == 784));
        assert!(matches!(&r.streams[1].1[..], [Sample::Dense(v)] if v.len() == 10));
    }
    let o = run(args!["dump", real("atis/atis.test.ctf").as_path(), &ATIS]);
    let out = o.code(0).stdout();
    assert_eq!(out.lines().count(), 893);
    let first = J::parse(out.lines().next().unwrap());
    assert_eq!(first.get("streams").keys(), ["query", "intentLabels", "slotLabels"]);
    let text = String::from_utf8(read(&real("atis/atis.test.ctf"))).unwrap();
    let ids: Vec<u64> = text.lines().map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect();
    let mut distinct = ids.clone();
    distinct.dedup();
    let keys: Vec<u64> = out.lines().map(|l| J::parse(l).get("key").u64()).collect();
    assert_eq!(keys, distinct);
    // seqcla: a dense label only on the first row, 5 numbers.
    let o = run(args!["dump", real("seqcla/Train.ctf").as_path(), &SEQCLA]);
    for l in o.code(0).stdout().lines() {
        let y = J::parse(l).get("streams").get("labels").clone();
        assert_eq!(y.arr().len(), 1);
        assert_eq!(y.arr()[0].arr().len(), 5);
    }
}

#[test]
fn dump_threads_and_mmap_give_identical_bytes() {
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (real("atis/atis.train.ctf"), ATIS.to_vec()),
        (real("cmudict/cmudict-0.7b.train-dev-1-21.ctf"), CMUDICT.to_vec()),
        (real("mnist/MNIST_dense.ctf"), MNIST.to_vec()),
        (real("seqcla/Train.ctf"), SEQCLA.to_vec()),
    ];
    for (path, schema) in cases {
        let base = run(args!["dump", &path, &schema[..], "--threads", "1"]);
        base.code(0);
        assert!(!base.stdout.is_empty());
        for extra in [
            &["--threads", "2"][..],
            &["--mmap"][..],
            &["--mmap", "--threads", "2"][..],
            &["--threads", "2", "--chunk-size", "64k"][..],
            &["--threads", "1", "--chunk-size", "10k", "--mmap"][..],
        ] {
            let o = run(args!["dump", &path, &schema[..], extra]);
            o.code(0);
            assert!(o.stdout == base.stdout, "{} {extra:?}: output differs", path.display());
        }
    }
}

#[test]
fn dump_fatal_error_mid_file_keeps_earlier_records_complete() {
    let d = tmp();
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(&format!("{i} |x {i}.5 1\n"));
    }
    // The second row of sequence 1999, on line 2001.
    text.push_str("1999 |x 1 zz\n");
    for i in 2000..3000 {
        text.push_str(&format!("{i} |x {i}.5 1\n"));
    }
    let p = write(d.path(), "mid.ctf", &text);
    for threads in ["1", "2"] {
        let o = run(args!["dump", &p, "--stream", "x:2:dense", "--chunk-size", "1k", "--threads", threads]);
        o.code(1);
        let out = o.stdout();
        assert!(out.ends_with('\n'), "no partial line");
        let recs = parse_dump(&out, &[("x".into(), StorageFormat::Dense, ElementType::F32)]);
        assert!(!recs.is_empty() && recs.len() < 2000, "{} records", recs.len());
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.key, i as u64, "records in file order, none missing");
            let Sample::Dense(v) = &r.streams[0].1[0] else { panic!() };
            assert_eq!(v, &vec![u64::from((i as f32 + 0.5).to_bits()), u64::from(1f32.to_bits())]);
        }
        let e = rendered_errors(&o.stderr);
        assert_eq!(e.len(), 1, "{}", o.stderr);
        assert_eq!((e[0].line, e[0].col, e[0].code.as_str()), (2001, 11, "E0022"));
        assert!(e[0].message.contains("too many errors (maxErrors = 0); the one over the limit: [E0008]"));
        check_snippet(&e[0], text.as_bytes());
    }
    // The same in one chunk: nothing at all is written.
    let o = run(args!["dump", &p, "--stream", "x:2:dense"]);
    o.code(1);
    assert!(o.stdout.is_empty());
    // With a budget, the whole file is dumped, without the bad sample.
    let o = run(args!["dump", &p, "--stream", "x:2:dense", "--max-errors", "3"]);
    assert_eq!(o.code(0).stdout().lines().count(), 3000);
}

#[test]
fn dump_to_a_closed_pipe_exits_0_quietly() {
    let mut c = cmd(args!["dump", real("atis/atis.train.ctf").as_path(), &ATIS, "--threads", "2"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The reader is dropped here: `cntkio dump … | head -1`.
    let o = child.wait_with_output().unwrap();
    assert!(first.starts_with("{\"key\":0,\"streams\":{\"query\":[[[178,1]]") && first.ends_with("}}\n"), "{first}");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
}

#[test]
fn dump_several_files_one_after_another() {
    let a = real("logreg/Train_cntk_text.ctf");
    let o = run(args!["dump", &a, &a, &LOGREG]);
    let one = run(args!["dump", &a, &LOGREG]).code(0).stdout.clone();
    assert!(o.code(0).stdout == [one.clone(), one].concat());
    // A CTF and a CBF file (with its own streams) in one run.
    let b = real("cbf/10x10_dense.bin");
    let o = run(args!["dump", &b, &a, &LOGREG]);
    let out = o.code(0).stdout();
    assert_eq!(out.lines().count(), 1010);
    assert!(out.starts_with("{\"key\":0,\"streams\":{\"features\":[["));
}

#[test]
fn dump_cbf_equals_dump_of_its_ctf_twin() {
    // Simple_dense is float and ctf2bin's values equal the reader's: the dumps are identical.
    let a = run(args!["dump", real("cbf/Simple_dense.bin").as_path()]);
    let b = run(args![
        "dump",
        real("cbf/Simple_dense.ctf").as_path(),
        "--stream",
        "features:2:dense:F",
        "--stream",
        "labels:2:dense:L"
    ]);
    assert!(a.code(0).stdout == b.code(0).stdout);
    assert_eq!(a.stdout().lines().count(), 10000);
}

// ===================================================================================================
// inspect
// ===================================================================================================

/// (alias, storage, smallest dim) of each stream of `inspect --json`, and the sequence count.
fn inspected(path: &Path) -> (Vec<(String, String, u64)>, u64, serde_json::Value) {
    let o = run(args!["inspect", path, "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.code(0).stdout).unwrap();
    let streams = j["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (s["alias"].as_str().unwrap().into(), s["storage"].as_str().unwrap().into(), s["min_dim"].as_u64().unwrap())
        })
        .collect();
    (streams, j["sequences"].as_u64().unwrap(), j)
}

/// (alias, storage, smallest dim) of each stream in order of appearance, from the text alone: sparse streams
/// by their largest index + 1, dense ones by their most values. Comments (`|#…`) run to the next `|`.
fn independent_streams(path: &Path) -> Vec<(String, String, u64)> {
    let text = String::from_utf8(read(path)).unwrap();
    let mut out: Vec<(String, String, u64)> = Vec::new();
    for line in text.lines() {
        for piece in line.split('|').skip(1) {
            let mut tokens = piece.split_whitespace();
            let Some(alias) = tokens.next() else { continue };
            if alias.starts_with('#') {
                continue;
            }
            let values: Vec<&str> = tokens.collect();
            let sparse = values.iter().any(|v| v.contains(':'));
            let dim = if sparse {
                values.iter().map(|v| v.split(':').next().unwrap().parse::<u64>().unwrap() + 1).max().unwrap()
            } else {
                values.len() as u64
            };
            match out.iter_mut().find(|s| s.0 == alias) {
                Some(s) => s.2 = s.2.max(dim),
                None => out.push((alias.to_string(), if sparse { "sparse" } else { "dense" }.to_string(), dim)),
            }
        }
    }
    out
}

#[test]
fn inspect_real_ctf_matches_the_readme_table() {
    let s = |a: &str, f: &str, d: u64| (a.to_string(), f.to_string(), d);
    let cases = vec![
        ("atis/atis.train.ctf", vec![s("S0", "sparse", 943), s("S1", "sparse", 26), s("S2", "sparse", 129)], 4978),
        ("cmudict/cmudict-0.7b.train-dev-1-21.ctf", vec![s("S0", "sparse", 30), s("S1", "sparse", 69)], 5447),
        ("seqcla/Train.ctf", vec![s("x", "sparse", 1995), s("y", "dense", 5)], 1247),
        ("mnist/MNIST_dense.ctf", vec![s("L", "dense", 10), s("F", "dense", 784)], 1000),
        ("logreg/Train_cntk_text.ctf", vec![s("features", "dense", 2), s("labels", "dense", 1)], 1000),
        ("logreg/Train_cntk_text.crlf.ctf", vec![s("features", "dense", 2), s("labels", "dense", 1)], 1000),
    ];
    for (name, streams, sequences) in cases {
        let (got, n, j) = inspected(&real(name));
        assert_eq!(got, streams, "{name}");
        assert_eq!(got, independent_streams(&real(name)), "{name}: computed here from the text");
        assert_eq!(n, sequences, "{name}");
        assert_eq!(j["format"], "ctf");
        assert_eq!(j["bytes"].as_u64(), Some(std::fs::metadata(real(name)).unwrap().len()));
    }
    // Counts from the README.
    let (_, _, j) = inspected(&real("atis/atis.train.ctf"));
    assert_eq!(
        (j["rows"].as_u64(), j["comments"].as_u64(), j["mode"].as_str()),
        (Some(66547), Some(138072), Some("ids"))
    );
    assert_eq!(j["sequence_length"]["max"], 48);
    assert_eq!(j["streams"][0]["max_index"], 942);
    assert_eq!(j["streams"][1]["samples"], 4978);
    let (_, _, j) = inspected(&real("cmudict/cmudict-0.7b.train-dev-1-21.ctf"));
    assert_eq!((j["streams"][0]["samples"].as_u64(), j["streams"][1]["samples"].as_u64()), (Some(51704), Some(45526)));
    assert_eq!((j["sequence_length"]["min"].as_u64(), j["sequence_length"]["max"].as_u64()), (Some(3), Some(21)));
    let (_, _, j) = inspected(&real("mnist/MNIST_dense.ctf"));
    assert_eq!(j["mode"], "lines");
    assert_eq!(j["streams"][1]["values_per_sample"], serde_json::json!({"min": 784, "max": 784}));
    // The text form: streams, dense/sparse, dims, and a schema that fits.
    let o = run(args!["inspect", real("atis/atis.train.ctf").as_path()]);
    let out = o.code(0).stdout();
    assert!(out.starts_with(&format!("{}: CTF, 3035052 bytes\n", real("atis/atis.train.ctf").display())));
    assert!(out.contains("sequences  4978 (grouped by sequence id)   rows 66547"));
    assert!(out.contains("    S0           sparse  dim ≥ 943      samples 66547"));
    assert!(out.contains("--stream S0:943:sparse --stream S1:26:sparse --stream S2:129:sparse"));
    let o = run(args!["inspect", real("mnist/MNIST_dense.ctf").as_path()]);
    o.code(0).out_has("    F            dense   dim ≥ 784 ").out_has("(one per line)");
}

#[test]
fn inspect_json_fields() {
    let (_, _, j) = inspected(&real("seqcla/Train.ctf"));
    let keys: BTreeSet<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "version",
            "path",
            "format",
            "bytes",
            "mode",
            "chunks_at_32MiB",
            "sequences",
            "rows",
            "empty_rows",
            "comments",
            "sequence_length",
            "streams"
        ]
        .into()
    );
    assert_eq!(j["version"], 1);
    let sl = &j["sequence_length"];
    assert_eq!(sl["unit"], "rows");
    assert_eq!((sl["min"].as_u64(), sl["max"].as_u64()), (Some(1), Some(13)));
    let hist: u64 = sl["histogram"].as_array().unwrap().iter().map(|h| h["sequences"].as_u64().unwrap()).sum();
    assert_eq!(hist, 1247, "the histogram counts every sequence");
    let stream_keys: BTreeSet<&str> = [
        "alias",
        "storage",
        "min_dim",
        "samples",
        "nnz",
        "max_index",
        "values_per_sample",
        "empty_samples",
        "sequences",
        "max_samples_per_sequence",
    ]
    .into();
    for s in j["streams"].as_array().unwrap() {
        assert_eq!(s.as_object().unwrap().keys().map(String::as_str).collect::<BTreeSet<_>>(), stream_keys);
    }
    let x = &j["streams"][0];
    assert_eq!(
        (x["nnz"].as_u64(), x["max_index"].as_u64(), x["values_per_sample"].is_null()),
        (Some(5433), Some(1994), true)
    );
    let y = &j["streams"][1];
    assert_eq!(
        (y["nnz"].is_null(), y["samples"].as_u64(), y["max_samples_per_sequence"].as_u64()),
        (true, Some(1247), Some(1))
    );
}

#[test]
fn inspect_schema_suggestion_validates() {
    // The suggested flags read the file they came from.
    for name in ["atis/atis.test.ctf", "seqcla/Train.ctf", "mnist/MNIST_dense.ctf", "logreg/Train_cntk_text.ctf"] {
        let o = run(args!["inspect", real(name).as_path()]);
        let out = o.code(0).stdout();
        let line = out.lines().find(|l| l.contains("a schema that fits")).unwrap();
        let flags: Vec<&str> = line.split(": ").nth(1).unwrap().split_whitespace().collect();
        run(args!["validate", real(name).as_path(), &flags[..]]).code(0);
    }
}

#[test]
fn suggested_flags_paste_into_a_shell_whatever_the_names() {
    // CTF names may hold any printable byte but '|': a ':' cannot go in --stream's NAME (it becomes the
    // alias), and shell characters are quoted. Each suggestion, run by `sh` as printed, reads the file.
    let d = tmp();
    let f = write(d.path(), "odd.ctf", "0 |a:b 1 2 |x$y 3:1 |it's 5\n1 |a:b 3 4 |x$y 0:1 |it's 6\n");
    let bin = env!("CARGO_BIN_EXE_cntkio");
    let o = run(args!["inspect", &f]);
    let out = o.code(0).stdout();
    let line = out.lines().find(|l| l.contains("a schema that fits")).unwrap();
    let inspect_flags = line.split(": ").nth(1).unwrap().to_string();
    assert!(inspect_flags.contains("--stream a_b:2:dense:a:b"), "{inspect_flags}");
    assert!(inspect_flags.contains("--stream 'x$y:4:sparse'"), "{inspect_flags}");
    assert!(inspect_flags.contains(r"--stream 'it'\''s:1:dense'"), "{inspect_flags}");
    // The flags a command without a schema suggests (its error).
    let o = run(args!["dump", &f]);
    let err = o.code(2).stderr.clone();
    let at = err.find("suggest --stream").unwrap_or_else(|| panic!("{err}")) + "suggest ".len();
    let error_flags = err[at..].split(" (each dim").next().unwrap().to_string();
    for flags in [inspect_flags, error_flags] {
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(format!("\"$0\" dump '{}' {flags}", f.display())).arg(bin);
        let o = run_cmd(c);
        let dumped = o.code(0).stdout();
        assert_eq!(dumped.lines().count(), 2, "{flags}: {dumped}");
        assert!(dumped.contains(r#""a_b":[[1,2]]"#), "{flags}: {dumped}");
    }
}

#[test]
fn inspect_cbf_lists_streams_and_chunks() {
    let p = real("cbf/Simple_dense.bin");
    let o = run(args!["inspect", &p]);
    let out = o.code(0).stdout();
    assert!(
        out.starts_with(&format!("{}: CBF version 1, 280086 bytes, header at byte 280012\n", p.display())),
        "{out}"
    );
    assert!(out.contains("sequences 10000   samples 10000   chunks 1"));
    assert!(out.contains("    features       dense  float  dim 2 "));
    assert!(out.contains("    labels         dense  float  dim 2 "));
    assert!(out.contains("    0     at byte 12 "));
    let o = run(args!["inspect", real("cbf/10x10_sparse.bin").as_path()]);
    o.code(0).out_has("    features       sparse double dim 100       samples 100        nnz 500");
    let o = run(args!["inspect", real("cbf/Simple_dense.bin").as_path(), "--json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.code(0).stdout).unwrap();
    assert_eq!(
        (j["format"].as_str(), j["cbf_version"].as_u64(), j["header_offset"].as_u64()),
        (Some("cbf"), Some(1), Some(280012))
    );
    assert_eq!(j["chunks"], serde_json::json!([{"offset": 12, "bytes": 280000, "sequences": 10000, "samples": 10000}]));
    assert_eq!(j["streams"][0]["name"], "features");
    assert_eq!(j["streams"][1]["element_type"], "float");
    // A multi-chunk file of our own: the chunks tile the data, their counts add up.
    let d = tmp();
    let c = d.path().join("atis.cbf");
    run(args!["-q", "convert", real("atis/atis.test.ctf").as_path(), &c, &ATIS, "--chunk-size", "64k"]).code(0);
    let j: serde_json::Value = serde_json::from_slice(&run(args!["inspect", &c, "--json"]).code(0).stdout).unwrap();
    let chunks = j["chunks"].as_array().unwrap();
    assert!(chunks.len() > 2);
    let mut at = 12;
    for ch in chunks {
        assert_eq!(ch["offset"].as_u64(), Some(at));
        assert!(ch["bytes"].as_u64().unwrap() <= 65536);
        at += ch["bytes"].as_u64().unwrap();
    }
    assert_eq!(Some(at), j["header_offset"].as_u64());
    assert_eq!(chunks.iter().map(|c| c["sequences"].as_u64().unwrap()).sum::<u64>(), 893);
    assert_eq!(j["sequences"], 893);
    let names: Vec<&str> = j["streams"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["query", "intentLabels", "slotLabels"]);
}

// ===================================================================================================
// convert
// ===================================================================================================

#[test]
fn convert_round_trips_are_byte_identical() {
    let d = tmp();
    let cases: Vec<(PathBuf, Vec<&str>, &str)> = vec![
        (real("atis/atis.test.ctf"), ATIS.to_vec(), "64k"),
        (real("cmudict/cmudict-0.7b.train-dev-1-21.ctf"), CMUDICT.to_vec(), "100k"),
        (real("seqcla/Train.ctf"), SEQCLA.to_vec(), "8k"),
        (real("mnist/MNIST_dense.ctf"), [&MNIST[..], &["--precision", "double"]].concat(), "300k"),
        (
            real("edge/space_separated.ctf"),
            vec![
                "--stream",
                "F1:15:dense",
                "--stream",
                "F2:12:dense",
                "--stream",
                "F3:1:dense",
                "--precision",
                "double",
            ],
            "32M",
        ),
    ];
    for (i, (src, schema, chunk)) in cases.into_iter().enumerate() {
        let c1 = d.path().join(format!("{i}.1.cbf"));
        let t1 = d.path().join(format!("{i}.1.ctf"));
        let c2 = d.path().join(format!("{i}.2.cbf"));
        let t2 = d.path().join(format!("{i}.2.ctf"));
        let c3 = d.path().join(format!("{i}.3.cbf"));
        run(args!["convert", &src, &c1, &schema[..], "--chunk-size", chunk]).code(0).err_has("CTF → CBF: ");
        // Back to CTF with the aliases of the schema, and again to CBF: the same bytes.
        run(args!["convert", &c1, &t1, &schema[..]]).code(0).err_has("CBF → CTF: ");
        // (with one parser thread, whose writer has a thread of its own, and with two; read, and mapped
        // as by default)
        run(args!["-q", "convert", &t1, &c2, &schema[..], "--chunk-size", chunk, "--threads", "1", "--no-mmap"])
            .code(0);
        assert!(read(&c1) == read(&c2), "{}: CTF → CBF → CTF → CBF changed the bytes", src.display());
        // Without aliases the CTF uses the stream names; with names as aliases it reads back the same.
        run(args!["-q", "convert", &c2, &t2]).code(0);
        let by_name: Vec<String> = schema
            .iter()
            .map(|s| {
                let p: Vec<&str> = s.split(':').collect();
                if p.len() == 4 {
                    format!("{}:{}:{}", p[0], p[1], p[2])
                } else {
                    s.to_string()
                }
            })
            .collect();
        let by_name: Vec<&str> = by_name.iter().map(String::as_str).collect();
        run(args!["-q", "convert", &t2, &c3, &by_name[..], "--chunk-size", chunk, "--threads", "2"]).code(0);
        assert!(read(&c1) == read(&c3), "{}: names as aliases", src.display());
        // The same dump from every form (CBF numbers the sequences from 0; the CTF source has its own ids).
        let stdout = renumber(&run(args!["dump", &src, &schema[..]]).code(0).stdout());
        let from_cbf = run(args!["dump", &c1]).code(0).stdout();
        assert_eq!(renumber(&from_cbf), from_cbf);
        assert!(from_cbf == stdout, "{}: dump of the CBF", src.display());
        for f in [&c2, &c3] {
            assert!(run(args!["dump", f]).code(0).stdout() == stdout, "{}: dump of {}", src.display(), f.display());
        }
        assert!(run(args!["dump", &t1, &schema[..]]).code(0).stdout() == stdout);
        assert!(run(args!["dump", &t2, &by_name[..]]).code(0).stdout() == stdout);
    }
}

/// A CTF input is memory-mapped by default; truncated while it is converted (or validated), it raises
/// SIGBUS, which the binary turns into an error that says so, with the temporary output removed and no
/// output written.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn convert_explains_a_mapped_input_truncated_meanwhile() {
    let d = tmp();
    let src = d.path().join("big.ctf");
    big_sparse_ctf(&src);
    let out = d.path().join("big.cbf");
    let shown = src.display().to_string();
    // Once the input is mapped (long before a conversion of these 72 MB ends), it loses its bytes.
    let (status, stderr) = act_while_running(
        args!["-q", "convert", &src, &out, "-s", "x:1000:sparse", "-s", "y:10:sparse", "-j", "2"],
        |pid| std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(&shown)),
        |_| std::fs::OpenOptions::new().write(true).open(&src).unwrap().set_len(0).unwrap(),
    );
    assert_eq!(status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.starts_with(&format!("error[E2001]: cannot read {shown}: it became shorter")), "{stderr}");
    assert!(stderr.contains("its partial temporary file was removed"), "{stderr}");
    assert!(stderr.contains("--no-mmap"), "{stderr}");
    assert_eq!(dir_names(d.path()), BTreeSet::from(["big.ctf".to_string()]), "only the input remains");

    // The same for a validation (which maps its CTF inputs by default too), without an output to speak of.
    big_sparse_ctf(&src);
    let (status, stderr) = act_while_running(
        args!["-q", "validate", &src, "-s", "x:1000:sparse", "-s", "y:10:sparse"],
        |pid| std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains(&shown)),
        |_| std::fs::OpenOptions::new().write(true).open(&src).unwrap().set_len(0).unwrap(),
    );
    assert_eq!(status.code(), Some(2), "stderr: {stderr}");
    let said = format!(
        "error[E2001]: cannot read {shown}: it became shorter or unreadable while it was memory-mapped, so the \
         validation stopped (SIGBUS)\n  = help: validate again once the file is complete, or pass --no-mmap to \
         read it without a map\n"
    );
    assert_eq!(stderr, said);
}

/// Interrupted (SIGINT, SIGTERM), a conversion in either direction removes its temporary output, says
/// so, and ends by the signal as it would have.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn convert_interrupted_leaves_nothing_behind() {
    use std::os::unix::process::ExitStatusExt;
    let d = tmp();
    let src = d.path().join("big.ctf");
    big_sparse_ctf(&src);
    let cbf = d.path().join("big.cbf");
    let schema = ["-s", "x:1000:sparse", "-s", "y:10:sparse"];
    run(args!["-q", "convert", &src, &cbf, &schema[..]]).code(0);
    let back = d.path().join("back.ctf");
    let before = dir_names(d.path());
    for (input, output, signal, number) in [(&src, d.path().join("again.cbf"), "INT", 2), (&cbf, back, "TERM", 15)] {
        let (status, stderr) = act_while_running(
            args!["-q", "convert", input, &output, &schema[..]],
            |_| writes_temporary(d.path()),
            |pid| kill(signal, pid),
        );
        assert_eq!(status.signal(), Some(number), "ended by SIG{signal}; stderr: {stderr}");
        let said = format!(
            "cntkio: interrupted: {} was not written; its partial temporary file was removed\n",
            output.display()
        );
        assert!(stderr.ends_with(&said), "SIG{signal}: {stderr}");
        assert_eq!(dir_names(d.path()), before, "SIG{signal}: nothing left behind");
    }
}

/// A dump with its keys replaced by 0, 1, 2, …
fn renumber(dump: &str) -> String {
    let mut out = String::new();
    for (i, l) in dump.lines().enumerate() {
        let rest = &l[l.find(",\"streams\":").expect("a dump record")..];
        out.push_str(&format!("{{\"key\":{i}{rest}\n"));
    }
    out
}

const CTF2BIN_HEADERS: [(&str, &str, &str); 5] = [
    ("10x10_dense", "features F0 dense 5\n", "float"),
    ("10x10_sparse", "features F0 sparse 100\n", "double"),
    ("50x20_jagged_sequences_dense", "features F0 dense 3\n", "double"),
    ("50x20_jagged_sequences_sparse", "features F0 sparse 100\n", "float"),
    ("Simple_dense", "features F dense 2\nlabels L dense 2\n", "float"),
];

fn ctf2bin_convert(d: &Path, name: &str, header: &str, precision: &str) -> PathBuf {
    let h = write(d, &format!("{name}.header"), header);
    let out = d.join(format!("{name}.bin"));
    run(args![
        "-q",
        "convert",
        real(&format!("cbf/{name}.ctf")).as_path(),
        &out,
        "--header",
        &h,
        "--precision",
        precision,
        "--ctf2bin-compatible",
        "--max-over-streams",
        "--chunk-size",
        "33554432"
    ])
    .code(0);
    out
}

#[test]
fn convert_ctf2bin_compatible_reproduces_real_bins_when_values_agree() {
    // The two files on which CNTK's reader and ctf2bin's Python float() give the same values.
    let d = tmp();
    for (name, header, precision) in CTF2BIN_HEADERS {
        let out = ctf2bin_convert(d.path(), name, header, precision);
        let (got, expected) = (read(&out), read(&real(&format!("cbf/{name}.bin"))));
        assert_eq!(got.len(), expected.len(), "{name}: size");
        if matches!(name, "10x10_dense" | "Simple_dense") {
            assert!(got == expected, "{name}: bytes differ");
        }
        // Always: the same structure, and values within one ulp of the real file's.
        let (a, ta) = library_cbf(&out);
        let (b, tb) = library_cbf(&real(&format!("cbf/{name}.bin")));
        assert_eq!(ta, tb);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.key, y.key);
            for ((_, sx), (_, sy)) in x.streams.iter().zip(&y.streams) {
                assert_eq!(sx.len(), sy.len());
                for (p, q) in sx.iter().zip(sy) {
                    let (vp, vq): (Vec<u64>, Vec<u64>) = match (p, q) {
                        (Sample::Dense(p), Sample::Dense(q)) => (p.clone(), q.clone()),
                        (Sample::Sparse(p), Sample::Sparse(q)) => {
                            assert_eq!(
                                p.iter().map(|e| e.0).collect::<Vec<_>>(),
                                q.iter().map(|e| e.0).collect::<Vec<_>>()
                            );
                            (p.iter().map(|e| e.1).collect(), q.iter().map(|e| e.1).collect())
                        }
                        _ => panic!("{name}: storage differs"),
                    };
                    for (u, v) in vp.iter().zip(&vq) {
                        assert!(u.abs_diff(*v) <= 1, "{name}: {u:x} vs {v:x}");
                    }
                }
            }
        }
    }
}

/// The values cntkio writes are the CTF reader's (CNTK's arithmetic), not ctf2bin's Python `float()`; where
/// the two agree for every value of a file, `--ctf2bin-compatible` output is byte-identical to ctf2bin's.
/// (On the other three real files a few values differ by one ulp: see the test above and the README.)
#[test]
fn convert_ctf2bin_compatible_is_byte_identical_where_the_values_agree() {
    let d = tmp();
    for (name, header, precision) in CTF2BIN_HEADERS {
        if !matches!(name, "10x10_dense" | "Simple_dense") {
            continue;
        }
        let out = ctf2bin_convert(d.path(), name, header, precision);
        assert!(read(&out) == read(&real(&format!("cbf/{name}.bin"))), "{name}");
    }
}

#[test]
fn convert_ctf2bin_chunking() {
    // CBF.md §7.5: ctf2bin with --chunk_size 1000 on Simple_dense: 63 sequences, then one per chunk.
    let d = tmp();
    let h = write(d.path(), "h", "features F dense 2\nlabels L dense 2\n");
    let out = d.path().join("c.bin");
    run(args![
        "-q",
        "convert",
        real("cbf/Simple_dense.ctf").as_path(),
        &out,
        "--header",
        &h,
        "--ctf2bin-compatible",
        "--chunk-size",
        "1000"
    ])
    .code(0);
    let j: serde_json::Value = serde_json::from_slice(&run(args!["inspect", &out, "--json"]).code(0).stdout).unwrap();
    let chunks = j["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 9938);
    assert_eq!(chunks[0]["sequences"], 63);
    assert!(chunks[1..].iter().all(|c| c["sequences"] == 1));
    // The exact chunking keeps chunks near the size asked for.
    let out2 = d.path().join("e.bin");
    run(args!["-q", "convert", real("cbf/Simple_dense.ctf").as_path(), &out2, "--header", &h, "--chunk-size", "1000"])
        .code(0);
    let j: serde_json::Value = serde_json::from_slice(&run(args!["inspect", &out2, "--json"]).code(0).stdout).unwrap();
    assert!(j["chunks"].as_array().unwrap().iter().all(|c| c["bytes"].as_u64().unwrap() <= 1000));
    assert!(run(args!["dump", &out]).stdout == run(args!["dump", &out2]).stdout);
}

#[test]
fn convert_failure_leaves_no_file_and_keeps_the_old_one() {
    let d = tmp();
    let bad = write(d.path(), "bad.ctf", "0 |x 1\n1 |x zz\n2 |x 3\n");
    let good = write(d.path(), "good.ctf", "0 |x 1\n1 |x 2\n2 |x 3\n");
    let es = write(d.path(), "es.ctf", "0 |a 1 |b 1:1\n1 |a 2\n2 |a 3 |b 2:1\n");
    let x = ["--stream", "x:1:dense"];
    let ab = ["--stream", "a:1:dense", "--stream", "b:3:sparse"];
    // With one parser the writer works on a thread of its own; with more, on the calling thread.
    for j in ["1", "2"] {
        let j = ["--threads", j];
        // A new output: not created.
        let before = dir_names(d.path());
        let o = run(args!["convert", &bad, d.path().join("new.cbf").as_path(), &x, &j]);
        o.code(1).err_has("bad.ctf:2:6: error[E0022]");
        assert_eq!(dir_names(d.path()), before, "no output and no temporary file");
        // An existing output: kept as it was.
        let old = write(d.path(), "out.cbf", "old contents");
        let before = dir_names(d.path());
        run(args!["convert", &bad, &old, &x, &j]).code(1);
        assert_eq!(read(&old), b"old contents");
        assert_eq!(dir_names(d.path()), before);
        // A sequence without a configured stream: refused (nothing written) ...
        run(args!["convert", &es, &old, &ab, &j]).code(1).err_has("es.ctf:2:1: error[E0021]");
        assert_eq!(read(&old), b"old contents");
        assert_eq!(dir_names(d.path()), before);
        // ... unless asked to drop it.
        run(args!["convert", &es, &old, &ab, "--skip-bad-sequences", &j]).code(0);
        let o = run(args!["dump", &old]);
        assert_eq!(
            o.code(0).stdout(),
            "{\"key\":0,\"streams\":{\"a\":[[1]],\"b\":[[[1,1]]]}}\n{\"key\":1,\"streams\":{\"a\":[[3]],\"b\":[[[2,1]]]}}\n"
        );
        std::fs::remove_file(&old).unwrap();
    }
    // A damaged CBF in its 4th chunk: CBF → CTF fails, leaving the old CTF output.
    let cbf = d.path().join("atis.cbf");
    run(args!["-q", "convert", real("atis/atis.test.ctf").as_path(), &cbf, &ATIS, "--chunk-size", "64k"]).code(0);
    let j: serde_json::Value = serde_json::from_slice(&run(args!["inspect", &cbf, "--json"]).code(0).stdout).unwrap();
    let c3 = &j["chunks"][3];
    let at = (c3["offset"].as_u64().unwrap() + 4 * c3["sequences"].as_u64().unwrap()) as usize;
    let mut bytes = read(&cbf);
    bytes[at..at + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let damaged = write(d.path(), "damaged.cbf", &bytes);
    let old_ctf = write(d.path(), "old.ctf", "old text");
    let before = dir_names(d.path());
    run(args!["convert", &damaged, &old_ctf]).code(1).err_has("error[E0100]").err_has(&format!("N at byte {at}"));
    assert_eq!(read(&old_ctf), b"old text");
    assert_eq!(dir_names(d.path()), before);
    run(args!["convert", &damaged, d.path().join("fresh.ctf").as_path()]).code(1);
    assert_eq!(dir_names(d.path()), before);
    // dump of the damaged file: the first three chunks, complete, then the error.
    let o = run(args!["dump", &damaged]);
    o.code(1).err_has("error[E0100]");
    let n: u64 = (0..3).map(|k| j["chunks"][k]["sequences"].as_u64().unwrap()).sum();
    assert_eq!(o.stdout().lines().count() as u64, n);
    assert!(o.stdout().ends_with('\n'));
    // An output that cannot be created: an I/O error (2), nothing left behind.
    run(args!["convert", &good, d.path().join("no/such/dir/o.cbf").as_path(), &x]).code(2).err_has("error[E2001]");
    let sub = d.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    run(args!["convert", &good, &sub, &x]).code(2).err_has("error[E2001]");
    assert_eq!(dir_names(&sub), BTreeSet::new());
    let mut expected = before;
    expected.insert("sub".to_string());
    assert_eq!(dir_names(d.path()), expected);
}

#[test]
fn convert_replaces_an_existing_output_on_success() {
    let d = tmp();
    let out = write(d.path(), "out.cbf", "old contents");
    let o = run(args!["convert", real("logreg/Train_cntk_text.ctf").as_path(), &out, &LOGREG]);
    o.code(0).err_has("CTF → CBF: ").err_has("1000 sequences, 1000 samples, 1 chunks, ");
    assert_eq!(dir_names(d.path()), ["out.cbf".to_string()].into());
    let o = run(args!["dump", &out]);
    assert!(o.code(0).stdout == run(args!["dump", real("logreg/Train_cntk_text.ctf").as_path(), &LOGREG]).stdout);
    // -q: silent.
    let o = run(args!["-q", "convert", &out, d.path().join("back.ctf").as_path()]);
    assert_eq!(o.code(0).stderr, "");
}

#[test]
fn convert_with_a_config() {
    let d = tmp();
    let out = d.path().join("slots.cbf");
    run(args!["-q", "convert", example("slots.ctf").as_path(), &out, "--config", example("slots.cntk").as_path()])
        .code(0);
    let a = run(args!["dump", &out]);
    let b = run(args!["dump", "--config", example("slots.cntk").as_path(), "--data-dir", example("").as_path()]);
    assert!(a.code(0).stdout == b.code(0).stdout);
    assert_eq!(a.stdout().lines().count(), 60);
    assert!(a.stdout().starts_with("{\"key\":0,\"streams\":{\"query\":[[[6,1]],"));
}

#[test]
#[cfg(unix)]
fn convert_output_has_normal_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmp();
    let out = d.path().join("o.cbf");
    run(args!["-q", "convert", real("logreg/Train_cntk_text.ctf").as_path(), &out, &LOGREG]).code(0);
    let reference = write(d.path(), "reference", "");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(format!("{:o}", mode(&out)), format!("{:o}", mode(&reference)), "as a file created with the same umask");
}

#[test]

fn convert_reports_dropped_sequences() {
    let d = tmp();
    let es = write(d.path(), "es.ctf", "0 |a 1 |b 1:1\n1 |a 2\n2 |a 3 |b 2:1\n");
    let o = run(args![
        "convert",
        &es,
        d.path().join("o.cbf").as_path(),
        "--stream",
        "a:1:dense",
        "--stream",
        "b:3:sparse",
        "--skip-bad-sequences"
    ]);
    o.code(0).err_has("2 sequences, 2 samples").err_has("; 1 sequences dropped");
}

// ===================================================================================================
// --config
// ===================================================================================================

#[test]
fn config_sections_validate_the_conformance_data() {
    let data = conf("Data/CNTKTextFormatReader");
    // (config, section, defMBSize, exit code)
    let mut cases: Vec<(&str, &str, &str, i32)> = Vec::new();
    for s in [
        "1x1",
        "1x2",
        "1x10",
        "10x1_MI",
        "10x10",
        "100x1",
        "MNIST",
        "Simple",
        "Simple_single_stream",
        "50x20_jagged_sequences",
        "5x10_and_5x5_jagged",
        "5x10_and_5x5_jagged_composite",
    ] {
        cases.push(("dense", s, "false", 0));
        cases.push(("dense", s, "true", 0));
    }
    for s in
        ["1x1", "1x2", "1x10", "10x10", "3x5_MI", "20x10_MI_jagged_samples", "50x20_jagged_sequences", "100x100_jagged"]
    {
        cases.push(("sparse", s, "false", 0));
        cases.push(("sparse", s, "true", 0));
    }
    for s in [
        "space_separated",
        "missing_trailing_newline",
        "empty_samples",
        "ref_data_with_escape_sequences",
        "blank_lines_ignored",
    ] {
        cases.push(("edge_cases", s, "false", 0));
    }
    // CNTK fails on these two ("Reached the maximum number of allowed errors").
    cases.push(("edge_cases", "blank_lines", "false", 1));
    cases.push(("edge_cases", "duplicate_inputs", "false", 1));
    // Files the conformance snapshot does not have: an I/O error.
    cases.push(("dense", "100x100x3_randomize_auto", "false", 2));
    for (cfg, section, def, code) in cases {
        let c = conf(&format!("Config/CNTKTextFormatReader/{cfg}.cntk"));
        let o = run(args![
            "validate",
            "--config",
            &c,
            "--section",
            section,
            "--set",
            &format!("defMBSize={def}"),
            "--data-dir",
            &data
        ]);
        assert_eq!(o.code, code, "{cfg} {section} defMBSize={def}:\n{}", o.stderr);
        if code == 0 {
            assert!(o.stderr.lines().last().unwrap().contains(&format!("{}", data.display())), "{}", o.stderr);
        }
    }
    let o = run(args![
        "validate",
        "--config",
        conf("Config/CNTKTextFormatReader/edge_cases.cntk").as_path(),
        "--section",
        "blank_lines_ignored",
        "--data-dir",
        &data
    ]);
    o.code(0).err_has("tolerated by maxErrors = 2");
    let o = run(args![
        "validate",
        "--config",
        conf("Config/CNTKTextFormatReader/dense.cntk").as_path(),
        "--section",
        "MNIST",
        "--data-dir",
        &data,
        "--json"
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.code(0).stdout).unwrap();
    assert_eq!(j["files"][0]["stream_samples"], serde_json::json!({"features": 1000, "labels": 1000}));
}

#[test]
fn config_with_several_sections_needs_section() {
    let dense = conf("Config/CNTKTextFormatReader/dense.cntk");
    let o = run(args!["validate", "--config", &dense]);
    o.code(2);
    assert_eq!(
        o.stderr,
        format!(
            "{}: error[E1005]: the config has several reader sections (1x1, 1x2, 1x10, 10x1_MI, 10x10, 100x1, MNIST, \
             Simple, Simple_single_stream, 50x20_jagged_sequences, 100x100x3_randomize_auto, 200x200x2_seq2seq, \
             5x10_and_5x5_jagged, 5x10_and_5x5_jagged_composite); choose one with --section\n",
            dense.display()
        )
    );
    run(args!["dump", "--config", &dense]).code(2).err_has("choose one with --section");
    run(args!["validate", "--config", conf("Config/CNTKTextFormatReader/sparse.cntk").as_path()])
        .code(2)
        .err_has("several reader sections (1x1, 1x2, 1x10, 10x10, 3x5_MI,");
}

#[test]
fn config_data_paths_resolve_against_the_current_directory() {
    let cfg = example("logreg.cntk");
    // CNTK resolves relative paths against the working directory.
    run_in(&example(""), args!["validate", "--config", "logreg.cntk"])
        .code(0)
        .err_has("logreg.ctf: 300 sequences, 300 samples; 0 error(s): valid");
    let d = tmp();
    run_in(d.path(), args!["validate", "--config", &cfg]).code(2).err_has("error[E2001]: cannot open logreg.ctf");
    run_in(d.path(), args!["validate", "--config", &cfg, "--data-dir", example("").as_path()]).code(0);
    // A single section needs no --section; FILE arguments take the config's streams.
    let o = run(args!["validate", real("logreg/Train_cntk_text.ctf").as_path(), "--config", &cfg]);
    o.code(0).err_has("Train_cntk_text.ctf: 1000 sequences, 1000 samples; 0 error(s): valid");
    // Flags override the config: a wrong dim makes it invalid.
    run(args![
        "validate",
        real("logreg/Train_cntk_text.ctf").as_path(),
        "--config",
        &cfg,
        "--stream",
        "features:1:dense",
        "--stream",
        "labels:1:dense"
    ])
    .code(1)
    .err_has("error[E0011]");
    // A CBF reader section: its file is read as CBF.
    let o = run(args![
        "validate",
        "--config",
        conf("Config/CNTKBinaryReader/test.cntk").as_path(),
        "--section",
        "Simple",
        "--data-dir",
        conf("Data/CNTKBinaryReader").as_path()
    ]);
    o.code(0).err_has("Simple_dense.bin: CBF, 10000 sequences, 10000 samples; 0 error(s): valid");
}

// ===================================================================================================
// bench
// ===================================================================================================

#[test]
fn bench_runs_and_reports_throughput() {
    let o = run(args!["bench", real("mnist/MNIST_dense.ctf").as_path(), &MNIST, "--repeat", "1", "--threads", "1"]);
    let out = o.code(0).stdout();
    assert!(out.contains("MB/s"), "{out}");
    assert!(out.contains("  index ") && out.contains("  index + parse "));
    assert!(out.contains("1000 sequences, 1000 samples, 794000 values (best of 1)"));
    let o = run(args!["bench", real("cbf/Simple_dense.bin").as_path(), "--repeat", "2"]);
    o.code(0).out_has("GB/s").out_has("CBF");
    let o = run(args![
        "bench",
        real("atis/atis.test.ctf").as_path(),
        real("cbf/10x10_sparse.bin").as_path(),
        &ATIS,
        "--repeat",
        "1",
        "--json"
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.code(0).stdout).unwrap();
    assert_eq!(j["version"], 1);
    let r = j["results"].as_array().unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!((r[0]["sequences"].as_u64(), r[0]["samples"].as_u64()), (Some(893), Some(10984)));
    assert!(r[0]["parse_mb_per_s"].as_f64().unwrap() > 0.0 && r[0]["index_mb_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!((r[1]["format"].as_str(), r[1]["samples"].as_u64()), (Some("cbf"), Some(100)));
    // bench reads like dump: an invalid file fails.
    let d = tmp();
    let bad = write(d.path(), "bad.ctf", "|x a\n");
    run(args!["bench", &bad, "--stream", "x:1:dense", "--repeat", "1"]).code(1).err_has("error[E0022]");
}

#[test]
fn a_file_neither_cbf_nor_ctf_without_a_schema_is_invalid_input() {
    // No CBF magic and not CTF text either: the input's fault (exit 1), located, rather than a request for a
    // schema (exit 2), which a CTF file without one still gets.
    let d = tmp();
    let junk = write(d.path(), "junk.bin", b"\x00\x01\x02garbage\xff\xfe");
    let out = d.path().join("out.cbf");
    for cmd in [args!["validate", &junk], args!["dump", &junk], args!["convert", &junk, &out]] {
        let o = run(cmd);
        o.code(1).err_has("junk.bin:1:1: error[E0003]").err_has("found byte 0x00").err_has("a CBF file starts with");
    }
    // A CTF file without a schema: the request names the schema its first rows suggest, ready to paste.
    let ctf = write(d.path(), "ok.ctf", "|a 1 2 |b 3:1\n|a 3 |b 7:1\n");
    let suggestion = "the file's first rows suggest --stream a:2:dense --stream b:8:sparse (each dim the largest seen";
    for cmd in [args!["dump", &ctf], args!["batches", &ctf, "--mb-size", "2"], args!["convert", &ctf, &out]] {
        run(cmd).code(2).err_has("error[E1001]").err_has(suggestion);
    }
    assert!(!out.exists());
    run(args!["convert", &ctf, &out, "--stream", "a:2:dense", "--stream", "b:8:sparse"]).code(0);
}

#[test]
fn validate_without_a_schema_checks_with_the_one_the_rows_suggest() {
    let d = tmp();
    let ok = write(d.path(), "ok.ctf", "|a 1 2 |b 3:1\n|a 3 4 |b 0:1\n");
    run(args!["validate", &ok])
        .code(0)
        .err_has("no schema given; checking with the one its rows suggest: --stream a:2:dense --stream b:4:sparse")
        .err_has("2 sequences, 2 samples; 0 error(s): valid");
    let bad = write(d.path(), "bad.ctf", "|a 1 2\n|a 1 x\n");
    run(args!["validate", &bad]).code(1).err_has("bad.ctf:2:6: error[E0008]");
    let o = run(args!["validate", "--json", &ok]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout()).unwrap();
    assert_eq!(v["files"][0]["schema_inferred"], true);
    assert_eq!(v["files"][0]["schema"], serde_json::json!(["a:2:dense", "b:4:sparse"]));
}

#[test]
fn validate_names_a_misspelled_input_and_the_cause_of_dropped_sequences() {
    let d = tmp();
    let f = write(d.path(), "s.ctf", "|features 1 2 |labels 0 1\n|features 3 4 |labels 1 0\n");
    let o = run(args!["validate", &f, "--stream", "featurs:2:dense", "--stream", "labels:2:dense"]);
    o.code(1)
        .err_has(
            "input |featurs of the schema (stream \"featurs\") never appears in the file; its rows have \
             |features (2 samples), which the schema lacks: did you mean |features?",
        )
        .err_has(
            "invalid: input |featurs of the schema never appears in the file (did you mean |features?), so 2 \
             sequence(s) lack stream \"featurs\" (always fatal in CNTK)",
        );
    // Reported once, not for the stream that is in the file.
    assert_eq!(o.stderr.matches("never appears in the file;").count(), 1, "{}", o.stderr);
    // Reading minibatches stops at the first chunk, whose error names the cause found in the chunk's rows.
    run(args!["batches", "--mb-size", "2", &f, "--stream", "featurs:2:dense", "--stream", "labels:2:dense"])
        .code(1)
        .err_has(
        "error[E0032]: input |featurs of the schema is in no row up to here; the rows have |features: did you mean \
             |features?; this caused: [E0021]",
    );
    let o = run(args!["validate", "--json", &f, "--stream", "featurs:2:dense", "--stream", "labels:2:dense"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout()).unwrap();
    let m = &v["files"][0]["missing_inputs"];
    assert_eq!(m.as_array().map(Vec::len), Some(1));
    assert_eq!(m[0]["suggestion"], "features");
    assert_eq!(m[0]["found"][0], serde_json::json!({"name": "features", "samples": 2}));
    // A dim too small for the sparse indices: the verdict names the indices, and the dim they need.
    let sp = write(d.path(), "sp.ctf", "|x 1 |y 5:1\n|x 2 |y 1:1\n");
    run(args!["validate", &sp, "--stream", "x:1:dense", "--stream", "y:3:sparse"]).code(1).err_has(
        "invalid: [E0015] sparse index 5 >= dim 3 in stream \"y\" (the largest index found: the dim must be at \
         least 6) dropped samples, so 1 sequence(s) lack a configured stream (always fatal in CNTK)",
    );
    // A dim larger than the data: valid, and the summary says what the zero-filling was.
    let o = run(args!["validate", &sp, "--stream", "x:3:dense", "--stream", "y:6:sparse"]);
    o.code(0).err_has(
        "note[W0001]: 2 sample(s) of stream \"x\" had fewer than 3 values (the first: 1) and were zero-filled, \
         as CNTK does; check the stream's dim (--warnings lists them)",
    );
    assert!(o.stderr.contains("0 error(s), 2 warning(s): valid"), "{}", o.stderr);
}

/// `batches --bench` reports the run and each sweep: the sweeps' samples add up to the run's.
#[test]
fn batches_bench_reports_each_sweep() {
    let o = run(args![
        "batches",
        real("cbf/Simple_dense.bin").as_path(),
        "--mb-size",
        "7",
        "--randomize",
        "--max-sweeps",
        "3",
        "--bench"
    ]);
    o.code(0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sweeps = v["sweeps"].as_array().unwrap();
    assert_eq!(sweeps.len(), 3, "{v}");
    let total: u64 = sweeps.iter().map(|s| s["samples"].as_u64().unwrap()).sum();
    assert_eq!(total, v["samples"].as_u64().unwrap());
    assert!(sweeps
        .iter()
        .all(|s| s["samples"].as_u64().unwrap() > 0 && s["samples_per_second"].as_f64().unwrap() > 0.0));
}

#[test]
fn sequences_the_packer_refuses_are_invalid_input() {
    // Found only when minibatches are packed, they are still the data's fault: exit 1, with their code.
    let d = tmp();
    let seq = write(d.path(), "seq.ctf", "0 |a 1\n1 |a 2\n1 |a 3\n");
    let o = run(args!["batches", &seq, "--stream", "a:1:dense", "--frame-mode", "--mb-size", "1"]);
    o.code(1).err_has("error[E0023]").err_has("non-frame sequence of size 2");
    let o = run(args!["batches", &seq, "--stream", "a:1:dense", "--frame-mode", "--mb-size", "1", "--bench"]);
    o.code(1).err_has("error[E0023]");
    let uneven = write(d.path(), "u.ctf", "0 |a 1 |b 0:1\n0 |a 2\n");
    let o = run(args![
        "batches",
        &uneven,
        "--stream",
        "a:1:dense",
        "--stream",
        "b:3:sparse",
        "--mb-size",
        "4",
        "--truncation",
        "2"
    ]);
    o.code(1).err_has("error[E0025]");
}

// ===================================================================================================
// Bugs found (ignored until fixed)
// ===================================================================================================

/// Runs `args` with stdout closed before the program writes anything (`… | true`).
fn closed_stdout(args: &[std::ffi::OsString]) -> (Option<i32>, String) {
    let mut c = cmd(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn closed_stdout_dump_exits_0() {
    let (code, err) = closed_stdout(&args!["dump", real("atis/atis.train.ctf").as_path(), &ATIS]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    let (code, err) = closed_stdout(&args!["dump", real("cbf/Simple_dense.bin").as_path()]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
}

#[test]

fn closed_stdout_is_not_a_panic_for_any_command() {
    let cases = [
        args!["inspect", real("atis/atis.train.ctf").as_path()],
        args!["inspect", real("atis/atis.train.ctf").as_path(), "--json"],
        args!["inspect", real("cbf/Simple_dense.bin").as_path()],
        args!["validate", real("atis/atis.train.ctf").as_path(), &ATIS, "--json"],
        args!["bench", real("atis/atis.test.ctf").as_path(), &ATIS, "--repeat", "1"],
    ];
    let mut failures = Vec::new();
    for a in cases {
        let (code, err) = closed_stdout(&a);
        if code != Some(0) || !err.is_empty() {
            failures
                .push(format!("{a:?}: exit {code:?}, stderr {:?}", err.lines().find(|l| !l.is_empty()).unwrap_or("")));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_command_locates_errors_by_line_and_column() {
    let d = tmp();
    write(d.path(), "sym.ctf", "abc |x 1\n");
    write(d.path(), "ovf.ctf", "0 |x 1\n99999999999999999999999 |x 3\n");
    write(d.path(), "u16.ctf", b"\xff\xfe|\0x\0 \x001\0\n\0");
    write(d.path(), "empty.ctf", "");
    let mut failures = Vec::new();
    for (file, expected) in [
        ("sym.ctf", "sym.ctf:1:1: error[E0003]"),
        ("ovf.ctf", "ovf.ctf:2:20: error[E0004]"),
        ("u16.ctf", "u16.ctf:1:1: error[E0001]"),
        ("empty.ctf", "empty.ctf:1:1: error[E0002]"),
    ] {
        for a in [
            args!["validate", file, "--stream", "x:1:dense"],
            args!["dump", file, "--stream", "x:1:dense"],
            args!["inspect", file],
        ] {
            let o = run_in(d.path(), &a);
            let has_snippet = rendered_errors(&o.stderr).first().is_some_and(|e| e.snippet.is_some());
            if o.code != 1 || !o.stderr.contains(expected) || !has_snippet {
                failures.push(format!("{a:?}: {:?}", o.stderr.lines().next().unwrap_or("")));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn validate_json_error_count_matches_the_text_summary() {
    let d = tmp();
    let p = write(d.path(), "bad.ctf", "0 |S0 1:1 |S2 3:1\n0 |S0 943:1 |S2 128:1\n1 |S0 7:1 |S2 3,1\n");
    let flags = ["--stream", "query:943:sparse:S0", "--stream", "slots:129:sparse:S2", "--max-errors", "1"];
    let text = run(args!["validate", &p, &flags]);
    text.code(1).err_has("3 error(s): invalid");
    let j: serde_json::Value =
        serde_json::from_slice(&run(args!["validate", &p, &flags, "--json"]).code(1).stdout).unwrap();
    let f = &j["files"][0];
    assert_eq!(f["errors"].as_array().unwrap().len(), 3);
    assert_eq!(f["num_errors"], 3, "{f}");
}

#[test]

fn crlf_snippets_do_not_show_the_carriage_return() {
    let d = tmp();
    write(d.path(), "c.ctf", "0 |x 1\r\n0 |x 2\r\n1 |x 3 a\r\n");
    let o = run_in(d.path(), ["validate", "c.ctf", "--stream", "x:1:dense", "--limit", "1"]);
    o.code(1);
    let e = &rendered_errors(&o.stderr)[0];
    assert_eq!(e.snippet.as_ref().unwrap().0, "1 |x 3 a");
}

#[test]
fn dense_too_many_values_caret_is_under_the_extra_values() {
    let d = tmp();
    write(d.path(), "c.ctf", "0 |x 1 2 3 |y 0:1\n");
    let o = run_in(d.path(), ["validate", "c.ctf", "--stream", "x:1:dense", "--stream", "y:1:sparse", "--limit", "1"]);
    o.code(1);
    let e = &rendered_errors(&o.stderr)[0];
    assert_eq!(e.code, "E0011");
    assert_eq!(e.col, 8, "the first value beyond dim 1 is the '2' in column 8:\n{}", o.stderr);
}

#[test]
fn skip_sequence_ids_and_skip_bad_sequences() {
    let d = tmp();
    let p = write(d.path(), "ids.ctf", "1 |x 1\n1 |x 2\n5 |x 3\n");
    let o = run(args!["dump", &p, "--stream", "x:1:dense"]);
    assert_eq!(
        o.code(0).stdout(),
        "{\"key\":1,\"streams\":{\"x\":[[1],[2]]}}\n{\"key\":5,\"streams\":{\"x\":[[3]]}}\n"
    );
    let o = run(args!["dump", &p, "--stream", "x:1:dense", "--skip-sequence-ids"]);
    assert_eq!(o.code(0).stdout().lines().map(|l| J::parse(l).get("key").u64()).collect::<Vec<_>>(), [0, 1, 2]);
    run(args!["validate", &p, "--stream", "x:1:dense", "--skip-sequence-ids"])
        .code(0)
        .err_has("3 sequences, 3 samples");
    // A sequence without a configured stream: dump fails, or drops it when asked.
    let es = write(d.path(), "es.ctf", "0 |a 1 |b 1:1\n1 |a 2\n2 |a 3 |b 2:1\n");
    let ab = ["--stream", "a:1:dense", "--stream", "b:3:sparse"];
    let o = run(args!["dump", &es, &ab]);
    o.code(1).err_has("es.ctf:2:1: error[E0021]");
    assert!(o.stdout.is_empty());
    let o = run(args!["dump", &es, &ab, "--skip-bad-sequences"]);
    assert_eq!(o.code(0).stdout().lines().map(|l| J::parse(l).get("key").u64()).collect::<Vec<_>>(), [0, 2]);
    // validate reports such sequences whatever the flag.
    run(args!["validate", &es, &ab, "--skip-bad-sequences"])
        .code(1)
        .err_has("invalid: 1 sequence(s) lack a configured stream");
}

#[test]
fn cache_index_writes_a_cache_beside_the_input() {
    let d = tmp();
    let p = d.path().join("atis.ctf");
    std::fs::copy(real("atis/atis.test.ctf"), &p).unwrap();
    let first = run(args!["dump", &p, &ATIS, "--cache-index"]);
    first.code(0);
    let caches: Vec<String> =
        dir_names(d.path()).into_iter().filter(|n| n.contains(".cntkio-") && n.ends_with(".idx")).collect();
    assert_eq!(caches.len(), 1, "files: {:?}", dir_names(d.path()));
    assert!(run(args!["dump", &p, &ATIS, "--cache-index"]).code(0).stdout == first.stdout);
}

/// A CBF file of one chunk and one dense float32 stream `a` of dim 1: each sequence's meta count and its
/// record's samples (CBF.md §1).
fn cbf_of(metas: &[u32], records: &[&[f32]]) -> Vec<u8> {
    let mut b = b"nib_ktnc".to_vec();
    b.extend(1u32.to_le_bytes());
    for m in metas {
        b.extend(m.to_le_bytes());
    }
    for r in records {
        b.extend((r.len() as u32).to_le_bytes());
        for v in *r {
            b.extend(v.to_le_bytes());
        }
    }
    let header = b.len() as u64;
    b.extend(b"nib_ktnc");
    b.extend(1u32.to_le_bytes()); // chunks
    b.extend(1u32.to_le_bytes()); // streams
    b.push(0); // dense
    b.extend(1u32.to_le_bytes());
    b.push(b'a');
    b.push(0); // float32
    b.extend(1u32.to_le_bytes()); // dim
    b.extend(12u64.to_le_bytes());
    b.extend((metas.len() as u32).to_le_bytes());
    b.extend(metas.iter().sum::<u32>().to_le_bytes());
    b.extend(header.to_le_bytes());
    b
}

#[test]
fn dump_of_cbf_delivers_what_cntk_delivers() {
    let d = tmp();
    let keys = |o: &Out| o.stdout().lines().map(|l| J::parse(l).get("key").u64()).collect::<Vec<_>>();
    // (a) A sequence of meta count 0 after the sweep's last counted sample (what ctf2bin writes for a last
    // row whose only sample is empty) is never delivered.
    let trailing = write(d.path(), "trailing.cbf", cbf_of(&[1, 1, 0], &[&[1.0], &[2.0], &[]]));
    assert_eq!(keys(run(args!["dump", &trailing]).code(0)), [0, 1]);
    // (b) One of meta count 0 before it is delivered.
    let middle = write(d.path(), "middle.cbf", cbf_of(&[1, 0, 1], &[&[1.0], &[2.0], &[3.0]]));
    assert_eq!(keys(run(args!["dump", &middle]).code(0)), [0, 1, 2]);
    // (c) A delivered sequence with an empty record: what comes before it, then CNTK's packing error.
    let empty = write(d.path(), "empty.cbf", cbf_of(&[1, 1, 1], &[&[1.0], &[], &[3.0]]));
    let o = run(args!["dump", &empty]);
    o.code(1).err_has("error[E0024]");
    assert_eq!(keys(&o), [0]);
    // batches agrees.
    run(args!["batches", &empty, "--mb-size", "1"]).code(1).err_has("error[E0024]");
}

#[test]
fn hostile_cbf_numbers_are_precise_errors_without_allocating_them() {
    // Counts and sizes read from a file are checked against the bytes the file has before anything is
    // allocated for them: each command fails at once (exit 1, the field and the byte named).
    let d = tmp();
    let mut seqs = cbf_of(&[1, 1], &[&[1.0], &[2.0]]);
    let n = seqs.len();
    seqs[n - 16..n - 12].copy_from_slice(&u32::MAX.to_le_bytes()); // the chunk claims 4 Gi sequences
    seqs[n - 12..n - 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let seqs = write(d.path(), "seqs.cbf", seqs);
    let mut samples = cbf_of(&[1], &[&[1.0]]);
    samples[16..20].copy_from_slice(&(i32::MAX as u32).to_le_bytes()); // a record claims 2 Gi samples
    let samples = write(d.path(), "samples.cbf", samples);
    let cases = [
        (&seqs, "4294967295 sequences need 17179869180 bytes of meta counts at byte 12, but the chunk ends at byte 36"),
        (&samples, "2147483647 samples × dim 1 × 4 bytes do not fit in the 4 bytes left in chunk 0"),
    ];
    for (f, needle) in cases {
        for cmd in [&["inspect"][..], &["dump"], &["validate"], &["batches", "--mb-size", "1"], &["convert"]] {
            let mut a: Vec<std::ffi::OsString> = cmd.iter().map(Into::into).collect();
            a.push(f.into());
            if cmd == ["convert"] {
                a.push(d.path().join("out.ctf").into());
            }
            let o = run(&a);
            o.code(1).err_has("error[E0100]").err_has(needle);
            assert!(!d.path().join("out.ctf").exists());
        }
    }
}

#[test]
fn a_dense_dim_far_larger_than_the_data_is_refused_not_allocated() {
    // `|a 1` with a dim of 4e9: zero-filled, one sample would take 16 GB. Refused before anything is allocated
    // (the limit is half the machine's memory), where the process would otherwise abort on the allocation.
    let d = tmp();
    let f = write(d.path(), "one.ctf", "|a 1\n|a 2\n");
    for cmd in [&["dump"][..], &["validate"], &["batches", "--mb-size", "1"], &["convert"]] {
        let mut a: Vec<std::ffi::OsString> = cmd.iter().map(Into::into).collect();
        a.extend([f.clone().into_os_string(), "--stream".into(), "a:4000000000:dense".into()]);
        if cmd == ["convert"] {
            a.push(d.path().join("out.cbf").into());
        }
        let o = run(&a);
        assert_eq!(o.code, 1, "{cmd:?}: {}", o.stderr);
        o.err_has("error[E3002]: decoded size of this chunk's dense samples");
        assert!(!o.stderr.contains("memory allocation"), "{}", o.stderr);
    }
    assert!(!d.path().join("out.cbf").exists());
}

#[test]
fn a_config_reads_its_cbf_deserializers_with_their_renames_in_its_order() {
    let d = tmp();
    let cbf = d.path().join("slots.cbf");
    run(args!["-q", "convert", example("slots.ctf").as_path(), &cbf, "--config", example("slots.cntk").as_path()])
        .code(0);
    std::fs::copy(example("slots.ctf"), d.path().join("slots.ctf")).unwrap();
    let config = write(
        d.path(),
        "both.cntk",
        r#"r = [ reader = [
    randomize = false
    deserializers = (
        [ type = "CNTKBinaryFormatDeserializer" ; module = "CNTKBinaryReader" ; file = "slots.cbf"
          input = [ words = [ alias = "query" ] ] ]
      : [ type = "CNTKTextFormatDeserializer" ; module = "CNTKTextFormatReader" ; file = "slots.ctf"
          input = [ query = [ alias = "word" ; dim = 13 ; format = "sparse" ; definesMBSize = true ]
                    intent = [ alias = "intent" ; dim = 5 ; format = "sparse" ]
                    slots = [ alias = "slot" ; dim = 12 ; format = "sparse" ] ] ]
    )
] ]
"#,
    );
    let both = run(args!["dump", "--config", &config, "--data-dir", d.path()]);
    let text = both.code(0).stdout();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 120, "the CBF file's 60 sequences, then the CTF file's");
    assert!(lines[0].starts_with("{\"key\":0,\"streams\":{\"words\":[[[6,1]],"), "{}", lines[0]);
    assert!(lines[60].starts_with("{\"key\":0,\"streams\":{\"query\":[[[6,1]],"), "{}", lines[60]);
    let plain = run(args!["dump", &cbf]);
    assert_eq!(lines[..60].join("\n").replace("\"words\"", "\"query\""), plain.code(0).stdout().trim_end());

    // Files given beside the config take its CTF deserializer's streams; a CBF file among them carries its own.
    let mixed = run(args!["dump", "--config", &config, example("slots.ctf").as_path(), &cbf]);
    assert_eq!(mixed.code(0).stdout().lines().count(), 120);
    // A broken config is an error even when it also has CBF deserializers.
    let broken =
        write(d.path(), "broken.cntk", std::fs::read_to_string(&config).unwrap().replace("dim = 5", "dim = x"));
    run(args!["dump", "--config", &broken, "--data-dir", d.path()]).code(2);
}

// ---------------------------------------------------------------------------------------------------
// stats
// ---------------------------------------------------------------------------------------------------

#[test]
fn stats_figures_exit_codes_and_threads() {
    let d = tmp();
    // x (dense, dim 2): dim 0 holds 1 3 5 7, dim 1 only 10. y (sparse, dim 3), dense: [0 0 1] [0.5 0 0] [0 0 1].
    let f = write(d.path(), "s.ctf", "0 |x 1 10 |y 2:1\n1 |x 3 10 |y 0:0.5\n1 |x 5 10\n2 |x 7 10 |y 2:1\n");
    let schema = ["--stream", "x:2:dense", "--stream", "y:3:sparse"];
    let o = run(args!["stats", &f, &schema, "--json"]);
    let r: serde_json::Value = serde_json::from_str(&o.code(0).stdout()).unwrap();
    assert_eq!((r["version"].as_u64(), r["sequences"].as_u64()), (Some(1), Some(3)));
    let x = &r["streams"][0];
    assert_eq!((x["name"].as_str(), x["format"].as_str(), x["samples"].as_u64()), (Some("x"), Some("dense"), Some(4)));
    let v = |s: &serde_json::Value, k: &str| -> Vec<f64> {
        s[k].as_array().unwrap().iter().map(|n| n.as_f64().unwrap()).collect()
    };
    assert_eq!(v(x, "mean"), [4.0, 10.0]);
    assert_eq!(v(x, "min"), [1.0, 10.0]);
    assert_eq!(v(x, "max"), [7.0, 10.0]);
    assert!((v(x, "std")[0] - 5f64.sqrt()).abs() < 1e-12 && v(x, "std")[1] == 0.0);
    assert!(x.get("entries").is_none() && x.get("entries_per_index").is_none());
    let y = &r["streams"][1];
    assert_eq!(
        (y["format"].as_str(), y["samples"].as_u64(), y["entries"].as_u64()),
        (Some("sparse"), Some(3), Some(3))
    );
    assert_eq!(y["entries_per_index"], serde_json::json!([1, 0, 2]));
    let mean = v(y, "mean");
    assert!((mean[0] - 0.5 / 3.0).abs() < 1e-15 && mean[1] == 0.0 && (mean[2] - 2.0 / 3.0).abs() < 1e-15);
    assert_eq!(v(y, "min"), [0.0, 0.0, 0.0]);
    assert_eq!(v(y, "max"), [0.5, 0.0, 1.0]);
    // Text: the constant dimension, and the indices by entries.
    run(args!["stats", &f, &schema]).code(0).out_has("1 dim(s) constant").out_has("2 (66.7 % of samples)");
    // The same bytes whatever the threads and chunks.
    let one = run(args!["stats", &f, &schema, "--json", "-j", "1", "--chunk-size", "20"]);
    let two = run(args!["stats", &f, &schema, "--json", "-j", "2", "--chunk-size", "20"]);
    assert_eq!(one.code(0).stdout, two.code(0).stdout);
    // A data error: exit 1, where it is; no schema: exit 2, with the one the rows suggest.
    let bad = write(d.path(), "bad.ctf", "0 |x 1 10 |y 2:1\n1 |x 3 q |y 0:0.5\n");
    run(args!["stats", &bad, &schema]).code(1).err_has("bad.ctf:2:");
    run(args!["stats", &f]).code(2).err_has("--stream x:2:dense");
}

/// `batches`, `stats`, `convert` and `validate` map a CBF input by default (as the Python API does): the
/// same output as `--no-mmap` (positional reads) and `--mmap`, and the two flags exclude each other.
#[test]
fn commands_map_cbf_by_default_and_read_it_with_no_mmap() {
    let d = tmp();
    let text: String = (0..300).map(|i| format!("{i} |x {} {} |y {}:1\n", i % 7, i / 3, i % 3)).collect();
    let f = write(d.path(), "m.ctf", text);
    let cbf = d.path().join("m.cbf");
    let schema = ["--stream", "x:2:dense", "--stream", "y:3:sparse"];
    run(args!["-q", "convert", &f, &cbf, &schema, "--chunk-size", "2k"]).code(0);
    let mb = ["--mb-size", "16", "--randomize", "--seed", "3", "--window-chunks", "2"];
    let mapped = run(args!["batches", &cbf, &mb]).code(0).stdout();
    assert!(mapped.lines().count() > 10, "{mapped}");
    assert_eq!(run(args!["batches", &cbf, &mb, "--no-mmap"]).code(0).stdout(), mapped);
    assert_eq!(run(args!["batches", &cbf, &mb, "--mmap"]).code(0).stdout(), mapped);
    run(args!["batches", &cbf, &mb, "--mmap", "--no-mmap"]).code(2).err_has("--no-mmap");
    let stats = run(args!["stats", &cbf, "--json"]).code(0).stdout();
    assert!(stats.contains("\"sequences\": 300"), "{stats}");
    assert_eq!(run(args!["stats", &cbf, "--json", "--no-mmap"]).code(0).stdout(), stats);
    let (mapped, read) = (d.path().join("mapped.ctf"), d.path().join("read.ctf"));
    run(args!["-q", "convert", &cbf, &mapped]).code(0);
    run(args!["-q", "convert", &cbf, &read, "--no-mmap"]).code(0);
    assert_eq!(std::fs::read(&mapped).unwrap(), std::fs::read(&read).unwrap());
    assert_eq!(std::fs::read_to_string(&mapped).unwrap().lines().count(), 300);
    let valid = run(args!["validate", &cbf, "--json"]).code(0).stdout();
    assert_eq!(run(args!["validate", &cbf, "--json", "--no-mmap"]).code(0).stdout(), valid);
    let dumped = run(args!["dump", &cbf]).code(0).stdout();
    assert_eq!(dumped.lines().count(), 300);
    assert_eq!(run(args!["dump", &cbf, "--no-mmap"]).code(0).stdout(), dumped);
    for (flags, mapped) in [(&[][..], true), (&["--no-mmap"][..], false), (&["--mmap"][..], true)] {
        let out = run(args!["bench", &cbf, "--json", "--repeat", "1", flags]).code(0).stdout();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let report = &v["results"][0];
        assert_eq!(report["mmap"], mapped, "{flags:?}: {out}");
        assert_eq!(report["samples"], 300, "{flags:?}: {out}");
    }
}
