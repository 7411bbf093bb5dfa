//! The minibatch source (`cntkio::source`): the worked examples of READER.md (§3.6, §4, §6, §8.3), a
//! differential test against the Python model of CNTK 2.7's V2 `MinibatchSource` (`tools/v2_oracle.py` over
//! `testdata/model`) on random CTF files and options, CBF and multi-file sources, and laws as
//! property tests (every sweep delivers every sequence once; workers are disjoint and cover the data; a
//! restore continues identically).
//!
//! When `python3` is missing the differential test prints a note and passes.

mod common;

use cntkio::cbf::CbfWriter;
use cntkio::randomize::{SequenceSource, Window};
use cntkio::source::{Batch, CbfSource, Deserializer, MinibatchConfig, MinibatchSource, MultiSource, RunLength};
use cntkio::{CtfOptions, CtfReader, Layout, Schema, StorageFormat, StreamSpec, Values};
use common::Mem;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

/// A stream of a test file: (name, dense, dim, definesMBSize).
type S = (&'static str, bool, usize, bool);

/// `text` parsed with `streams` and written to `path` as a CBF file of `chunk_size`-byte chunks; returns
/// the parsed data.
fn write_cbf(path: &Path, text: &str, streams: &[S], chunk_size: u64) -> cntkio_core::ChunkData {
    let schema = schema(streams);
    let data =
        cntkio_core::ctf::parse::parse_bytes(text.as_bytes(), &schema, false, &mut cntkio_core::ctf::parse::FailFast)
            .unwrap();
    let mut w = CbfWriter::create(path, &schema, chunk_size).unwrap();
    w.write(&data).unwrap();
    w.finish().unwrap();
    data
}

fn schema(streams: &[S]) -> Schema {
    Schema::new(
        streams
            .iter()
            .map(|&(n, dense, dim, mb)| {
                StreamSpec::new(n, dim, if dense { StorageFormat::Dense } else { StorageFormat::Sparse })
                    .defines_mb_size(mb)
            })
            .collect(),
    )
    .unwrap()
}

fn ctf(path: &Path, streams: &[S], chunk_size: u64) -> Arc<dyn Deserializer> {
    let opts = CtfOptions { chunk_size, ..CtfOptions::default() };
    Arc::new(CtfReader::open(path, &schema(streams), &opts).unwrap())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Every minibatch until the end of the run (at most `limit`).
fn drain(src: &mut MinibatchSource, mb: u64, limit: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    while out.len() < limit {
        match src.next_minibatch(mb).unwrap() {
            Some(b) => {
                let end = b.end_of_run;
                out.push(b);
                if end {
                    break;
                }
            }
            None => break,
        }
    }
    out
}

fn keys(bs: &[Batch]) -> Vec<Vec<u64>> {
    bs.iter().map(|b| b.data.keys.to_vec()).collect()
}

fn cfg(randomize: bool, window: Window, seed: u64, run_length: RunLength) -> MinibatchConfig {
    MinibatchConfig { randomize, window, seed, run_length, ..MinibatchConfig::default() }
}

/// The 20-row file of CTF.md §3 / READER.md §3.6.
fn twenty(dir: &Path) -> Arc<dyn Deserializer> {
    let text: String = (0..20).map(|i| format!("{i} |a {i} {} |b {}:1\n", -i, i % 4)).collect();
    ctf(&write(dir, "twenty.ctf", &text), &[("a", true, 2, false), ("b", false, 4, false)], 64)
}

#[test]
fn worked_example_orders() {
    let dir = tempfile::tempdir().unwrap();
    let d = twenty(dir.path());
    assert_eq!(d.chunks().len(), 7);
    for (window, order) in [
        (Window::Chunks(128), "9 13 7 12 17 14 16 1 2 4 18 10 8 15 3 11 19 5 0 6"),
        (Window::Chunks(1), "9 10 11 0 1 2 12 13 14 19 18 6 7 8 3 5 4 17 16 15"),
        (Window::Chunks(2), "0 11 10 9 1 2 14 13 12 18 19 8 7 6 4 3 5 16 17 15"),
        (Window::Samples(4), "9 10 11 0 1 2 12 13 14 19 18 7 8 6 3 5 4 17 16 15"),
    ] {
        let mut s = MinibatchSource::new(d.clone(), cfg(true, window, 0, RunLength::Sweeps(1))).unwrap();
        let got: Vec<String> = keys(&drain(&mut s, 1000, 100)).concat().iter().map(|k| k.to_string()).collect();
        assert_eq!(got.join(" "), order, "{window:?}");
    }
    let mut s = MinibatchSource::new(d, cfg(true, Window::Chunks(128), 0, RunLength::Sweeps(1))).unwrap();
    let bs = drain(&mut s, 5, 100);
    assert_eq!(
        keys(&bs),
        [vec![9, 13, 7, 12, 17], vec![14, 16, 1, 2, 4], vec![18, 10, 8, 15, 3], vec![11, 19, 5, 0, 6]]
    );
    assert_eq!(bs.iter().map(|b| b.end_of_sweep).collect::<Vec<_>>(), [false, false, false, true]);
    assert!(s.next_minibatch(5).unwrap().is_none());
    // The values travel with the keys: sequence 9 is `|a 9 -9 |b 1:1`.
    let b = &bs[0].data;
    assert_eq!(b.streams[0].values, Values::F32(vec![9., -9., 13., -13., 7., -7., 12., -12., 17., -17.]));
    assert_eq!(b.streams[0].sequence_offsets, [0, 1, 2, 3, 4, 5]);
    match &b.streams[1].layout {
        Layout::Sparse { indices, sample_offsets } => {
            assert_eq!(indices, &[1, 1, 3, 0, 1]);
            assert_eq!(sample_offsets, &[0, 1, 2, 3, 4, 5]);
        }
        Layout::Dense => panic!("b is sparse"),
    }
}

#[test]
fn sweep_ends_and_max_samples() {
    let dir = tempfile::tempdir().unwrap();
    let d = ctf(&write(dir.path(), "four.ctf", "0 |a 0\n1 |a 1\n2 |a 2\n3 |a 3\n"), &[("a", true, 1, false)], 1 << 20);
    for randomize in [false, true] {
        let mut s =
            MinibatchSource::new(d.clone(), cfg(randomize, Window::Chunks(128), 0, RunLength::Sweeps(3))).unwrap();
        let bs = drain(&mut s, 5, 100);
        let got: Vec<(usize, bool)> = bs.iter().map(|b| (b.num_sequences(), b.end_of_sweep)).collect();
        assert_eq!(got, [(5, true), (5, true), (2, true)], "randomize {randomize}");
        assert!(s.next_minibatch(5).unwrap().is_none());
        let mut s =
            MinibatchSource::new(d.clone(), cfg(randomize, Window::Chunks(128), 0, RunLength::Samples(11))).unwrap();
        let bs = drain(&mut s, 5, 100);
        let got: Vec<(usize, bool)> = bs.iter().map(|b| (b.num_sequences(), b.end_of_sweep)).collect();
        assert_eq!(got, [(5, true), (5, true), (1, false)], "randomize {randomize}");
    }
    let mut s = MinibatchSource::new(d.clone(), MinibatchConfig::default()).unwrap();
    assert!(s.next_minibatch(0).is_err());
    // An endless run cannot fill a minibatch of 2^64 − 1 samples: an error, not sweeps gathered forever; a
    // run with an end gives what it has (CNTK's full-sweep minibatch).
    let e = s.next_minibatch(u64::MAX).unwrap_err();
    assert!(e.to_string().contains("endless run"), "{e}");
    assert_eq!(s.next_minibatch(3).unwrap().unwrap().num_sequences(), 3);
    let mut s = MinibatchSource::new(d, cfg(true, Window::Chunks(128), 0, RunLength::Sweeps(2))).unwrap();
    assert_eq!(s.next_minibatch(u64::MAX).unwrap().unwrap().num_sequences(), 8);
    assert!(s.next_minibatch(u64::MAX).unwrap().is_none());
}

fn twelve(dir: &Path) -> Arc<dyn Deserializer> {
    let text: String = (0..12).map(|i| format!("{i} |a {i}\n")).collect();
    ctf(&write(dir, "twelve.ctf", &text), &[("a", true, 1, false)], 16)
}

#[test]
fn distributed_example() {
    let dir = tempfile::tempdir().unwrap();
    let d = twelve(dir.path());
    assert_eq!(d.chunks().len(), 7);
    let run = |randomize: bool, rank: u32| {
        let c = MinibatchConfig { workers: 2, rank, ..cfg(randomize, Window::Chunks(1), 0, RunLength::Sweeps(1)) };
        keys(&drain(&mut MinibatchSource::new(d.clone(), c).unwrap(), 4, 100))
    };
    assert_eq!(run(false, 0), [vec![0, 2], vec![4, 6], vec![8, 10]]);
    assert_eq!(run(false, 1), [vec![1, 3], vec![5, 7], vec![9, 11]]);
    assert_eq!(run(true, 0), [vec![6, 7], vec![9, 8], vec![5, 4], vec![10]]);
    assert_eq!(run(true, 1), [vec![0, 1], vec![11, 3], vec![2]]);
}

#[test]
fn restore_example_exact_and_cntk_quirk() {
    let dir = tempfile::tempdir().unwrap();
    let d = twelve(dir.path());
    let c = cfg(true, Window::Chunks(1), 1, RunLength::Sweeps(1));
    let mut full = MinibatchSource::new(d.clone(), c.clone()).unwrap();
    let all = keys(&drain(&mut full, 3, 100));
    assert_eq!(all, [vec![7, 6, 1], vec![0, 2, 3], vec![10, 8, 9], vec![5, 4, 11]]);
    let mut first = MinibatchSource::new(d.clone(), c.clone()).unwrap();
    drain(&mut first, 3, 2);
    let state = first.state();
    assert_eq!((state.position, state.minibatches), (6, 2));
    let json = state.to_json();
    assert_eq!(json, r#"{"version":1,"position":6,"minibatches":2,"sweep_size":12}"#);
    let state = cntkio::source::SourceState::from_json(&json).unwrap();
    // Exact by default.
    let mut r = MinibatchSource::new(d.clone(), c.clone()).unwrap();
    r.restore(&state).unwrap();
    assert_eq!(keys(&drain(&mut r, 3, 100)), all[2..]);
    assert_eq!(r.minibatches(), 4);
    // CNTK's quirk on request.
    let mut q = MinibatchSource::new(d.clone(), MinibatchConfig { cntk_restore_quirk: true, ..c.clone() }).unwrap();
    q.restore(&state).unwrap();
    assert_eq!(keys(&drain(&mut q, 3, 100)), [vec![10, 9, 8], vec![5, 4, 11]]);
    // Wrong data or version.
    let mut bad = state;
    bad.sweep_size = 13;
    assert!(r.restore(&bad).is_err());
    assert!(cntkio::source::SourceState::from_json(r#"{"version":2,"position":6,"minibatches":2,"sweep_size":12}"#)
        .is_err());
}

#[test]
fn frame_mode_and_empty_streams() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "f.ctf", "0 |a 1\n1 |a 2\n1 |a 3\n2 |a 4\n");
    let d = ctf(&p, &[("a", true, 1, false)], 1 << 20);
    let frame = MinibatchConfig { frame_mode: true, ..cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(1)) };
    let mut s = MinibatchSource::new(d.clone(), frame.clone()).unwrap();
    assert_eq!(s.next_minibatch(1).unwrap().unwrap().data.keys, [0]);
    let e = s.next_minibatch(1).unwrap_err();
    assert!(e.to_string().contains("non-frame sequence of size 2"), "{e}");
    // A data error (exit 1 in the CLI, FormatError in Python), with its fields.
    assert_eq!((e.code(), e.category()), ("E0023", cntkio::Category::Format));
    assert!(
        matches!(e.kind(), cntkio::ErrorKind::NonFrameSequence { sequence: 1, stream, samples: 2 } if stream == "a")
    );
    let p = write(dir.path(), "e.ctf", "0 |a 1 |b 0:1\n1 |a 2\n");
    let d = ctf(&p, &[("a", true, 1, false), ("b", false, 3, false)], 1 << 20);
    let mut s = MinibatchSource::new(d, cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(1))).unwrap();
    // The CTF reader already refuses the chunk (CTF.md §6.2); the packer's own check is for CBF files.
    assert!(s.next_minibatch(2).is_err());
}

#[test]
fn cbf_source_matches_its_ctf_twin() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..50).map(|i| format!("{i} |a {i} {} |b {}:{}\n", i * 2, i % 4, i + 1)).collect();
    let p = write(dir.path(), "x.ctf", &text);
    let streams = [("a", true, 2, false), ("b", false, 4, false)];
    let c = ctf(&p, &streams, 100);
    let data = cntkio_core::ctf::parse::parse_bytes(
        text.as_bytes(),
        &schema(&streams),
        false,
        &mut cntkio_core::ctf::parse::FailFast,
    )
    .unwrap();
    let cbf = |name: &str, chunk_size: u64| -> Arc<dyn Deserializer> {
        let bin = dir.path().join(name);
        let mut w = CbfWriter::create(&bin, &schema(&streams), chunk_size).unwrap();
        w.write(&data).unwrap();
        w.finish().unwrap();
        Arc::new(CbfSource::open(&bin).unwrap())
    };
    let small = cbf("small.bin", 100);
    assert!(small.chunks().len() > 5);
    let whole = cbf("whole.bin", 1 << 20);
    let one = ctf(&p, &streams, 1 << 20);
    assert_eq!(whole.chunks(), one.chunks(), "one chunk each");
    // CTF keys are the ids 0..50 and CBF keys the sequence indices 0..50: the same here.
    let off = cfg(false, Window::Chunks(3), 7, RunLength::Sweeps(2));
    let x = drain(&mut MinibatchSource::new(c, off.clone()).unwrap(), 7, 1000);
    assert_eq!(x, drain(&mut MinibatchSource::new(small, off).unwrap(), 7, 1000));
    for window in [Window::Chunks(1), Window::Samples(10)] {
        let on = cfg(true, window, 7, RunLength::Sweeps(2));
        let x = drain(&mut MinibatchSource::new(one.clone(), on.clone()).unwrap(), 7, 1000);
        assert_eq!(x, drain(&mut MinibatchSource::new(whole.clone(), on).unwrap(), 7, 1000));
    }
}

/// CBF and CTF chunks whose sequences all have the same length in a stream (their values are located
/// without reading the chunk's offsets or records) next to chunks whose lengths vary: the same minibatches
/// from CBF (read and mapped) and CTF in file order, every sequence as parsed in any order, with minibatches
/// mixing both kinds of chunk.
#[test]
fn cbf_chunks_of_equal_and_varying_lengths_match_their_ctf_twin() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(11);
    let mut text = String::new();
    for id in 0..120u64 {
        // Runs of 30 sequences: all of 1 row, all of 2 rows, 1–3 rows, all of 3 rows.
        let rows = match id / 30 {
            0 => 1,
            1 => 2,
            2 => 1 + rng.below(3),
            _ => 3,
        };
        for r in 0..rows {
            text += &format!("{id} |a {} {} {} |b {}:{}", rng.below(100), id, r, rng.below(5), rng.below(9));
            // `c` (dense, one value) only in the first row: its length is 1 where `a`'s is not.
            if r == 0 {
                text += &format!(" |c {}", rng.below(1000));
            }
            text.push('\n');
        }
    }
    let streams = [("a", true, 3, false), ("b", false, 5, false), ("c", true, 1, false)];
    let p = write(dir.path(), "runs.ctf", &text);
    let bin = dir.path().join("runs.bin");
    let data = write_cbf(&bin, &text, &streams, 400);
    let read: Arc<dyn Deserializer> = Arc::new(CbfSource::open(&bin).unwrap());
    let mapped: Arc<dyn Deserializer> =
        Arc::new(CbfSource::open_with(&bin, &cntkio::cbf::CbfOptions::default().mmap(true)).unwrap());
    assert!(read.chunks().len() > 6, "{}", read.chunks().len());
    // The CBF source tells chunks of 1-row (and of 3-row) sequences apart as uniform, and lists the others;
    // a source that lists every chunk gives the same minibatches.
    let uniform: Vec<bool> =
        (0..read.chunks().len() as u32).map(|k| read.uniform_sequences(k).unwrap().is_some()).collect();
    assert!(uniform.contains(&true) && uniform.contains(&false), "{uniform:?}");
    let listed: Arc<dyn Deserializer> = Arc::new(Listed(read.clone()));
    let c = ctf(&p, &streams, 1 << 20);
    let small = ctf(&p, &streams, 400);
    assert!(small.chunks().len() > 6, "{}", small.chunks().len());
    for (randomize, window) in [
        (false, Window::Chunks(0)),
        (true, Window::Chunks(128)),
        (true, Window::Chunks(2)),
        (true, Window::Samples(50)),
    ] {
        for mb in [1, 7, 64, 1000] {
            // The CTF twin has one chunk: only the order in file order is the same as the CBF file's; with
            // randomization the CBF sources are compared with each other and with the CTF data by key.
            let conf = cfg(randomize, window, 3, RunLength::Sweeps(2));
            let a = drain(&mut MinibatchSource::new(read.clone(), conf.clone()).unwrap(), mb, 10_000);
            let b = drain(&mut MinibatchSource::new(mapped.clone(), conf.clone()).unwrap(), mb, 10_000);
            assert_eq!(a, b);
            assert_eq!(a, drain(&mut MinibatchSource::new(listed.clone(), conf.clone()).unwrap(), mb, 10_000));
            let t = drain(&mut MinibatchSource::new(small.clone(), conf.clone()).unwrap(), mb, 10_000);
            if !randomize {
                assert_eq!(a, drain(&mut MinibatchSource::new(c.clone(), conf).unwrap(), mb, 10_000));
                assert_eq!(a, t);
            }
            // Every sequence as the parsed data has it.
            for batch in a.iter().chain(&t) {
                for (i, key) in batch.data.keys.iter().enumerate() {
                    for (st, d) in batch.data.streams.iter().enumerate() {
                        let mut want = cntkio::StreamData::new(d.format(), d.dim, d.values.element_type());
                        cntkio::source::SourceChunk::from_data(Arc::new(data.clone())).append_sequence(
                            st,
                            key as usize,
                            &mut want,
                        );
                        let mut got = cntkio::StreamData::new(d.format(), d.dim, d.values.element_type());
                        let one = Arc::new(batch.data.clone());
                        cntkio::source::SourceChunk::from_data(one).append_sequence(st, i, &mut got);
                        assert_eq!(got, want, "sequence {key}, stream {st}");
                    }
                }
            }
        }
    }
}

/// A deserializer that lists the sequences of every chunk of another: never uniform.
struct Listed(Arc<dyn Deserializer>);

impl SequenceSource for Listed {
    fn chunks(&self) -> &[cntkio::randomize::ChunkInfo] {
        self.0.chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<cntkio::randomize::SequenceInfo>) -> Result<(), cntkio::Error> {
        self.0.sequences(chunk, out)
    }
}

impl Deserializer for Listed {
    fn streams(&self) -> &[StreamSpec] {
        self.0.streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<cntkio::ChunkData>, cntkio::Error> {
        self.0.load_chunk(chunk)
    }
}

/// A CBF chunk's meta counts are told uniform, read in pieces, only when every one of them is the same: a
/// chunk of 20,000 one-row sequences is, with a last sequence of two rows it is not.
#[test]
fn cbf_uniform_meta_counts_are_checked_to_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let streams = [("a", true, 1, false)];
    let rows: String = (0..20_000).map(|i| format!("{i} |a {i}\n")).collect();
    for (name, text, want) in [("same", rows.clone(), Some((0, 1))), ("last", rows + "20000 |a 1\n20000 |a 2\n", None)]
    {
        let bin = dir.path().join(name);
        write_cbf(&bin, &text, &streams, 1 << 30);
        let f = cntkio::cbf::CbfFile::open(&bin).unwrap();
        assert_eq!(f.chunk_count(), 1);
        assert_eq!(f.uniform_meta_count(0).unwrap(), want.map(|(_, n)| n), "{name}");
        assert_eq!(CbfSource::new(f).unwrap().uniform_sequences(0).unwrap(), want, "{name}");
    }
}

#[test]
fn multi_file_source_concatenates_shards() {
    let dir = tempfile::tempdir().unwrap();
    let streams = [("a", true, 1, false)];
    let all: String = (0..30).map(|i| format!("{i} |a {i}\n")).collect();
    let one = ctf(&write(dir.path(), "all.ctf", &all), &streams, 40);
    let shards: Vec<Arc<dyn Deserializer>> = (0..3)
        .map(|k| {
            let t: String = (k * 10..k * 10 + 10).map(|i| format!("{i} |a {i}\n")).collect();
            ctf(&write(dir.path(), &format!("s{k}.ctf"), &t), &streams, 40)
        })
        .collect();
    let multi: Arc<dyn Deserializer> = Arc::new(MultiSource::new(shards).unwrap());
    let conf = cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(2));
    let x = drain(&mut MinibatchSource::new(one, conf.clone()).unwrap(), 7, 1000);
    let y = drain(&mut MinibatchSource::new(multi.clone(), conf).unwrap(), 7, 1000);
    assert_eq!(keys(&x), keys(&y));
    let mut s = MinibatchSource::new(multi, cfg(true, Window::Chunks(2), 3, RunLength::Sweeps(1))).unwrap();
    let mut k = keys(&drain(&mut s, 4, 1000)).concat();
    k.sort();
    assert_eq!(k, (0..30).collect::<Vec<u64>>());
    // Different streams are refused.
    let other = ctf(&write(dir.path(), "o.ctf", "0 |a 1 2\n"), &[("a", true, 2, false)], 40);
    let first = ctf(&dir.path().join("s0.ctf"), &streams, 40);
    assert!(MultiSource::new(vec![first, other]).is_err());
}

// ---------------------------------------------------------------------------------------------------------
// Differential against the Python model.

fn run_oracle(jobs: &[Value]) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/v2_oracle.py");
    let input = Value::Array(jobs.to_vec()).to_string();
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start python3");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("python3 output");
    writer.join().unwrap().expect("write the jobs");
    assert!(out.status.success(), "v2_oracle.py failed: {}", out.status);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from v2_oracle.py");
    v.as_array().expect("a list").clone()
}

fn num(v: &Values, i: usize) -> Value {
    json!(v.get_f64(i))
}

/// A batch in the oracle's form.
fn canon(b: &Batch, index: u64, streams: &[StreamSpec]) -> Value {
    let mut st = serde_json::Map::new();
    for (spec, d) in streams.iter().zip(&b.data.streams) {
        let mut seqs = Vec::new();
        for s in 0..d.num_sequences() {
            let mut samples = Vec::new();
            for k in d.sequence_samples(s) {
                let r = d.sample_value_range(k);
                samples.push(match &d.layout {
                    Layout::Dense => Value::Array(r.map(|i| num(&d.values, i)).collect()),
                    Layout::Sparse { indices, .. } => {
                        Value::Array(r.map(|i| json!([indices[i], num(&d.values, i)])).collect())
                    }
                });
            }
            seqs.push(Value::Array(samples));
        }
        st.insert(spec.name.clone(), Value::Array(seqs));
    }
    json!({"mb": index, "sweep_end": b.end_of_sweep, "keys": b.data.keys.to_vec(), "lens": b.data.num_samples.to_vec(), "streams": st})
}

/// What cntkio makes of a job: the oracle's result shape.
fn run_cntkio(job: &Value) -> Value {
    let path = job["path"].as_str().unwrap();
    let streams: Vec<StreamSpec> = job["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let f = if s["dense"].as_bool().unwrap() { StorageFormat::Dense } else { StorageFormat::Sparse };
            StreamSpec::new(s["name"].as_str().unwrap(), s["dim"].as_u64().unwrap() as usize, f)
                .alias(s["alias"].as_str().unwrap())
                .defines_mb_size(s["defines"].as_bool().unwrap_or(false))
        })
        .collect();
    let opts = CtfOptions { chunk_size: job["chunk_size"].as_u64().unwrap(), ..CtfOptions::default() };
    let reader = CtfReader::open(path, &Schema::new(streams.clone()).unwrap(), &opts).unwrap();
    let d: Arc<dyn Deserializer> = Arc::new(reader);
    let window = match job["window_samples"].as_u64() {
        Some(w) => Window::Samples(w),
        None => Window::Chunks(job["window_chunks"].as_u64().unwrap()),
    };
    let run_length = match (job["max_sweeps"].as_u64(), job["max_samples"].as_u64()) {
        (Some(k), _) => RunLength::Sweeps(k),
        (_, Some(n)) => RunLength::Samples(n),
        _ => RunLength::Infinite,
    };
    let config = MinibatchConfig {
        randomize: job["randomize"].as_bool().unwrap(),
        window,
        seed: job["seed"].as_u64().unwrap(),
        run_length,
        frame_mode: job["frame"].as_bool().unwrap(),
        workers: job["workers"].as_u64().unwrap() as u32,
        rank: job["rank"].as_u64().unwrap() as u32,
        cntk_restore_quirk: job["quirk"].as_bool().unwrap(),
        balanced_workers: false,
        threads: job["threads"].as_u64().map(|t| t as usize),
        prefetch: job["prefetch"].as_u64().map(|t| t as usize),
        truncation_length: 0,
        elastic_resume: None,
    };
    let mb = job["mb"].as_u64().unwrap();
    let limit = job["max_mbs"].as_u64().unwrap();
    let read = |s: &mut MinibatchSource, limit: u64| -> (Vec<Value>, Value) {
        let mut out = Vec::new();
        while (out.len() as u64) < limit {
            match s.next_minibatch(mb) {
                Ok(Some(b)) => {
                    out.push(canon(&b, s.minibatches() - 1, &streams));
                    if b.end_of_run {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => return (out, json!(e.to_string())),
            }
        }
        (out, Value::Null)
    };
    let mut s = MinibatchSource::new(d.clone(), config.clone()).unwrap();
    match job["checkpoint_after"].as_u64() {
        None => {
            let (b, e) = read(&mut s, limit);
            json!({"batches": b, "error": e, "state": null, "restored": null})
        }
        Some(k) => {
            let (b, e) = read(&mut s, k);
            if !e.is_null() {
                return json!({"batches": b, "error": e, "state": null, "restored": null});
            }
            let state = s.state();
            let mut r = MinibatchSource::new(d, config).unwrap();
            r.restore(&state).unwrap();
            let (rb, e) = read(&mut r, limit);
            json!({"batches": b, "error": e, "state": state.position, "restored": rb})
        }
    }
}

/// A small deterministic generator for test data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let x = self.0;
        (x ^ (x >> 29)).wrapping_mul(0xbf58476d1ce4e5b9) >> 16
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random CTF file: `n` sequences with ids, 1..=max_rows rows each, dense `a` (dim 2) on every row,
/// sparse `b` (dim 5) on some rows (on at least one row of each sequence unless `allow_empty`).
fn random_ctf(rng: &mut Rng, n: u64, max_rows: u64, allow_empty: bool) -> String {
    let mut t = String::new();
    for id in 0..n {
        let rows = 1 + rng.below(max_rows);
        let with_b = rng.below(rows);
        for r in 0..rows {
            t += &format!("{id} |a {} {}", rng.below(100) as i64 - 50, rng.below(7));
            let b = if allow_empty { rng.below(5) != 0 } else { r == with_b || rng.below(2) == 0 };
            if b {
                t += &format!(" |b {}:{} {}:1", rng.below(5), rng.below(9), rng.below(5));
            }
            t += "\n";
        }
    }
    t
}

fn random_job(rng: &mut Rng, dir: &Path, i: usize) -> Value {
    let frame = rng.below(6) == 0;
    let n = 1 + rng.below(40);
    let max_rows = if frame { 1 + rng.below(4) / 3 } else { 1 + rng.below(4) };
    let allow_empty = rng.below(15) == 0;
    let text = random_ctf(rng, n, max_rows, allow_empty);
    let path = write(dir, &format!("r{i}.ctf"), &text);
    let defines = rng.below(4) == 0;
    let randomize = rng.below(3) != 0;
    let workers = if rng.below(3) == 0 { 1 + rng.below(3) } else { 1 };
    let (max_sweeps, max_samples) = match rng.below(4) {
        0 => (Value::Null, json!(1 + rng.below(3 * n * max_rows))),
        1 => (Value::Null, Value::Null),
        _ => (json!(1 + rng.below(3)), Value::Null),
    };
    let sample_window = rng.below(3) == 0;
    let chunk_size = [1u64, 16, 40, 100, 300, 1 << 20][rng.below(6) as usize];
    json!({
        "path": path.to_str().unwrap(),
        "streams": [
            {"name": "a", "alias": "a", "dense": true, "dim": 2, "defines": false},
            {"name": "b", "alias": "b", "dense": false, "dim": 5, "defines": defines},
        ],
        "mb": 1 + rng.below(12),
        "chunk_size": chunk_size,
        "randomize": randomize,
        "seed": rng.below(4),
        "window_chunks": if sample_window { Value::Null } else { json!(1 + rng.below(5)) },
        "window_samples": if sample_window { json!(1 + rng.below(30)) } else { Value::Null },
        "max_sweeps": max_sweeps,
        "max_samples": max_samples,
        "frame": frame,
        "workers": workers,
        "rank": rng.below(workers),
        "max_mbs": 60,
        "checkpoint_after": if rng.below(3) == 0 { json!(rng.below(6)) } else { Value::Null },
        "quirk": true,
    })
}

#[test]
fn random_runs_match_python_model() {
    if !common::testdata::python_model_runs("v2model.py") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    let mut jobs: Vec<Value> = (0..160).map(|i| random_job(&mut rng, dir.path(), i)).collect();
    // Loading threads and prefetch depth never change a minibatch (the model has neither).
    for (i, job) in jobs.iter_mut().enumerate() {
        job["threads"] = json!([0, 1, 2, 4][i % 4]);
        job["prefetch"] = json!([0, 1, 4][(i / 4) % 3]);
    }
    let model = run_oracle(&jobs);
    let (mut batches, mut errors, mut restored) = (0, 0, 0);
    for (job, want) in jobs.iter().zip(&model) {
        let got = run_cntkio(job);
        assert_eq!(got["batches"], want["batches"], "job {job}");
        assert_eq!(got["state"], want["state"], "job {job}");
        assert_eq!(got["restored"], want["restored"], "job {job}");
        assert_eq!(got["error"].is_null(), want["error"].is_null(), "job {job}: {} vs {}", got["error"], want["error"]);
        batches += want["batches"].as_array().unwrap().len();
        errors += usize::from(!want["error"].is_null());
        restored += usize::from(!want["restored"].is_null());
    }
    eprintln!("{} jobs, {batches} minibatches, {errors} errors, {restored} restores: identical", jobs.len());
    assert!(batches > 500 && restored > 10);
}

// ---------------------------------------------------------------------------------------------------------
// Laws, on an in-memory deserializer.

fn structure() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(1u32..5, 0..6), 1..10)
        .prop_filter("some sequence", |c| c.iter().any(|x| !x.is_empty()))
}

fn window() -> impl Strategy<Value = Window> {
    prop_oneof![(1u64..6).prop_map(Window::Chunks), (1u64..30).prop_map(Window::Samples)]
}

fn config() -> impl Strategy<Value = MinibatchConfig> {
    (any::<bool>(), window(), 0u64..5).prop_map(|(randomize, window, seed)| MinibatchConfig {
        randomize,
        window,
        seed,
        ..MinibatchConfig::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_sweep_delivers_every_sequence_once(lens in structure(), c in config(), sweeps in 1u64..4, mb in 1u64..12) {
        let mem = Arc::new(Mem::new(lens));
        let n = mem.num_sequences();
        let mut s = MinibatchSource::new(mem, MinibatchConfig { run_length: RunLength::Sweeps(sweeps), ..c }).unwrap();
        let bs = drain(&mut s, mb, 100_000);
        let mut got: Vec<u64> = keys(&bs).concat();
        // The values travel with their keys.
        for b in &bs {
            let d = &b.data.streams[0];
            for (i, k) in b.data.keys.iter().enumerate() {
                for j in d.sequence_samples(i) {
                    prop_assert_eq!(d.values.get_f64(j as usize), k as f64);
                }
            }
        }
        prop_assert_eq!(got.len() as u64, n * sweeps);
        // Sweep by sweep: each run of n sequences is a permutation.
        for sweep in got.chunks_mut(n as usize) {
            sweep.sort();
            prop_assert_eq!(sweep.to_vec(), (0..n).collect::<Vec<u64>>());
        }
        prop_assert!(bs.last().unwrap().end_of_sweep && bs.last().unwrap().end_of_run);
        prop_assert!(s.next_minibatch(mb).unwrap().is_none());
    }

    #[test]
    fn workers_are_disjoint_and_cover(lens in structure(), c in config(), workers in 1u32..5, mb in 1u64..12) {
        let mem = Arc::new(Mem::new(lens));
        let n = mem.num_sequences();
        let mut all = Vec::new();
        for rank in 0..workers {
            let conf = MinibatchConfig { run_length: RunLength::Sweeps(1), workers, rank, ..c.clone() };
            let mut s = MinibatchSource::new(mem.clone(), conf).unwrap();
            all.extend(keys(&drain(&mut s, mb, 100_000)).concat());
        }
        all.sort();
        prop_assert_eq!(all, (0..n).collect::<Vec<u64>>());
    }

    #[test]
    fn restore_continues_identically(lens in structure(), c in config(), workers in 1u32..4, rank in 0u32..4,
                                     mb in 1u64..12, at in 0usize..30) {
        let rank = rank % workers;
        let mem = Arc::new(Mem::new(lens));
        let conf = MinibatchConfig { run_length: RunLength::Sweeps(3), workers, rank, ..c };
        let full = drain(&mut MinibatchSource::new(mem.clone(), conf.clone()).unwrap(), mb, 100_000);
        let at = at.min(full.len());
        let mut first = MinibatchSource::new(mem.clone(), conf.clone()).unwrap();
        prop_assert_eq!(&drain(&mut first, mb, at)[..], &full[..at]);
        let state = cntkio::source::SourceState::from_json(&first.state().to_json()).unwrap();
        let mut r = MinibatchSource::new(mem.clone(), conf.clone()).unwrap();
        r.restore(&state).unwrap();
        prop_assert_eq!(&drain(&mut r, mb, 100_000)[..], &full[at..]);
        // In place, after reading to the end (a rewind).
        first.restore(&state).unwrap();
        prop_assert_eq!(&drain(&mut first, mb, 100_000)[..], &full[at..]);
    }
}

/// Randomization off, 2 workers, 3 sequences: after a restore in sweep 1, CNTK restarts the round robin
/// at the sequence's index within the sweep (its quirk); cntkio continues the uninterrupted assignment.
#[test]
fn restore_keeps_the_round_robin_across_sweeps() {
    let mem = Arc::new(Mem::new(vec![vec![1, 1, 1]]));
    let conf = MinibatchConfig {
        randomize: false,
        run_length: RunLength::Sweeps(4),
        workers: 2,
        rank: 0,
        ..MinibatchConfig::default()
    };
    let full = keys(&drain(&mut MinibatchSource::new(mem.clone(), conf.clone()).unwrap(), 2, 100));
    assert_eq!(full, [vec![0], vec![2], vec![1], vec![0], vec![2], vec![1]]);
    let mut first = MinibatchSource::new(mem.clone(), conf.clone()).unwrap();
    drain(&mut first, 2, 3);
    let state = first.state();
    assert_eq!(state.position, 5);
    let mut exact = MinibatchSource::new(mem.clone(), conf.clone()).unwrap();
    exact.restore(&state).unwrap();
    assert_eq!(keys(&drain(&mut exact, 2, 100)), full[3..]);
    let mut quirk = MinibatchSource::new(mem, MinibatchConfig { cntk_restore_quirk: true, ..conf }).unwrap();
    quirk.restore(&state).unwrap();
    assert_ne!(keys(&drain(&mut quirk, 2, 100)), full[3..]);
}

/// READER.md §7: features in one file, labels in another, joined by key; keys missing in the labels are
/// dropped; the result reads like one file holding both streams.
#[test]
fn composite_joins_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let feats: String = (0..20).map(|i| format!("{i} |x {i}\n{i} |x {}\n", i + 100)).collect();
    let labels: String = (0..20).rev().filter(|i| i % 5 != 0).map(|i| format!("{i} |y {}:1\n", i % 3)).collect();
    let both: String =
        (0..20).filter(|i| i % 5 != 0).map(|i| format!("{i} |x {i} |y {}:1\n{i} |x {}\n", i % 3, i + 100)).collect();
    let f = ctf(&write(dir.path(), "f.ctf", &feats), &[("x", true, 1, false)], 1 << 20);
    let l = ctf(&write(dir.path(), "l.ctf", &labels), &[("y", false, 3, false)], 30);
    let b = ctf(&write(dir.path(), "b.ctf", &both), &[("x", true, 1, false), ("y", false, 3, false)], 1 << 20);
    let joined: Arc<dyn Deserializer> = Arc::new(cntkio::source::Composite::new(vec![f.clone(), l.clone()]).unwrap());
    assert_eq!(joined.streams().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["x", "y"]);
    assert_eq!(joined.chunks(), b.chunks());
    for randomize in [false, true] {
        let c = cfg(randomize, Window::Chunks(4), 3, RunLength::Sweeps(2));
        let x = drain(&mut MinibatchSource::new(joined.clone(), c.clone()).unwrap(), 5, 1000);
        assert_eq!(x, drain(&mut MinibatchSource::new(b.clone(), c).unwrap(), 5, 1000));
    }
    // With labels defining the length, every sequence counts 1 sample.
    let ly = ctf(&dir.path().join("l.ctf"), &[("y", false, 3, true)], 30);
    let j = cntkio::source::Composite::new(vec![f.clone(), ly]).unwrap();
    assert_eq!(cntkio::randomize::SequenceSource::chunks(&j)[0].num_samples, 16);
    // No common key.
    let other = ctf(&write(dir.path(), "o.ctf", "77 |y 0:1\n"), &[("y", false, 3, false)], 30);
    let e = cntkio::source::Composite::new(vec![f, other]).unwrap_err();
    assert!(e.to_string().contains("Could not reconcile"), "{e}");
    assert_eq!((e.code(), e.category()), ("E0030", cntkio::Category::Format));
}

// ---------------------------------------------------------------------------------------------------------
// Loading: threads, prefetch, memory bound, and the undecoded CBF path.

/// A CTF file of `n` sequences of 1–3 rows (dense `a` dim 3, sparse `b` dim 7) and its CBF twins (read and
/// mapped), with small chunks.
fn shards(dir: &Path, n: u64) -> (Arc<dyn Deserializer>, Arc<dyn Deserializer>, Arc<dyn Deserializer>) {
    let mut rng = Rng(n);
    let mut text = String::new();
    for id in 0..n {
        for _ in 0..1 + rng.below(3) {
            text += &format!(
                "{id} |a {} {} {} |b {}:{} {}:1\n",
                rng.below(100),
                id,
                rng.below(9),
                rng.below(7),
                rng.below(50),
                rng.below(7)
            );
        }
    }
    let streams = [("a", true, 3, false), ("b", false, 7, false)];
    let p = write(dir, "shards.ctf", &text);
    let c = ctf(&p, &streams, 300);
    let bin = dir.join("shards.bin");
    write_cbf(&bin, &text, &streams, 300);
    let read: Arc<dyn Deserializer> = Arc::new(CbfSource::open(&bin).unwrap());
    let mapped: Arc<dyn Deserializer> =
        Arc::new(CbfSource::open_with(&bin, &cntkio::cbf::CbfOptions::default().mmap(true)).unwrap());
    (c, read, mapped)
}

/// The same minibatches with 0, 1, 2 and 4 loading threads and prefetch depths 0, 1 and 4, from CTF, CBF
/// and mapped CBF, randomized (windows in chunks and samples) or not, for several workers, across sweeps
/// and through a restore; small minibatches and large ones (assembled by two threads).
#[test]
fn loading_threads_and_prefetch_never_change_a_minibatch() {
    let dir = tempfile::tempdir().unwrap();
    let (c, read, mapped) = shards(dir.path(), 200);
    assert!(c.chunks().len() > 10 && read.chunks().len() > 10, "{} {}", c.chunks().len(), read.chunks().len());
    for (window, randomize) in [
        (Window::Chunks(1), true),
        (Window::Chunks(3), true),
        (Window::Chunks(128), true),
        (Window::Samples(40), true),
        (Window::Chunks(128), false),
    ] {
        for (workers, rank, mb) in [(1, 0, 17), (3, 2, 17), (1, 0, 300), (2, 1, 500)] {
            let base = MinibatchConfig {
                workers,
                rank,
                threads: Some(0),
                prefetch: Some(0),
                ..cfg(randomize, window, 5, RunLength::Sweeps(3))
            };
            if !randomize {
                // In file order the chunking does not matter: all three deliver the same minibatches.
                let all: Vec<Vec<Batch>> = [&c, &read, &mapped]
                    .iter()
                    .map(|d| drain(&mut MinibatchSource::new((*d).clone(), base.clone()).unwrap(), mb, 10_000))
                    .collect();
                assert!(all[0] == all[1] && all[1] == all[2]);
            }
            for d in [&c, &read, &mapped] {
                // Each deserializer against itself (CTF and CBF chunks differ, and so does the order).
                let want = drain(&mut MinibatchSource::new(d.clone(), base.clone()).unwrap(), mb, 10_000);
                assert!(want.len() >= 3, "{}", want.len());
                let all = [0, 1, 2, 4].into_iter().flat_map(|t| [0, 1, 4].into_iter().map(move |p| (t, p)));
                let combos: Vec<(usize, usize)> = if mb > 100 { vec![(1, 0), (2, 1), (4, 4)] } else { all.collect() };
                for &(threads, prefetch) in &combos {
                    {
                        let conf = MinibatchConfig { threads: Some(threads), prefetch: Some(prefetch), ..base.clone() };
                        let mut s = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
                        let got = drain(&mut s, mb, 10_000);
                        let what =
                            format!("{window:?} {randomize} {workers}/{rank} threads {threads} prefetch {prefetch}");
                        assert_eq!(keys(&got), keys(&want), "{what}");
                        assert!(got == want, "{what}");
                        // Restore half way into a source that has already read ahead.
                        let mut first = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
                        drain(&mut first, mb, want.len() / 2);
                        let state = first.state();
                        drain(&mut first, mb, 3);
                        first.restore(&state).unwrap();
                        assert!(drain(&mut first, mb, 10_000) == want[want.len() / 2..], "{what}: restored");
                    }
                }
            }
        }
    }
}

/// A deserializer that counts the chunks it loads.
struct Counted(Arc<dyn Deserializer>, std::sync::atomic::AtomicUsize);

impl Counted {
    fn loads(&self) -> usize {
        self.1.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

impl SequenceSource for Counted {
    fn chunks(&self) -> &[cntkio::randomize::ChunkInfo] {
        self.0.chunks()
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<cntkio::randomize::SequenceInfo>) -> Result<(), cntkio::Error> {
        self.0.sequences(chunk, out)
    }
    fn uniform_sequences(&self, chunk: u32) -> Result<Option<(u64, u32)>, cntkio::Error> {
        self.0.uniform_sequences(chunk)
    }
}

impl Deserializer for Counted {
    fn streams(&self) -> &[StreamSpec] {
        self.0.streams()
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<cntkio::ChunkData>, cntkio::Error> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.load_chunk(chunk)
    }
    fn load_source_chunk(
        &self,
        chunk: u32,
        spare: Option<cntkio::source::SourceChunk>,
    ) -> Result<cntkio::source::SourceChunk, cntkio::Error> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.load_source_chunk(chunk, spare)
    }
    fn load_order_matters(&self) -> bool {
        self.0.load_order_matters()
    }
    fn chunk_size(&self, chunk: u32) -> Option<u64> {
        self.0.chunk_size(chunk)
    }
}

/// Epochs (a source each, seed + epoch) that leave their chunks in a keep deliver the minibatches of
/// epochs without one, from CTF, CBF and mapped CBF, for any window, workers, threads and a restore. A
/// randomized source whose window covers the data uses the keep: the later epochs load nothing, and the keep
/// never holds more bytes than a source held at once; a smaller window or file order leaves it empty. A keep given to another deserializer lets
/// go of the first one's chunks; a source whose loading order matters does not use it.
#[test]
fn kept_chunks_never_change_a_minibatch_and_spare_loads() {
    use cntkio::source::ChunkKeep;
    use std::sync::atomic::AtomicUsize;

    let dir = tempfile::tempdir().unwrap();
    let (c, read, mapped) = shards(dir.path(), 200);
    for (window, randomize) in [
        (Window::Chunks(2), true),
        (Window::Chunks(128), true),
        (Window::Samples(40), true),
        (Window::Samples(1 << 40), true),
        (Window::Chunks(128), false),
    ] {
        for (workers, rank, threads) in [(1, 0, 2), (3, 2, 1), (1, 0, 0)] {
            for d in [&c, &read, &mapped] {
                let counted = Arc::new(Counted(d.clone(), AtomicUsize::new(0)));
                let src: Arc<dyn Deserializer> = counted.clone();
                let keep = ChunkKeep::new();
                let covers = randomize && matches!(window, Window::Chunks(128) | Window::Samples(1_099_511_627_776));
                let what = format!("{window:?} {randomize} {workers}/{rank} threads {threads}");
                let mut loads = Vec::new();
                for epoch in 0..3 {
                    let conf = MinibatchConfig {
                        workers,
                        rank,
                        threads: Some(threads),
                        ..cfg(randomize, window, 5 + epoch, RunLength::Sweeps(1))
                    };
                    let want = drain(&mut MinibatchSource::new(d.clone(), conf.clone()).unwrap(), 17, 10_000);
                    let mut s = MinibatchSource::new(src.clone(), conf.clone()).unwrap();
                    s.keep_chunks(keep.clone());
                    counted.loads();
                    let mut got = Vec::new();
                    while let Some(b) = s.next_minibatch(17).unwrap() {
                        let end = b.end_of_run;
                        got.push(b);
                        if end {
                            break;
                        }
                    }
                    assert!(got == want, "{what} epoch {epoch}");
                    if epoch == 1 {
                        // A restore half way, from a source over the same keep.
                        let mut first = MinibatchSource::new(src.clone(), conf.clone()).unwrap();
                        first.keep_chunks(keep.clone());
                        drain(&mut first, 17, want.len() / 2);
                        let state = first.state();
                        drop(first);
                        let mut again = MinibatchSource::new(src.clone(), conf).unwrap();
                        again.keep_chunks(keep.clone());
                        again.restore(&state).unwrap();
                        assert!(drain(&mut again, 17, 10_000) == want[want.len() / 2..], "{what}: restored");
                    }
                    drop(s);
                    loads.push(counted.loads());
                    if covers {
                        assert!(keep.bytes() > 0 && keep.bytes() <= keep.peak(), "{what} epoch {epoch}");
                    } else {
                        assert!(keep.is_empty(), "{what} epoch {epoch}");
                    }
                }
                let chunks = d.chunks().len();
                assert!(loads[0] >= chunks / workers.max(1) as usize / 2, "{what}: {loads:?}");
                if covers && workers == 1 {
                    assert_eq!(loads[2], 0, "{what}: {loads:?}");
                }
            }
        }
    }
    // Another deserializer: the keep lets go of the first one's chunks.
    let keep = ChunkKeep::new();
    for d in [&read, &mapped] {
        let mut s = MinibatchSource::new(d.clone(), cfg(true, Window::Chunks(128), 1, RunLength::Sweeps(1))).unwrap();
        s.keep_chunks(keep.clone());
        assert!(keep.is_empty());
        let got = drain(&mut s, 17, 10_000);
        let want = drain(
            &mut MinibatchSource::new(d.clone(), cfg(true, Window::Chunks(128), 1, RunLength::Sweeps(1))).unwrap(),
            17,
            10_000,
        );
        assert!(got == want);
        drop(s);
        assert!(keep.len() > 10 && keep.bytes() > 0, "{}", keep.len());
    }
    // A CTF budget of errors: loaded on demand, every epoch.
    let p = write(dir.path(), "m.ctf", &(0..50).map(|i| format!("{i} |a {i}\n")).collect::<String>());
    let opts = CtfOptions { chunk_size: 40, max_errors: 3, ..CtfOptions::default() };
    let r: Arc<dyn Deserializer> = Arc::new(CtfReader::open(&p, &schema(&[("a", true, 1, false)]), &opts).unwrap());
    let keep = ChunkKeep::new();
    let mut s = MinibatchSource::new(r, cfg(true, Window::Chunks(128), 1, RunLength::Sweeps(1))).unwrap();
    s.keep_chunks(keep.clone());
    drain(&mut s, 7, 10_000);
    drop(s);
    assert!(keep.is_empty());
}

/// A source made to plan ahead behind another ([`MinibatchSource::then`], a training loop's next epoch)
/// delivers exactly the minibatches of a fresh source with its configuration: from CTF, CBF and mapped CBF,
/// for windows that cover the data or not, in file order, for several workers, when chained (the next one's
/// `then` given while it already plans), asked for another size, or restored. It waits in its slot once
/// the source before it has planned its last minibatch on a planning thread; a source that plans on the
/// caller's thread (no loading threads) never fills it.
#[test]
fn a_next_source_planned_ahead_gives_the_minibatches_of_a_fresh_one() {
    use cntkio::source::{ChunkKeep, PlanNext};

    let dir = tempfile::tempdir().unwrap();
    let (c, read, mapped) = shards(dir.path(), 200);
    for (window, randomize) in [(Window::Chunks(128), true), (Window::Chunks(3), true), (Window::Chunks(128), false)] {
        for (workers, rank) in [(1, 0), (3, 2)] {
            for d in [&c, &read, &mapped] {
                let what = format!("{window:?} {randomize} {workers}/{rank}");
                let conf = |epoch: u64, threads: usize| MinibatchConfig {
                    workers,
                    rank,
                    threads: Some(threads),
                    ..cfg(randomize, window, 5 + epoch, RunLength::Sweeps(1))
                };
                let fresh = |epoch: u64, mb: u64| {
                    drain(&mut MinibatchSource::new(d.clone(), conf(epoch, 2)).unwrap(), mb, 10_000)
                };
                let keep = ChunkKeep::new();
                let over = |epoch: u64, threads: usize| {
                    let mut s = MinibatchSource::new(d.clone(), conf(epoch, threads)).unwrap();
                    s.keep_chunks(keep.clone());
                    s
                };
                // Epoch 0 makes epoch 1 ahead, which makes epoch 2 (given while epoch 1 plans already).
                let mut s = over(0, 2);
                let slot = s.then(over(1, 2), 17, PlanNext::Always);
                assert!(!slot.is_waiting(), "{what}");
                assert!(drain(&mut s, 17, 10_000) == fresh(0, 17), "{what}: epoch 0");
                drop(s);
                assert!(slot.is_waiting(), "{what}");
                let mut s = slot.take().expect("planned behind epoch 0");
                assert!(slot.take().is_none());
                let slot = s.then(over(2, 2), 17, PlanNext::Always);
                assert!(drain(&mut s, 17, 10_000) == fresh(1, 17), "{what}: epoch 1");
                drop(s);
                let mut s = slot.take().expect("planned behind epoch 1");
                // Asked for another size than it planned for.
                assert!(drain(&mut s, 29, 10_000) == fresh(2, 29), "{what}: epoch 2, another size");
                // Restored half way before its first minibatch.
                let want = fresh(1, 17);
                let mut half = MinibatchSource::new(d.clone(), conf(1, 2)).unwrap();
                drain(&mut half, 17, want.len() / 2);
                let state = half.state();
                let mut s = over(0, 2);
                let slot = s.then(over(1, 2), 17, PlanNext::Always);
                drain(&mut s, 17, 10_000);
                drop(s);
                let mut s = slot.take().expect("planned behind epoch 0");
                s.restore(&state).unwrap();
                assert!(drain(&mut s, 17, 10_000) == want[want.len() / 2..], "{what}: restored");
                // Planning on the caller's thread: nothing is made ahead.
                let mut s = over(0, 0);
                let slot = s.then(over(1, 0), 17, PlanNext::Always);
                drain(&mut s, 17, 10_000);
                drop(s);
                assert!(!slot.is_waiting() && slot.take().is_none(), "{what}");
            }
        }
    }
}

/// The chunks held stay within the window's chunks plus the prefetch depth (plus the chunks of the
/// minibatch being assembled), and no thread starts before the first minibatch.
#[test]
fn chunks_held_are_bounded_by_window_and_prefetch() {
    let dir = tempfile::tempdir().unwrap();
    let (_, read, _) = shards(dir.path(), 400);
    let n = read.chunks().len();
    assert!(n > 30, "{n}");
    for (window, prefetch) in [(1u64, 0usize), (2, 1), (4, 2), (3, 4)] {
        let conf = MinibatchConfig {
            threads: Some(2),
            prefetch: Some(prefetch),
            ..cfg(true, Window::Chunks(window), 1, RunLength::Sweeps(2))
        };
        let mut s = MinibatchSource::new(read.clone(), conf).unwrap();
        assert_eq!(s.chunks_held(), 0);
        let mut max = 0;
        while let Some(b) = s.next_minibatch(5).unwrap() {
            max = max.max(s.chunks_held());
            assert!(
                s.chunks_held() <= window as usize + prefetch + 2,
                "window {window} prefetch {prefetch}: {} chunks held",
                s.chunks_held()
            );
            if b.end_of_run {
                break;
            }
        }
        assert!(max >= window as usize, "{max}");
    }
}

/// Corrupt records make the undecoded CBF path fail exactly as the decoder does; intact chunks before them
/// are delivered as before.
#[test]
fn cbf_records_are_checked_as_the_decoder_checks_them() {
    let dir = tempfile::tempdir().unwrap();
    let streams = [("a", true, 2, false), ("b", false, 4, false)];
    let text: String = (0..40).map(|i| format!("{i} |a {i} 1 |b {}:2\n", i % 4)).collect();
    let bin = dir.path().join("x.bin");
    write_cbf(&bin, &text, &streams, 200);
    let f = cntkio::cbf::CbfFile::open(&bin).unwrap();
    assert!(f.chunk_count() > 3);
    let k = 2;
    let range = f.header().chunk_range(k).unwrap();
    let sequences = f.chunks()[k].num_sequences as u64;
    let bytes = std::fs::read(&bin).unwrap();
    // Records of chunk 2: meta counts, then stream a (4 + 2·4 bytes per sequence), then stream b's first
    // record: N, NNZ, value, index. Corrupt that index, then (separately) the first dense N.
    let b_first = range.start + 4 * sequences + 12 * sequences;
    for (at, value) in [(b_first + 12, 9u32), (range.start + 4 * sequences, 1000)] {
        let mut bad = bytes.clone();
        bad[at as usize..at as usize + 4].copy_from_slice(&value.to_le_bytes());
        let p = dir.path().join("bad.bin");
        std::fs::write(&p, &bad).unwrap();
        let want = cntkio::cbf::CbfFile::open(&p).unwrap().read_chunk(k).unwrap_err().to_string();
        for mmap in [false, true] {
            let d: Arc<dyn Deserializer> =
                Arc::new(CbfSource::open_with(&p, &cntkio::cbf::CbfOptions::default().mmap(mmap)).unwrap());
            let conf = MinibatchConfig { threads: Some(2), ..cfg(false, Window::Chunks(1), 0, RunLength::Sweeps(1)) };
            let mut s = MinibatchSource::new(d, conf).unwrap();
            let mut got = Vec::new();
            let err = loop {
                match s.next_minibatch(3) {
                    Ok(Some(b)) => got.extend(b.data.keys.iter()),
                    Ok(None) => panic!("no error"),
                    Err(e) => break e.to_string(),
                }
            };
            assert_eq!(err, want, "mmap {mmap}");
            assert!(got.len() >= 6, "{got:?}");
        }
    }
}

/// A CTF reader with a `maxErrors` budget is loaded on demand only (the budget depends on the order).
#[test]
fn order_dependent_sources_load_on_demand() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "m.ctf", &(0..50).map(|i| format!("{i} |a {i}\n")).collect::<String>());
    let opts = CtfOptions { chunk_size: 40, max_errors: 3, ..CtfOptions::default() };
    let r: Arc<dyn Deserializer> = Arc::new(CtfReader::open(&p, &schema(&[("a", true, 1, false)]), &opts).unwrap());
    assert!(r.load_order_matters());
    let s = MinibatchSource::new(r, MinibatchConfig { threads: Some(4), ..MinibatchConfig::default() }).unwrap();
    assert_eq!(s.loader_threads(), 0);
}

// ---------------------------------------------------------------------------------------------------------
// Truncated BPTT (READER.md §5.3). The Python model does not cover it: the expected minibatches come from
// the spec's description, run over the sequences a twin source without BPTT hands out one request at a
// time (global ∞, local 1: minibatch size 1).

/// A sequence held in a row of the model: key, length, end-of-sweep flag of its request, dense samples
/// per stream.
type Held = (u64, usize, bool, Vec<Vec<Vec<f64>>>);

/// One expected BPTT minibatch: (keys, fragment lengths, fragments, per stream the dense samples in
/// fragment order, end of sweep, end of run).
type Expected = (Vec<u64>, Vec<u32>, Vec<cntkio::source::Fragment>, Vec<Vec<Vec<f64>>>, bool, bool);

fn dense_samples(b: &Batch, st: usize, seq: usize) -> Vec<Vec<f64>> {
    let d = &b.data.streams[st];
    d.sequence_samples(seq)
        .map(|k| {
            let mut v = vec![0.0; d.dim];
            for i in d.sample_value_range(k) {
                match &d.layout {
                    Layout::Dense => v[i - k as usize * d.dim] = d.values.get_f64(i),
                    Layout::Sparse { indices, .. } => v[indices[i] as usize] = d.values.get_f64(i),
                }
            }
            v
        })
        .collect()
}

fn bptt_model(d: &Arc<dyn Deserializer>, conf: &MinibatchConfig, mb: u64, tau: u64, limit: usize) -> Vec<Expected> {
    let mut twin = MinibatchSource::new(d.clone(), MinibatchConfig { truncation_length: 0, ..conf.clone() }).unwrap();
    let p = (mb / tau).max(1);
    let w = u64::from(conf.workers);
    let rows = p / w + u64::from(u64::from(conf.rank) < p % w);
    let mut queues: Vec<std::collections::VecDeque<Held>> = vec![Default::default(); rows as usize];
    let mut cursors = vec![0usize; rows as usize];
    let mut done = false;
    let mut out = Vec::new();
    while out.len() < limit {
        for (q, &c) in queues.iter_mut().zip(&cursors) {
            while !done && q.iter().map(|h| h.1).sum::<usize>() - c <= tau as usize {
                match twin.next_minibatch(1).unwrap() {
                    Some(b) => {
                        for i in 0..b.num_sequences() {
                            let data: Vec<Vec<Vec<f64>>> =
                                (0..b.data.streams.len()).map(|st| dense_samples(&b, st, i)).collect();
                            q.push_back((b.data.keys.get(i), data[0].len(), b.end_of_sweep, data));
                        }
                        done |= b.end_of_run;
                    }
                    None => done = true,
                }
            }
        }
        if queues.iter().all(|q| q.is_empty()) {
            break;
        }
        let ns = d.streams().len();
        let (mut keys, mut lens, mut frags, mut data, mut eos) = (vec![], vec![], vec![], vec![vec![]; ns], false);
        for (r, (q, c)) in queues.iter_mut().zip(cursors.iter_mut()).enumerate() {
            let n = (tau as usize).min(q.iter().map(|h| h.1).sum::<usize>() - *c);
            let mut col = 0;
            while col < n {
                let (key, len, e, samples) = q.front().unwrap().clone();
                let take = (len - *c).min(n - col);
                keys.push(key);
                lens.push(take as u32);
                frags.push(cntkio::source::Fragment {
                    row: r as u32,
                    column: col as u64,
                    offset: *c as u64,
                    sequence_len: len as u64,
                });
                for st in 0..ns {
                    data[st].extend(samples[st][*c..*c + take].iter().cloned());
                }
                col += take;
                *c += take;
                if *c == len {
                    eos |= e;
                    q.pop_front();
                    *c = 0;
                }
            }
        }
        let eor = queues.iter().all(|q| q.is_empty());
        out.push((keys, lens, frags, data, eos, eor));
    }
    out
}

fn bptt_actual(b: &Batch) -> Expected {
    let ns = b.data.streams.len();
    let data =
        (0..ns).map(|st| (0..b.num_sequences()).flat_map(|i| dense_samples(b, st, i)).collect::<Vec<_>>()).collect();
    let l = b.bptt.as_ref().expect("a BPTT layout");
    (b.data.keys.to_vec(), b.data.num_samples.to_vec(), l.fragments.clone(), data, b.end_of_sweep, b.end_of_run)
}

#[test]
fn bptt_worked_example() {
    let dir = tempfile::tempdir().unwrap();
    // Sequences 0..4 of 3, 1, 2, 4 and 1 samples; M = 4, τ = 2: two rows.
    let text = "0 |a 1 |b 0:1\n0 |a 2 |b 1:1\n0 |a 3 |b 2:1\n1 |a 4 |b 0:1\n2 |a 5 |b 1:2\n2 |a 6 |b 2:2\n\
                3 |a 7 |b 0:3\n3 |a 8 |b 0:3\n3 |a 9 |b 0:3\n3 |a 10 |b 0:3\n4 |a 11 |b 1:4\n";
    let d = ctf(&write(dir.path(), "b.ctf", text), &[("a", true, 1, false), ("b", false, 3, false)], 1 << 20);
    let conf = MinibatchConfig { truncation_length: 2, ..cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(1)) };
    let mut s = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
    assert!(s.streams().iter().all(|st| st.format == StorageFormat::Dense));
    let bs = drain(&mut s, 4, 100);
    let f = |row, column, offset, sequence_len| cntkio::source::Fragment { row, column, offset, sequence_len };
    // Row 0 holds 0 then 3; row 1 holds 1, 2, then 4 (fetched by the request reaching the sweep's end).
    let want = [
        (vec![0, 1, 2], vec![f(0, 0, 0, 3), f(1, 0, 0, 1), f(1, 1, 0, 2)], false),
        (vec![0, 3, 2, 4], vec![f(0, 0, 2, 3), f(0, 1, 0, 4), f(1, 0, 1, 2), f(1, 1, 0, 1)], true),
        (vec![3], vec![f(0, 0, 1, 4)], false),
        (vec![3], vec![f(0, 0, 3, 4)], false),
    ];
    assert_eq!(bs.len(), want.len());
    for (b, (k, frags, eos)) in bs.iter().zip(&want) {
        assert_eq!(&b.data.keys, k);
        assert_eq!(&b.bptt.as_ref().unwrap().fragments, frags);
        assert_eq!(b.end_of_sweep, *eos);
        assert_eq!((b.bptt.as_ref().unwrap().rows, b.bptt.as_ref().unwrap().columns), (2, 2));
    }
    assert!(bs[3].end_of_run && !bs[2].end_of_run);
    assert_eq!(bs[1].data.streams[0].values, Values::F32(vec![3., 7., 6., 11.]));
    // Sparse streams are densified.
    assert_eq!(bs[0].data.streams[1].values, Values::F32(vec![1., 0., 0., 0., 1., 0., 1., 0., 0., 0., 2., 0.]));
    assert!(s.next_minibatch(4).unwrap().is_none());
    // CNTK's errors.
    let e = MinibatchSource::new(d.clone(), MinibatchConfig { frame_mode: true, ..conf.clone() }).unwrap_err();
    assert!(e.to_string().contains("truncation and frame mode are mutually exclusive"), "{e}");
    let mut w = MinibatchSource::new(d.clone(), MinibatchConfig { workers: 3, ..conf.clone() }).unwrap();
    assert!(w.next_minibatch(4).unwrap_err().to_string().contains("Too many workers"));
    let uneven = ctf(
        &write(dir.path(), "u.ctf", "0 |a 1 |b 0:1\n0 |a 2\n"),
        &[("a", true, 1, false), ("b", false, 3, false)],
        1 << 20,
    );
    let e = MinibatchSource::new(uneven, conf).unwrap().next_minibatch(4).unwrap_err();
    assert!(
        e.to_string().contains("For BPTT sequences between different input stream should have the same length"),
        "{e}"
    );
    assert_eq!((e.code(), e.category()), ("E0025", cntkio::Category::Format));
    assert!(matches!(
        e.kind(),
        cntkio::ErrorKind::UnequalStreamLengths { sequence: 0, stream, samples: 1, expected: 2 } if stream == "b"
    ));
}

/// Random files and options: BPTT minibatches as READER.md §5.3 describes them, restores from every
/// checkpoint continue exactly, and changing the minibatch size empties the rows.
#[test]
fn bptt_matches_the_spec_and_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0xb977);
    let streams = [("a", true, 2, false), ("b", false, 5, false)];
    let mut cases = 0;
    for i in 0..60 {
        let n = 1 + rng.below(30);
        let mut text = String::new();
        for id in 0..n {
            for _ in 0..1 + rng.below(6) {
                text += &format!("{id} |a {} {} |b {}:{}\n", rng.below(50), id, rng.below(5), 1 + rng.below(9));
            }
        }
        let path = write(dir.path(), &format!("t{i}.ctf"), &text);
        let d = ctf(&path, &streams, [30, 100, 1 << 20][rng.below(3) as usize]);
        let randomize = rng.below(3) != 0;
        let window =
            if rng.below(2) == 0 { Window::Chunks(1 + rng.below(4)) } else { Window::Samples(1 + rng.below(20)) };
        let run_length =
            if rng.below(3) == 0 { RunLength::Samples(1 + rng.below(60)) } else { RunLength::Sweeps(1 + rng.below(3)) };
        let tau = 1 + rng.below(5);
        let mb = 1 + rng.below(12);
        let p = (mb / tau).max(1);
        let workers = 1 + rng.below(p.min(3)) as u32;
        let conf = MinibatchConfig {
            workers,
            rank: rng.below(u64::from(workers)) as u32,
            truncation_length: tau,
            threads: Some(rng.below(3) as usize),
            ..cfg(randomize, window, rng.below(3), run_length)
        };
        let want = bptt_model(&d, &conf, mb, tau, 500);
        let mut s = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
        let got = drain(&mut s, mb, 500);
        let what = format!("case {i}: {conf:?} mb {mb}");
        assert_eq!(got.iter().map(bptt_actual).collect::<Vec<_>>(), want, "{what}");
        // Restore from every checkpoint, into fresh sources and in place.
        let mut first = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
        for at in 0..=got.len() {
            let state = cntkio::source::SourceState::from_json(&first.state().to_json()).unwrap();
            let mut r = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
            r.restore(&state).unwrap();
            assert!(drain(&mut r, mb, 500) == got[at..], "{what}: restored after {at}");
            if at < got.len() {
                assert!(first.next_minibatch(mb).unwrap().unwrap() == got[at], "{what}");
            }
        }
        cases += usize::from(!got.is_empty());
    }
    assert!(cases > 40, "{cases}");
}

/// A new minibatch size empties the rows (CNTK recreates its buffers); the sequences held are lost.
#[test]
fn bptt_new_minibatch_size_starts_new_rows() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..6).flat_map(|i| (0..3).map(move |j| format!("{i} |a {}\n", 10 * i + j))).collect();
    let d = ctf(&write(dir.path(), "r.ctf", &text), &[("a", true, 1, false)], 1 << 20);
    let conf = MinibatchConfig { truncation_length: 2, ..cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(1)) };
    let mut s = MinibatchSource::new(d, conf).unwrap();
    let b = s.next_minibatch(4).unwrap().unwrap();
    assert_eq!(b.data.keys, [0, 1]);
    let b = s.next_minibatch(2).unwrap().unwrap();
    // The rest of 0 and 1 is dropped with the rows; one row now, starting with the next sequence.
    assert_eq!((b.data.keys.to_vec(), b.bptt.as_ref().unwrap().rows), (vec![2], 1));
}

// ---------------------------------------------------------------------------------------------------------
// CNTK's reader tests (testdata/cntk, INDEX.md) through the V2 source. The control files were
// written by the legacy epoch loop; epoch e = [e·E, (e+1)·E) is a V2 run ending at (e+1)·E restored to
// e·E (the legacy epoch start seeks there, READER.md §4.5, §8.2). With one worker the legacy limits
// (global = local = M, no minibatch across a sweep end) give the same minibatches as V2's in every case
// below: none has a minibatch crossing a sweep end inside an epoch. At most 10 minibatches per epoch are
// written, each stream time-major over CNTK's first-fit layout, values as `%g`.

fn conformance_data(dir: &str, name: &str) -> PathBuf {
    common::testdata::cntk_dir().join("Data").join(dir).join(name)
}

/// A conformance stream: (name, alias, dense, dim, definesMBSize).
type CS = (&'static str, &'static str, bool, usize, bool);

fn conformance_ctf(file: &str, streams: &[CS], double: bool, chunk: u64, skip_ids: bool) -> Arc<dyn Deserializer> {
    let t = if double { cntkio::ElementType::F64 } else { cntkio::ElementType::F32 };
    let schema = Schema::new(
        streams
            .iter()
            .map(|&(n, a, dense, dim, mb)| {
                StreamSpec::new(n, dim, if dense { StorageFormat::Dense } else { StorageFormat::Sparse })
                    .alias(a)
                    .element_type(t)
                    .defines_mb_size(mb)
            })
            .collect(),
    )
    .unwrap();
    let opts = CtfOptions { chunk_size: chunk, skip_sequence_ids: skip_ids, ..CtfOptions::default() };
    Arc::new(CtfReader::open(conformance_data("CNTKTextFormatReader", file), &schema, &opts).unwrap())
}

/// Appends one minibatch as the test helper writes it.
fn write_packed(b: &Batch, streams: &[StreamSpec], names: &[&str], out: &mut Vec<String>) {
    for name in names {
        let si = streams.iter().position(|s| s.name == *name).unwrap_or_else(|| panic!("no stream {name}"));
        let d = &b.data.streams[si];
        let lens: Vec<u64> = (0..d.num_sequences()).map(|i| d.sequence_len(i)).collect();
        let (width, rows, place) = common::layout_packed(&lens);
        let mut cell = std::collections::HashMap::new();
        for (q, &(row, t0)) in place.iter().enumerate() {
            for t in 0..lens[q] {
                cell.insert((t0 + t, row), (q, t));
            }
        }
        for t in 0..width {
            for row in 0..rows {
                let Some(&(q, k)) = cell.get(&(t, row)) else { continue };
                let v = &dense_samples(b, si, q)[k as usize];
                out.push(v.iter().map(|&x| common::fmt_g(x)).collect::<Vec<_>>().join(" "));
            }
        }
    }
}

/// The legacy epoch loop over V2 sources: `window` in chunks (None: no randomization), seed 0.
fn v2_epochs(
    d: &Arc<dyn Deserializer>,
    names: &[&str],
    epoch_size: u64,
    mb: u64,
    epochs: u64,
    window: Option<u64>,
) -> Result<Vec<String>, cntkio::Error> {
    let mut out = Vec::new();
    for e in 0..epochs {
        let conf = MinibatchConfig {
            randomize: window.is_some(),
            window: Window::Chunks(window.unwrap_or(0)),
            run_length: RunLength::Samples((e + 1) * epoch_size),
            cntk_restore_quirk: true,
            ..MinibatchConfig::default()
        };
        let mut s = MinibatchSource::new(d.clone(), conf)?;
        if e > 0 {
            let state = cntkio::source::SourceState {
                version: 1,
                position: e * epoch_size,
                minibatches: 0,
                sweep_size: s.sweep_size(),
                bptt: None,
            };
            s.restore(&state)?;
        }
        for _ in 0..10 {
            let Some(b) = s.next_minibatch(mb)? else { break };
            write_packed(&b, s.streams(), names, &mut out);
            if b.end_of_run {
                break;
            }
        }
    }
    Ok(out)
}

fn check_control(name: &str, got: Result<Vec<String>, cntkio::Error>, control: &str) {
    let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = common::testdata::read_to_string(
        &common::testdata::cntk_dir().join("Control/CNTKTextFormatReader").join(control),
    );
    let want: Vec<&str> = text.split_whitespace().collect();
    let joined = got.join(" ");
    let got: Vec<&str> = joined.split_whitespace().collect();
    assert!(!want.is_empty(), "{name}");
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{name}: differs from {control} at token {at} ({} vs {} tokens)", got.len(), want.len());
    }
}

#[test]
fn cntk_reader_control_files_through_the_v2_source() {
    const M32: u64 = 32 << 20;
    let w = |chunk: u64| Some((1u64 << 32) / chunk);
    for dmb in [false, true] {
        let c = |f: &str, st: &[CS], double: bool, chunk: u64| conformance_ctf(f, st, double, chunk, false);
        let t = |n: &str| format!("{n}[defMBSize={dmb}]");
        let st: &[CS] = &[("features", "F", true, 2, dmb), ("labels", "L", true, 2, false)];
        let d = c("Simple_dense.txt", st, false, M32);
        check_control(
            &t("Simple_dense"),
            v2_epochs(&d, &["features", "labels"], 1000, 250, 10, None),
            "Simple_dense.txt",
        );
        check_control(
            &t("Simple_dense_single_stream"),
            v2_epochs(&d, &["features"], 1000, 250, 10, None),
            "Simple_dense_single_stream.txt",
        );
        let st: &[CS] = &[("features", "F", true, 784, false), ("labels", "L", true, 10, dmb)];
        let d = c("MNIST_dense.txt", st, true, 10000);
        check_control(
            &t("MNIST_dense"),
            v2_epochs(&d, &["features", "labels"], 1000, 1000, 1, None),
            "MNIST_dense.txt",
        );
        let st: &[CS] = &[("features", "F", true, 10000, dmb)];
        let d = c("1x1_dense.txt", st, true, M32);
        check_control(&t("1x1_1_dense"), v2_epochs(&d, &["features"], 1, 1, 1, w(M32)), "1x1_1_dense.txt");
        check_control(&t("1x1_2_dense"), v2_epochs(&d, &["features"], 2, 1, 3, w(M32)), "1x1_2_dense.txt");
        let st: &[CS] = &[("features", "F0", true, 10, dmb)];
        let d = c("1x10_dense.txt", st, false, M32);
        check_control(&t("1x10_dense"), v2_epochs(&d, &["features"], 10, 10, 1, w(M32)), "1x10_dense.txt");
        let st: &[CS] = &[
            ("features1", "F1", true, 1, dmb),
            ("features2", "F2", true, 10, false),
            ("features3", "F3", true, 100, false),
            ("features4", "F4", true, 1000, false),
            ("labels1", "L1", true, 1, false),
            ("labels2", "L2", true, 10, false),
            ("labels3", "L3", true, 100, false),
        ];
        let names = ["features1", "features2", "features3", "features4", "labels1", "labels2", "labels3"];
        let d = c("10x1_MI_dense.txt", st, false, 50000);
        check_control(&t("10x1_MI_2_dense"), v2_epochs(&d, &names, 7, 3, 3, w(50000)), "10x1_MI_2_dense.txt");
        check_control(&t("1x10_MI_1_dense"), v2_epochs(&d, &names, 10, 1, 3, w(50000)), "10x1_MI_1_dense.txt");
        let st: &[CS] = &[("features", "F0", true, 5, dmb)];
        let d = c("10x10_dense.txt", st, false, M32);
        check_control(&t("10x10_dense"), v2_epochs(&d, &["features"], 100, 100, 1, None), "10x10_dense.txt");
        let st: &[CS] = &[("features", "F", true, 100, false), ("labels", "L", true, 100, dmb)];
        let d = c("100x1_dense.txt", st, true, 10000);
        let fl = ["features", "labels"];
        check_control(&t("100x1_1_dense"), v2_epochs(&d, &fl, 10, 1, 10, w(10000)), "100x1_1_dense.txt");
        check_control(&t("100x1_2_dense"), v2_epochs(&d, &fl, 5, 3, 4, w(10000)), "100x1_2_dense.txt");
        let st: &[CS] = &[("features", "F0", true, 3, dmb)];
        let d = c("50x20_jagged_sequences_dense.txt", st, true, M32);
        check_control(
            &t("50x20_jagged_sequences_dense"),
            v2_epochs(&d, &["features"], 508, 508, 1, None),
            "50x20_jagged_sequences_dense.txt",
        );
        for (file, dim, double, es, window) in [
            ("1x1_sparse.txt", 10000, false, 1, w(M32)),
            ("1x2_sparse.txt", 1000, false, 2, w(M32)),
            ("1x10_sparse.txt", 100, true, 10, w(M32)),
            ("10x10_sparse.txt", 100, true, 100, None),
        ] {
            let d = c(file, &[("features", "F0", false, dim, dmb)], double, M32);
            check_control(&t(file), v2_epochs(&d, &["features"], es, es, 1, window), file);
        }
        let st: &[CS] = &[
            ("features1", "F0", false, 2, dmb),
            ("features2", "F1", false, 20, false),
            ("features3", "F2", false, 200, false),
        ];
        let f3 = ["features1", "features2", "features3"];
        let d = c("3x5_MI_sparse.txt", st, false, M32);
        check_control(&t("3x5_MI_sparse"), v2_epochs(&d, &f3, 15, 15, 1, None), "3x5_MI_sparse.txt");
        let d = c("20x10_MI_jagged_samples_sparse.txt", st, false, M32);
        check_control(
            &t("20x10_MI_jagged_samples_sparse"),
            v2_epochs(&d, &f3, 200, 200, 1, None),
            "20x10_MI_jagged_samples_sparse.txt",
        );
        let st: &[CS] = &[
            ("features1", "F1", true, 15, dmb),
            ("features2", "F2", true, 12, false),
            ("features3", "F3", true, 1, false),
        ];
        let d = c("space_separated.txt", st, true, M32);
        check_control(&t("space_separated"), v2_epochs(&d, &f3, 2, 2, 1, w(M32)), "space_separated.txt");
        let st: &[CS] = &[("features", "features", true, 1, dmb)];
        let d = c("missing_trailing_newline.txt", st, true, M32);
        check_control(
            &t("missing_trailing_newline"),
            v2_epochs(&d, &["features"], 2, 2, 1, w(M32)),
            "missing_trailing_newline.txt",
        );
        if dmb {
            let d = conformance_ctf("contains_blank_lines.txt", st, true, M32, true);
            check_control(&t("blank_lines"), v2_epochs(&d, &["features"], 2, 2, 1, w(M32)), "blank_lines.txt");
        }
        let st: &[CS] = &[("features", "F0", true, 10, dmb), ("labels", "F1", false, 10, false)];
        let d = c("empty_samples.txt", st, false, M32);
        check_control(&t("empty_samples"), v2_epochs(&d, &fl, 6, 6, 1, None), "empty_samples.txt");
        let st: &[CS] = &[("features", "F0", false, 100, dmb), ("labels", "F1", true, 3, false)];
        let d = c("ref_data_with_escape_sequences.txt", st, false, M32);
        check_control(
            &t("ref_data_with_escape_sequences"),
            v2_epochs(&d, &fl, 9, 9, 1, None),
            "ref_data_with_escape_sequences.txt",
        );
    }
    let d = conformance_ctf(
        "50x20_jagged_sequences_sparse.txt",
        &[("features", "F0", false, 100, false)],
        false,
        M32,
        false,
    );
    check_control(
        "50x20_jagged_sequences_sparse",
        v2_epochs(&d, &["features"], 564, 564, 1, None),
        "50x20_jagged_sequences_sparse.txt",
    );
    let d = conformance_ctf("100x100_jagged_sparse.txt", &[("features", "F0", false, 20, false)], false, M32, false);
    check_control(
        "100x100_jagged_sparse",
        v2_epochs(&d, &["features"], 4887, 4887, 1, None),
        "100x100_jagged_sparse.txt",
    );
    // The CBF reader tests compare with the CTF control files.
    for (file, names, es, mb, ep, control) in [
        ("Simple_dense.bin", &["features", "labels"][..], 1000, 250, 10, "Simple_dense.txt"),
        ("10x10_dense.bin", &["features"][..], 100, 100, 1, "10x10_dense.txt"),
        ("50x20_jagged_sequences_dense.bin", &["features"][..], 508, 508, 1, "50x20_jagged_sequences_dense.txt"),
        ("10x10_sparse.bin", &["features"][..], 100, 100, 1, "10x10_sparse.txt"),
        ("50x20_jagged_sequences_sparse.bin", &["features"][..], 564, 564, 1, "50x20_jagged_sequences_sparse.txt"),
    ] {
        for mmap in [false, true] {
            let p = conformance_data("CNTKBinaryReader", file);
            let d: Arc<dyn Deserializer> =
                Arc::new(CbfSource::open_with(&p, &cntkio::cbf::CbfOptions::default().mmap(mmap)).unwrap());
            check_control(&format!("{file} mmap {mmap}"), v2_epochs(&d, names, es, mb, ep, None), control);
        }
    }
    // CNTKTextFormatReaderNoFirstMinibatchData: one chunk, worker 1 of 2 gets nothing.
    let d = conformance_ctf("1x2_dense.txt", &[("features", "F0", true, 100, false)], true, M32, false);
    let conf = MinibatchConfig { workers: 2, rank: 1, ..MinibatchConfig::default() };
    assert!(MinibatchSource::new(d, conf).unwrap().next_minibatch(1).unwrap().is_none());
    // The composite test: one file equals two files joined by key (V2: the composite reader's local
    // timeline).
    let st: &[CS] = &[("features1", "F0", true, 10, false), ("features2", "F1", true, 5, false)];
    let one = conformance_ctf("5x10_and_5x5_jagged.txt", st, true, M32, false);
    let two: Arc<dyn Deserializer> = Arc::new(
        cntkio::source::Composite::new(vec![
            conformance_ctf("5x10_jagged.txt", &st[..1], true, M32, false),
            conformance_ctf("5x5_jagged.txt", &st[1..], true, M32, false),
        ])
        .unwrap(),
    );
    for (es, mb) in [(40, 10), (413, 21)] {
        let a = v2_epochs(&one, &["features1", "features2"], es, mb, 3, w(M32)).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a, v2_epochs(&two, &["features1", "features2"], es, mb, 3, w(M32)).unwrap(), "mb {mb}");
    }
}

// ---------------------------------------------------------------------------------------------------------
// The behaviours of CNTK 2.7's Python io tests (`cntk/io/tests/io_tests.py` in the cntk 2.7 wheel, listed
// in testdata/cntk/INDEX.md), on their small inline inputs.

const MBDATA_DENSE_1: &str = "0  |S0 0   |S1 0\n0   |S0 1   |S1 1\n0   |S0 2\n0   |S0 3   |S1 3\n1   |S0 4\n\
                              1   |S0 5   |S1 1\n1   |S0 6   |S1 2\n";
const MBDATA_DENSE_2: &str = "0  |S0 0   |S1 0\n0   |S0 1   |S1 1\n0   |S0 2\n0   |S0 3   |S1 3\n0   |S0 4\n\
                              0   |S0 5   |S1 1\n0   |S0 6   |S1 2\n";
const MBDATA_SPARSE: &str = "0\t|x 560:1\t|y 1 0 0 0 0\n0\t|x 0:1\n0\t|x 0:1\n1\t|x 560:1\t|y 0 1 0 0 0\n\
                             1\t|x 0:1\n1\t|x 0:1\n1\t|x 424:1\n";
const MBDATA_SPARSE1: &str = "0\t|x 560:1\n0\t|x 0:1\n0\t|x 0:1\n1\t|x 560:1\n1\t|x 0:1\n1\t|x 0:1\n1\t|x 424:1\n";
const MBDATA_SPARSE2: &str = "0\t|y 1 0 0 0 0\n1\t|y 0 1 0 0 0\n";

/// `features` = alias `x` (sparse, 1000) and `labels` = alias `y` (dense, 5), or the S0/S1 pair.
fn io_ctf(dir: &Path, name: &str, text: &str, streams: &[(&str, &str, bool, usize, bool)]) -> Arc<dyn Deserializer> {
    let schema = Schema::new(
        streams
            .iter()
            .map(|&(n, a, sparse, dim, mb)| {
                StreamSpec::new(n, dim, if sparse { StorageFormat::Sparse } else { StorageFormat::Dense })
                    .alias(a)
                    .defines_mb_size(mb)
            })
            .collect(),
    )
    .unwrap();
    Arc::new(CtfReader::open(write(dir, name, text), &schema, &CtfOptions::default()).unwrap())
}

/// The four-line file of the io tests' `create_temp_file` (rows without ids, no final newline).
fn io_four(dir: &Path) -> Arc<dyn Deserializer> {
    io_ctf(dir, "mbtest.txt", "|S0 1\n|S0 2\n|S0 3\n|S0 4", &[("features", "S0", false, 1, false)])
}

fn stream_samples(b: &Batch, name: &str, s: &MinibatchSource) -> u64 {
    let i = s.streams().iter().position(|st| st.name == name).unwrap();
    b.data.streams[i].num_samples()
}

#[test]
fn io_text_format_and_minibatch_defined_by_labels() {
    let dir = tempfile::tempdir().unwrap();
    let xy = |mb| vec![("features", "x", true, 1000, false), ("labels", "y", false, 5, mb)];
    let off = MinibatchConfig { randomize: false, ..MinibatchConfig::default() };
    // test_text_format: size counts the longest stream; the labels stream has one sample per sequence.
    let mut s = MinibatchSource::new(io_ctf(dir.path(), "a.txt", MBDATA_SPARSE, &xy(false)), off.clone()).unwrap();
    let b = s.next_minibatch(7).unwrap().unwrap();
    assert_eq!((b.num_sequences(), b.end_of_sweep), (2, true));
    assert_eq!((stream_samples(&b, "features", &s), stream_samples(&b, "labels", &s)), (7, 2));
    let longest = (0..2).map(|i| b.data.streams[0].sequence_len(i)).max();
    assert_eq!(longest, Some(4));
    let labels: Vec<Vec<Vec<f64>>> = (0..2).map(|i| dense_samples(&b, 1, i)).collect();
    assert_eq!(labels, [vec![vec![1., 0., 0., 0., 0.]], vec![vec![0., 1., 0., 0., 0.]]]);
    let b = s.next_minibatch(1).unwrap().unwrap();
    assert!(!b.end_of_sweep && stream_samples(&b, "features", &s) < 7 && stream_samples(&b, "labels", &s) == 1);
    // test_minibatch_defined_by_labels: one file, and the two files joined by key.
    let one = io_ctf(dir.path(), "b.txt", MBDATA_SPARSE, &xy(true));
    let two: Arc<dyn Deserializer> = Arc::new(
        cntkio::source::Composite::new(vec![
            io_ctf(dir.path(), "1", MBDATA_SPARSE1, &xy(false)[..1]),
            io_ctf(dir.path(), "2", MBDATA_SPARSE2, &xy(true)[1..]),
        ])
        .unwrap(),
    );
    for d in [one, two] {
        let mut s = MinibatchSource::new(d, off.clone()).unwrap();
        let b = s.next_minibatch(2).unwrap().unwrap();
        assert_eq!((b.num_sequences(), b.end_of_sweep), (2, true));
        assert_eq!((stream_samples(&b, "features", &s), stream_samples(&b, "labels", &s)), (7, 2));
        assert_eq!(dense_samples(&b, 1, 1), [vec![0., 1., 0., 0., 0.]]);
        let b = s.next_minibatch(3).unwrap().unwrap();
        assert_eq!((stream_samples(&b, "features", &s), stream_samples(&b, "labels", &s)), (10, 3));
    }
}

#[test]
fn io_full_sweep_and_large_minibatches() {
    let dir = tempfile::tempdir().unwrap();
    let s01 = [("features", "S0", false, 1, false), ("labels", "S1", false, 1, false)];
    // test_full_sweep_minibatch: window of 0 chunks (no randomization), one sweep.
    let d = io_ctf(dir.path(), "d1.txt", MBDATA_DENSE_1, &s01);
    let conf =
        MinibatchConfig { window: Window::Chunks(0), run_length: RunLength::Sweeps(1), ..MinibatchConfig::default() };
    let mut s = MinibatchSource::new(d, conf).unwrap();
    let b = s.next_minibatch(1000).unwrap().unwrap();
    assert_eq!((b.num_sequences(), b.end_of_sweep), (2, true));
    let seqs = |st: usize| (0..2).map(|i| dense_samples(&b, st, i).concat()).collect::<Vec<_>>();
    assert_eq!(seqs(0), [vec![0., 1., 2., 3.], vec![4., 5., 6.]]);
    assert_eq!(seqs(1), [vec![0., 1., 3.], vec![1., 2.]]);
    assert!(s.next_minibatch(1000).unwrap().is_none());
    // test_large_minibatch: one 7-row sequence (5 rows with labels), repeated forever; a minibatch of
    // 1000 samples takes 142 whole sequences across sweeps.
    let d = io_ctf(dir.path(), "d2.txt", MBDATA_DENSE_2, &s01);
    let mut s =
        MinibatchSource::new(d, MinibatchConfig { window: Window::Chunks(0), ..MinibatchConfig::default() }).unwrap();
    let b = s.next_minibatch(1000).unwrap().unwrap();
    assert!(b.end_of_sweep);
    assert_eq!(b.num_sequences(), 1000 / 7);
    assert_eq!(
        (stream_samples(&b, "features", &s), stream_samples(&b, "labels", &s)),
        (1000 - 1000 % 7, 5 * (1000 / 7))
    );
}

#[test]
fn io_max_samples_sweeps_and_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let d = io_four(dir.path());
    let run = |run_length: RunLength, sizes: &[u64]| -> Vec<Option<(u64, bool)>> {
        let mut s =
            MinibatchSource::new(d.clone(), MinibatchConfig { run_length, ..MinibatchConfig::default() }).unwrap();
        sizes
            .iter()
            .map(|&m| s.next_minibatch(m).unwrap().map(|b| (b.num_declared_samples(), b.end_of_sweep)))
            .collect()
    };
    // test_max_samples
    assert_eq!(run(RunLength::Samples(1), &[10, 10]), [Some((1, false)), None]);
    // test_max_sweeps: 3 sweeps of 4 samples.
    assert_eq!(run(RunLength::Sweeps(3), &[5, 5, 5, 1]), [Some((5, true)), Some((5, true)), Some((2, true)), None]);
    // test_max_samples_over_several_sweeps
    assert_eq!(run(RunLength::Samples(11), &[5, 5, 5, 1]), [Some((5, true)), Some((5, true)), Some((1, false)), None]);
    // test_one_sweep: max_sweeps=1, max_samples=FULL_DATA_SWEEP (INFINITELY_REPEAT is no limit).
    use cntkio::source::{FULL_DATA_SWEEP, INFINITELY_REPEAT};
    for r in [RunLength::Sweeps(1), RunLength::Samples(FULL_DATA_SWEEP)] {
        assert_eq!(run(r, &[100, 100]), [Some((4, true)), None], "{r:?}");
    }
    assert_eq!(run(RunLength::Samples(INFINITELY_REPEAT), &[100]), run(RunLength::Infinite, &[100]));
    // test_random_seed: seed 0 is the default; sweep k is shuffled with seed + k, so a source seeded 0
    // continues after its first sweep as a source seeded 1 starts.
    let values = |seed: u64| -> Vec<f64> {
        let conf = MinibatchConfig { seed, ..MinibatchConfig::default() };
        let b = MinibatchSource::new(d.clone(), conf).unwrap().next_minibatch(100).unwrap().unwrap();
        (0..b.num_sequences()).flat_map(|i| dense_samples(&b, 0, i).concat()).collect()
    };
    let (d0, d123, d1) = (values(0), values(123), values(1));
    assert_eq!(d0.len(), 100);
    assert_ne!(d0, d123);
    assert_eq!(d0, values(MinibatchConfig::default().seed));
    assert_eq!(d0[4..], d1[..96]);
}

#[test]
fn io_compare_cbf_and_ctf() {
    let dir = tempfile::tempdir().unwrap();
    let s01 = vec![("features", "S0", false, 1, false), ("labels", "S1", false, 1, false)];
    let xy = vec![("features", "x", true, 1000, false), ("labels", "y", false, 5, false)];
    for (i, (text, streams)) in [
        (MBDATA_DENSE_1, s01.clone()),
        (MBDATA_DENSE_2, s01),
        (MBDATA_SPARSE, xy.clone()),
        (MBDATA_SPARSE1, xy[..1].to_vec()),
        (MBDATA_SPARSE2, xy[1..].to_vec()),
    ]
    .into_iter()
    .enumerate()
    {
        let c = io_ctf(dir.path(), &format!("c{i}.txt"), text, &streams);
        // As ctf2bin.py writes it (one chunk, meta count = the longest stream).
        let schema = Schema::new(c.streams().to_vec()).unwrap();
        let data = cntkio_core::ctf::parse::parse_bytes(
            text.as_bytes(),
            &schema,
            false,
            &mut cntkio_core::ctf::parse::FailFast,
        )
        .unwrap();
        let bin = dir.path().join(format!("c{i}.bin"));
        let mut w = CbfWriter::create(&bin, &schema, 32 << 20).unwrap();
        w.write(&data).unwrap();
        w.finish().unwrap();
        let b: Arc<dyn Deserializer> = Arc::new(CbfSource::open(&bin).unwrap());
        for randomize in [false, true] {
            for (mbs, size) in [(1, 1), (1, 10), (3, 100), (10, 2)] {
                let conf = MinibatchConfig { randomize, ..MinibatchConfig::default() };
                let x = drain(&mut MinibatchSource::new(c.clone(), conf.clone()).unwrap(), size, mbs);
                let y = drain(&mut MinibatchSource::new(b.clone(), conf).unwrap(), size, mbs);
                assert_eq!(x.len(), mbs);
                for (p, q) in x.iter().zip(&y) {
                    assert_eq!(p.data.streams, q.data.streams, "input {i}");
                    assert_eq!((p.num_sequences(), p.end_of_sweep), (q.num_sequences(), q.end_of_sweep));
                }
            }
        }
    }
}

/// Minibatches planned ahead on a thread (once a size is asked for twice in a row) are those of the same
/// calls made one by one: sizes that change (the plans made ahead are dropped and the position moves back),
/// checkpoints taken while plans are queued (restored into a source that plans nothing ahead), restores,
/// and the end of the run.
#[test]
fn planning_ahead_never_changes_a_minibatch() {
    let dir = tempfile::tempdir().unwrap();
    let (c, read, _) = shards(dir.path(), 300);
    let mut rng = Rng(7);
    let mut total_ahead = 0;
    for case in 0..40u64 {
        let d = if case % 2 == 0 { &c } else { &read };
        let (window, randomize) = match case % 4 {
            0 => (Window::Chunks(2), true),
            1 => (Window::Chunks(128), true),
            2 => (Window::Samples(50), true),
            _ => (Window::Chunks(128), false),
        };
        let (workers, rank) = if case % 5 == 4 { (3, (case % 3) as u32) } else { (1, 0) };
        let base = MinibatchConfig {
            workers,
            rank,
            ..cfg(randomize, window, case, if case % 3 == 0 { RunLength::Samples(1500) } else { RunLength::Sweeps(3) })
        };
        let inline = MinibatchConfig { threads: Some(0), ..base.clone() };
        let ahead = MinibatchConfig { threads: Some(2), ..base.clone() };
        // Runs of equal sizes, some long enough to plan far ahead, some of one call.
        let mut sizes = Vec::new();
        while sizes.len() < 400 {
            let size = [1, 7, 17, 64, 300][rng.below(5) as usize];
            let run = [1, 2, 3, 40][rng.below(4) as usize];
            sizes.extend(std::iter::repeat_n(size, run as usize));
        }
        let mut want = MinibatchSource::new(d.clone(), inline.clone()).unwrap();
        let mut got = MinibatchSource::new(d.clone(), ahead.clone()).unwrap();
        let mut restored_from = None;
        let mut planned_ahead = 0;
        for (i, &size) in sizes.iter().enumerate() {
            let what = format!("case {case}, call {i}, size {size}");
            if i % 37 == 20 {
                // A checkpoint taken while plans may be queued: the same as one-by-one, and a source that
                // plans nothing ahead continues from it as the planning one does.
                let state = got.state();
                assert_eq!(state, want.state(), "{what}");
                let mut r = MinibatchSource::new(d.clone(), inline.clone()).unwrap();
                r.restore(&state).unwrap();
                restored_from = Some(r);
            }
            if i % 91 == 90 {
                // Restore the planning source to an earlier point of the other one's run.
                let state = want.state();
                got.restore(&state).unwrap();
            }
            let a = want.next_minibatch(size).unwrap();
            let b = got.next_minibatch(size).unwrap();
            assert!(a == b, "{what}: {:?} vs {:?}", a.as_ref().map(|b| &b.data.keys), b.as_ref().map(|b| &b.data.keys));
            if let Some(r) = restored_from.as_mut() {
                assert!(r.next_minibatch(size).unwrap() == a, "{what}: restored");
            }
            assert_eq!(got.minibatches(), want.minibatches(), "{what}");
            assert!(!want.plans_ahead());
            planned_ahead += usize::from(got.plans_ahead());
            if a.is_none() {
                break;
            }
        }
        assert!(planned_ahead > 0, "case {case}: never planned ahead");
        total_ahead += planned_ahead;
    }
    assert!(total_ahead > 500, "planned ahead at {total_ahead} calls");
}

/// Balanced dealing (`balanced_workers`, not in CNTK): worker `r` of `W` gets exactly the sequences at
/// indices `t ≡ r (mod W)` of the single worker's randomized order, so workers are disjoint, cover the
/// data and differ by at most one sequence per sweep, also with fewer chunks than workers; a restore
/// continues exactly.
#[test]
fn balanced_workers_split_the_order_evenly() {
    let dir = tempfile::tempdir().unwrap();
    let (c, read, _) = shards(dir.path(), 200);
    let few = twenty(dir.path());
    assert!(few.chunks().len() < 8, "{}", few.chunks().len());
    for (d, window) in [(&c, Window::Chunks(3)), (&read, Window::Samples(40)), (&few, Window::Chunks(128))] {
        for seed in [0, 3] {
            let one = MinibatchConfig { balanced_workers: true, ..cfg(true, window, seed, RunLength::Sweeps(1)) };
            let order: Vec<u64> =
                drain(&mut MinibatchSource::new(d.clone(), one.clone()).unwrap(), 10, usize::MAX).concat_keys();
            assert_eq!(order.len() as u64, d.chunks().iter().map(|c| u64::from(c.num_sequences)).sum::<u64>());
            for workers in [2u32, 3, 8] {
                let mut sizes = Vec::new();
                for rank in 0..workers {
                    let conf = MinibatchConfig { workers, rank, ..one.clone() };
                    for mb in [1, 7, 64] {
                        let got = drain(&mut MinibatchSource::new(d.clone(), conf.clone()).unwrap(), mb, usize::MAX)
                            .concat_keys();
                        let want: Vec<u64> =
                            order.iter().skip(rank as usize).step_by(workers as usize).copied().collect();
                        assert_eq!(got, want, "{window:?} seed {seed} worker {rank}/{workers} mb {mb}");
                        sizes.push(got.len());
                    }
                }
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "{sizes:?}");
                // Restore half way through three sweeps.
                let conf =
                    MinibatchConfig { workers, rank: workers - 1, run_length: RunLength::Sweeps(3), ..one.clone() };
                let all = drain(&mut MinibatchSource::new(d.clone(), conf.clone()).unwrap(), 9, usize::MAX);
                let mut first = MinibatchSource::new(d.clone(), conf.clone()).unwrap();
                drain(&mut first, 9, all.len() / 2);
                let mut second = MinibatchSource::new(d.clone(), conf).unwrap();
                second.restore(&first.state()).unwrap();
                assert!(drain(&mut second, 9, usize::MAX) == all[all.len() / 2..], "{window:?} restored");
            }
        }
    }
}

trait ConcatKeys {
    fn concat_keys(&self) -> Vec<u64>;
}

impl ConcatKeys for Vec<Batch> {
    fn concat_keys(&self) -> Vec<u64> {
        self.iter().flat_map(|b| b.data.keys.iter()).collect()
    }
}

/// Truncated BPTT delivers every stream dense: a sparse stream's dimension times the samples of a minibatch,
/// or of one sequence held for it, beyond `2^30` values is an error before anything that size is allocated.
#[test]
fn truncated_bptt_refuses_dense_minibatches_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    // A sequence of 16 samples, then one of 2.
    let mut text = (0..16).map(|i| format!("0 |s {i}:1\n")).collect::<String>();
    text += "1 |s 1:1\n1 |s 2:1\n";
    let p = write(dir.path(), "big.ctf", &text);
    let run = |dim: usize, size: u64| {
        let d = ctf(&p, &[("s", false, dim, false)], 1 << 20);
        let conf = MinibatchConfig { truncation_length: 4, ..cfg(false, Window::Chunks(128), 0, RunLength::Sweeps(1)) };
        let mut s = MinibatchSource::new(d, conf).unwrap();
        let mut n = 0;
        loop {
            match s.next_minibatch(size) {
                Ok(Some(_)) => n += 1,
                Ok(None) => return Ok(n),
                Err(e) => return Err((n, e)),
            }
        }
    };
    // 8 samples of dim 2^28: 2^31 values a minibatch.
    let (n, e) = run(1 << 28, 8).unwrap_err();
    assert_eq!((n, e.code()), (0, "E3002"), "{e}");
    assert!(e.to_string().contains("a minibatch of 8 samples × 268435456 values a sample"), "{e}");
    // 4 samples of dim 2^27 a minibatch (2^29 values) pass, but the 16-sample sequence held whole does not.
    let (n, e) = run(1 << 27, 4).unwrap_err();
    assert_eq!((n, e.code()), (0, "E3002"), "{e}");
    assert!(e.to_string().contains("sequence 0 of 16 samples × 134217728 values a sample"), "{e}");
    // Within the limit, the same data reads.
    assert!(run(1 << 10, 4).unwrap() > 0);
}
