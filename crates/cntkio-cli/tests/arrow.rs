//! The command line on Parquet and Arrow IPC files: `dump` of a converted file equals `dump` of the
//! original byte for byte, and every command takes them as input.

#[path = "../../cntkio/tests/common/testdata.rs"]
mod testdata;
#[macro_use]
mod common;

use common::*;
use std::path::{Path, PathBuf};

fn real(rel: &str) -> PathBuf {
    testdata::real_dir().join(rel)
}

const ATIS: [&str; 6] =
    ["--stream", "query:943:sparse:S0", "--stream", "intent:26:sparse:S1", "--stream", "slots:129:sparse:S2"];

fn dump(args: &[std::ffi::OsString]) -> Vec<u8> {
    let o = run(args);
    o.code(0);
    assert!(!o.stdout.is_empty());
    o.stdout
}

fn convert(input: &Path, output: &Path, extra: &[&str]) {
    run(args!["convert", input, output, "--quiet", extra]).code(0);
}

#[test]
fn dump_of_a_converted_file_equals_dump_of_the_original() {
    let d = tmp();
    let ctf = real("atis/atis.test.ctf");
    let original = dump(&args!["dump", &ctf, &ATIS]);
    for (name, extra) in [
        ("a.parquet", &[][..]),
        ("b.parquet", &["--parquet-compression", "snappy", "--row-group-size", "7"][..]),
        ("c.parquet", &["--parquet-compression", "none", "--threads", "1"][..]),
        ("d.arrow", &["--row-group-size", "100"][..]),
    ] {
        let out = d.path().join(name);
        run(args!["convert", &ctf, &out, "--quiet", &ATIS, extra]).code(0);
        assert_eq!(dump(&args!["dump", &out]), original, "{name}");
        // And back: CTF and CBF written from it dump the same.
        let back = d.path().join(format!("{name}.ctf"));
        convert(&out, &back, &[]);
        assert_eq!(dump(&args!["dump", &back, &ATIS]), original, "{name} → CTF");
    }
    // CBF → Parquet → CBF: the CBF made from ATIS dumps the same through both.
    let cbf = d.path().join("atis.cbf");
    run(args!["convert", &ctf, &cbf, "--quiet", &ATIS]).code(0);
    let from_cbf = dump(&args!["dump", &cbf]);
    let pq = d.path().join("from_cbf.parquet");
    convert(&cbf, &pq, &[]);
    assert_eq!(dump(&args!["dump", &pq]), from_cbf);
    let cbf2 = d.path().join("again.bin");
    convert(&pq, &cbf2, &[]);
    assert_eq!(dump(&args!["dump", &cbf2]), from_cbf);
    assert_eq!(std::fs::read(&cbf2).unwrap(), std::fs::read(&cbf).unwrap(), "the same CBF bytes");
}

#[test]
fn the_real_files_dump_the_same_through_parquet_and_arrow() {
    // CNTK's data (testdata/real/README.md): streams of different lengths with definesMBSize (CMUDict),
    // sparse features with dense sequence labels (SequenceClassification), MNIST in double precision,
    // CRLF line ends, empty dense and sparse samples, and a file whose errors maxErrors tolerates.
    let cases: [(&str, &[&str]); 6] = [
        (
            "cmudict/cmudict-0.7b.train-dev-1-21.ctf",
            &["-s", "rawInput:69:sparse:S0", "-s", "rawLabels:69:sparse:S1", "--defines-mb-size", "rawInput"],
        ),
        ("seqcla/Train.ctf", &["-s", "features:2000:sparse:x", "-s", "labels:5:dense:y"]),
        ("mnist/MNIST_dense.ctf", &["-s", "features:784:dense:F", "-s", "labels:10:dense:L", "--precision", "double"]),
        ("logreg/Train_cntk_text.crlf.ctf", &["-s", "features:2:dense", "-s", "labels:1:dense"]),
        ("edge/empty_samples.ctf", &["-s", "a:10:dense:F0", "-s", "b:10:sparse:F1", "--max-errors", "100"]),
        ("edge/invalid_inputs.ctf", &["-s", "a:1:dense:A", "-s", "b:10:sparse:B", "--max-errors", "99999"]),
    ];
    let d = tmp();
    for (rel, schema) in cases {
        let ctf = real(rel);
        let original = dump(&args!["dump", &ctf, schema]);
        for ext in ["parquet", "arrow"] {
            let out = d.path().join(format!("x.{ext}"));
            run(args!["convert", &ctf, &out, "--quiet", schema]).code(0);
            assert_eq!(dump(&args!["dump", &out]), original, "{rel} as {ext}");
        }
    }
}

#[test]
fn flattened_files_dump_the_same() {
    let d = tmp();
    let ctf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/data/logreg.ctf");
    let s = ["--stream", "features:2:dense", "--stream", "labels:1:dense"];
    let original = dump(&args!["dump", &ctf, &s]);
    let out = d.path().join("flat.arrow");
    run(args!["convert", &ctf, &out, "--quiet", "--flatten", &s]).code(0);
    assert_eq!(dump(&args!["dump", &out]), original);
    let j = run(args!["inspect", &out, "--json"]);
    j.code(0);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(
        (v["format"].as_str(), v["rows"].as_str(), v["mapping_version"].as_u64()),
        (Some("arrow"), Some("samples"), Some(1))
    );
    // Sequences of several samples cannot be flattened: a usage error, and no output.
    let atis_out = d.path().join("atis.parquet");
    run(args!["convert", &real("atis/atis.test.ctf"), &atis_out, &ATIS, "--flatten"])
        .code(2)
        .err_has("E1006")
        .err_has("--flatten");
    assert!(!atis_out.exists());
    assert_eq!(dir_names(d.path()).len(), 1, "{:?}", dir_names(d.path()));
}

#[test]
fn every_command_reads_parquet() {
    let d = tmp();
    let ctf = real("atis/atis.test.ctf");
    let pq = d.path().join("a.parquet");
    run(args!["convert", &ctf, &pq, "--quiet", &ATIS, "--row-group-size", "50"]).code(0);
    run(args!["validate", &pq]).code(0).err_has("Parquet").err_has("valid");
    let j = run(args!["inspect", &pq, "--json"]);
    j.code(0);
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["format"], "parquet");
    let names: Vec<&str> = v["streams"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["query", "intent", "slots"]);
    let c = run(args!["inspect", &ctf]);
    c.code(0);
    let sequences = v["sequences"].as_u64().unwrap();
    assert!(c.stdout().contains(&format!("sequences  {sequences} ")), "{}", c.stdout());
    run(args!["inspect", &pq]).code(0).out_has("Parquet in cntkio's Arrow mapping version 1");
    // Minibatches in file order are those of the original.
    let a = run(args!["batches", &ctf, &ATIS, "--mb-size", "64"]);
    let b = run(args!["batches", &pq, "--mb-size", "64"]);
    a.code(0);
    b.code(0);
    assert_eq!(a.stdout, b.stdout);
    // Randomized, they run (chunks differ, so the order may too) and deliver every sequence once.
    run(args!["batches", &pq, "--mb-size", "64", "--randomize", "--seed", "3"]).code(0);
    // An output of no known format, from Parquet.
    run(args!["convert", &pq, &d.path().join("x.out")]).code(2).err_has(".ctf");
    run(args!["convert", &ctf, &d.path().join("y.cbf"), &ATIS, "--flatten"]).code(2).err_has("--flatten");
}

#[test]
fn damaged_and_foreign_files_are_input_errors() {
    let d = tmp();
    let bad = write(d.path(), "bad.parquet", b"PAR1 not really parquet PAR1");
    run(args!["dump", &bad]).code(1).err_has("E0102");
    run(args!["validate", &bad]).code(1).err_has("E0102");
    run(args!["inspect", &bad]).code(1).err_has("E0102");
    let out = d.path().join("out.ctf");
    run(args!["convert", &bad, &out]).code(1).err_has("E0102");
    assert!(!out.exists());
}
