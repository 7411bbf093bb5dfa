//! Typed errors through the public API: each kind carries its data in fields, a stable code and the
//! category (whose fault) that the code's first digit names — format E0, usage E1, I/O E2, limit E3, bug E9.

mod common;

use cntkio::cbf::{CbfFile, CbfWriter};
use cntkio::randomize::{ChunkInfo, SequenceEnumerator, SequenceInfo, SequenceSource};
use cntkio::source::{Deserializer, MinibatchConfig, MinibatchSource, MultiSource, SourceState};
use cntkio::{Category, ChunkData, CtfOptions, CtfReader, Error, ErrorKind, Schema, StorageFormat, StreamSpec};
use common::Mem;
use std::sync::Arc;

/// The error's code and category, checked against each other.
fn code(e: &Error) -> (&'static str, Category) {
    let digit = match e.category() {
        Category::Format => '0',
        Category::Usage => '1',
        Category::Io => '2',
        Category::Limit => '3',
        Category::Internal => '9',
    };
    assert_eq!(e.code().chars().nth(1), Some(digit), "{e}");
    (e.code(), e.category())
}

fn schema() -> Schema {
    Schema::new(vec![StreamSpec::new("x", 2, StorageFormat::Dense)]).unwrap()
}

#[test]
fn a_chunk_that_does_not_exist_is_the_callers_error() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.ctf");
    std::fs::write(&p, "0 |x 1 2\n1 |x 3 4\n").unwrap();
    let r = CtfReader::open(&p, &schema(), &CtfOptions::default()).unwrap();
    let e = r.load_chunk(7).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::ChunkOutOfRange { chunk: 7, num_chunks: 1 }), "{e:?}");
    assert_eq!(code(&e), ("E1008", Category::Usage));
    assert_eq!(e.kind().to_string(), "chunk 7 does not exist; the data has 1 chunks");
    assert_eq!(e.kind().name(), "ChunkOutOfRange");
}

#[test]
fn writers_refuse_inconsistent_data_and_missing_sequences() {
    let d = tempfile::tempdir().unwrap();
    let mut w = CbfWriter::create(d.path().join("o.cbf"), &schema(), 1 << 20).unwrap();
    let data = ChunkData::new(&schema());
    let e = w.write_sequence(&data, 3).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::SequenceOutOfRange { sequence: 3, num_sequences: 0 }), "{e:?}");
    assert_eq!(code(&e), ("E1009", Category::Usage));

    // Keys without sample counts: the data handed in contradicts itself.
    let mut bad = ChunkData::new(&schema());
    bad.keys.push(0);
    let e = w.write(&bad).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidChunkData { sequence: None, .. }), "{e:?}");
    assert_eq!(code(&e), ("E1011", Category::Usage));
    let e = cntkio_core::cbf::encode_chunk(&bad, &mut Vec::new()).unwrap_err();
    assert_eq!(code(&e), ("E1011", Category::Usage));
    assert_eq!(e.kind().to_string(), "chunk data: 1 keys but 0 sample counts");

    // The same key twice in a row would merge two sequences in CTF.
    let mut twice = ChunkData::new(&schema());
    for _ in 0..2 {
        twice.keys.push(5);
        twice.num_samples.push(1);
        let s = &mut twice.streams[0];
        s.values.push_f64(1.0);
        s.values.push_f64(2.0);
        let last = *s.sequence_offsets.last().unwrap();
        s.sequence_offsets.push(last + 1);
    }
    let e = cntkio_core::ctf::write::write_chunk(&twice, &schema(), &mut Vec::new()).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidChunkData { sequence: Some(1), .. }), "{e:?}");
    assert_eq!(e.position().sequence_id, Some(5));
}

#[test]
fn shards_with_other_streams_are_refused_with_both_lists() {
    let a: Arc<dyn Deserializer> = Arc::new(Mem::new(vec![vec![1]]));
    let mut other = Mem::new(vec![vec![1]]);
    other.streams = vec![StreamSpec::new("b", 3, StorageFormat::Sparse)];
    let e = MultiSource::new(vec![a, Arc::new(other)]).expect_err("refused");
    match e.kind() {
        ErrorKind::StreamsDiffer { part, streams, first } => {
            assert_eq!(*part, 2);
            assert!(streams.contains('b') && first.contains('a'), "{e}");
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(code(&e), ("E1012", Category::Usage));
}

#[test]
fn a_state_that_does_not_fit_is_a_state_error() {
    let e = SourceState::from_json("{}").unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidState { .. }), "{e:?}");
    assert_eq!(code(&e), ("E1007", Category::Usage));
    assert!(e.to_string().contains("not a minibatch source state"), "{e}");

    let mut src = MinibatchSource::new(Arc::new(Mem::new(vec![vec![1, 2]])), MinibatchConfig::default()).unwrap();
    let mut state = src.state();
    let other = MinibatchSource::new(Arc::new(Mem::new(vec![vec![1, 2, 3]])), MinibatchConfig::default()).unwrap();
    state.sweep_size = other.state().sweep_size;
    let e = src.restore(&state).unwrap_err();
    assert_eq!(code(&e), ("E1007", Category::Usage));
    assert!(e.to_string().contains("samples per sweep"), "{e}");
}

#[test]
fn options_name_their_key() {
    let c = MinibatchConfig { frame_mode: true, truncation_length: 2, ..MinibatchConfig::default() };
    let e = MinibatchSource::new(Arc::new(Mem::new(vec![vec![1]])), c).expect_err("refused");
    match e.kind() {
        ErrorKind::InvalidOption { key, value: None, problem } => {
            assert_eq!(key, "truncation_length");
            assert!(problem.contains("mutually exclusive"), "{e}");
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(code(&e), ("E1006", Category::Usage));
    let c = MinibatchConfig { workers: 2, rank: 5, ..MinibatchConfig::default() };
    let e = MinibatchSource::new(Arc::new(Mem::new(vec![vec![1]])), c).expect_err("refused");
    assert!(matches!(e.kind(), ErrorKind::WorkerOutOfRange { rank: 5, workers: 2 }), "{e:?}");
    assert_eq!(code(&e), ("E1010", Category::Usage));
}

#[test]
fn a_chunk_table_that_lies_about_its_sequences_is_a_data_error() {
    /// Declares two sequences in its only chunk and lists one.
    struct Lying(Mem);
    impl SequenceSource for Lying {
        fn chunks(&self) -> &[ChunkInfo] {
            &self.0.chunks
        }
        fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
            self.0.sequences(chunk, out)?;
            out.pop();
            Ok(())
        }
    }
    let e = cntkio::randomize::NoRandomizer::new(Lying(Mem::new(vec![vec![1, 1]])))
        .and_then(|mut r| {
            r.start_epoch(&cntkio::randomize::EpochConfig::default())?;
            r.get_next(10, 10)
        })
        .expect_err("refused");
    assert!(matches!(e.kind(), ErrorKind::ChunkSequenceCount { chunk: 0, declared: 2, found: 1 }), "{e:?}");
    assert_eq!(code(&e), ("E0028", Category::Format));
}

#[test]
fn a_panicking_deserializer_is_reported_as_a_bug() {
    /// Panics on every load.
    struct Panics(Mem);
    impl SequenceSource for Panics {
        fn chunks(&self) -> &[ChunkInfo] {
            &self.0.chunks
        }
        fn sequences(&self, chunk: u32, out: &mut Vec<SequenceInfo>) -> Result<(), Error> {
            self.0.sequences(chunk, out)
        }
    }
    impl Deserializer for Panics {
        fn streams(&self) -> &[StreamSpec] {
            &self.0.streams
        }
        fn load_chunk(&self, _: u32) -> Result<Arc<ChunkData>, Error> {
            panic!("deliberately")
        }
    }
    let mut src = MinibatchSource::new(Arc::new(Panics(Mem::new(vec![vec![1]]))), MinibatchConfig::default()).unwrap();
    let e = src.next_minibatch(1).expect_err("a panic is an error");
    assert!(matches!(e.kind(), ErrorKind::Internal { .. }), "{e:?}");
    assert_eq!(code(&e), ("E9001", Category::Internal));
    assert!(e.to_string().contains("loading chunk 0 panicked: deliberately"), "{e}");
    assert!(e.to_string().contains("this is a bug in cntkio, please report it"), "{e}");
}

#[test]
fn cbf_format_errors_carry_the_number_found_and_the_range_expected() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("a.cbf");
    let mut w = CbfWriter::create(&p, &schema(), 1 << 20).unwrap();
    let mut data = ChunkData::new(&schema());
    data.keys.push(0);
    data.num_samples.push(1);
    data.streams[0].values.push_f64(1.0);
    data.streams[0].values.push_f64(2.0);
    data.streams[0].sequence_offsets.push(1);
    w.write(&data).unwrap();
    w.finish().unwrap();
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[8] = 7; // the version
    std::fs::write(&p, &bytes).unwrap();
    let e = CbfFile::open(&p).expect_err("refused");
    match e.kind() {
        ErrorKind::CbfFormat { field, offset: 8, found: Some(7), expected: Some(r), .. } => {
            assert_eq!((field.as_str(), r.clone()), ("version", 1..=1));
        }
        k => panic!("{k:?}"),
    }
    assert_eq!(code(&e), ("E0100", Category::Format));
}
