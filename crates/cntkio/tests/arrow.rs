//! The Arrow mapping: CTF → Parquet / Arrow IPC → CTF and → CBF keep every value's bits, the keys and the
//! sequence lengths; the CNTK-made files of testdata/ go through Parquet unchanged; damaged and foreign
//! files are errors, never panics; a failed conversion leaves no temporary file.

mod common;

use cntkio::arrow::{
    arrow_to_cbf, arrow_to_ctf, cbf_to_arrow, ctf_to_arrow, ArrowFile, ArrowFormat, ArrowSource, ArrowToCbf,
    ArrowToCtf, ParquetCompression, ToArrow,
};
use cntkio::cbf::{CbfFile, CbfOptions, CbfWriterOptions};
use cntkio::ctf::ScanOptions;
use cntkio::randomize::SequenceSource;
use cntkio::source::Deserializer;
use cntkio::{
    Access, ChunkData, CtfOptions, ElementType, ErrorKind, Layout, Schema, StorageFormat, StreamSpec, Values,
};
use cntkio_core::ctf::parse::{parse_bytes, FailFast};
use cntkio_core::ctf::write::write_chunk;
use proptest::prelude::*;
use std::path::{Path, PathBuf};

/// Every chunk of a file in the mapping, appended into one.
fn read_all(path: &Path) -> ChunkData {
    let f = ArrowFile::open(path).unwrap();
    let mut all = ChunkData::new(f.schema());
    for k in 0..f.chunk_count() {
        append(&mut all, &f.read_chunk(k).unwrap());
    }
    all
}

/// Appends `b`'s sequences to `a` (same schema).
fn append(a: &mut ChunkData, b: &ChunkData) {
    a.keys.extend(b.keys.iter());
    a.num_samples.extend(b.num_samples.iter());
    for (x, y) in a.streams.iter_mut().zip(&b.streams) {
        let samples = x.num_samples();
        x.sequence_offsets.extend(y.sequence_offsets[1..].iter().map(|o| o + samples));
        let entries = x.values.len() as u64;
        if let (Layout::Sparse { indices, sample_offsets }, Layout::Sparse { indices: yi, sample_offsets: yo }) =
            (&mut x.layout, &y.layout)
        {
            indices.extend_from_slice(yi);
            sample_offsets.extend(yo[1..].iter().map(|o| o + entries));
        }
        x.values.extend_from(&y.values, 0..y.values.len());
    }
}

fn bits(v: &Values) -> Vec<u64> {
    match v {
        Values::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        Values::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
    }
}

/// Same values (bits), layouts and sequence lengths; keys and declared lengths compared apart.
fn assert_same_streams(a: &ChunkData, b: &ChunkData, what: &str) {
    assert_eq!(a.streams.len(), b.streams.len(), "{what}");
    for (i, (x, y)) in a.streams.iter().zip(&b.streams).enumerate() {
        assert_eq!(x.layout, y.layout, "{what}: stream {i} layout");
        assert_eq!(x.sequence_offsets, y.sequence_offsets, "{what}: stream {i} sequence lengths");
        assert_eq!(bits(&x.values), bits(&y.values), "{what}: stream {i} values");
    }
}

fn how(format: ArrowFormat, rows: Option<usize>, flatten: bool) -> ToArrow {
    ToArrow { rows_per_group: rows, flatten, ..ToArrow::new(format) }
}

fn to_arrow(ctf: &Path, out: &Path, schema: &Schema, how: &ToArrow, threads: usize) {
    let scan = ScanOptions { threads, ..ScanOptions::default() };
    ctf_to_arrow(ctf, out, schema, &CtfOptions::default(), &scan, Access::Read, how, &mut |_| {}).unwrap();
}

/// Random CTF data (the CBF round trip's generator): 1–3 streams (dense or sparse, float or double), 1–11
/// sequences with ids that skip, 1–3 samples per stream (sometimes 40 times as many), sparse samples with
/// 0–4 entries (empty samples and duplicate indices included), finite values of any bits.
fn random_ctf() -> impl Strategy<Value = (Schema, Vec<u8>)> {
    common::random::random_data(true, 1..4, 1..12).prop_map(|(schema, d)| {
        let mut text = Vec::new();
        write_chunk(&d, &schema, &mut text).unwrap();
        (schema, text)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ctf_through_parquet_and_arrow_keeps_every_bit(
        (schema, text) in random_ctf(),
        ipc: bool,
        rows in prop::option::of(1usize..5),
        threads in 1usize..3,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let ctf = dir.path().join("in.ctf");
        std::fs::write(&ctf, &text).unwrap();
        let want = parse_bytes(&text, &schema, false, &mut FailFast).unwrap();
        let format = if ipc { ArrowFormat::Ipc } else { ArrowFormat::Parquet };
        let out = dir.path().join(if ipc { "a.arrow" } else { "a.parquet" });
        to_arrow(&ctf, &out, &schema, &how(format, rows, false), threads);

        let got = read_all(&out);
        prop_assert_eq!(&got.keys, &want.keys);
        prop_assert_eq!(&got.num_samples, &want.num_samples);
        assert_same_streams(&got, &want, "Arrow file");
        let f = ArrowFile::open(&out).unwrap();
        prop_assert_eq!(f.schema().streams(), schema.streams());
        if let Some(r) = rows {
            prop_assert_eq!(f.chunk_count(), want.num_sequences().div_ceil(r));
        }

        // → CTF: the same data, the ids as keys, the aliases kept.
        let back = dir.path().join("back.ctf");
        arrow_to_ctf(&out, &back, &ArrowToCtf::default(), &mut |_| {}).unwrap();
        let again = parse_bytes(&std::fs::read(&back).unwrap(), &schema, false, &mut FailFast).unwrap();
        prop_assert_eq!(&again.keys, &want.keys);
        prop_assert_eq!(&again.num_samples, &want.num_samples);
        assert_same_streams(&again, &want, "CTF written back");

        // → CBF: the declared lengths as meta counts.
        let cbf = dir.path().join("back.cbf");
        let h = ArrowToCbf { writer: CbfWriterOptions::new(1 << 20), hooks: Default::default() };
        arrow_to_cbf(&out, &cbf, &h, &mut |_| {}).unwrap();
        let c = CbfFile::open(&cbf).unwrap();
        let mut all = ChunkData::new(&c.schema().unwrap());
        for k in 0..c.chunk_count() {
            append(&mut all, &c.read_chunk(k).unwrap());
        }
        prop_assert_eq!(&all.num_samples, &want.num_samples);
        assert_same_streams(&all, &want, "CBF written back");

        // The deserializer announces the sequences it loads.
        let src = ArrowSource::open(&out).unwrap();
        let mut seqs = Vec::new();
        for c in 0..src.chunks().len() as u32 {
            src.sequences(c, &mut seqs).unwrap();
            let d = src.load_chunk(c).unwrap();
            prop_assert_eq!(d.num_sequences() as u32, src.chunks()[c as usize].num_sequences);
        }
        let keys: Vec<u64> = seqs.iter().map(|s| s.key).collect();
        prop_assert_eq!(keys, want.keys.clone());
    }
}

#[test]
fn flattened_files_have_a_row_per_sample() {
    let dir = tempfile::tempdir().unwrap();
    let ctf = dir.path().join("in.ctf");
    std::fs::write(&ctf, "0 |x 1 2 |y 3:1\n1 |x 3 4 |y\n2 |x 5 6 |y 0:1 2:0.5\n").unwrap();
    let schema = Schema::new(vec![
        StreamSpec::new("x", 2, StorageFormat::Dense),
        StreamSpec::new("y", 4, StorageFormat::Sparse).element_type(ElementType::F64),
    ])
    .unwrap();
    for format in [ArrowFormat::Parquet, ArrowFormat::Ipc] {
        let out = dir.path().join(if format == ArrowFormat::Ipc { "a.arrow" } else { "a.parquet" });
        to_arrow(&ctf, &out, &schema, &how(format, Some(2), true), 1);
        let f = ArrowFile::open(&out).unwrap();
        assert_eq!(f.mapping().rows, cntkio::arrow::Rows::Samples);
        let got = read_all(&out);
        let want = parse_bytes(&std::fs::read(&ctf).unwrap(), &schema, false, &mut FailFast).unwrap();
        assert_eq!((got.keys.clone(), got.num_samples.clone()), (want.keys.clone(), want.num_samples.clone()));
        assert_same_streams(&got, &want, "flattened");
    }
    // A sequence of two samples cannot be flattened: a usage error naming it, and no output.
    std::fs::write(&ctf, "0 |x 1 2 |y 3:1\n5 |x 3 4 |y 1:1\n5 |x 5 6 |y 0:1\n").unwrap();
    let out = dir.path().join("b.parquet");
    let scan = ScanOptions::default();
    let e = ctf_to_arrow(
        &ctf,
        &out,
        &schema,
        &CtfOptions::default(),
        &scan,
        Access::Read,
        &how(ArrowFormat::Parquet, None, true),
        &mut |_| {},
    )
    .unwrap_err();
    assert_eq!(e.code(), "E1006");
    assert!(e.to_string().contains("sequence 5 declares 2 samples"), "{e}");
    assert_only(dir.path(), &["a.arrow", "a.parquet", "in.ctf"]);
}

/// The names in `dir` are exactly `names` (no temporary file left).
fn assert_only(dir: &Path, names: &[&str]) {
    let mut found: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    found.sort();
    assert_eq!(found, names);
}

#[test]
fn a_failed_conversion_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let ctf = dir.path().join("in.ctf");
    // Sequence 1 has a bad number; with maxErrors 0 the conversion stops there, after a chunk was written.
    let mut text = String::new();
    for k in 0..2000 {
        text.push_str(&format!("{k} |x {k} 1\n"));
    }
    text.push_str("2000 |x oops 1\n");
    std::fs::write(&ctf, text).unwrap();
    let schema = Schema::new(vec![StreamSpec::new("x", 2, StorageFormat::Dense)]).unwrap();
    for (name, format) in [("a.parquet", ArrowFormat::Parquet), ("a.arrow", ArrowFormat::Ipc)] {
        let opts = CtfOptions { chunk_size: 4096, ..CtfOptions::default() };
        let e = ctf_to_arrow(
            &ctf,
            &dir.path().join(name),
            &schema,
            &opts,
            &ScanOptions::default(),
            Access::Read,
            &how(format, Some(100), false),
            &mut |_| {},
        )
        .unwrap_err();
        assert_eq!(e.code(), "E0022", "{e}");
    }
    assert_only(dir.path(), &["in.ctf"]);
}

fn real(rel: &str) -> PathBuf {
    common::testdata::real_dir().join(rel)
}

#[test]
fn cntk_made_cbf_files_go_through_parquet_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    for name in
        ["10x10_dense", "10x10_sparse", "50x20_jagged_sequences_dense", "50x20_jagged_sequences_sparse", "Simple_dense"]
    {
        let bin = real(&format!("cbf/{name}.bin"));
        let out = dir.path().join(format!("{name}.parquet"));
        let h = ToArrow { compression: ParquetCompression::Snappy, ..ToArrow::new(ArrowFormat::Parquet) };
        cbf_to_arrow(&bin, &out, &CbfOptions::default(), &h, &mut |_| {}).unwrap();
        let c = CbfFile::open(&bin).unwrap();
        let mut want = ChunkData::new(&c.schema().unwrap());
        for k in 0..c.chunk_count() {
            append(&mut want, &c.read_chunk(k).unwrap());
        }
        let got = read_all(&out);
        assert_eq!((&got.keys, &got.num_samples), (&want.keys, &want.num_samples), "{name}");
        assert_same_streams(&got, &want, name);
    }
}

#[test]
fn cntk_ctf_files_go_through_arrow_unchanged() {
    // ATIS (sparse sequences, ids) and the edge cases CNTK reads (empty sparse samples, blank lines).
    let atis = Schema::new(vec![
        StreamSpec::new("query", 943, StorageFormat::Sparse).alias("S0"),
        StreamSpec::new("intent", 26, StorageFormat::Sparse).alias("S1"),
        StreamSpec::new("slots", 129, StorageFormat::Sparse).alias("S2"),
    ])
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ctf = real("atis/atis.test.ctf");
    for (format, name) in [(ArrowFormat::Parquet, "a.parquet"), (ArrowFormat::Ipc, "a.arrow")] {
        let out = dir.path().join(name);
        to_arrow(&ctf, &out, &atis, &how(format, None, false), 2);
        let want = parse_bytes(&std::fs::read(&ctf).unwrap(), &atis, false, &mut FailFast).unwrap();
        let got = read_all(&out);
        assert_eq!((&got.keys, &got.num_samples), (&want.keys, &want.num_samples));
        assert_same_streams(&got, &want, "atis");
    }
}

#[test]
fn foreign_and_damaged_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ctf = dir.path().join("in.ctf");
    let mut text = String::new();
    for k in 0..300 {
        text.push_str(&format!("{k} |x {k} 0.5 |y {}:1\n", k % 9));
    }
    std::fs::write(&ctf, text).unwrap();
    let schema = Schema::new(vec![
        StreamSpec::new("x", 2, StorageFormat::Dense),
        StreamSpec::new("y", 9, StorageFormat::Sparse),
    ])
    .unwrap();
    for (name, format) in [("a.parquet", ArrowFormat::Parquet), ("a.arrow", ArrowFormat::Ipc)] {
        let good = dir.path().join(name);
        let h = ToArrow { compression: ParquetCompression::None, ..how(format, Some(64), false) };
        to_arrow(&ctf, &good, &schema, &h, 1);
        let bytes = std::fs::read(&good).unwrap();
        let bad = dir.path().join(format!("bad.{name}"));
        // Every truncation point that keeps the magic bytes at both ends, and bytes overwritten all over: an
        // error or the right data (a changed value), never a panic.
        let mut rng = 0x9e3779b97f4a7c15u64;
        let mut step = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for i in 0..300 {
            let mut b = bytes.clone();
            if i % 3 == 0 {
                let cut = (step() as usize % (b.len() - 12)) + 6;
                b.drain(cut..b.len() - 6);
            } else {
                for _ in 0..1 + i % 4 {
                    let at = step() as usize % b.len();
                    b[at] = step() as u8;
                }
            }
            std::fs::write(&bad, &b).unwrap();
            let r = std::panic::catch_unwind(|| {
                let f = ArrowFile::open(&bad)?;
                for k in 0..f.chunk_count() {
                    f.read_chunk(k)?;
                }
                Ok::<_, cntkio::Error>(())
            });
            assert!(r.is_ok(), "{name}: damage {i} panicked");
        }
    }
    // An IPC footer length past the file's start is refused before anything is allocated for it.
    let mut b = std::fs::read(dir.path().join("a.arrow")).unwrap();
    let at = b.len() - 10;
    b[at..at + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    let long = dir.path().join("long.arrow");
    std::fs::write(&long, &b).unwrap();
    let e = ArrowFile::open(&long).unwrap_err();
    assert!(e.to_string().contains("footer's length 2147483647"), "{e}");
    // A record batch whose block in the footer claims more bytes than the file holds is refused at open,
    // before anything is allocated for it (the IPC reader would allocate and zero all of it).
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arrow/body-length-past-the-end.arrow");
    let e = ArrowFile::open(&fixture).unwrap_err();
    assert_eq!(e.code(), "E0102", "{e}");
    assert!(
        e.to_string().contains("record batch 1: bytes 4096..+1024+17179885568 lie outside the file of 7682 bytes"),
        "{e}"
    );
    // Garbage between the magic bytes.
    let garbage = dir.path().join("g.parquet");
    std::fs::write(&garbage, b"PAR1\x00\x01\x02\x03\xff\xff\xff\x7fPAR1").unwrap();
    let e = ArrowFile::open(&garbage).unwrap_err();
    assert_eq!((e.code(), e.position().path.is_some()), ("E0102", true), "{e}");
    // A CTF file is not one.
    assert_eq!(ArrowFile::open(&ctf).unwrap_err().code(), "E0102");
}

#[test]
fn files_outside_the_mapping_name_the_column() {
    use arrow_array::{Float32Array, RecordBatch, UInt64Array};
    use arrow_schema::{DataType, Field, Schema as ArrowSchema};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &Path, schema: ArrowSchema, batch_cols: Vec<arrow_array::ArrayRef>| {
        let schema = Arc::new(schema);
        let batch = RecordBatch::try_new(schema.clone(), batch_cols).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    // A plain table: no mapping metadata.
    let plain = dir.path().join("plain.parquet");
    let fields = vec![Field::new("key", DataType::UInt64, false), Field::new("x", DataType::Float32, false)];
    let cols: Vec<arrow_array::ArrayRef> =
        vec![Arc::new(UInt64Array::from(vec![1u64, 2])), Arc::new(Float32Array::from(vec![0.5f32, 1.5]))];
    write(&plain, ArrowSchema::new(fields.clone()), cols.clone());
    let e = ArrowFile::open(&plain).unwrap_err();
    assert_eq!(e.code(), "E0102");
    assert!(e.to_string().contains("x: Float32"), "{e}");
    // The metadata of a flattened dense stream "x" of dim 1, but a float column.
    let meta = r#"{"mapping":1,"rows":"samples","streams":[{"name":"x","alias":"x","dim":1,"storage":"dense","element_type":"float"}]}"#;
    let md = std::collections::HashMap::from([("cntkio.arrow".to_string(), meta.to_string())]);
    let typed = dir.path().join("typed.parquet");
    write(&typed, ArrowSchema::new_with_metadata(fields, md), cols);
    let e = ArrowFile::open(&typed).unwrap_err();
    match e.kind() {
        ErrorKind::ArrowColumn { column, expected, found } => {
            assert_eq!((column.as_str(), found.as_str()), ("x", "Float32"));
            assert!(expected.contains("FixedSizeList(1 x"), "{expected}");
        }
        k => panic!("{k:?}"),
    }
}
