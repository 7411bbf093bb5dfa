//! Differential tests of the fast CTF indexer and parser against a slow reference model.
//!
//! The reference (`tests/reference/mod.rs`) is a byte-at-a-time transliteration of the Python model
//! `testdata/model/ctfref.py` (which agrees with the real CNTK 2.7) and shares no code with
//! `cntkio_core`. Random files come from `tests/reference/gen.rs`. For every case the fast path must give
//! the same chunks and sequences (keys, declared counts, byte ranges), bit-identical values, the same
//! number of counted errors and the same fatal outcome, whether the file is parsed whole, chunk by chunk,
//! or through `parse_bytes`. The file-level paths (`scan_file` with 1 and 2 threads, `CtfReader`, mmap and
//! `read()`) are compared with the same reference in `cntkio/tests/ctf_model.rs`.

mod reference;

use cntkio_core::ctf::index::{index_bytes, ChunkDesc};
use cntkio_core::ctf::parse::{parse_bytes, CtfParser, ErrorSink};
use cntkio_core::{ChunkData, ElementType, Error, ErrorKind, Layout, Schema, StorageFormat, StreamSpec, Values};
use proptest::prelude::*;
use reference::gen::{self, Case};
use reference::{Elem, Fatal, IndexError, Outcome, RefChunk, RefSeq, SeqOut, StreamCfg, StreamOut};

/// The schema of a configuration.
fn schema(streams: &[StreamCfg], elem: Elem) -> Schema {
    let t = match elem {
        Elem::F32 => ElementType::F32,
        Elem::F64 => ElementType::F64,
    };
    Schema::new(
        streams
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

/// CNTK's `maxErrors` budget as the model keeps it: the error that finds the budget used up stops parsing.
struct Budget {
    left: u64,
    counted: u64,
    exhausted: bool,
}

impl ErrorSink for Budget {
    fn error(&mut self, e: Error) -> Result<(), Error> {
        if self.left == 0 {
            self.exhausted = true;
            return Err(e);
        }
        self.left -= 1;
        self.counted += 1;
        Ok(())
    }
}

fn ref_chunks(chunks: &[ChunkDesc]) -> Vec<RefChunk> {
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

fn index_error(e: &Error) -> IndexError {
    match e.kind() {
        ErrorKind::Utf16Bom => IndexError::Utf16Bom,
        ErrorKind::EmptyFile => IndexError::Empty,
        ErrorKind::MissingSequenceId { .. } => IndexError::MissingId(e.position().byte.expect("an offset")),
        ErrorKind::SequenceIdOverflow => IndexError::IdOverflow,
        k => panic!("unexpected index error {k:?}"),
    }
}

fn bits(v: &Values, i: usize) -> u64 {
    match v {
        Values::F32(v) => u64::from(v[i].to_bits()),
        Values::F64(v) => v[i].to_bits(),
    }
}

/// The completed sequences of parsed chunk data, in the reference's shape.
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

fn fatal_of(e: &Error, sink: &Budget) -> Fatal {
    if sink.exhausted {
        return Fatal::MaxErrors;
    }
    match e.kind() {
        ErrorKind::EmptyStream { .. } => Fatal::EmptyStream,
        k => panic!("unexpected parse error {k:?}"),
    }
}

/// How the fast path is driven.
#[derive(Debug, Clone, Copy)]
enum Drive {
    /// All sequences of all chunks in one `parse_sequences` call over the whole file.
    Whole,
    /// Every chunk's bytes parsed separately (like the file reader), one buffer cleared between chunks.
    Chunked,
    /// `parse_bytes` (its own index with unlimited chunk size).
    ParseBytes,
}

/// The fast path's outcome in the reference's shape.
fn fast(case: &Case, drive: Drive) -> Outcome {
    let schema = schema(&case.streams, case.elem);
    let index = index_bytes(&case.data, case.skip_ids, case.main(), case.chunk_size);
    let mut out = Outcome {
        index: index.as_ref().map(|c| ref_chunks(c)).map_err(index_error),
        seqs: vec![],
        errors: 0,
        fatal: None,
    };
    let chunks = match index {
        Ok(c) => c,
        Err(_) => return out,
    };
    let parser = CtfParser::new(&schema);
    let mut sink = Budget { left: case.max_errors, counted: 0, exhausted: false };
    match drive {
        Drive::Whole => {
            let all: Vec<_> = chunks.iter().flat_map(|c| c.sequences.iter().copied()).collect();
            let mut d = ChunkData::new(&schema);
            let r = parser.parse_sequences(&case.data, 0, &all, &mut d, &mut sink);
            out.seqs = sequences_of(&d);
            out.fatal = r.err().map(|e| fatal_of(&e, &sink));
        }
        Drive::Chunked => {
            let mut d = ChunkData::new(&schema);
            for c in &chunks {
                d.clear();
                let bytes = &case.data[c.offset as usize..c.end() as usize];
                let r = parser.parse_sequences(bytes, c.offset, &c.sequences, &mut d, &mut sink);
                out.seqs.extend(sequences_of(&d));
                if let Err(e) = r {
                    out.fatal = Some(fatal_of(&e, &sink));
                    break;
                }
            }
        }
        Drive::ParseBytes => {
            let r = parse_bytes(&case.data, &schema, case.skip_ids, &mut sink);
            match r {
                Ok(d) => out.seqs = sequences_of(&d),
                Err(e) => out.fatal = Some(fatal_of(&e, &sink)),
            }
        }
    }
    out.errors = sink.counted;
    out
}

fn reference(case: &Case) -> Outcome {
    reference::run(&case.data, &case.streams, case.skip_ids, case.chunk_size, case.max_errors, case.elem)
}

/// Compares every drive of the fast path with the reference; `Err` describes the first difference.
fn compare(case: &Case) -> Result<(), String> {
    let want = reference(case);
    for drive in [Drive::Whole, Drive::Chunked, Drive::ParseBytes] {
        let got = fast(case, drive);
        let got_cmp = match drive {
            // parse_bytes indexes with an unlimited chunk size and stops without handing back the
            // sequences parsed before a fatal error: compare what it can tell.
            Drive::ParseBytes => Outcome {
                index: want.index.clone(),
                seqs: if got.fatal.is_some() || got.index.is_err() { want.seqs.clone() } else { got.seqs.clone() },
                ..got.clone()
            },
            _ => got.clone(),
        };
        if got_cmp != want {
            return Err(format!("{case:?}\ndrive {drive:?}\nreference: {want:#?}\nfast: {got:#?}"));
        }
    }
    Ok(())
}

fn cfg(alias: &str, dense: bool, dim: usize) -> StreamCfg {
    StreamCfg { name: alias.to_string(), alias: alias.to_string(), dense, dim, defines: false }
}

fn case(data: &[u8], streams: Vec<StreamCfg>) -> Case {
    Case {
        data: data.to_vec(),
        streams,
        skip_ids: false,
        chunk_size: u64::MAX,
        max_errors: 0,
        elem: Elem::F64,
        noise: 0,
    }
}

fn check(c: &Case) {
    if let Err(m) = compare(c) {
        panic!("{m}");
    }
}

/// Widened values of stream `s` of every sequence (reference), for the spec examples below.
fn ref_values(c: &Case, s: usize) -> Vec<Vec<f64>> {
    reference(c).seqs.iter().map(|q| q.streams[s].values.iter().map(|&b| f64::from_bits(b)).collect()).collect()
}

/// Number of random cases: 3,000 by default, `CNTKIO_PROPTEST_CASES` to change it.
fn num_cases() -> u32 {
    std::env::var("CNTKIO_PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(num_cases()) })]

    /// Random files: fast path (whole, chunked, parse_bytes) == reference.
    #[test]
    fn fast_path_matches_reference(c in gen::case()) {
        if let Err(m) = compare(&c) {
            prop_assert!(false, "{}", m);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The reference itself against the worked examples of CTF.md (so a wrong reference cannot hide a bug).

#[test]
fn reference_follows_the_spec_examples() {
    // §5.1: a short last sample without `\n` is zero-padded; `1-2` is two values; `5.` is 5.
    let c = case(b"|a 1 2\n|a 3", vec![cfg("a", true, 2)]);
    assert_eq!(ref_values(&c, 0), vec![vec![1.0, 2.0], vec![3.0, 0.0]]);
    let c = case(b"0 |a 1-2 5.\n", vec![cfg("a", true, 3)]);
    assert_eq!(ref_values(&c, 0), vec![vec![1.0, -2.0, 5.0]]);
    // §2.2: `5`, no id, `5`, `6` → sequence 5 has 3 rows.
    let c = case(b"5 |a 1\n|a 2\n5 |a 3\n6 |a 4\n", vec![cfg("a", true, 1)]);
    let r = reference(&c);
    let seqs: Vec<(u64, u64)> = r.index.unwrap()[0].seqs.iter().map(|s| (s.key, s.ns)).collect();
    assert_eq!(seqs, vec![(5, 3), (6, 1)]);
    // §3 worked example: 7 chunks with the given spans.
    let mut data = String::new();
    for i in 0..20i64 {
        data += &format!("{i} |a {i} {} |b {}:1\n", -i, i % 4);
    }
    let chunks = reference::index(data.as_bytes(), false, None, 64).unwrap();
    let spans: Vec<(u64, u64)> = chunks.iter().map(|c| (c.start, c.end)).collect();
    assert_eq!(spans, vec![(0, 50), (50, 101), (101, 152), (152, 209), (209, 269), (269, 329), (329, 369)]);
    // §5.3: 0e400 is NaN, 1e400 inf, 3.5e38 inf as float.
    let mut c = case(b"|a 0e400 1e400 3.5e38\n", vec![cfg("a", true, 3)]);
    c.elem = Elem::F32;
    let v: Vec<u64> = reference(&c).seqs[0].streams[0].values.clone();
    assert!(f32::from_bits(v[0] as u32).is_nan());
    assert_eq!(f32::from_bits(v[1] as u32), f32::INFINITY);
    assert_eq!(f32::from_bits(v[2] as u32), f32::INFINITY);
    // §6.2: a stream empty in a sequence is fatal regardless of maxErrors.
    let mut c = case(b"|a 1\n|b 2\n", vec![cfg("a", true, 1), cfg("b", true, 1)]);
    c.max_errors = 100;
    assert_eq!(reference(&c).fatal, Some(Fatal::EmptyStream));
    // §7: a blank line inside a sequence costs one error; maxErrors 0 makes it fatal.
    let c = case(b"1 |a 1\n\n1 |a 2\n", vec![cfg("a", true, 1)]);
    assert_eq!(reference(&c).fatal, Some(Fatal::MaxErrors));
    let mut c = c;
    c.max_errors = 1;
    let r = reference(&c);
    // 3 rows, 2 samples: the blank row and "fewer samples than declared" are 2 errors → fails at the 2nd.
    assert_eq!((r.fatal, r.errors), (Some(Fatal::MaxErrors), 1));
    c.max_errors = 2;
    let r = reference(&c);
    assert_eq!((r.fatal, r.errors), (None, 2));
    // Sparse entries in file order, duplicates kept; `01:2` is index 1.
    let c = case(b"|s 3:1 01:2 3:4\n", vec![cfg("s", false, 5)]);
    let r = reference(&c);
    assert_eq!(r.seqs[0].streams[0].indices, vec![3, 1, 3]);
    assert_eq!(r.seqs[0].streams[0].nnz, vec![3]);
}

// ------------------------------------------------------------------------------------------------
// Hand-written regressions: shapes the random search found or that are easy to get wrong.

#[test]
fn regressions_agree_with_reference() {
    let two = || vec![cfg("a", true, 2), cfg("b", false, 3)];
    let inputs: &[&[u8]] = &[
        b"|a 1 2\n|a 3",
        b"|a 1 2 3",                 // too long at EOF: the first dim values are kept
        b"|a ",                      // empty dense sample at EOF
        b"0 |a 1 |b\n",              // empty sparse sample with \n
        b"0 |a 1 |b",                // empty sparse sample at EOF (error: nothing read before)
        b"0 |a 1 |b 1:1\n0 |a 1 |b", // ... unless the sequence already has entries
        b"|a\x0b1 2\n",
        b"\xef\xbb|a 1\n",
        b"\xef\xbb\xbf\n\n|a 1\n|a 2\n",
        b"1 |a 1 |b 1: 2\n",
        b"1 |a 1 |b +1:2\n",
        b"1 |a 1 |b 99999999999999999999:2\n",
        b"1 |a 1 |b 30000000000000000000:2\n",
        b"1 |a 1 |# c|b 1:1\n",
        b"1 |a 1 |b 1:1 |a 2\n",
        b"007 |a 1 |b 0:1\n7 |a 2 |b 0:1\n",
        b"1 |a 1e |b 0:1\n",
        b"1 |a 1 |b 0:1\r\n\r\n1 |a 2 |b 0:1\r\n",
        b"1\t|a\t1\t2\t|b\t2:5\n",
        b"|a 1 2 |b 0:1\n|zz 1\n|a 1 |b 1:1",
        b"1 |a 1 |b 1:1\n 1 |a 3 4\n",
        b"1 |a 1 |b 2:1\n2",
        b"12",
        b"abc |a 1",
        b"\xff\xfe|a 1",
        b" \n\t\x0b\x0c\r\n",
        b"",
    ];
    for data in inputs {
        for max_errors in [0, 1, 5] {
            for skip_ids in [false, true] {
                for elem in [Elem::F32, Elem::F64] {
                    for chunk_size in [1, 16, u64::MAX] {
                        let mut c = case(data, two());
                        c.max_errors = max_errors;
                        c.skip_ids = skip_ids;
                        c.elem = elem;
                        c.chunk_size = chunk_size;
                        check(&c);
                        c.streams[0].defines = true;
                        check(&c);
                    }
                }
            }
        }
    }
}

/// The generator must keep producing every kind of outcome (a generator that drifts to "everything
/// fails at the first byte" would make the differential tests vacuous).
#[test]
fn generator_covers_the_interesting_outcomes() {
    let cases = gen::cases_from_seed(7, 1000);
    let (mut index_err, mut ok, mut max_errors, mut empty_stream) = (0, 0, 0, 0);
    let (mut ok_with_errors, mut multi_row, mut multi_chunk, mut line_mode, mut seqs) = (0, 0, 0, 0, 0);
    for c in &cases {
        let r = reference(c);
        match (&r.index, r.fatal) {
            (Err(_), _) => index_err += 1,
            (Ok(_), None) => ok += 1,
            (Ok(_), Some(Fatal::MaxErrors)) => max_errors += 1,
            (Ok(_), Some(Fatal::EmptyStream)) => empty_stream += 1,
        }
        if r.fatal.is_none() && r.errors > 0 {
            ok_with_errors += 1;
        }
        if let Ok(chunks) = &r.index {
            multi_chunk += usize::from(chunks.len() > 1);
            multi_row += usize::from(chunks.iter().flat_map(|c| &c.seqs).any(|s| s.ns > 1));
            line_mode += usize::from(
                c.skip_ids
                    || chunks.first().and_then(|c| c.seqs.first()).is_some_and(|s| c.data[s.off as usize] == b'|'),
            );
        }
        seqs += r.seqs.len();
    }
    let counts = format!(
        "index errors {index_err}, ok {ok} (with tolerated errors {ok_with_errors}), maxErrors {max_errors}, \
         empty stream {empty_stream}, multi-row sequences {multi_row}, multi-chunk {multi_chunk}, \
         line mode {line_mode}, sequences parsed {seqs}"
    );
    eprintln!("{counts}");
    assert!(index_err >= 20 && ok >= 350 && ok_with_errors >= 30 && max_errors >= 100, "{counts}");
    assert!(
        empty_stream >= 100 && multi_row >= 100 && multi_chunk >= 200 && line_mode >= 200 && seqs >= 2000,
        "{counts}"
    );
}

// ------------------------------------------------------------------------------------------------
// Bugs of the library found by the tests above (fixed); each test states the model's (= CNTK's) behaviour.

/// Bug 1a: in id mode, a last row made only of digits and without `\n` is "no id" and — as in CNTK's
/// `TextInputIndexBuilder` loop, which stops when reading the id hits the end of the file — it is not
/// counted towards the sequence's declared length (cntkio counted it, declared 2 rows, and then failed
/// "fewer samples than declared" (1 vs. 2), fatal with maxErrors = 0).
#[test]
fn bug_digits_only_last_row_is_not_counted() {
    let c = case(b"1 |a 1\n2", vec![cfg("a", true, 1)]);
    let want = reference(&c);
    assert_eq!(want.index.as_ref().unwrap()[0].seqs, vec![RefSeq { key: 1, ns: 1, off: 0, size: 8 }]);
    assert_eq!((want.fatal, want.errors), (None, 0));
    check(&c);
}

/// Bug 1b: a file whose first (and only) row is a run of digits without `\n` (e.g. `12`, or `\n007`) has
/// no sequence id: CNTK fails with `Expected a sequence id at the offset 0, none was found.` (cntkio
/// returned an empty index).
#[test]
fn bug_file_of_only_digits_has_no_sequence_id() {
    for (data, at) in [(&b"12"[..], 0), (b"\n007", 1)] {
        let c = case(data, vec![cfg("a", true, 1)]);
        assert_eq!(reference(&c).index, Err(IndexError::MissingId(at)));
        check(&c);
    }
}

/// Numbers of every digit-run length (the fast path reads digits 8 at a time and switches to f64
/// accumulation after 15 digits; `D` overflows after 308 fraction digits) ended by every byte value.
#[test]
fn numbers_agree_at_every_length_and_terminator() {
    let digits = "98765432109876543210".repeat(21);
    let lens: Vec<usize> = (1..=24).chain(305..=312).chain(395..=405).collect();
    let streams = vec![cfg("a", true, 3), cfg("b", false, 4)];
    for &n in &lens {
        let run = &digits[..n];
        for form in [run.to_string(), format!("1.{run}"), format!("-{run}.5e-3"), format!("0.{run}e{}", n % 40)] {
            for end in 0..=255u8 {
                let mut data = format!("|a {form}").into_bytes();
                data.push(end);
                data.extend_from_slice(b" 7 |b 3:");
                data.extend_from_slice(form.as_bytes());
                data.push(end);
                data.extend_from_slice(b"\n|a 1 |b 0:1\n");
                for elem in [Elem::F32, Elem::F64] {
                    let mut c = case(&data, streams.clone());
                    c.elem = elem;
                    c.max_errors = 10;
                    check(&c);
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The structural fast path of dense value lists (64-byte windows of separator masks): long lists, values
// across window borders, long numbers, and every reason to fall back to the careful loop.

/// A dense value token: mostly the forms of real files, sometimes one that makes the fast path stop.
fn long_list_token() -> impl Strategy<Value = String> {
    prop_oneof![
        10 => "-?[0-9]\\.[0-9]{1,6}",
        4 => "[0-9]",
        2 => "-?[0-9]{1,3}(\\.[0-9]{0,8})?",
        1 => "[+-]?[0-9]{1,2}(\\.[0-9]{1,3})?[eE][+-]?[0-9]{1,2}",
        1 => "[0-9]{9,20}(\\.[0-9]{9,20})?",
        1 => "[0-9]{60,80}",
        1 => prop::sample::select(vec![
            "5.", "-0", "+2.5", "007", "1-2", "1.5.5", "1e", "1e+", ".5", "-", "x", "nan", "1:2", "2,5", "1|",
            "|", "|b 1:1", "#c", "\r", "\x0b", "\x00", "\u{e9}", "\n",
        ])
        .prop_map(str::to_string),
    ]
}

fn long_list_sep() -> impl Strategy<Value = &'static str> {
    prop_oneof![30 => Just(" "), 2 => Just("\t"), 2 => Just("  "), 1 => Just(" \t "), 1 => Just("")]
}

/// Files of rows `[id] |a TOKEN TOKEN ... [|b 2:1]` with up to `max_tokens` tokens of `token` per row
/// (stream `a` dense or sparse, its dimension drawn from `dims`), random chunk sizes, budgets, element
/// types, and line or id mode (two rows per id).
fn list_case(
    token: impl Strategy<Value = String>,
    max_tokens: usize,
    dense: bool,
    dims: impl Strategy<Value = usize>,
) -> impl Strategy<Value = Case> {
    let row = (
        prop::collection::vec((long_list_sep(), token), 0..max_tokens),
        any::<bool>(),
        prop_oneof![8 => Just("\n"), 1 => Just("\r\n"), 1 => Just(" \n"), 1 => Just("")],
    );
    (
        prop::collection::vec(row, 1..6),
        dims,
        prop::sample::select(vec![0u64, 100, 700, u64::MAX]),
        prop::sample::select(vec![0u64, 3, 1_000_000]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(rows, dim, chunk_size, max_errors, f64, ids)| {
            let mut data = Vec::new();
            for (i, (vals, with_b, end)) in rows.iter().enumerate() {
                if ids {
                    data.extend_from_slice(format!("{} ", i / 2).as_bytes());
                }
                data.extend_from_slice(b"|a");
                for (sep, tok) in vals {
                    data.extend_from_slice(sep.as_bytes());
                    data.extend_from_slice(tok.as_bytes());
                }
                if *with_b {
                    data.extend_from_slice(b" |b 2:1");
                }
                data.extend_from_slice(end.as_bytes());
            }
            Case {
                data,
                streams: vec![cfg("a", dense, dim), cfg("b", false, 3)],
                skip_ids: false,
                chunk_size,
                max_errors,
                elem: if f64 { Elem::F64 } else { Elem::F32 },
                noise: 0,
            }
        })
}

/// Files of rows `|a v v v ... [|b i:v]`, with 0–120 values per sample.
fn long_list_case() -> impl Strategy<Value = Case> {
    list_case(long_list_token(), 120, true, 1usize..130)
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(num_cases() / 3) })]

    /// Long dense value lists: fast path (whole, chunked, parse_bytes) == reference.
    #[test]
    fn long_dense_lists_match_reference(c in long_list_case()) {
        if let Err(m) = compare(&c) {
            prop_assert!(false, "{}", m);
        }
    }
}

/// Value lists of exactly the shape of the benchmark files, cut at every length (so every window
/// border and every end of the sequence falls in every place of a number).
#[test]
fn dense_lists_cut_everywhere_agree_with_reference() {
    let vals = "-4.22509 0.646123 0.0248291 12.5 -0 7 1e5 3.25e-2 0.000125 -99.5 1 0 0 1";
    let row = format!("|a {vals} {vals} {vals} {vals} {vals} |b 1:1\n|a {vals}\n");
    for cut in 0..=row.len() {
        for dim in [14, 70, 100] {
            for elem in [Elem::F32, Elem::F64] {
                let mut c = case(&row.as_bytes()[..cut], vec![cfg("a", true, dim), cfg("b", false, 3)]);
                c.elem = elem;
                c.max_errors = 100;
                check(&c);
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------
// The tight loop of sparse entry lists (`index:d `): long lists, every form that makes it stop.

/// A sparse entry: mostly `index:1`, sometimes one of another form or a broken one.
fn sparse_token() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => "[0-9]{1,5}:[01]",
        2 => "[0-9]{6,9}:[0-9]",
        2 => "[0-9]{1,3}:-?[0-9]{1,2}(\\.[0-9]{0,4})?",
        1 => "[0-9]{1,2}:[0-9][eE][+-]?[0-9]",
        1 => "0{1,9}[0-9]{0,3}:1",
        1 => prop::sample::select(vec![
            "1:", ":1", "1::1", "1 :1", "1: 1", "12x:1", "1:1x", "1:x", "x", "-1:1", "1.5:1", "99999999999999999999:1",
            "1:1:1", "|", "|b 1:1", "#c", "\r", "\x0b", "\x00", "\u{e9}", "\n", "1:1|a", "7:+",
        ])
        .prop_map(str::to_string),
    ]
}

/// Files of rows `|a i:v i:v ... [|b i:v]`, with 0–80 entries per sample and a dimension that some
/// indices exceed.
fn sparse_list_case() -> impl Strategy<Value = Case> {
    list_case(sparse_token(), 80, false, prop::sample::select(vec![1usize, 10, 1000, 100_000, 1_000_000_000]))
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(num_cases() / 3) })]

    /// Long sparse entry lists: fast path (whole, chunked, parse_bytes) == reference.
    #[test]
    fn long_sparse_lists_match_reference(c in sparse_list_case()) {
        if let Err(m) = compare(&c) {
            prop_assert!(false, "{}", m);
        }
    }
}

/// Sparse lists of the shape of the benchmark files, cut at every length (so the end of the sequence
/// falls in every place of an entry, and the 16 bytes the tight loop needs run out everywhere).
#[test]
fn sparse_lists_cut_everywhere_agree_with_reference() {
    let ents = "6196:1 8862:1 13277:1 0:1 7:0 99999:1 1234567:1 12345678:1 5:2.5 3:-1 44:1e2 8:1\t9:1  10:1";
    let row = format!("|a {ents} {ents} |b 1:1\n|a {ents}\n|b 2:1 |a 1:1\n");
    // Indices around small dimensions, followed by enough valid entries for the tight loop. The first
    // index out of range fails the whole sample, so each sequence has a second row that keeps it valid.
    let edges: String =
        (8..=12).map(|k| format!("{k} |a 1:1 {k}:1 0:1 1:1 2:1 3:1 4:1 5:1 |b 0:1\n{k} |a 2:1\n")).collect();
    for (text, dims) in [(&row, [9, 100_000, 100_000_000]), (&edges, [9, 10, 11])] {
        for cut in 0..=text.len() {
            for dim in dims {
                for elem in [Elem::F32, Elem::F64] {
                    let mut c = case(&text.as_bytes()[..cut], vec![cfg("a", false, dim), cfg("b", false, 3)]);
                    c.elem = elem;
                    c.max_errors = 100;
                    check(&c);
                }
            }
        }
    }
}
