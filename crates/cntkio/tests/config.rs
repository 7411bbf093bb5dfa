//! Reading reader sections of CNTK BrainScript configs: the conformance configs of CNTK's reader tests
//! (`testdata/cntk/Config/`, checked against the test table of `testdata/cntk/INDEX.md`),
//! and error cases.

mod common;

use cntkio::config::{
    brainscript, load_reader_config, load_reader_config_file, reader_sections, DeserializerConfig, Randomization,
    ReaderConfig, ReaderKind, RANDOMIZE_AUTO,
};
use cntkio::{ElementType, Error, StorageFormat};
use std::path::{Path, PathBuf};

const DENSE: &str = "CNTKTextFormatReader/dense.cntk";
const SPARSE: &str = "CNTKTextFormatReader/sparse.cntk";
const EDGE: &str = "CNTKTextFormatReader/edge_cases.cntk";
const BINARY: &str = "CNTKBinaryReader/test.cntk";

/// `testdata/cntk/Config`: the configs of CNTK's reader tests.
fn config_dir() -> PathBuf {
    common::testdata::cntk_dir().join("Config")
}

fn def_mb_size() -> Vec<(String, String)> {
    vec![("defMBSize".to_string(), "true".to_string())]
}

fn load(file: &str, section: &str, overrides: &[(String, String)]) -> ReaderConfig {
    load_reader_config_file(config_dir().join(file), Some(section), overrides, None)
        .unwrap_or_else(|e| panic!("{file} [{section}]: {e}"))
}

/// One stream as the INDEX.md table writes it: input name, alias, dim, format, definesMBSize.
type Stream<'a> = (&'a str, &'a str, usize, StorageFormat, bool);

fn ctf(d: &DeserializerConfig) -> (&str, &cntkio::Schema, &cntkio::CtfOptions) {
    match d {
        DeserializerConfig::Ctf { file, schema, options, .. } => (file, schema, options),
        other => panic!("expected a CTF deserializer, got {other:?}"),
    }
}

fn assert_streams(d: &DeserializerConfig, precision: ElementType, expected: &[Stream<'_>]) {
    let (_, schema, _) = ctf(d);
    let got: Vec<Stream<'_>> = schema
        .streams()
        .iter()
        .map(|s| (s.name.as_str(), s.alias.as_str(), s.dim, s.format, s.defines_mb_size))
        .collect();
    assert_eq!(got, expected);
    assert!(schema.streams().iter().all(|s| s.element_type == precision));
}

use StorageFormat::{Dense as D, Sparse as S};

#[test]
fn every_conformance_section_loads_with_and_without_def_mb_size() {
    let dir = config_dir();
    let mut count = 0;
    for file in [DENSE, SPARSE, EDGE, BINARY] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let root = brainscript::parse(&text).unwrap();
        assert!(root.first_problem().is_none(), "{file}: {:?}", root.first_problem());
        let sections = reader_sections(&root);
        assert!(!sections.is_empty(), "{file}");
        for section in &sections {
            let plain = load(file, section, &[]);
            let with = load(file, section, &def_mb_size());
            assert!(plain.warnings.is_empty(), "{file} [{section}]: {:?}", plain.warnings);
            assert_eq!(plain.deserializers.len(), with.deserializers.len());
            // `$defMBSize$` follows the command line; without it, the file's `defMbSize=false` applies.
            let body = text.split(&format!("\n{section} = [")).nth(1).unwrap().split("\n]\n").next().unwrap();
            let uses_var = body.contains("$defMBSize$");
            for (p, w) in plain.deserializers.iter().zip(&with.deserializers) {
                if let (DeserializerConfig::Ctf { schema: ps, .. }, DeserializerConfig::Ctf { schema: ws, .. }) = (p, w)
                {
                    assert_eq!(ps.main_stream(), None, "{file} [{section}]");
                    assert_eq!(ws.main_stream().is_some(), uses_var, "{file} [{section}]");
                }
            }
            count += 1;
        }
    }
    // dense.cntk 14, sparse.cntk 8, edge_cases.cntk 7, test.cntk 8 sections.
    assert_eq!(count, 37);
}

#[test]
fn dense_sections_match_the_test_table() {
    let dir = config_dir();
    let data = dir.join("CNTKTextFormatReader");

    let c = load(DENSE, "Simple", &def_mb_size());
    assert_eq!(c.section, "Simple.reader");
    assert_eq!(c.kind, ReaderKind::LegacyCtf);
    assert_eq!(c.legacy_reader.as_deref(), Some("CNTKTextFormatReader"));
    assert_eq!(c.precision, ElementType::F32);
    assert!(!c.randomize);
    assert_eq!(c.randomization, Randomization::Off);
    assert_eq!(c.deserializers.len(), 1);
    assert_streams(
        &c.deserializers[0],
        ElementType::F32,
        &[("features", "F", 2, D, true), ("labels", "L", 2, D, false)],
    );
    assert_eq!(c.deserializers[0].file(), "Simple_dense.txt");
    assert_eq!(c.deserializers[0].path(), data.join("Simple_dense.txt"));

    let c = load(DENSE, "Simple_single_stream", &def_mb_size());
    assert_eq!(c.trace_level, 0);
    assert_eq!(ctf(&c.deserializers[0]).2.trace_level, 0);
    assert_streams(&c.deserializers[0], ElementType::F32, &[("features", "F", 2, D, true)]);

    let c = load(DENSE, "MNIST", &def_mb_size());
    assert_eq!(c.precision, ElementType::F64);
    assert_streams(
        &c.deserializers[0],
        ElementType::F64,
        &[("features", "F", 784, D, false), ("labels", "L", 10, D, true)],
    );
    let (_, _, o) = ctf(&c.deserializers[0]);
    assert_eq!((o.chunk_size, o.keep_data_in_memory, o.max_errors), (10000, true, 0));
    assert!(c.keep_data_in_memory);
    assert_eq!(c.randomization, Randomization::Off);

    let c = load(DENSE, "1x1", &[]);
    assert_eq!(c.precision, ElementType::F64);
    assert!(c.randomize);
    assert_eq!(c.randomization, Randomization::Chunks(128)); // 4 GiB / 32 MiB
    assert_streams(&c.deserializers[0], ElementType::F64, &[("features", "F", 10000, D, false)]);

    let c = load(DENSE, "10x1_MI", &def_mb_size());
    assert_eq!(c.randomization, Randomization::Chunks((4u64 << 30) / 50000));
    assert_streams(
        &c.deserializers[0],
        ElementType::F32,
        &[
            ("features1", "F1", 1, D, true),
            ("features2", "F2", 10, D, false),
            ("features3", "F3", 100, D, false),
            ("features4", "F4", 1000, D, false),
            ("labels1", "L1", 1, D, false),
            ("labels2", "L2", 10, D, false),
            ("labels3", "L3", 100, D, false),
        ],
    );

    let c = load(DENSE, "100x1", &def_mb_size());
    assert_eq!(c.randomization, Randomization::Chunks((4u64 << 30) / 10000));
    assert_streams(
        &c.deserializers[0],
        ElementType::F64,
        &[("features", "F", 100, D, false), ("labels", "L", 100, D, true)],
    );

    let c = load(DENSE, "50x20_jagged_sequences", &def_mb_size());
    assert_streams(&c.deserializers[0], ElementType::F64, &[("features", "F0", 3, D, true)]);
    assert_eq!(c.randomization, Randomization::Off);
}

#[test]
fn sparse_and_edge_sections_match_the_test_table() {
    let c = load(SPARSE, "1x1", &def_mb_size());
    assert_streams(&c.deserializers[0], ElementType::F32, &[("features", "F0", 10000, S, true)]);
    let c = load(SPARSE, "10x10", &def_mb_size());
    assert_streams(&c.deserializers[0], ElementType::F64, &[("features", "F0", 100, S, true)]);
    assert_eq!(c.randomization, Randomization::Off);
    let c = load(SPARSE, "3x5_MI", &def_mb_size());
    assert_streams(
        &c.deserializers[0],
        ElementType::F32,
        &[("features1", "F0", 2, S, true), ("features2", "F1", 20, S, false), ("features3", "F2", 200, S, false)],
    );
    let c = load(SPARSE, "100x100_jagged", &[]);
    assert_streams(&c.deserializers[0], ElementType::F32, &[("features", "F0", 20, S, false)]);

    let c = load(EDGE, "space_separated", &def_mb_size());
    assert!(c.randomize); // the section does not set it
    assert_eq!(c.randomization, Randomization::Chunks(128));
    assert_streams(
        &c.deserializers[0],
        ElementType::F64,
        &[("features1", "F1", 15, D, true), ("features2", "F2", 12, D, false), ("features3", "F3", 1, D, false)],
    );
    let c = load(EDGE, "missing_trailing_newline", &[]);
    assert_streams(&c.deserializers[0], ElementType::F64, &[("features", "features", 1, D, false)]);
    let c = load(EDGE, "blank_lines", &def_mb_size());
    assert!(ctf(&c.deserializers[0]).2.skip_sequence_ids);
    let c = load(EDGE, "blank_lines_ignored", &[]);
    assert_eq!(ctf(&c.deserializers[0]).2.max_errors, 2);
    assert!(!ctf(&c.deserializers[0]).2.skip_sequence_ids);
    assert_eq!(c.max_errors, 2);
    assert_eq!(c.randomization, Randomization::Off);
    let c = load(EDGE, "empty_samples", &def_mb_size());
    assert_streams(
        &c.deserializers[0],
        ElementType::F32,
        &[("features", "F0", 10, D, true), ("labels", "F1", 10, S, false)],
    );
    let c = load(EDGE, "ref_data_with_escape_sequences", &def_mb_size());
    assert_streams(
        &c.deserializers[0],
        ElementType::F32,
        &[("features", "F0", 100, S, true), ("labels", "F1", 3, D, false)],
    );
}

#[test]
fn composite_sections_give_their_deserializers() {
    let dir = config_dir();
    let data = dir.join("CNTKTextFormatReader");
    let c = load(DENSE, "5x10_and_5x5_jagged_composite", &def_mb_size());
    assert_eq!(c.kind, ReaderKind::Composite);
    assert_eq!(c.legacy_reader, None);
    assert_eq!(c.precision, ElementType::F64);
    assert_eq!(c.deserializers.len(), 2);
    assert_streams(&c.deserializers[0], ElementType::F64, &[("features1", "F0", 10, D, false)]);
    assert_streams(&c.deserializers[1], ElementType::F64, &[("features2", "F1", 5, D, false)]);
    assert_eq!(c.deserializers[0].path(), data.join("5x10_jagged.txt"));
    assert_eq!(c.deserializers[1].path(), data.join("5x5_jagged.txt"));
    // A CTF deserializer and no window: 4 GiB / 32 MiB chunks, not sample-based (READER.md §2).
    assert!(c.randomize);
    assert_eq!(c.randomization, Randomization::Chunks(128));
    assert!(c.local_timeline && c.check_data && c.use_numeric_sequence_keys);

    let c = load(DENSE, "5x10_and_5x5_jagged", &[]);
    assert_eq!(c.deserializers.len(), 1);
    assert_streams(
        &c.deserializers[0],
        ElementType::F64,
        &[("features1", "F0", 10, D, false), ("features2", "F1", 5, D, false)],
    );
}

#[test]
fn binary_sections_give_cbf_deserializers() {
    let dir = config_dir();
    let data = dir.join("CNTKBinaryReader");
    let cases = [
        ("Simple", "Simple_dense.bin", ElementType::F32, false),
        ("MNIST", "MNIST_dense.bin", ElementType::F64, false),
        ("10x10_dense", "10x10_dense.bin", ElementType::F32, false),
        ("50x20_jagged_sequences_dense", "50x20_jagged_sequences_dense.bin", ElementType::F64, false),
        ("10x10_sparse", "10x10_sparse.bin", ElementType::F64, false),
        ("50x20_jagged_sequences_sparse", "50x20_jagged_sequences_sparse.bin", ElementType::F32, false),
        ("100x100x3_randomize_auto", "100x100x3_jagged_sequences_dense.bin", ElementType::F64, true),
    ];
    for (section, file, precision, randomize) in cases {
        let c = load(BINARY, section, &[]);
        assert_eq!(c.kind, ReaderKind::LegacyCbf, "{section}");
        assert_eq!(c.precision, precision, "{section}");
        assert_eq!(c.randomize, randomize, "{section}");
        let expected = if randomize { Randomization::Chunks(128) } else { Randomization::Off };
        assert_eq!(c.randomization, expected, "{section}");
        let [DeserializerConfig::Cbf { file: f, path, renames, precision: p }] = c.deserializers.as_slice() else {
            panic!("{section}: {:?}", c.deserializers)
        };
        assert_eq!((f.as_str(), path.clone(), renames.len(), *p), (file, data.join(file), 0, precision));
    }
    assert!(load(BINARY, "MNIST", &[]).keep_data_in_memory);
    let c = load(BINARY, "5_inputs_100x10_jagged_mixed", &[]);
    let DeserializerConfig::Cbf { renames, .. } = &c.deserializers[0] else { panic!() };
    let expected: Vec<(String, String)> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("features{}", i + 1), a.to_string()))
        .collect();
    assert_eq!(renames, &expected);
    // No randomize key: the default is on, with the legacy CBF window of 128 chunks.
    assert_eq!(c.randomization, Randomization::Chunks(128));
}

#[test]
fn data_dir_and_error_paths() {
    let dir = config_dir();
    let c = load_reader_config_file(dir.join(DENSE), Some("Simple"), &[], Some(Path::new("/data"))).unwrap();
    assert_eq!(c.deserializers[0].path(), Path::new("/data/Simple_dense.txt"));
    assert_eq!(c.deserializers[0].file(), "Simple_dense.txt");
    let e = load_reader_config_file(dir.join(DENSE), Some("Nope"), &[], None).unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("dense.cntk: error[E1005]: no section \"Nope\""), "{shown}");
    assert!(shown.contains("sections with a reader: 1x1, 1x2, 1x10, 10x1_MI"), "{shown}");
    let e = load_reader_config_file(dir.join(DENSE), Some("Simple"), &[("defMBSize".into(), "maybe".into())], None)
        .unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains(
            "dense.cntk:217:31: error[E1006]: Simple.reader.input.features.definesMbSize: expected a boolean"
        ),
        "{shown}"
    );
    // A key's bad value is typed: the key's dotted path in a field, its place in the position.
    match e.kind() {
        cntkio::ErrorKind::InvalidOption { key, value: None, .. } => {
            assert_eq!(key, "Simple.reader.input.features.definesMbSize")
        }
        k => panic!("{k:?}"),
    }
    assert_eq!((e.position().line, e.position().column), (Some(217), Some(31)));
    let e = load_reader_config_file(dir.join("missing.cntk"), None, &[], None).unwrap_err();
    assert!(e.is_io());
}

// ---- behaviour on small configs ------------------------------------------------------------------------

fn err(text: &str, section: Option<&str>) -> Error {
    match load_reader_config(text, section, &[]) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e,
    }
}

fn line_col(e: &Error) -> (u64, u64) {
    (e.position().line.unwrap_or(0), e.position().column.unwrap_or(0))
}

const ONE: &str = r#"
precision = "double"
train = [
    reader = [
        readerType = "CNTKTextFormatReader"
        file = "$DataDir$/train.txt"
        input = [ x = [ dim = 3 ; format = "Dense" ] ]
    ]
]
DataDir = "/data"
"#;

#[test]
fn single_section_found_and_precision_inherited() {
    let c = load_reader_config(ONE, None, &[]).unwrap();
    assert_eq!(c.section, "train.reader");
    assert_eq!(c.precision, ElementType::F64);
    assert_eq!(c.deserializers[0].file(), "/data/train.txt");
    assert_eq!(c.deserializers[0].path(), Path::new("/data/train.txt"));
    assert_eq!(c.legacy_reader.as_deref(), Some("CNTKTextFormatReader"));
    let (_, schema, options) = ctf(&c.deserializers[0]);
    assert_eq!(schema.streams()[0].alias, "x");
    assert_eq!(options, &cntkio::CtfOptions::default());
    assert!(c.raw.contains("readerType"));
    // Command-line values override top-level ones and may merge into blocks.
    let overrides = [
        ("DataDir".to_string(), "/elsewhere".to_string()),
        ("train".to_string(), "[reader=[randomize=none; maxErrors = 5]]".to_string()),
    ];
    let c = load_reader_config(ONE, Some("TRAIN"), &overrides).unwrap();
    assert_eq!(c.deserializers[0].file(), "/elsewhere/train.txt");
    assert_eq!(c.randomization, Randomization::Off);
    assert_eq!(ctf(&c.deserializers[0]).2.max_errors, 5);
    // A dotted path names the reader block directly.
    assert_eq!(load_reader_config(ONE, Some("train.reader"), &[]).unwrap().section, "train.reader");
}

#[test]
fn top_level_reader_and_section_choice() {
    let text = "reader = [ file = a.txt ; input = [ x = [ dim = 1 ; format = sparse ] ] ]\n";
    let c = load_reader_config(text, None, &[]).unwrap();
    assert_eq!(c.section, "reader");
    assert_eq!(c.legacy_reader.as_deref(), Some("Cntk.Deserializers.TextFormat"));
    let text = "a = [ reader = [ file = a.txt ] ]\nb = [ reader = [ file = b.txt ] ]\nc = [ x = 1 ]\n";
    let e = err(text, None);
    assert!(e.to_string().contains("several reader sections (a, b)"), "{e}");
    let e = err(text, Some("c"));
    assert!(e.to_string().contains("section \"c\" has no reader block; sections with a reader: a, b"), "{e}");
    assert_eq!(line_col(&e), (3, 5));
    let e = err("x = 1\n", None);
    assert!(e.to_string().contains("no reader section found"), "{e}");
}

#[test]
fn unknown_syntax_elsewhere_is_tolerated() {
    let text = r#"
command = train:test
this is not a record
include "other.cntk"
train = [
    BrainScriptNetworkBuilder = {
        model = Sequential ( DenseLayer {10, activation=ReLU} : LinearLayer {2} )
        features = Input {3} ; z = model (features)
        odd stuff here
    }
    SGD = [ learningRatesPerSample = 0.01*5:0.001 ; maxEpochs = 3 ]
    reader = [
        file = "a.txt"
        input = [ x = [ dim = 3 ; format = dense ] ]
    ]
]
"#;
    let c = load_reader_config(text, Some("train"), &[]).unwrap();
    assert_eq!(c.deserializers.len(), 1);
    // The top level's unreadable record is reported, not fatal; the one in the network builder is not
    // even looked at.
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(c.warnings[0].position.line, Some(3));
}

#[test]
fn syntax_errors_have_positions() {
    let e = err("s = [\n  reader = [\n    file = a.txt\n", None);
    assert!(e.to_string().contains("unterminated '['"), "{e}");
    assert_eq!(line_col(&e), (2, 12));
    // A problem inside the reader section is an error there.
    let e = err("s = [ reader = [ file = a.txt\n  input 3\n ] ]\n", None);
    assert!(e.to_string().contains("s.reader: expected '=' after \"input\""), "{e}");
    assert_eq!(line_col(&e), (2, 9));
}

const CTF_READER: &str = "s = [ reader = [\n  file = a.txt\n  input = [\n    INPUT\n  ]\n] ]\n";

fn with_input(input: &str) -> String {
    CTF_READER.replace("INPUT", input)
}

#[test]
fn input_errors() {
    let e = err(&with_input("x = [ format = dense ]"), None);
    assert!(e.to_string().contains("s.reader.input.x: missing \"dim\""), "{e}");
    assert_eq!(line_col(&e), (4, 5));
    let e = err(&with_input("x = [ dim = 3 ]"), None);
    assert!(e.to_string().contains("missing \"format\""), "{e}");
    let e = err(&with_input("x = [ dim = 3; format = \"dens\" ]"), None);
    assert!(e.to_string().contains("s.reader.input.x.format: must be \"dense\" or \"sparse\", found \"dens\""), "{e}");
    assert_eq!(line_col(&e), (4, 29));
    let e = err(&with_input("x = [ dim = -3; format = dense ]"), None);
    assert!(e.to_string().contains("expected a non-negative integer, found \"-3\""), "{e}");
    let e = err(
        &with_input("x = [ dim = 3; format = dense; alias = A ]\n y = [ dim = 3; format = dense; alias = A ]"),
        None,
    );
    assert_eq!(e.code(), "E1003");
    assert_eq!(line_col(&e), (5, 2));
    let two_mains =
        "x = [ dim = 3; format = dense; definesMBSize = true ]\n y = [ dim = 3; format = dense; definesMbSize = T ]";
    assert_eq!(err(&with_input(two_mains), None).code(), "E1004");
    let e = err(&with_input("x = [ dim = 3; format = dense; alias = \"\" ]"), None);
    assert!(e.to_string().contains("the alias of input \"x\" is empty"), "{e}");
    let e = err(&with_input("x = 5"), None);
    assert!(e.to_string().contains("s.reader.input.x: expected a block"), "{e}");
    let e = err(&with_input(""), None);
    assert!(e.to_string().contains("the \"input\" block is empty"), "{e}");
    let e = err("s = [ reader = [ file = a.txt ] ]", None);
    assert!(e.to_string().contains("no \"input\" block"), "{e}");
    let e = err(&with_input("x = [ dim = 2147483648; format = sparse ]"), None);
    assert_eq!(e.code(), "E1002");
    let e = err(&CTF_READER.replace("file = a.txt", "").replace("INPUT", "x = [ dim = 1; format = dense ]"), None);
    assert!(e.to_string().contains("s.reader: missing \"file\""), "{e}");
}

#[test]
fn reader_key_errors() {
    let base = with_input("x = [ dim = 1; format = dense ]");
    let with = |extra: &str| base.replace("file = a.txt", &format!("file = a.txt\n  {extra}"));
    let e = err(&with("randomize = auto"), None);
    assert!(e.to_string().contains("s.reader.randomize: expected a boolean"), "{e}");
    assert!(e.to_string().contains("\"auto\" is a config error"), "{e}");
    assert_eq!(line_col(&e), (3, 15));
    for off in ["none", "NONE", "false", "F", "0"] {
        let c = load_reader_config(&with(&format!("randomize = {off}")), None, &[]).unwrap();
        assert_eq!(c.randomization, Randomization::Off, "{off}");
    }
    let e = err(&with("randomize = tRue"), None);
    assert!(e.to_string().contains("found \"tRue\""), "{e}");
    let e = err(&with("precision = Float"), None);
    assert!(e.to_string().contains("must be written in lowercase"), "{e}");
    let e = err(&with("precision = half"), None);
    assert!(e.to_string().contains("must be \"float\" or \"double\", found \"half\""), "{e}");
    let e = err(&with("chunkSizeInBytes = 0"), None);
    assert!(e.to_string().contains("chunkSizeInBytes: must be > 0"), "{e}");
    let e = err(&with("readerType = HTKMLFReader"), None);
    assert!(e.to_string().contains("not supported by cntkio"), "{e}");
    let e = err(&with("maxErrors = $undefined$"), None);
    assert!(e.to_string().contains("undefined variable $undefined$"), "{e}");
    assert_eq!(line_col(&e), (3, 15));
    // `default` means the default.
    let c = load_reader_config(&with("randomize = default\n  chunkSizeInBytes = default"), None, &[]).unwrap();
    assert_eq!(c.randomization, Randomization::Chunks(128));
}

#[test]
fn legacy_windows_and_options() {
    let base = with_input("x = [ dim = 1; format = dense ]");
    let with = |extra: &str| {
        load_reader_config(&base.replace("file = a.txt", &format!("file = a.txt; {extra}")), None, &[]).unwrap()
    };
    assert_eq!(with("randomizationWindow = 7").randomization, Randomization::Chunks(7));
    assert_eq!(with("randomizationWindow = 0").randomization, Randomization::Off);
    let c = with("randomizationWindow = 700; sampleBasedRandomizationWindow = true; randomizationSeed = 3");
    assert_eq!(c.randomization, Randomization::Samples(700));
    assert_eq!(
        (c.randomization_window, c.sample_based_randomization_window, c.randomization_seed),
        (Some(700), Some(true), 3)
    );
    assert_eq!(with("sampleBasedRandomizationWindow = true").randomization, Randomization::Samples(RANDOMIZE_AUTO));
    let c = with("cacheIndex = true; frameMode = true; traceLevel = -1; keepDataInMemory");
    let (_, _, o) = ctf(&c.deserializers[0]);
    assert!(o.cache_index && o.frame_mode && o.keep_data_in_memory);
    assert_eq!((o.trace_level, c.trace_level), (0, 0));
    assert!(c.frame_mode);
    // Typos are warned about, with a suggestion.
    let c = with("randomise = false; numChunksToCache = 4");
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(c.warnings[0]
        .message
        .contains("unknown key \"randomise\" is ignored by CNTK; did you mean \"randomize\"?"));
    assert!(c.warnings[1].message.contains("numChunksToCache: not used"));
}

const COMPOSITE: &str = r#"
traceLevel = 2
s = [
    precision = "double"
    reader = [
        EXTRA
        deserializers = (
            [
                type = "CNTKTextFormatDeserializer" ; module = "CNTKTextFormatReader"
                file = "f.txt" ; maxErrors = 3 ; precision = "float"
                input = [ features = [ dim = 10 ; format = "dense" ; definesMBSize = true ] ]
            ] : [
                type = "CNTKTextFormatDeserializer" ; module = "CNTKTextFormatReader"
                file = "l.txt"
                input = [ labels = [ dim = 5 ; format = "sparse" ] ]
            ]
        )
    ]
]
"#;

fn composite(extra: &str) -> Result<ReaderConfig, Error> {
    load_reader_config(&COMPOSITE.replace("EXTRA", extra), None, &[])
}

#[test]
fn composite_keys() {
    let c = composite("maxErrors = 9").unwrap();
    assert_eq!(c.kind, ReaderKind::Composite);
    assert_eq!(c.max_errors, 9);
    let (_, s0, o0) = ctf(&c.deserializers[0]);
    let (_, s1, o1) = ctf(&c.deserializers[1]);
    // Deserializer blocks do not see the reader's keys (CNTK passes them without a parent)...
    assert_eq!((o0.max_errors, o1.max_errors), (3, 0));
    // ...except precision, frameMode and traceLevel, which the composite reader inserts.
    assert_eq!(s0.streams()[0].element_type, ElementType::F64);
    assert_eq!(s1.streams()[0].element_type, ElementType::F64);
    assert_eq!((o0.trace_level, o1.trace_level, c.trace_level), (2, 2, 2));
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings); // the deserializer's own precision is ignored
    assert!(c.warnings[0].message.contains("[0].precision: ignored"));
    assert_eq!(c.randomization, Randomization::Chunks(128));

    assert_eq!(composite("randomizationWindow = 1000").unwrap().randomization, Randomization::Samples(1000));
    assert_eq!(composite("chunkSizeInBytes = 1048576").unwrap().randomization, Randomization::Chunks(4096));
    let c = composite("randomizationWindow = 4; sampleBasedRandomizationWindow = false").unwrap();
    assert_eq!(c.randomization, Randomization::Chunks(4));
    let e = composite("sampleBasedRandomizationWindow = true").unwrap_err();
    assert!(e.to_string().contains("requires that the 'randomizationWindow' is explicitly specified"), "{e}");
    let c = composite("truncated = true; truncationLength = 20; rightSplice = 2").unwrap();
    assert_eq!((c.truncation_length, c.right_splice), (Some(20), 2));
    let e = composite("truncated = true").unwrap_err();
    assert!(e.to_string().contains("truncationLength: must be given and > 0"), "{e}");
    let e = composite("truncated = true; truncationLength = 5; frameMode = true").unwrap_err();
    assert!(e.to_string().contains("mutually exclusive"), "{e}");
    let c = composite("frameMode = true").unwrap();
    assert!(c.frame_mode && ctf(&c.deserializers[1]).2.frame_mode);
    let e = composite("readerType = CNTKTextFormatReader").unwrap_err();
    assert!(e.to_string().contains("cannot be combined with \"deserializers\""), "{e}");
    assert!(composite("readerType = CompositeDataReader").is_ok());
    let c = composite("randomize = none").unwrap();
    assert_eq!(c.randomization, Randomization::Off);
    assert!(c.warnings.iter().any(|w| w.message.contains("accepts only booleans")), "{:?}", c.warnings);
}

#[test]
fn composite_deserializer_errors() {
    let text = COMPOSITE.replace("EXTRA", "");
    let lower = text.replacen("\"CNTKTextFormatDeserializer\" ;", "\"cntkTextFormatDeserializer\" ;", 1);
    let e = load_reader_config(&lower, None, &[]).unwrap_err();
    assert!(e.to_string().contains("type names are case-sensitive: \"CNTKTextFormatDeserializer\""), "{e}");
    assert_eq!(line_col(&e), (9, 24));
    let e = load_reader_config(&text.replacen("; module = \"CNTKTextFormatReader\"", "", 1), None, &[]).unwrap_err();
    assert!(e.to_string().contains("s.reader.deserializers[0]: missing \"module\""), "{e}");
    // A CBF deserializer must come first.
    let cbf = text.replacen(
        "type = \"CNTKTextFormatDeserializer\" ; module = \"CNTKTextFormatReader\"\n                file = \"l.txt\"",
        "type = \"CNTKBinaryFormatDeserializer\" ; module = \"CNTKBinaryReader\"\n                file = \"l.bin\"",
        1,
    );
    let e = load_reader_config(&cbf, None, &[]).unwrap_err();
    assert!(e.to_string().contains("can only be the first (primary) one"), "{e}");
    let e = load_reader_config("s = [ reader = [ deserializers = ( ) ] ]", None, &[]).unwrap_err();
    assert!(e.to_string().contains("no deserializers"), "{e}");
}

#[test]
fn composite_cbf_and_bracket_array() {
    let text = r#"
r = [ reader = [
    randomize = false
    deserializers = [
        [ type = "CNTKBinaryFormatDeserializer"; module = "CNTKBinaryReader"; file = "d.bin"
          input = [ feats = [ alias = "features" ] ; labels = [ dim = 3 ] ] ]
        [ type = "CNTKTextFormatDeserializer"; module = "CNTKTextFormatReader"; file = "e.txt"
          input = [ extra = [ dim = 2 ; format = dense ] ] ]
    ]
] ]
"#;
    let c = load_reader_config(text, None, &[]).unwrap();
    assert_eq!(c.deserializers.len(), 2);
    let DeserializerConfig::Cbf { renames, precision, .. } = &c.deserializers[0] else { panic!() };
    assert_eq!(renames, &[("feats".to_string(), "features".to_string())]);
    assert_eq!(*precision, ElementType::F32);
    assert_eq!(c.randomization, Randomization::Off);
}

#[test]
fn binary_reader_keys() {
    let text = "t = [ precision = double\n reader = [ readerType = CNTKBinaryReader ; file = x.bin\n input = [ a = [ alias = n ] ; b = [ alias = n ] ] ] ]\n";
    let e = load_reader_config(text, None, &[]).unwrap_err();
    assert_eq!(e.code(), "E1003");
    assert_eq!(line_col(&e), (3, 46));
    let text = "t = [ reader = [ readerType = CNTKBinaryReader ; file = x.bin ; frameMode = true ; randomizationWindow = 9 ] ]";
    let c = load_reader_config(text, None, &[]).unwrap();
    assert_eq!(c.randomization, Randomization::Chunks(9));
    assert!(!c.frame_mode);
    assert_eq!(c.warnings.len(), 1);
    assert!(c.warnings[0].message.contains("frameMode is ignored"));
}
