//! Tests of the parser: the fast paths against the careful loops, and CNTK's cases.

use super::dense::read_dense;
use super::masks::{is_sep, separators, separators_swar, WINDOW};
use super::parser::name_end;
use super::sparse::read_sparse;
use super::*;
use crate::ctf::{is_non_printable, simd};
use crate::test_rng::Rng;
use crate::{ElementType, StorageFormat, StreamSpec};

/// A small deterministic generator for the tests below.
/// One sparse entry, mostly of the common form `index:d ` (which the fast paths take: an index
/// below `dim` of at most 7 digits, some with leading zeros), else (`bad`: one in `bad` entries)
/// one of the forms that must stop them at exactly that entry.
fn sparse_entry(r: &mut Rng, out: &mut Vec<u8>, bad: u64, dim: usize) {
    let digits = |r: &mut Rng, out: &mut Vec<u8>, n: u64| {
        for _ in 0..n {
            out.push(b'0' + r.below(10) as u8);
        }
    };
    let index = |r: &mut Rng, out: &mut Vec<u8>| {
        let i = r.below(dim.min(10_000_000) as u64).to_string();
        let width = if r.below(8) == 0 { 1 + r.below(7) as usize } else { 0 };
        out.extend_from_slice(format!("{i:0>width$}").as_bytes());
    };
    let common = |r: &mut Rng, out: &mut Vec<u8>| {
        index(r, out);
        out.push(b':');
        digits(r, out, 1);
    };
    let form = if r.below(bad) == 0 { r.below(8) } else { 99 };
    match form {
        0 => {
            let n = 8 + r.below(3);
            digits(r, out, n); // too long an index for the fast paths
            out.extend_from_slice(b":1");
        }
        1 => {
            common(r, out);
            let n = 1 + r.below(2);
            digits(r, out, n); // a longer value
        }
        2 => {
            index(r, out);
            out.extend_from_slice(
                [&b":-1"[..], b":1.5", b":.5", b":1e3", b"::1", b":", b":a", b":+2"][r.below(8) as usize],
            );
        }
        3 => index(r, out), // no colon
        4 => out.extend_from_slice([&b":1"[..], b"", b"x:1", b"1x:1", b"1:1:1", b"12\r:3"][r.below(6) as usize]),
        5 => {
            // Another end than one space.
            common(r, out);
            out.push([b'\t', b' ', b'|', b'\r', 0x80][r.below(5) as usize]);
        }
        // Out of range, and the last index.
        6 => out.extend_from_slice(format!("{}:1", dim + r.below(2) as usize).as_bytes()),
        7 => out.extend_from_slice(format!("{}:1", dim - 1).as_bytes()),
        _ => common(r, out),
    }
    out.push(b' ');
}

/// With `CNTKIO_EXPECT_SIMD` set (by `scripts/test.sh` on processors with AVX-512), the vector
/// paths must be available: the comparisons below would otherwise test nothing new.
fn expect_vector_paths() {
    if std::env::var_os("CNTKIO_EXPECT_SIMD").is_some() {
        assert!(simd::available().is_some(), "AVX-512 is expected but the vector paths are not available");
    }
}

/// Parses `data` with and without the vector paths, as rows and as indexed sequences, and asserts
/// the same data, errors, warnings and outcome. Returns how many values the rows gave.
fn vector_agrees(schema: &Schema, data: &[u8], case: usize) -> usize {
    expect_vector_paths();
    let run = |vector: bool, rows: bool| {
        let mut parser = CtfParser::new(schema);
        parser.set_vector_paths(vector);
        let mut out = ChunkData::new(schema);
        let mut sink = Collect::new(usize::MAX, true);
        let res = if rows {
            let mut seqs = Vec::new();
            parser.parse_rows(data, 0, 0, &mut seqs, &mut out, &mut sink).map(|_| format!("{seqs:?}"))
        } else {
            crate::ctf::index::index_bytes(data, false, None, u64::MAX).and_then(|chunks| {
                for c in &chunks {
                    parser.parse_sequences(data, 0, &c.sequences, &mut out, &mut sink)?;
                }
                Ok(String::new())
            })
        };
        (format!("{res:?}"), out, format!("{:?} {:?}", sink.errors, sink.warnings))
    };
    for rows in [true, false] {
        let scalar = run(false, rows);
        let vector = run(true, rows);
        assert_eq!(vector, scalar, "case {case} rows {rows}: {:?}", String::from_utf8_lossy(data));
        // What the CBF writer trusts in parsed data (`check_parsed_chunk_fast`): every sparse index
        // kept is below the stream's dimension, whatever errors were tolerated around it.
        for d in &vector.1.streams {
            if let crate::Layout::Sparse { indices, sample_offsets } = &d.layout {
                let used = sample_offsets.last().copied().unwrap_or(0) as usize;
                assert!(
                    indices[..used].iter().all(|&x| x >= 0 && (x as usize) < d.dim),
                    "case {case} rows {rows}: a sparse index out of range was kept"
                );
            }
        }
    }
    run(true, true).1.streams.iter().map(|d| d.values.len()).sum()
}

/// Random sparse rows (2 streams, dims from 1 to 2^31 - 1, long runs of common entries
/// with every form that stops the fast paths mixed in, at every offset of a window), parsed with
/// and without the vector paths, as rows and as indexed sequences, in f32 and f64: the same data,
/// errors and outcome. (Where the processor lacks AVX-512 both runs take the scalar paths.)
/// The word-at-a-time name scan stops where the byte loop does, for every byte value, start and
/// sequence end, near and far from the end of the bytes.
#[test]
fn name_end_finds_the_byte_loops_end() {
    let byte_loop = |ext: &[u8], n: usize, mut p: usize| {
        while p < n && !(ext[p] == b' ' || ext[p] == b'|' || is_non_printable(ext[p])) {
            p += 1;
        }
        p
    };
    // Every byte value at every position of a word.
    for b in 0..=255u8 {
        for at in 0..12 {
            let mut ext = vec![b'a'; 20];
            ext[at] = b;
            for n in [ext.len(), 9, 3] {
                for p in 0..n.min(5) {
                    assert_eq!(name_end(&ext, n, p), byte_loop(&ext, n, p), "byte {b:#x} at {at}, n {n}, p {p}");
                }
            }
        }
    }
    let mut r = Rng(0x5DEE_CE66_D1CE_4E5B);
    for _ in 0..20_000 {
        let len = r.below(40) as usize + 1;
        // Mostly name bytes, some stops.
        let ext: Vec<u8> =
            (0..len).map(|_| if r.below(10) == 0 { r.below(256) as u8 } else { b'a' + r.below(26) as u8 }).collect();
        let n = r.below(len as u64 + 1) as usize;
        let p = r.below(n as u64 + 1) as usize;
        assert_eq!(name_end(&ext, n, p), byte_loop(&ext, n, p), "{ext:?} n {n} p {p}");
    }
}

#[test]
fn vector_paths_read_as_the_scalar_paths() {
    let mut r = Rng(0x2545_F491_4F6C_DD1D);
    let mut vector_entries = 0usize;
    for case in 0..1000 {
        let dims = [1usize, 7, 10, 100, 1000, 54321, 100_000, 9_999_999, 10_000_000, (1 << 31) - 1];
        let (dx, dy) = (dims[r.below(10) as usize], dims[r.below(10) as usize]);
        // An error drops a row's sample, which leaves its stream empty in the sequence: fatal. So
        // a case ends at its first error, and most entries must be good for the cases to be long.
        let bad = [10, 300, 3000, u64::MAX][r.below(4) as usize];
        let elem = if case % 2 == 0 { ElementType::F32 } else { ElementType::F64 };
        let schema = Schema::new(vec![
            StreamSpec::new("x", dx, StorageFormat::Sparse).element_type(elem),
            StreamSpec::new("y", dy, StorageFormat::Sparse).element_type(elem),
        ])
        .expect("a schema");
        let mut data = Vec::new();
        for _ in 0..1 + r.below(20) {
            if r.below(4) == 0 {
                data.extend_from_slice(b"7 ");
            }
            for (name, dim) in [(&b"|x"[..], dx), (b"|y", dy)] {
                if r.below(200) == 0 {
                    continue; // a stream without samples in a sequence is fatal
                }
                data.extend_from_slice(name);
                data.push(b' ');
                let most = if r.below(3) == 0 { 3 } else { 60 };
                for _ in 0..1 + r.below(most) {
                    sparse_entry(&mut r, &mut data, bad, dim);
                }
                if r.below(2) == 0 {
                    data.pop(); // the sample's last entry ends at `|` or `\n`
                }
            }
            data.push(b'\n');
        }
        if r.below(3) == 0 {
            data.pop();
        }
        vector_entries += vector_agrees(&schema, &data, case);
    }
    assert!(vector_entries > 10_000, "the cases must hold many entries ({vector_entries})");
}

/// `read_sparse` with and without the vector path on entry lists cut at every length `n` (bytes
/// after `n` are still there, as after a sequence inside a chunk): the same result, values and
/// indices. The vector path must take nothing that ends at or past `n`.
#[test]
fn vector_path_stops_at_the_end_given() {
    expect_vector_paths();
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let mut taken = 0usize;
    for _ in 0..200 {
        let dim = [10usize, 100_000, 10_000_000][r.below(3) as usize];
        let bad = [20, 1000][r.below(2) as usize];
        let mut ext = Vec::new();
        for _ in 0..1 + r.below(40) {
            sparse_entry(&mut r, &mut ext, bad, dim);
        }
        ext.extend_from_slice(b"12:1 34:5 |y 1:1\n");
        for n in 1..=ext.len() {
            let read = |vector: bool| {
                let (mut v, mut idx) = (Vec::<f32>::new(), Vec::new());
                let vector = if vector { simd::available() } else { None };
                let res = read_sparse(vector, &ext, n, 0, dim, &mut v, &mut idx, false, |x| x as f32);
                let res = res.map(|d| d.end).map_err(|f| (f.at, format!("{:?}", f.into_kind("x", dim))));
                (res, v, idx)
            };
            let vector = read(true);
            assert_eq!(vector, read(false), "n {n}: {:?}", String::from_utf8_lossy(&ext));
            taken += vector.1.len();
        }
    }
    assert!(taken > 100_000, "the lists must hold many entries ({taken})");
}

/// One dense value, mostly of the common forms the fast paths take (an optional sign, 1–7 integer
/// digits, optionally `.` and 1–7 fraction digits), else (one in `bad`) one that must stop them at
/// exactly that value; then one or more separators.
fn dense_value(r: &mut Rng, out: &mut Vec<u8>, bad: u64) {
    let digits = |r: &mut Rng, out: &mut Vec<u8>, n: u64| {
        for _ in 0..n {
            out.push(b'0' + r.below(10) as u8);
        }
    };
    let common = |r: &mut Rng, out: &mut Vec<u8>| {
        match r.below(6) {
            0 => out.push(b'-'),
            1 if r.below(4) == 0 => out.push(b'+'),
            _ => {}
        }
        let n = 1 + r.below(7);
        digits(r, out, n);
        if r.below(5) != 0 {
            out.push(b'.');
            let n = 1 + r.below(7);
            digits(r, out, n);
        }
    };
    let form = if r.below(bad) == 0 { r.below(10) } else { 99 };
    match form {
        0 => {
            // Too many digits in a part.
            let (int, frac) =
                if r.below(2) == 0 { (8 + r.below(3), r.below(9)) } else { (1 + r.below(7), 8 + r.below(3)) };
            digits(r, out, int);
            if frac > 0 {
                out.push(b'.');
                digits(r, out, frac);
            }
        }
        1 => {
            common(r, out);
            out.extend_from_slice([&b"e5"[..], b"E-3", b".", b".5", b"x", b"-"][r.below(6) as usize]);
        }
        2 => out.extend_from_slice(
            [&b"."[..], b"-", b"+", b".5", b"-.5", b"5.", b"-0", b"--1", b"1..2", b"nan"][r.below(10) as usize],
        ),
        3 => {
            common(r, out);
            out.push([b'|', b'\r', 0x80, b':'][r.below(4) as usize]);
        }
        4 => {
            // Longest common forms.
            out.push(b'-');
            digits(r, out, 7);
            out.push(b'.');
            digits(r, out, 7);
        }
        _ => common(r, out),
    }
    for _ in 0..if r.below(8) == 0 { 1 + r.below(3) } else { 1 } {
        out.push(if r.below(10) == 0 { b'\t' } else { b' ' });
    }
}

/// Random dense rows (2 streams, dims below, at and above the values given, so with short and
/// long samples), parsed with and without the vector paths, as rows and as indexed sequences, in
/// f32 and f64: the same data, errors, warnings and outcome.
#[test]
fn dense_vector_path_reads_as_the_scalar_paths() {
    let mut r = Rng(0x1234_5678_9ABC_DEF1);
    let mut entries = 0usize;
    for case in 0..1000 {
        let counts = [1 + r.below(40), 1 + r.below(150)];
        let dims = [counts[0] as usize, (counts[1] as usize + r.below(3) as usize).saturating_sub(1).max(1)];
        let elem = if case % 2 == 0 { ElementType::F32 } else { ElementType::F64 };
        let schema = Schema::new(vec![
            StreamSpec::new("x", dims[0], StorageFormat::Dense).element_type(elem),
            StreamSpec::new("y", dims[1], StorageFormat::Dense).element_type(elem),
        ])
        .expect("a schema");
        let bad = [10, 300, 3000, u64::MAX][r.below(4) as usize];
        let mut data = Vec::new();
        for _ in 0..1 + r.below(20) {
            for (name, count) in [(&b"|x"[..], counts[0]), (b"|y", counts[1])] {
                data.extend_from_slice(name);
                data.push(b' ');
                for _ in 0..count {
                    dense_value(&mut r, &mut data, bad);
                }
                if r.below(2) == 0 {
                    data.pop(); // the sample's last value ends at `|` or `\n`
                }
            }
            data.push(b'\n');
        }
        entries += vector_agrees(&schema, &data, case);
    }
    assert!(entries > 100_000, "the cases must hold many values ({entries})");
}

/// `read_dense` with and without the vector path on value lists cut at every length `n`: the same
/// result and values. The vector path must take nothing that ends at or past `n`.
#[test]
fn dense_vector_path_stops_at_the_end_given() {
    expect_vector_paths();
    let mut r = Rng(0x0F1E_2D3C_4B5A_6978);
    let mut taken = 0usize;
    for _ in 0..150 {
        let bad = [20, 1000][r.below(2) as usize];
        let mut ext = Vec::new();
        for _ in 0..1 + r.below(40) {
            dense_value(&mut r, &mut ext, bad);
        }
        ext.extend_from_slice(b"1.5 -2 |y 1\n");
        let dim = 1 + r.below(45) as usize;
        for n in 1..=ext.len() {
            let read = |vector: bool| {
                let mut v = Vec::<f64>::new();
                let vector = if vector { simd::available() } else { None };
                let res = read_dense(vector, &ext, n, 0, dim, &mut v, |x| x);
                let res = res.map(|d| (d.end, format!("{:?}", d.note)));
                let res = res.map_err(|f| (f.at, format!("{:?}", f.into_kind("x", dim))));
                (res, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            let vector = read(true);
            assert_eq!(vector, read(false), "n {n} dim {dim}: {:?}", String::from_utf8_lossy(&ext));
            taken += vector.1.len();
        }
    }
    assert!(taken > 100_000, "the lists must hold many values ({taken})");
}

/// Stream names found by word (up to 8 bytes, read with what follows) and by slice: every alias
/// and every prefix and extension of one, at the end of the bytes and before more bytes.
#[test]
fn lookup_by_word_and_by_slice() {
    let aliases = ["a", "ab", "abcdefg", "abcdefgh", "abcdefghi", "features", "x.y", "0"];
    let schema = Schema::new(
        aliases
            .iter()
            .enumerate()
            .map(|(i, a)| StreamSpec::new(format!("s{i}"), 1, StorageFormat::Dense).alias(*a))
            .collect(),
    )
    .expect("a schema");
    let parser = CtfParser::new(&schema);
    let mut names: Vec<Vec<u8>> = aliases.iter().map(|a| a.as_bytes().to_vec()).collect();
    for a in aliases {
        let b = a.as_bytes();
        names.push(b[..b.len() - 1].to_vec());
        names.push([b, b"z"].concat());
        names.push([b"z", b].concat());
    }
    for name in &names {
        let want = aliases.iter().position(|a| a.as_bytes() == &name[..]);
        for after in [&b""[..], b" ", b"abcdefghijklmnop", b"\0\0\0\0\0\0\0\0"] {
            let ext = [&b"|"[..], name, after].concat();
            assert_eq!(parser.lookup(&ext, 1, name.len()), want, "{name:?} then {after:?}");
        }
    }
}

/// The separator masks (SIMD and portable) against a byte loop, on every byte value in every place
/// and on pseudo-random windows.
#[test]
fn separator_masks() {
    let naive = |w: &[u8; WINDOW]| (0..WINDOW).fold(0u64, |m, i| m | (u64::from(is_sep(w[i])) << i));
    let mut windows = Vec::new();
    for b in 0..=255u8 {
        for at in [0, 7, 8, 15, 16, 31, 32, 63] {
            let mut w = [b'1'; WINDOW];
            w[at] = b;
            windows.push(w);
            let mut w = [b' '; WINDOW];
            w[at] = b;
            windows.push(w);
        }
    }
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..2000 {
        let mut w = [0u8; WINDOW];
        for c in w.iter_mut() {
            *c = [b' ', b'\t', b'1', b'.', b'|', b'\n', 0x89, 0xa0, 0x20 | 0x80, 0x09 | 0x80][r.below(10) as usize];
        }
        windows.push(w);
    }
    for w in &windows {
        assert_eq!(separators(w), naive(w), "{w:?}");
        assert_eq!(separators_swar(w), naive(w), "{w:?}");
    }
}

/// Heap bytes per row of a chunk of `rows` copies of `row` parsed into chunk data made ready for it as the
/// chunk readers make theirs ([`ChunkData::reserve_like`] a chunk of the same rows parsed before).
fn bytes_per_row(row: &str, schema: &Schema, rows: usize) -> f64 {
    let text = row.repeat(rows);
    let first = parse_bytes(text.as_bytes(), schema, false, &mut FailFast).unwrap();
    let mut data = ChunkData::new(schema);
    data.reserve_like(&first.sizes());
    let parser = CtfParser::new(schema);
    for c in crate::ctf::index::index_bytes(text.as_bytes(), false, None, u64::MAX).unwrap() {
        parser.parse_sequences(text.as_bytes(), 0, &c.sequences, &mut data, &mut FailFast).unwrap();
    }
    assert_eq!((data.num_sequences(), &data), (rows, &first));
    let per_row = data.heap_bytes() as f64 / rows as f64;
    eprintln!("{row:?}: {per_row} bytes per row");
    per_row
}

/// A chunk of tiny sequences costs a few times its text: no key or declared length per sequence while
/// they count up by one and are all equal (line mode), and otherwise values, indices and offsets.
#[test]
fn a_chunk_of_tiny_rows_costs_a_few_times_its_text() {
    let dense = Schema::new(vec![StreamSpec::new("a", 1, StorageFormat::Dense)]).unwrap();
    let per_row = bytes_per_row("|a 1\n", &dense, 100_000);
    // 4 bytes of value and 8 of sequence offset, with the eighth more that `reserve_like` adds: under 3
    // times the text.
    assert!(per_row <= 13.5 + 0.01, "{per_row} bytes per row of 5");
    let sparse = Schema::new(vec![StreamSpec::new("b", 10, StorageFormat::Sparse)]).unwrap();
    let per_row = bytes_per_row("|b 3:1\n", &sparse, 100_000);
    // Value, index, sample offset, sequence offset.
    assert!(per_row <= 27.0 + 0.01, "{per_row} bytes per row of 7");
}
