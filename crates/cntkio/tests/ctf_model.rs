//! Differential tests of cntkio's CTF reading against models of CNTK 2.7.
//!
//! * Against the Python model `testdata/model/ctfref.py` (which agrees with the real CNTK 2.7
//!   binaries), through `tools/ctf_oracle.py`: every file of CNTK's own reader tests with the stream
//!   configurations of `run_cntk_unit_tests.py` (with and without `definesMBSize`), every `.ctf` of
//!   `testdata/real/`, and a few hundred generated files (one Python process per batch).
//!   When `python3` is missing these tests print a note and pass.
//! * Against the Rust reference model (`cntkio-core/tests/reference`), on random files written to temp
//!   files: `CtfReader` (index with 1 and 2 threads, `load_chunk` of every chunk in order) and `scan_file`
//!   (1 and 2 parser threads), each with `Access::Read` and `Access::Mmap`, must all give what the model
//!   gives.
//!
//! What is compared: the index (chunks; sequence keys, declared counts, byte ranges), the values of every
//! sequence delivered (bits of the element type; sparse indices and per-sample entry counts), the error
//! that stops reading (by kind), and, where cntkio reports it, the number of tolerated errors. cntkio
//! delivers whole chunks, so after a failure only the chunks the model completed before it are compared.

mod common;
#[path = "../../cntkio-core/tests/reference/mod.rs"]
mod reference;

use cntkio::ctf::{scan_file, ScanOptions};
use cntkio::{
    Access, CtfOptions, CtfReader, ElementType, Error, ErrorKind, InputFile, Layout, Schema, StorageFormat, StreamSpec,
    Values,
};
use cntkio_core::ChunkData;
use proptest::prelude::*;
use reference::gen::{self, Case};
use reference::{Elem, Fatal, IndexError, Outcome, RefChunk, RefSeq, SeqOut, StreamCfg, StreamOut};
use serde_json::{json, Value};
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

// ------------------------------------------------------------------------------------------------
// Configurations and observations

/// A file and its reader configuration.
#[derive(Debug, Clone)]
struct Job {
    path: PathBuf,
    streams: Vec<StreamCfg>,
    skip_ids: bool,
    chunk_size: u64,
    max_errors: u64,
    elem: Elem,
}

impl Job {
    fn to_json(&self) -> Value {
        json!({
            "path": self.path.to_str().expect("a UTF-8 path"),
            "streams": self.streams.iter().map(|s| json!({
                "name": s.name, "alias": s.alias, "dense": s.dense, "dim": s.dim, "defines": s.defines,
            })).collect::<Vec<_>>(),
            "skip_ids": self.skip_ids,
            "chunk_size": self.chunk_size,
            "max_errors": self.max_errors,
            "precision": match self.elem { Elem::F32 => "float", Elem::F64 => "double" },
        })
    }

    fn schema(&self) -> Schema {
        let t = match self.elem {
            Elem::F32 => ElementType::F32,
            Elem::F64 => ElementType::F64,
        };
        Schema::new(
            self.streams
                .iter()
                .map(|s| {
                    StreamSpec::new(
                        s.name.clone(),
                        s.dim,
                        if s.dense { StorageFormat::Dense } else { StorageFormat::Sparse },
                    )
                    .alias(s.alias.clone())
                    .element_type(t)
                    .defines_mb_size(s.defines)
                })
                .collect(),
        )
        .expect("a valid schema")
    }

    fn options(&self) -> CtfOptions {
        CtfOptions {
            max_errors: self.max_errors,
            skip_sequence_ids: self.skip_ids,
            chunk_size: self.chunk_size,
            ..CtfOptions::default()
        }
    }

    fn describe(&self) -> String {
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|s| {
                format!(
                    "{}={} {} {}{}",
                    s.name,
                    s.alias,
                    if s.dense { "dense" } else { "sparse" },
                    s.dim,
                    if s.defines { " definesMBSize" } else { "" }
                )
            })
            .collect();
        format!(
            "{} [{}] skip_ids={} chunk_size={} max_errors={} {:?}",
            self.path.display(),
            streams.join(", "),
            self.skip_ids,
            self.chunk_size,
            self.max_errors,
            self.elem
        )
    }
}

/// Why reading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Utf16Bom,
    EmptyFile,
    MissingId(u64),
    IdOverflow,
    MaxErrors,
    EmptyStream,
}

/// What a reader (or a model) made of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    /// The index (None if indexing failed, or if the reader does not expose it).
    chunks: Option<Vec<RefChunk>>,
    /// Sequences delivered, in file order.
    seqs: Vec<SeqOut>,
    /// Tolerated errors (None where the reader does not report them).
    errors: Option<u64>,
    /// What stopped reading.
    stop: Option<Stop>,
}

impl Observed {
    /// Number of leading chunks whose sequences were all delivered.
    fn complete_chunks(&self) -> usize {
        let mut left = self.seqs.len();
        let mut k = 0;
        for c in self.chunks.iter().flatten() {
            if c.seqs.len() > left {
                break;
            }
            left -= c.seqs.len();
            k += 1;
        }
        k
    }

    /// What a chunk-at-a-time reader can deliver: after a failure, only the chunks completed before it.
    fn whole_chunks(&self) -> Observed {
        let mut o = self.clone();
        if o.stop.is_some() {
            let k = self.complete_chunks();
            let keep = o.chunks.iter().flatten().take(k).map(|c| c.seqs.len()).sum();
            o.seqs.truncate(keep);
        }
        o
    }
}

impl Stop {
    /// A fatal problem of the indexer (before any data is parsed).
    fn is_index_level(self) -> bool {
        matches!(self, Stop::Utf16Bom | Stop::EmptyFile | Stop::MissingId(_) | Stop::IdOverflow)
    }
}

fn from_outcome(o: &Outcome) -> Observed {
    let (chunks, stop) = match &o.index {
        Ok(c) => (
            Some(c.clone()),
            o.fatal.map(|f| match f {
                Fatal::MaxErrors => Stop::MaxErrors,
                Fatal::EmptyStream => Stop::EmptyStream,
            }),
        ),
        Err(e) => (
            None,
            Some(match e {
                IndexError::Utf16Bom => Stop::Utf16Bom,
                IndexError::Empty => Stop::EmptyFile,
                IndexError::MissingId(b) => Stop::MissingId(*b),
                IndexError::IdOverflow => Stop::IdOverflow,
            }),
        ),
    };
    Observed { chunks, seqs: o.seqs.clone(), errors: Some(o.errors), stop }
}

fn stop_of_error(e: &Error) -> Stop {
    match e.kind() {
        ErrorKind::Utf16Bom => Stop::Utf16Bom,
        ErrorKind::EmptyFile => Stop::EmptyFile,
        ErrorKind::MissingSequenceId { .. } => Stop::MissingId(e.position().byte.expect("an offset")),
        ErrorKind::SequenceIdOverflow => Stop::IdOverflow,
        ErrorKind::MaxErrorsReached { .. } => Stop::MaxErrors,
        ErrorKind::EmptyStream { .. } => Stop::EmptyStream,
        // cntkio's explanation of a failed chunk (an input of the schema no row has): CNTK's stop it holds.
        ErrorKind::MissingInput { caused, .. } => stop_of_error(caused),
        _ => panic!("unexpected error: {e}"),
    }
}

/// The Python model's message → why it stopped.
fn stop_of_message(m: &str) -> Stop {
    if m.starts_with("Reached the maximum number of allowed errors") {
        Stop::MaxErrors
    } else if m.starts_with("Malformed input file") {
        Stop::EmptyStream
    } else if m.starts_with("Input file is empty") {
        Stop::EmptyFile
    } else if m.starts_with("Found a UTF-16 BOM") {
        Stop::Utf16Bom
    } else if m.starts_with("Overflow while reading a numeric sequence id") {
        Stop::IdOverflow
    } else if let Some(rest) = m.strip_prefix("Expected a sequence id at the offset ") {
        Stop::MissingId(rest.split(',').next().unwrap().trim().parse().expect("an offset"))
    } else {
        panic!("unknown message from the Python model: {m}")
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

fn from_oracle(v: &Value, elem: Elem) -> Observed {
    let chunks = v["chunks"].as_array().map(|cs| {
        cs.iter()
            .map(|c| RefChunk {
                start: u(&c["start"]),
                end: u(&c["end"]),
                ns: u(&c["ns"]),
                seqs: c["seqs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|q| RefSeq { key: u(&q[0]), ns: u(&q[1]), off: u(&q[2]), size: u(&q[3]) })
                    .collect(),
            })
            .collect()
    });
    let hex = |h: &Value| {
        let h = h.as_str().unwrap();
        assert_eq!(h.len(), if elem == Elem::F32 { 8 } else { 16 });
        u64::from_str_radix(h, 16).unwrap()
    };
    let seqs = v["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| SeqOut {
            key: u(&s["key"]),
            ns: u(&s["ns"]),
            streams: s["streams"]
                .as_array()
                .unwrap()
                .iter()
                .map(|st| StreamOut {
                    n: u(&st["n"]),
                    values: st["values"].as_array().unwrap().iter().map(hex).collect(),
                    indices: st["indices"].as_array().unwrap().iter().map(u).collect(),
                    nnz: st["nnz"].as_array().unwrap().iter().map(u).collect(),
                })
                .collect(),
        })
        .collect();
    Observed { chunks, seqs, errors: Some(u(&v["errors"])), stop: v["error"].as_str().map(stop_of_message) }
}

fn ref_chunks(chunks: &[cntkio::ctf::ChunkDesc]) -> Vec<RefChunk> {
    chunks
        .iter()
        .map(|c| RefChunk {
            start: c.offset,
            end: c.end(),
            ns: c.num_samples,
            seqs: c
                .sequences
                .iter()
                .map(|s| RefSeq {
                    key: s.key,
                    ns: u64::from(s.num_samples),
                    off: s.offset,
                    size: u64::from(s.len_bytes),
                })
                .collect(),
        })
        .collect()
}

fn bits(v: &Values, i: usize) -> u64 {
    match v {
        Values::F32(v) => u64::from(v[i].to_bits()),
        Values::F64(v) => v[i].to_bits(),
    }
}

/// The sequences of a parsed chunk, in the models' shape.
fn sequences_of(d: &ChunkData) -> Vec<SeqOut> {
    (0..d.keys.len())
        .map(|s| SeqOut {
            key: d.keys.get(s),
            ns: u64::from(d.num_samples.get(s)),
            streams: d
                .streams
                .iter()
                .map(|st| {
                    let mut o = StreamOut { n: st.sequence_len(s), ..StreamOut::default() };
                    for k in st.sequence_samples(s) {
                        let r = st.sample_value_range(k);
                        if let Layout::Sparse { indices, .. } = &st.layout {
                            o.nnz.push(r.len() as u64);
                            o.indices.extend(r.clone().map(|i| indices[i] as u64));
                        }
                        o.values.extend(r.map(|i| bits(&st.values, i)));
                    }
                    o
                })
                .collect(),
        })
        .collect()
}

// ------------------------------------------------------------------------------------------------
// cntkio's ways of reading a file

/// `CtfReader::open_with` (index built with `threads`), then `load_chunk` of every chunk in order.
fn via_reader(job: &Job, access: Access, threads: usize) -> Observed {
    let r = match CtfReader::open_with(&job.path, &job.schema(), &job.options(), access, threads) {
        Ok(r) => r,
        Err(e) => return Observed { chunks: None, seqs: vec![], errors: None, stop: Some(stop_of_error(&e)) },
    };
    let mut o = Observed { chunks: Some(ref_chunks(&r.index().chunks)), seqs: vec![], errors: None, stop: None };
    for i in 0..r.index().chunks.len() {
        match r.load_chunk(i) {
            Ok(d) => o.seqs.extend(sequences_of(&d)),
            Err(e) => {
                o.stop = Some(stop_of_error(&e));
                break;
            }
        }
    }
    o
}

/// `scan_file` with `threads` parser threads and CNTK's budget. `chunks` are the chunks delivered.
fn via_scan(job: &Job, access: Access, threads: usize) -> Observed {
    let file = InputFile::open(&job.path, access).expect("open");
    let mut chunks = Vec::new();
    let mut seqs = Vec::new();
    let scan = ScanOptions { threads, ..ScanOptions::default() };
    let r = scan_file(
        &file,
        &job.schema(),
        &job.options(),
        &scan,
        |p| {
            chunks.push(p.desc.clone());
            seqs.extend(sequences_of(&p.data));
            Ok(ControlFlow::Continue(()))
        },
        &mut |_| {},
    );
    match r {
        Ok(summary) => Observed { chunks: Some(ref_chunks(&chunks)), seqs, errors: Some(summary.errors), stop: None },
        Err(e) => {
            let stop = stop_of_error(&e);
            if stop.is_index_level() {
                // The index streams, so chunks before a late indexing error may have been delivered.
                Observed { chunks: None, seqs: vec![], errors: None, stop: Some(stop) }
            } else {
                Observed { chunks: Some(ref_chunks(&chunks)), seqs, errors: None, stop: Some(stop) }
            }
        }
    }
}

/// Compares every cntkio reading path with `want` (a model's observation); returns the differences.
fn compare_paths(job: &Job, want: &Observed) -> Vec<String> {
    let whole = want.whole_chunks();
    // CtfReader: the index is complete even when loading fails; it does not report error counts.
    let expect_reader = Observed { errors: None, ..whole.clone() };
    // scan_file: the chunks delivered; error counts only when it succeeds.
    let expect_scan = match want.stop {
        Some(s) if s.is_index_level() => Observed { chunks: None, seqs: vec![], errors: None, stop: Some(s) },
        _ => Observed {
            chunks: whole.chunks.as_ref().map(|c| c[..want.complete_chunks()].to_vec()),
            errors: if want.stop.is_none() { want.errors } else { None },
            ..whole.clone()
        },
    };
    let mut diffs = Vec::new();
    for access in [Access::Read, Access::Mmap] {
        for threads in [1, 2] {
            let got = via_reader(job, access, threads);
            if got != expect_reader {
                diffs.push(describe_diff(&format!("CtfReader {access:?} {threads} threads"), &expect_reader, &got));
            }
            let got = via_scan(job, access, threads);
            if got != expect_scan {
                diffs.push(describe_diff(&format!("scan_file {access:?} {threads} threads"), &expect_scan, &got));
            }
        }
    }
    diffs
}

fn describe_diff(what: &str, want: &Observed, got: &Observed) -> String {
    let mut s = format!("{what}: ");
    if want.stop != got.stop {
        s += &format!("stop: model {:?}, cntkio {:?}; ", want.stop, got.stop);
    }
    if want.errors != got.errors {
        s += &format!("errors: model {:?}, cntkio {:?}; ", want.errors, got.errors);
    }
    if want.chunks != got.chunks {
        s += &format!("chunks differ: model {:?}, cntkio {:?}; ", want.chunks, got.chunks);
    }
    if want.seqs != got.seqs {
        s += &format!("sequences: model {}, cntkio {}", want.seqs.len(), got.seqs.len());
        if let Some(k) = (0..want.seqs.len().min(got.seqs.len())).find(|&k| want.seqs[k] != got.seqs[k]) {
            s += &format!("; first difference at #{k}: model {:?}, cntkio {:?}", want.seqs[k], got.seqs[k]);
        }
    }
    s
}

// ------------------------------------------------------------------------------------------------
// The Python model

fn oracle_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/ctf_oracle.py")
}

/// Runs the oracle on a batch of jobs (one Python process).
fn run_oracle(jobs: &[Job]) -> Vec<Observed> {
    let input = Value::Array(jobs.iter().map(Job::to_json).collect()).to_string();
    let mut child = Command::new("python3")
        .arg(oracle_script())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start python3");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("python3 output");
    writer.join().unwrap().expect("write the jobs");
    assert!(out.status.success(), "ctf_oracle.py failed: {}", out.status);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from ctf_oracle.py");
    let res = v.as_array().expect("a list of results");
    assert_eq!(res.len(), jobs.len());
    res.iter().zip(jobs).map(|(r, j)| from_oracle(r, j.elem)).collect()
}

/// Runs the jobs through the model (in two Python processes) and every cntkio path; fails on any
/// difference. Returns (jobs, sequences compared).
fn check_against_model(jobs: &[Job]) -> (usize, usize) {
    let half = jobs.len() / 2;
    let (a, b) = jobs.split_at(half);
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| run_oracle(a));
        let rb = run_oracle(b);
        (ha.join().unwrap(), rb)
    });
    let mut failures = Vec::new();
    let mut seqs = 0;
    for (job, want) in jobs.iter().zip(ra.into_iter().chain(rb)) {
        if let Some(e) = want.errors.filter(|_| want.stop == Some(Stop::MaxErrors)) {
            assert_eq!(e, job.max_errors, "the model tolerates exactly maxErrors errors before it stops");
        }
        seqs += want.seqs.len();
        // The Rust reference model must agree exactly with the Python one (it is a transliteration).
        let data = std::fs::read(&job.path).unwrap();
        let r =
            from_outcome(&reference::run(&data, &job.streams, job.skip_ids, job.chunk_size, job.max_errors, job.elem));
        if r != want {
            failures.push(format!("{}\n  {}", job.describe(), describe_diff("Rust reference model", &want, &r)));
        }
        for d in compare_paths(job, &want) {
            failures.push(format!("{}\n  {d}", job.describe()));
        }
    }
    assert!(failures.is_empty(), "{} differences from the Python model:\n{}", failures.len(), failures.join("\n"));
    (jobs.len(), seqs)
}

fn st(name: &str, alias: &str, dense: bool, dim: usize) -> StreamCfg {
    StreamCfg { name: name.into(), alias: alias.into(), dense, dim, defines: false }
}

fn d(name: &str, alias: &str, dim: usize) -> StreamCfg {
    st(name, alias, true, dim)
}

fn s(name: &str, alias: &str, dim: usize) -> StreamCfg {
    st(name, alias, false, dim)
}

fn job(path: PathBuf, streams: Vec<StreamCfg>, elem: Elem) -> Job {
    Job { path, streams, skip_ids: false, chunk_size: 32 << 20, max_errors: 0, elem }
}

/// `job` with and without `definesMBSize` on stream `main`.
fn both_mb(j: Job, main: usize) -> Vec<Job> {
    let mut m = j.clone();
    m.streams[main].defines = true;
    vec![j, m]
}

/// The configurations of CNTK's reader unit tests (`run_cntk_unit_tests.py`), per data file.
fn unit_test_jobs(dir: &Path) -> Vec<Job> {
    use Elem::{F32, F64};
    let p = |f: &str| dir.join(f);
    let mi = || {
        vec![
            d("features1", "F1", 1),
            d("features2", "F2", 10),
            d("features3", "F3", 100),
            d("features4", "F4", 1000),
            d("labels1", "L1", 1),
            d("labels2", "L2", 10),
            d("labels3", "L3", 100),
        ]
    };
    let mis = || vec![s("features1", "F0", 2), s("features2", "F1", 20), s("features3", "F2", 200)];
    let mut jobs: Vec<(Job, usize)> = vec![
        (job(p("Simple_dense.txt"), vec![d("features", "F", 2), d("labels", "L", 2)], F32), 0),
        (job(p("Simple_dense.txt"), vec![d("features", "F", 2)], F32), 0),
        (
            Job {
                chunk_size: 10000,
                ..job(p("MNIST_dense.txt"), vec![d("features", "F", 784), d("labels", "L", 10)], F64)
            },
            1,
        ),
        (job(p("1x1_dense.txt"), vec![d("features", "F", 10000)], F64), 0),
        (job(p("1x10_dense.txt"), vec![d("features", "F0", 10)], F32), 0),
        (Job { chunk_size: 50000, ..job(p("10x1_MI_dense.txt"), mi(), F32) }, 0),
        (job(p("10x10_dense.txt"), vec![d("features", "F0", 5)], F32), 0),
        (
            Job {
                chunk_size: 10000,
                ..job(p("100x1_dense.txt"), vec![d("features", "F", 100), d("labels", "L", 100)], F64)
            },
            1,
        ),
        (job(p("50x20_jagged_sequences_dense.txt"), vec![d("features", "F0", 3)], F64), 0),
        (job(p("1x1_sparse.txt"), vec![s("features", "F0", 10000)], F32), 0),
        (job(p("1x2_sparse.txt"), vec![s("features", "F0", 1000)], F32), 0),
        (job(p("1x10_sparse.txt"), vec![s("features", "F0", 100)], F64), 0),
        (job(p("10x10_sparse.txt"), vec![s("features", "F0", 100)], F64), 0),
        (job(p("3x5_MI_sparse.txt"), mis(), F32), 0),
        (job(p("20x10_MI_jagged_samples_sparse.txt"), mis(), F32), 0),
        (
            job(
                p("space_separated.txt"),
                vec![d("features1", "F1", 15), d("features2", "F2", 12), d("features3", "F3", 1)],
                F64,
            ),
            0,
        ),
        (job(p("missing_trailing_newline.txt"), vec![d("features", "features", 1)], F64), 0),
        (Job { skip_ids: true, ..job(p("contains_blank_lines.txt"), vec![d("features", "features", 1)], F64) }, 0),
        (Job { max_errors: 2, ..job(p("contains_blank_lines.txt"), vec![d("features", "features", 1)], F64) }, 0),
        (job(p("empty_samples.txt"), vec![d("features", "F0", 10), s("labels", "F1", 10)], F32), 0),
        (job(p("ref_data_with_escape_sequences.txt"), vec![s("features", "F0", 100), d("labels", "F1", 3)], F32), 0),
        (job(p("50x20_jagged_sequences_sparse.txt"), vec![s("features", "F0", 100)], F32), 0),
        (job(p("100x100_jagged_sparse.txt"), vec![s("features", "F0", 20)], F32), 0),
        // Not used by any CNTK test; same layout as 100x100_jagged_sparse.txt.
        (job(p("100x100_jagged_sequences_sparse.txt"), vec![s("features", "F0", 20)], F32), 0),
        (job(p("duplicate_inputs.txt"), vec![d("features1", "F1", 1), d("features2", "F2", 1)], F32), 0),
        (Job { max_errors: 99999, ..job(p("invalid_inputs.txt"), vec![d("A", "A", 1), s("B", "B", 10)], F32) }, 0),
        (job(p("5x10_and_5x5_jagged.txt"), vec![d("features1", "F0", 10), d("features2", "F1", 5)], F32), 0),
        (job(p("5x10_jagged.txt"), vec![d("features1", "F0", 10)], F32), 0),
        (job(p("5x5_jagged.txt"), vec![d("features2", "F1", 5)], F32), 0),
        (job(p("1x2_dense.txt"), vec![d("features", "F0", 100)], F32), 0),
    ];
    // Small chunks too, so that files span many chunks (and the error budget crosses chunks).
    let small: Vec<(Job, usize)> = jobs
        .iter()
        .filter(|(j, _)| std::fs::metadata(&j.path).is_ok_and(|m| m.len() < 300_000))
        .map(|(j, m)| (Job { chunk_size: 997, ..j.clone() }, *m))
        .collect();
    jobs.extend(small);
    jobs.into_iter().flat_map(|(j, m)| both_mb(j, m)).collect()
}

/// The configurations of `testdata/real/README.md`.
fn real_data_jobs(dir: &Path) -> Vec<Job> {
    use Elem::{F32, F64};
    let p = |f: &str| dir.join(f);
    let atis = || vec![s("query", "S0", 943), s("intentLabels", "S1", 26), s("slotLabels", "S2", 129)];
    let cmu = || vec![s("rawInput", "S0", 69), s("rawLabels", "S1", 69)];
    let logreg = || vec![d("features", "features", 2), d("labels", "labels", 1)];
    let jobs: Vec<(Job, usize)> = vec![
        (job(p("atis/atis.train.ctf"), atis(), F32), 0),
        (Job { chunk_size: 65536, ..job(p("atis/atis.test.ctf"), atis(), F32) }, 0),
        (job(p("cmudict/cmudict-0.7b.train-dev-1-21.ctf"), cmu(), F32), 0),
        (
            Job {
                max_errors: 1_000_000,
                chunk_size: 100_000,
                ..job(p("cmudict/cmudict-0.7b.train-dev-1-21.ctf"), cmu(), F32)
            },
            1,
        ),
        (job(p("cmudict/tiny.ctf"), cmu(), F32), 0),
        (Job { max_errors: 100, ..job(p("cmudict/tiny.ctf"), cmu(), F64) }, 1),
        (job(p("seqcla/Train.ctf"), vec![s("features", "x", 2000), d("labels", "y", 5)], F32), 0),
        (
            Job {
                chunk_size: 300_000,
                ..job(p("mnist/MNIST_dense.ctf"), vec![d("features", "F", 784), d("labels", "L", 10)], F64)
            },
            1,
        ),
        (job(p("logreg/Train_cntk_text.ctf"), logreg(), F32), 0),
        (Job { chunk_size: 4096, ..job(p("logreg/Train_cntk_text.crlf.ctf"), logreg(), F32) }, 0),
        (job(p("cbf/10x10_dense.ctf"), vec![d("features", "F0", 5)], F32), 0),
        (job(p("cbf/10x10_sparse.ctf"), vec![s("features", "F0", 100)], F64), 0),
        (job(p("cbf/50x20_jagged_sequences_dense.ctf"), vec![d("features", "F0", 3)], F64), 0),
        (
            Job {
                chunk_size: 8192,
                ..job(p("cbf/50x20_jagged_sequences_sparse.ctf"), vec![s("features", "F0", 100)], F32)
            },
            0,
        ),
        (job(p("cbf/Simple_dense.ctf"), vec![d("features", "F", 2), d("labels", "L", 2)], F32), 0),
        (Job { skip_ids: true, ..job(p("edge/contains_blank_lines.ctf"), vec![d("features", "features", 1)], F32) }, 0),
        (
            Job {
                skip_ids: true,
                max_errors: 2,
                ..job(p("edge/contains_blank_lines.ctf"), vec![d("features", "features", 1)], F32)
            },
            0,
        ),
        (job(p("edge/duplicate_inputs.ctf"), vec![d("features1", "F1", 1), d("features2", "F2", 1)], F32), 0),
        (job(p("edge/empty_samples.ctf"), vec![d("features", "F0", 10), s("labels", "F1", 10)], F32), 0),
        (Job { max_errors: 99999, ..job(p("edge/invalid_inputs.ctf"), vec![d("A", "A", 1), s("B", "B", 10)], F32) }, 0),
        (
            Job {
                max_errors: 99999,
                chunk_size: 64,
                ..job(p("edge/invalid_inputs.ctf"), vec![d("A", "A", 1), s("B", "B", 10)], F64)
            },
            0,
        ),
        (job(p("edge/missing_trailing_newline.ctf"), vec![d("features", "features", 1)], F32), 0),
        (
            job(
                p("edge/ref_data_with_escape_sequences.ctf"),
                vec![s("features", "F0", 100), d("labels", "F1", 3)],
                F32,
            ),
            0,
        ),
        (
            job(
                p("edge/space_separated.ctf"),
                vec![d("features1", "F1", 15), d("features2", "F2", 12), d("features3", "F3", 1)],
                F64,
            ),
            0,
        ),
    ];
    // Every .ctf here must be covered.
    let mut files = Vec::new();
    for sub in std::fs::read_dir(dir).expect("data/real") {
        let sub = sub.unwrap().path();
        if sub.is_dir() {
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "ctf") {
                    files.push(f);
                }
            }
        }
    }
    for f in &files {
        assert!(jobs.iter().any(|(j, _)| &j.path == f), "no configuration for {}", f.display());
    }
    for (j, _) in &jobs {
        assert!(j.path.is_file(), "missing {}", j.path.display());
    }
    jobs.into_iter().flat_map(|(j, m)| both_mb(j, m)).collect()
}

#[test]
fn cntk_unit_test_files_match_python_model() {
    if !common::testdata::python_model_runs("ctfref.py") {
        return;
    }
    let dir = common::testdata::cntk_dir().join("Data/CNTKTextFormatReader");
    let jobs = unit_test_jobs(&dir);
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap().path();
        assert!(jobs.iter().any(|j| j.path == f), "no configuration for {}", f.display());
    }
    let (n, seqs) = check_against_model(&jobs);
    eprintln!("{n} configurations, {seqs} sequences compared");
}

#[test]
fn real_files_match_python_model() {
    if !common::testdata::python_model_runs("ctfref.py") {
        return;
    }
    let jobs = real_data_jobs(&common::testdata::real_dir());
    let (n, seqs) = check_against_model(&jobs);
    eprintln!("{n} configurations, {seqs} sequences compared");
}

// ------------------------------------------------------------------------------------------------
// Random files

fn write_case(dir: &Path, i: usize, c: &Case) -> Job {
    let path = dir.join(format!("case{i}.ctf"));
    std::fs::write(&path, &c.data).unwrap();
    Job {
        path,
        streams: c.streams.clone(),
        skip_ids: c.skip_ids,
        chunk_size: c.chunk_size,
        max_errors: c.max_errors,
        elem: c.elem,
    }
}

#[test]
fn random_files_match_python_model() {
    if !common::testdata::python_model_runs("ctfref.py") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // CNTKIO_MODEL_CASES: number of random files (default 260).
    let n = std::env::var("CNTKIO_MODEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(260);
    let jobs: Vec<Job> =
        gen::cases_from_seed(0x5C, n).iter().enumerate().map(|(i, c)| write_case(dir.path(), i, c)).collect();
    let (n, seqs) = check_against_model(&jobs);
    eprintln!("{n} random files, {seqs} sequences compared");
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(
        std::env::var("CNTKIO_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400)) })]

    /// Random files on disk: every reading path of cntkio == the Rust reference model.
    #[test]
    fn file_paths_match_reference(c in gen::case()) {
        let dir = tempfile::tempdir().unwrap();
        let job = write_case(dir.path(), 0, &c);
        let want = from_outcome(&reference::run(&c.data, &c.streams, c.skip_ids, c.chunk_size, c.max_errors, c.elem));
        let diffs = compare_paths(&job, &want);
        prop_assert!(diffs.is_empty(), "{:?}\n{}", c, diffs.join("\n"));
    }
}

/// Files larger than two 4 MiB scan windows: indexing crosses window and block borders (with 1 and 2
/// threads, `read()` and mmap), sequences and chunks span them, and the error budget runs across chunks.
#[test]
fn large_files_match_reference() {
    let mut data = Vec::new();
    let mut i = 0u64;
    while data.len() < 9 << 20 {
        let id = i / 3; // three rows per sequence
        let row = match i % 100_003 {
            50_000 => format!("{id} |a {i}.5 1 |b 0:1\n\n"), // a blank row inside a sequence: 2 errors (row, count)
            _ if i.is_multiple_of(7) => format!("{id}\t|a {i}.25 -{}e-3\t|# c{i} |b {}:1.5 |zz 1 2\n", i % 1000, i % 5),
            _ => format!("{id} |b {}:{i} {}:-2 |a {i} 0.{i}\n", i % 5, (i + 1) % 5),
        };
        data.extend_from_slice(row.as_bytes());
        i += 1;
    }
    // One row longer than a scan window (a 5 MiB comment), in the middle of a sequence.
    let at = data[..data.len() / 3].iter().rposition(|&c| c == b'\n').unwrap() + 1;
    let id = std::str::from_utf8(&data[at..]).unwrap().split(|c: char| !c.is_ascii_digit()).next().unwrap().to_string();
    let mut long = format!("{id} |a 1 2 |b 0:1 |#").into_bytes();
    long.resize(long.len() + (5 << 20), b'x');
    long.push(b'\n');
    data.splice(at..at, long);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.ctf");
    std::fs::write(&path, &data).unwrap();
    let streams = vec![d("a", "a", 2), s("b", "b", 5)];
    let configs: [(bool, Option<usize>, u64, u64); 4] = [
        (false, None, 32 << 20, 1_000_000),
        (false, Some(1), 1 << 20, 1_000_000),
        (true, Some(0), 100_000, 1_000_000),
        (false, None, 1 << 20, 3), // fails in the middle of the file
    ];
    for (skip_ids, main, chunk_size, max_errors) in configs {
        let mut streams = streams.clone();
        if let Some(m) = main {
            streams[m].defines = true;
        }
        let job = Job { path: path.clone(), streams, skip_ids, chunk_size, max_errors, elem: Elem::F32 };
        let want = from_outcome(&reference::run(&data, &job.streams, skip_ids, chunk_size, max_errors, job.elem));
        assert!(want.seqs.len() > 1000, "{}: only {} sequences", job.describe(), want.seqs.len());
        if max_errors == 3 {
            assert!(want.stop == Some(Stop::MaxErrors) && want.complete_chunks() > 2, "{}", job.describe());
        }
        let diffs = compare_paths(&job, &want);
        assert!(diffs.is_empty(), "{}\n{}", job.describe(), diffs.join("\n"));
    }
}

/// Bug 1 (fixed; see `cntkio-core/tests/ctf_reference.rs`): a digits-only last row without `\n` in id mode.
#[test]
fn bug_digits_only_last_row_matches_python_model() {
    if !common::testdata::python_model_runs("ctfref.py") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<Job> = [&b"1 |a 1\n2"[..], b"12", b"\n007"]
        .iter()
        .enumerate()
        .map(|(i, data)| {
            let path = dir.path().join(format!("bug{i}.ctf"));
            std::fs::write(&path, data).unwrap();
            job(path, vec![d("a", "a", 1)], Elem::F32)
        })
        .collect();
    check_against_model(&jobs);
}
