//! CNTK's own CTF reader tests (`testdata/cntk`, see its INDEX.md): every control file is
//! regenerated from cntkio's reader with CNTK's test harness semantics and compared token by token.

mod common;

use cntkio::randomize::{
    BlockRandomizer, ChunkInfo, EpochConfig, NoRandomizer, Pick, SequenceEnumerator, SequenceInfo, SequenceSource,
    Window,
};
use cntkio::{ChunkData, CtfOptions, CtfReader, Error, ErrorKind, Layout, Schema, StorageFormat, StreamSpec};
use common::testdata::{cntk_dir, real_dir};
use common::{fmt_g, layout_packed};
use std::path::PathBuf;
use std::sync::Arc;

fn data(name: &str) -> PathBuf {
    cntk_dir().join("Data/CNTKTextFormatReader").join(name)
}
fn control(name: &str) -> String {
    common::testdata::read_to_string(&cntk_dir().join("Control/CNTKTextFormatReader").join(name))
}

/// A stream of a test: (name, alias, dense, dim, definesMBSize).
type S = (&'static str, &'static str, bool, usize, bool);

fn schema(streams: &[S], double: bool) -> Schema {
    Schema::new(
        streams
            .iter()
            .map(|&(n, a, dense, dim, mb)| {
                StreamSpec::new(n, dim, if dense { StorageFormat::Dense } else { StorageFormat::Sparse })
                    .alias(a)
                    .element_type(if double { cntkio::ElementType::F64 } else { cntkio::ElementType::F32 })
                    .defines_mb_size(mb)
            })
            .collect(),
    )
    .expect("a valid schema")
}

/// Something that hands out chunks of parsed data with a sequence list (a CTF reader or a join of two).
trait Deser: SequenceSource {
    fn schema(&self) -> Schema;
    /// Per sequence of the chunk, per schema stream: (chunk data, sequence index in it).
    fn stream_of(&self, chunk: u32, seq: u32, stream: usize) -> Result<(Arc<ChunkData>, usize, usize), Error>;
}

impl Deser for CtfReader {
    fn schema(&self) -> Schema {
        CtfReader::schema(self).clone()
    }
    fn stream_of(&self, chunk: u32, seq: u32, stream: usize) -> Result<(Arc<ChunkData>, usize, usize), Error> {
        Ok((self.load_chunk(chunk as usize)?, seq as usize, stream))
    }
}

/// (index in the primary chunk, secondary chunk, index there, length, key).
type Joined = (u32, u32, u32, u32, u64);

/// CNTK's composite reader in the test: a primary and a secondary deserializer joined by sequence key.
struct Join {
    a: CtfReader,
    b: CtfReader,
    chunks: Vec<ChunkInfo>,
    /// Per primary chunk: (index in the primary chunk, secondary chunk, index there, length, key).
    map: Vec<Vec<Joined>>,
}

impl Join {
    fn new(a: CtfReader, b: CtfReader) -> Join {
        let mut where_b = std::collections::HashMap::new();
        for (ci, c) in b.index().chunks.iter().enumerate() {
            for (k, s) in c.sequences.iter().enumerate() {
                where_b.entry(s.key).or_insert((ci as u32, k as u32, s.num_samples));
            }
        }
        let mut map = Vec::new();
        let mut chunks = Vec::new();
        for c in &a.index().chunks {
            let mut l = Vec::new();
            for (k, s) in c.sequences.iter().enumerate() {
                if let Some(&(bc, bk, bn)) = where_b.get(&s.key) {
                    l.push((k as u32, bc, bk, s.num_samples.max(bn), s.key));
                }
            }
            chunks
                .push(ChunkInfo { num_samples: l.iter().map(|x| u64::from(x.3)).sum(), num_sequences: l.len() as u32 });
            map.push(l);
        }
        Join { a, b, chunks, map }
    }
}

impl SequenceSource for Join {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        out.extend(self.map[chunk as usize].iter().map(|x| SequenceInfo { num_samples: x.3, key: x.4 }));
        Ok(())
    }
}

impl Deser for Join {
    fn schema(&self) -> Schema {
        let mut s = self.a.schema().streams().to_vec();
        s.extend(self.b.schema().streams().iter().cloned());
        Schema::new(s).unwrap()
    }
    fn stream_of(&self, chunk: u32, seq: u32, stream: usize) -> Result<(Arc<ChunkData>, usize, usize), Error> {
        let (k, bc, bk, _, _) = self.map[chunk as usize][seq as usize];
        let na = self.a.schema().len();
        if stream < na {
            Ok((self.a.load_chunk(chunk as usize)?, k as usize, stream))
        } else {
            Ok((self.b.load_chunk(bc as usize)?, bk as usize, stream - na))
        }
    }
}

fn names_for(feats: usize, labels: usize) -> Vec<String> {
    let mut v: Vec<String> =
        if feats == 1 { vec!["features".into()] } else { (1..=feats).map(|i| format!("features{i}")).collect() };
    if labels == 1 {
        v.push("labels".into());
    } else {
        v.extend((1..=labels).map(|i| format!("labels{i}")));
    }
    v
}

struct Run {
    feats: usize,
    labels: usize,
    epoch_size: u64,
    mb: u64,
    epochs: u64,
    float: bool,
    /// Randomization window in chunks (None: randomization off).
    window: Option<u64>,
    workers: u32,
    rank: u32,
    local_timeline: bool,
}

/// ReaderTestHelper's loop: epochs of `epoch_size` samples, at most 10 minibatches written per epoch,
/// each stream's minibatch written time-major over CNTK's packed layout, values as `%g`.
fn harness(d: &dyn Deser, r: &Run) -> Result<Vec<String>, Error> {
    let mut en: Box<dyn SequenceEnumerator + '_> = match r.window {
        Some(w) => {
            Box::new(BlockRandomizer::new(d as &dyn SequenceSource, Window::Chunks(w), 0)?.with_cntk_seek_quirk(true))
        }
        None => Box::new(NoRandomizer::new(d as &dyn SequenceSource)?),
    };
    let schema = d.schema();
    let mut out = Vec::new();
    for ep in 0..r.epochs {
        en.start_epoch(&EpochConfig {
            epoch_size: r.epoch_size,
            epoch_index: ep,
            workers: r.workers,
            rank: r.rank,
            sweeps: None,
            cross_sweeps: false,
        })?;
        let mut count = 0;
        loop {
            let (g, l) = if r.local_timeline { (u64::MAX, r.mb) } else { (r.mb, r.mb) };
            let m = en.get_next(g, l)?;
            if m.picks.is_empty() || count >= 10 {
                break;
            }
            count += 1;
            write_minibatch(d, &schema, &m.picks, r, &mut out)?;
            if m.end_of_epoch {
                break;
            }
        }
    }
    Ok(out)
}

fn write_minibatch(
    d: &dyn Deser,
    schema: &Schema,
    picks: &[Pick],
    r: &Run,
    out: &mut Vec<String>,
) -> Result<(), Error> {
    for name in names_for(r.feats, r.labels) {
        let si = schema.by_name(&name).unwrap_or_else(|| panic!("no stream {name}"));
        let dim = schema.streams()[si].dim;
        let mut seqs = Vec::new();
        for p in picks {
            let (data, k, local) = d.stream_of(p.chunk, p.index, si)?;
            seqs.push((data, k, local));
        }
        let lens: Vec<u64> = seqs.iter().map(|(c, k, s)| c.streams[*s].sequence_len(*k)).collect();
        let (width, rows, place) = layout_packed(&lens);
        let mut cell = std::collections::HashMap::new();
        for (q, &(row, t0)) in place.iter().enumerate() {
            for t in 0..lens[q] {
                cell.insert((t0 + t, row), (q, t));
            }
        }
        for t in 0..width {
            for row in 0..rows {
                let Some(&(q, k)) = cell.get(&(t, row)) else { continue };
                let (c, seq, s) = &seqs[q];
                let sd = &c.streams[*s];
                let sample = sd.sequence_samples(*seq).start + k;
                let mut vals = vec![0f64; dim];
                let range = sd.sample_value_range(sample);
                match &sd.layout {
                    Layout::Dense => {
                        for (j, i) in range.enumerate() {
                            vals[j] = sd.values.get_f64(i);
                        }
                    }
                    Layout::Sparse { indices, .. } => {
                        for i in range {
                            vals[indices[i] as usize] = sd.values.get_f64(i); // the later duplicate wins
                        }
                    }
                }
                let _ = r.float;
                out.push(vals.iter().map(|&v| fmt_g(v)).collect::<Vec<_>>().join(" "));
            }
        }
    }
    Ok(())
}

fn open(file: &str, streams: &[S], double: bool, chunk: u64, max_errors: u64, skip_ids: bool) -> CtfReader {
    // keepDataInMemory: the harness asks for every sequence separately; parse each chunk once.
    let opts = CtfOptions {
        chunk_size: chunk,
        max_errors,
        skip_sequence_ids: skip_ids,
        keep_data_in_memory: true,
        ..CtfOptions::default()
    };
    CtfReader::open(data(file), &schema(streams, double), &opts).expect("the file indexes")
}

fn check(name: &str, got: Result<Vec<String>, Error>, control_file: &str) {
    let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
    let want: Vec<String> = control(control_file).split_whitespace().map(String::from).collect();
    let got_tokens: Vec<String> = got.join(" ").split_whitespace().map(String::from).collect();
    assert!(!want.is_empty() || got_tokens.is_empty(), "{name}");
    if got_tokens != want {
        let at = got_tokens.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got_tokens.len().min(want.len()));
        panic!(
            "{name}: output differs from {control_file} at token {at} (got {} tokens, want {}): got {:?}, want {:?}",
            got_tokens.len(),
            want.len(),
            got_tokens.get(at),
            want.get(at)
        );
    }
}

const M32: u64 = 32 << 20;
fn w(chunk: u64) -> Option<u64> {
    Some((1u64 << 32) / chunk)
}

#[allow(clippy::too_many_arguments)]
fn run(feats: usize, labels: usize, es: u64, mb: u64, ep: u64, float: bool, window: Option<u64>) -> Run {
    Run { feats, labels, epoch_size: es, mb, epochs: ep, float, window, workers: 1, rank: 0, local_timeline: false }
}

#[test]
fn ctf_reader_tests_regenerate_cntk_control_files() {
    for dmb in [false, true] {
        let t = |n: &str| format!("{n}[defMBSize={dmb}]");
        let st: &[S] = &[("features", "F", true, 2, dmb), ("labels", "L", true, 2, false)];
        check(
            &t("Simple_dense"),
            harness(&open("Simple_dense.txt", st, false, M32, 0, false), &run(1, 1, 1000, 250, 10, true, None)),
            "Simple_dense.txt",
        );
        let st: &[S] = &[("features", "F", true, 2, dmb)];
        check(
            &t("Simple_dense_single_stream"),
            harness(&open("Simple_dense.txt", st, false, M32, 0, false), &run(1, 0, 1000, 250, 10, true, None)),
            "Simple_dense_single_stream.txt",
        );
        let st: &[S] = &[("features", "F", true, 784, false), ("labels", "L", true, 10, dmb)];
        check(
            &t("MNIST_dense"),
            harness(&open("MNIST_dense.txt", st, true, 10000, 0, false), &run(1, 1, 1000, 1000, 1, false, None)),
            "MNIST_dense.txt",
        );
        let st: &[S] = &[("features", "F", true, 10000, dmb)];
        check(
            &t("1x1_1_dense"),
            harness(&open("1x1_dense.txt", st, true, M32, 0, false), &run(1, 0, 1, 1, 1, false, w(M32))),
            "1x1_1_dense.txt",
        );
        check(
            &t("1x1_2_dense"),
            harness(&open("1x1_dense.txt", st, true, M32, 0, false), &run(1, 0, 2, 1, 3, false, w(M32))),
            "1x1_2_dense.txt",
        );
        let st: &[S] = &[("features", "F0", true, 10, dmb)];
        check(
            &t("1x10_dense"),
            harness(&open("1x10_dense.txt", st, false, M32, 0, false), &run(1, 0, 10, 10, 1, true, w(M32))),
            "1x10_dense.txt",
        );
        let st: &[S] = &[
            ("features1", "F1", true, 1, dmb),
            ("features2", "F2", true, 10, false),
            ("features3", "F3", true, 100, false),
            ("features4", "F4", true, 1000, false),
            ("labels1", "L1", true, 1, false),
            ("labels2", "L2", true, 10, false),
            ("labels3", "L3", true, 100, false),
        ];
        check(
            &t("10x1_MI_2_dense"),
            harness(&open("10x1_MI_dense.txt", st, false, 50000, 0, false), &run(4, 3, 7, 3, 3, true, w(50000))),
            "10x1_MI_2_dense.txt",
        );
        check(
            &t("1x10_MI_1_dense"),
            harness(&open("10x1_MI_dense.txt", st, false, 50000, 0, false), &run(4, 3, 10, 1, 3, true, w(50000))),
            "10x1_MI_1_dense.txt",
        );
        let st: &[S] = &[("features", "F0", true, 5, dmb)];
        check(
            &t("10x10_dense"),
            harness(&open("10x10_dense.txt", st, false, M32, 0, false), &run(1, 0, 100, 100, 1, true, None)),
            "10x10_dense.txt",
        );
        let st: &[S] = &[("features", "F", true, 100, false), ("labels", "L", true, 100, dmb)];
        check(
            &t("100x1_1_dense"),
            harness(&open("100x1_dense.txt", st, true, 10000, 0, false), &run(1, 1, 10, 1, 10, false, w(10000))),
            "100x1_1_dense.txt",
        );
        check(
            &t("100x1_2_dense"),
            harness(&open("100x1_dense.txt", st, true, 10000, 0, false), &run(1, 1, 5, 3, 4, false, w(10000))),
            "100x1_2_dense.txt",
        );
        let st: &[S] = &[("features", "F0", true, 3, dmb)];
        check(
            &t("50x20_jagged_sequences_dense"),
            harness(
                &open("50x20_jagged_sequences_dense.txt", st, true, M32, 0, false),
                &run(1, 0, 508, 508, 1, false, None),
            ),
            "50x20_jagged_sequences_dense.txt",
        );
        let st: &[S] = &[("features", "F0", false, 10000, dmb)];
        check(
            &t("1x1_sparse"),
            harness(&open("1x1_sparse.txt", st, false, M32, 0, false), &run(1, 0, 1, 1, 1, true, w(M32))),
            "1x1_sparse.txt",
        );
        let st: &[S] = &[("features", "F0", false, 1000, dmb)];
        check(
            &t("1x2_sparse"),
            harness(&open("1x2_sparse.txt", st, false, M32, 0, false), &run(1, 0, 2, 2, 1, true, w(M32))),
            "1x2_sparse.txt",
        );
        let st: &[S] = &[("features", "F0", false, 100, dmb)];
        check(
            &t("1x10_sparse"),
            harness(&open("1x10_sparse.txt", st, true, M32, 0, false), &run(1, 0, 10, 10, 1, false, w(M32))),
            "1x10_sparse.txt",
        );
        check(
            &t("10x10_sparse"),
            harness(&open("10x10_sparse.txt", st, true, M32, 0, false), &run(1, 0, 100, 100, 1, false, None)),
            "10x10_sparse.txt",
        );
        let st: &[S] = &[
            ("features1", "F0", false, 2, dmb),
            ("features2", "F1", false, 20, false),
            ("features3", "F2", false, 200, false),
        ];
        check(
            &t("3x5_MI_sparse"),
            harness(&open("3x5_MI_sparse.txt", st, false, M32, 0, false), &run(3, 0, 15, 15, 1, true, None)),
            "3x5_MI_sparse.txt",
        );
        check(
            &t("20x10_MI_jagged_samples_sparse"),
            harness(
                &open("20x10_MI_jagged_samples_sparse.txt", st, false, M32, 0, false),
                &run(3, 0, 200, 200, 1, true, None),
            ),
            "20x10_MI_jagged_samples_sparse.txt",
        );
        let st: &[S] = &[
            ("features1", "F1", true, 15, dmb),
            ("features2", "F2", true, 12, false),
            ("features3", "F3", true, 1, false),
        ];
        check(
            &t("space_separated"),
            harness(&open("space_separated.txt", st, true, M32, 0, false), &run(3, 0, 2, 2, 1, false, w(M32))),
            "space_separated.txt",
        );
        let st: &[S] = &[("features", "features", true, 1, dmb)];
        check(
            &t("missing_trailing_newline"),
            harness(&open("missing_trailing_newline.txt", st, true, M32, 0, false), &run(1, 0, 2, 2, 1, false, w(M32))),
            "missing_trailing_newline.txt",
        );
        let r = harness(&open("contains_blank_lines.txt", st, true, M32, 0, true), &run(1, 0, 2, 2, 1, false, w(M32)));
        if dmb {
            check(&t("blank_lines"), r, "blank_lines.txt");
        } else {
            let e = r.expect_err("a blank line is an error in line mode without definesMBSize");
            assert!(matches!(e.kind(), ErrorKind::MaxErrorsReached { max_errors: 0, .. }), "{e}");
        }
        let st: &[S] = &[("features", "F0", true, 10, dmb), ("labels", "F1", false, 10, false)];
        check(
            &t("empty_samples"),
            harness(&open("empty_samples.txt", st, false, M32, 0, false), &run(1, 1, 6, 6, 1, true, None)),
            "empty_samples.txt",
        );
        let st: &[S] = &[("features", "F0", false, 100, dmb), ("labels", "F1", true, 3, false)];
        check(
            &t("ref_data_with_escape_sequences"),
            harness(
                &open("ref_data_with_escape_sequences.txt", st, false, M32, 0, false),
                &run(1, 1, 9, 9, 1, true, None),
            ),
            "ref_data_with_escape_sequences.txt",
        );
    }
    let st: &[S] = &[("features", "F0", false, 100, false)];
    check(
        "50x20_jagged_sequences_sparse",
        harness(
            &open("50x20_jagged_sequences_sparse.txt", st, false, M32, 0, false),
            &run(1, 0, 564, 564, 1, true, None),
        ),
        "50x20_jagged_sequences_sparse.txt",
    );
    let st: &[S] = &[("features", "F0", false, 20, false)];
    check(
        "100x100_jagged_sparse",
        harness(&open("100x100_jagged_sparse.txt", st, false, M32, 0, false), &run(1, 0, 4887, 4887, 1, true, None)),
        "100x100_jagged_sparse.txt",
    );
    let st: &[S] = &[("features", "features", true, 1, false)];
    check(
        "blank_lines_ignored",
        harness(&open("contains_blank_lines.txt", st, true, M32, 2, false), &run(1, 0, 3, 3, 1, false, None)),
        "blank_lines.txt",
    );
    let st: &[S] = &[("features1", "F1", true, 1, false), ("features2", "F2", true, 1, false)];
    let e = harness(&open("duplicate_inputs.txt", st, true, M32, 0, false), &run(2, 0, 1, 1, 1, false, w(M32)))
        .expect_err("a duplicated input");
    assert!(matches!(e.kind(), ErrorKind::MaxErrorsReached { .. }), "{e}");
}

#[test]
fn composite_reader_one_file_equals_two_files_joined_by_key() {
    let st: &[S] = &[("features1", "F0", true, 10, false), ("features2", "F1", true, 5, false)];
    for (es, mb) in [(40, 10), (413, 21)] {
        let mut r = run(2, 0, es, mb, 3, false, w(M32));
        r.local_timeline = true;
        let one = harness(&open("5x10_and_5x5_jagged.txt", st, true, M32, 0, false), &r).unwrap();
        let a = open("5x10_jagged.txt", &st[..1], true, M32, 0, false);
        let b = open("5x5_jagged.txt", &st[1..], true, M32, 0, false);
        let two = harness(&Join::new(a, b), &r).unwrap();
        assert!(!one.is_empty());
        assert_eq!(one, two, "minibatch size {mb}");
    }
}

#[test]
fn a_worker_without_chunks_gets_no_data() {
    let st: &[S] = &[("features", "F0", true, 100, false)];
    let mut r = run(1, 0, 10, 1, 10, false, w(M32));
    r.workers = 2;
    r.rank = 1;
    assert_eq!(harness(&open("1x2_dense.txt", st, true, M32, 0, false), &r).unwrap(), Vec::<String>::new());
}

fn load_all(bytes: &[u8], streams: &[S], max_errors: u64) -> Result<Vec<Arc<ChunkData>>, Error> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("no_trailing_newline.txt");
    std::fs::write(&p, bytes).unwrap();
    let opts = CtfOptions { max_errors, ..CtfOptions::default() };
    let r = CtfReader::open(&p, &schema(streams, true), &opts)?;
    (0..r.index().chunks.len()).map(|i| r.load_chunk(i)).collect()
}

#[test]
fn no_trailing_newline_valid_and_invalid_inputs() {
    let st: &[S] = &[("A", "A", true, 1, false)];
    for (text, v) in [("1", 1.0), ("-123", -123.0), ("45.", 45.0), ("6.78", 6.78), ("9.10e-11", 9.10e-11)] {
        let d = load_all(format!("|A {text}").as_bytes(), st, 0).unwrap();
        let got = d[0].streams[0].values.get_f64(0);
        assert!((got - v).abs() <= v.abs() * 1e-7, "{text}: {got}");
    }
    for text in ["", "\t", " ", "     ", " -", " +", " 12.+", " 12.+e", " 1:"] {
        let e = load_all(format!("|A{text}").as_bytes(), st, 0).expect_err(text);
        assert!(matches!(e.kind(), ErrorKind::MaxErrorsReached { .. }), "{text:?}: {e}");
    }
    for text in ["|A 1 |B 1 2 3", "|A 2 |this_input_is_supposed_to_be_also_ignored 1 2 3"] {
        load_all(text.as_bytes(), st, 0).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

#[test]
fn invalid_inputs_errors_are_counted_and_located() {
    // CNTK's test parses this file with maxErrors 99999 and compares its stderr (48 warning/info lines,
    // `Control/.../invalid_inputs_Control.txt`). The Python model that reproduces that stderr exactly
    // counts 28 errors (calls of its `err()`); cntkio must count the same and say where each one is.
    let st: &[S] = &[("A", "A", true, 1, false), ("B", "B", false, 10, false)];
    let opts = CtfOptions { max_errors: 99999, chunk_size: u64::MAX, ..CtfOptions::default() };
    let file = cntkio::InputFile::open(&data("invalid_inputs.txt"), cntkio::Access::Read).unwrap();
    let mut errors = Vec::new();
    cntkio::ctf::scan_file(
        &file,
        &schema(st, true),
        &opts,
        &cntkio::ctf::ScanOptions { enforce_max_errors: false, ..Default::default() },
        |p| {
            errors.extend(p.errors.iter().cloned());
            Ok(std::ops::ControlFlow::Continue(()))
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(errors.len(), 28);
    let at = |line: u64| -> Vec<&str> {
        errors.iter().filter(|e| e.position().line == Some(line)).map(|e| e.code()).collect()
    };
    assert_eq!(at(2), ["E0015"]); // |B 10:1 in dim 10
    assert_eq!(at(3), ["E0011"]); // two values for dim 1
    assert_eq!(at(5), ["E0008"]); // 2,0
    for e in &errors {
        let p = e.position();
        assert!(p.line.is_some() && p.column.is_some() && p.path.is_some(), "{e}");
    }
}

/// A CBF file as a deserializer of the harness: chunks as in the file, keys = global sequence index,
/// lengths = the per-sequence meta counts (CBF.md §4).
struct Cbf {
    file: cntkio::cbf::CbfFile,
    chunks: Vec<ChunkInfo>,
    seqs: Vec<Vec<SequenceInfo>>,
    data: Vec<Arc<ChunkData>>,
}

impl Cbf {
    fn open(name: &str) -> Cbf {
        let p = cntk_dir().join("Data/CNTKBinaryReader").join(name);
        let file = cntkio::cbf::CbfFile::open(&p).expect("a valid CBF file");
        let mut key = 0u64;
        let (mut chunks, mut seqs, mut data) = (Vec::new(), Vec::new(), Vec::new());
        for k in 0..file.chunk_count() {
            let d = file.read_chunk(k).expect("a valid chunk");
            let l: Vec<SequenceInfo> = d
                .num_samples
                .iter()
                .map(|n| {
                    key += 1;
                    SequenceInfo { num_samples: n, key: key - 1 }
                })
                .collect();
            chunks.push(ChunkInfo { num_samples: file.chunks()[k].num_samples.into(), num_sequences: l.len() as u32 });
            seqs.push(l);
            data.push(Arc::new(d));
        }
        Cbf { file, chunks, seqs, data }
    }
}

impl SequenceSource for Cbf {
    fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
        out.extend_from_slice(&self.seqs[chunk as usize]);
        Ok(())
    }
}

impl Deser for Cbf {
    fn schema(&self) -> Schema {
        self.file.schema().unwrap()
    }
    fn stream_of(&self, chunk: u32, seq: u32, stream: usize) -> Result<(Arc<ChunkData>, usize, usize), Error> {
        Ok((self.data[chunk as usize].clone(), seq as usize, stream))
    }
}

#[test]
fn cbf_reader_tests_compare_with_the_ctf_control_files() {
    for (name, file, feats, labels, es, mb, ep, control) in [
        ("CNTKBinaryReader_Simple_dense", "Simple_dense.bin", 1, 1, 1000, 250, 10, "Simple_dense.txt"),
        ("CNTKBinaryReader_10x10_dense", "10x10_dense.bin", 1, 0, 100, 100, 1, "10x10_dense.txt"),
        (
            "CNTKBinaryReader_50x20_jagged_sequences_dense",
            "50x20_jagged_sequences_dense.bin",
            1,
            0,
            508,
            508,
            1,
            "50x20_jagged_sequences_dense.txt",
        ),
        ("CNTKBinaryReader_10x10_sparse", "10x10_sparse.bin", 1, 0, 100, 100, 1, "10x10_sparse.txt"),
        (
            "CNTKBinaryReader_50x20_jagged_sequences_sparse",
            "50x20_jagged_sequences_sparse.bin",
            1,
            0,
            564,
            564,
            1,
            "50x20_jagged_sequences_sparse.txt",
        ),
    ] {
        let d = Cbf::open(file);
        check(name, harness(&d, &run(feats, labels, es, mb, ep, true, None)), control);
    }
}

/// `testdata/real/edge/`: CNTK's edge-case inputs with CNTK's recorded outputs (`expected/`).
#[test]
fn real_edge_cases_give_cntks_expected_outputs() {
    let edge = real_dir().join("edge");
    let expected = |f: &str| -> Vec<String> {
        common::testdata::read_to_string(&edge.join("expected").join(f)).split_whitespace().map(String::from).collect()
    };
    let reader = |f: &str, st: &[S], max_errors: u64, skip: bool| {
        let opts =
            CtfOptions { max_errors, skip_sequence_ids: skip, keep_data_in_memory: true, ..CtfOptions::default() };
        CtfReader::open(edge.join(f), &schema(st, true), &opts).unwrap()
    };
    let tokens = |r: Result<Vec<String>, Error>| -> Vec<String> {
        r.unwrap().join(" ").split_whitespace().map(String::from).collect()
    };
    let st: &[S] = &[("features", "features", true, 1, false)];
    let got = harness(&reader("contains_blank_lines.ctf", st, 2, false), &run(1, 0, 3, 3, 1, false, None));
    assert_eq!(tokens(got), expected("blank_lines.out"));
    let got = harness(&reader("missing_trailing_newline.ctf", st, 0, false), &run(1, 0, 2, 2, 1, false, w(M32)));
    assert_eq!(tokens(got), expected("missing_trailing_newline.out"));
    let st: &[S] = &[("features", "F0", true, 10, false), ("labels", "F1", false, 10, false)];
    let mut r = run(1, 1, 6, 6, 1, true, None);
    r.float = true;
    let opts = CtfOptions { keep_data_in_memory: true, ..CtfOptions::default() };
    let f32_reader = CtfReader::open(edge.join("empty_samples.ctf"), &schema(st, false), &opts).unwrap();
    assert_eq!(tokens(harness(&f32_reader, &r)), expected("empty_samples.out"));
    let st: &[S] = &[("features", "F0", false, 100, false), ("labels", "F1", true, 3, false)];
    let f32_reader =
        CtfReader::open(edge.join("ref_data_with_escape_sequences.ctf"), &schema(st, false), &opts).unwrap();
    assert_eq!(
        tokens(harness(&f32_reader, &run(1, 1, 9, 9, 1, true, None))),
        expected("ref_data_with_escape_sequences.out")
    );
    let st: &[S] = &[
        ("features1", "F1", true, 15, false),
        ("features2", "F2", true, 12, false),
        ("features3", "F3", true, 1, false),
    ];
    let got = harness(&reader("space_separated.ctf", st, 0, false), &run(3, 0, 2, 2, 1, false, w(M32)));
    assert_eq!(tokens(got), expected("space_separated.out"));
    let e = harness(
        &reader(
            "duplicate_inputs.ctf",
            &[("features1", "F1", true, 1, false), ("features2", "F2", true, 1, false)],
            0,
            false,
        ),
        &run(2, 0, 1, 1, 1, false, w(M32)),
    )
    .expect_err("a duplicated input");
    assert!(matches!(e.kind(), ErrorKind::MaxErrorsReached { .. }));
    // invalid_inputs.ctf / invalid_inputs.log: see `invalid_inputs_errors_are_counted_and_located`.
}
