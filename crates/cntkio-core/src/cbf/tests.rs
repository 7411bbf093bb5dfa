use super::*;
use crate::ctf::parse::{parse_bytes, FailFast};
use crate::data::{Layout, StreamData, Values};
use crate::schema::{StorageFormat, StreamSpec};

/// CBF.md §6.2: the complete 178-byte file.
pub(crate) const EXAMPLE_178: &str = "\
6e69625f6b746e6301000000020000000100000002000000030000000000003f\
000000400000803f010000000300000002000000020000000100000001000000\
01000000000080bf0000000001000000010000000000803f0000004001000000\
00004040000080406e69625f6b746e6301000000020000000108000000666561\
7475726573000400000000060000006c6162656c7300020000000c0000000000\
000002000000030000006800000000000000";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn schema() -> Schema {
    Schema::new(vec![
        StreamSpec::new("features", 4, StorageFormat::Sparse).alias("x"),
        StreamSpec::new("labels", 2, StorageFormat::Dense).alias("y"),
    ])
    .unwrap()
}

/// Sorts each sparse sample's entries by index (stable), as ctf2bin.py does.
fn sort_sparse(d: &mut ChunkData) {
    for s in &mut d.streams {
        if let (Layout::Sparse { indices, sample_offsets }, Values::F32(v)) = (&mut s.layout, &mut s.values) {
            for w in sample_offsets.windows(2) {
                let (a, b) = (w[0] as usize, w[1] as usize);
                let mut e: Vec<(i32, f32)> = indices[a..b].iter().copied().zip(v[a..b].iter().copied()).collect();
                e.sort_by_key(|p| p.0);
                for (k, (i, x)) in e.into_iter().enumerate() {
                    indices[a + k] = i;
                    v[a + k] = x;
                }
            }
        }
    }
}

#[test]
fn example_178_bytes() {
    let expected = unhex(EXAMPLE_178);
    assert_eq!(expected.len(), 178);
    let mut data =
        parse_bytes(b"0 |x 3:2 1:0.5 |y 1 2\n0 |x 2:1\n1 |x 0:-1 |y 3 4\n", &schema(), false, &mut FailFast).unwrap();
    sort_sparse(&mut data);
    let file = encode_file(&StreamHeader::from_schema(&schema()), std::slice::from_ref(&data)).unwrap();
    assert_eq!(file, expected);

    let (h, chunks) = decode_file(&file, &Limits::default()).unwrap();
    assert_eq!(h.header_offset(), 104);
    assert_eq!(h.chunks(), &[ChunkEntry { offset: 12, num_sequences: 2, num_samples: 3 }]);
    assert_eq!(h.streams()[0].name, "features");
    assert_eq!(h.chunk_range(0), Some(12..104));
    assert_eq!(chunks[0], data);
}

#[test]
fn unsorted_entries_stay_in_file_order() {
    let data = parse_bytes(b"0 |x 3:2 1:0.5 |y 1 2\n", &schema(), false, &mut FailFast).unwrap();
    let file = encode_file(&StreamHeader::from_schema(&schema()), std::slice::from_ref(&data)).unwrap();
    let (_, chunks) = decode_file(&file, &Limits::default()).unwrap();
    let Layout::Sparse { indices, .. } = &chunks[0].streams[0].layout else { panic!() };
    assert_eq!(indices, &[3, 1]);
}

#[test]
fn header_errors_name_their_field() {
    let good = unhex(EXAMPLE_178);
    let field = |f: &[u8]| match Header::from_file_bytes(f, &Limits::default()).unwrap_err().into_kind() {
        ErrorKind::CbfFormat { field, .. } => field,
        ErrorKind::Limit { what, .. } => what,
        k => panic!("{k:?}"),
    };
    let mut f = good.clone();
    f[0] ^= 1;
    assert_eq!(field(&f), "magic");
    let mut f = good.clone();
    f[8] = 2;
    assert_eq!(field(&f), "version");
    let mut f = good.clone();
    f[170] = 0x69;
    assert_eq!(field(&f), "header sentinel");
    let mut f = good.clone();
    f[170..178].copy_from_slice(&(-5i64).to_le_bytes());
    assert_eq!(field(&f), "header offset");
    assert_eq!(field(&good[..30]), "file length");
}

#[test]
fn empty_file_and_zero_chunks() {
    let file = encode_file(&StreamHeader::from_schema(&schema()), &[]).unwrap();
    let (h, chunks) = decode_file(&file, &Limits::default()).unwrap();
    assert!(chunks.is_empty());
    assert_eq!(h.num_sequences(), 0);
}

#[test]
fn convert_and_precision() {
    let data = parse_bytes(b"0 |x 1:0.1 |y 1 2\n", &schema(), false, &mut FailFast).unwrap();
    let file = encode_file(&StreamHeader::from_schema(&schema()), &[data]).unwrap();
    let (h, mut chunks) = decode_file(&file, &Limits::default()).unwrap();
    assert!(h.check_precision(ElementType::F32).is_ok());
    assert!(h.check_precision(ElementType::F64).is_err());
    convert_element_type(&mut chunks[0], ElementType::F64);
    assert_eq!(chunks[0].streams[0].values, Values::F64(vec![f64::from(0.1f32)]));
}

#[test]
fn renames() {
    let file = unhex(EXAMPLE_178);
    let mut h = Header::from_file_bytes(&file, &Limits::default()).unwrap();
    let unused = h.rename(&[("labels".into(), "y".into()), ("nope".into(), "z".into())]).unwrap();
    assert_eq!(unused, vec![("nope".to_string(), "z".to_string())]);
    assert_eq!(h.streams()[1].name, "y");
    assert!(h.rename(&[("y".into(), "features".into())]).is_err());
}

/// `check_chunk_fast` on sparse indices: true only when every sequence passes `check_sequence`, and
/// false for any index outside `[0, dim)` (negative, `dim`, the `i32` extremes), whatever the dim (up to
/// and past 2^31 and 2^32, where the 32-bit test must not wrap).
#[test]
fn check_chunk_fast_agrees_with_check_sequence_on_sparse_indices() {
    let mut r = crate::test_rng::Rng(0x9E37_79B9_7F4A_7C15);
    let mut rnd = move |n: u64| r.below(n);
    let dims: [usize; 7] = [1, 7, 100_000, (1 << 31) - 1, 1 << 31, (1 << 32) + 5, usize::MAX];
    for case in 0..2000 {
        let dim = dims[case % dims.len()];
        let mut d = StreamData::new(StorageFormat::Sparse, dim, ElementType::F32);
        let mut data = ChunkData::default();
        let seqs = 1 + rnd(4) as usize;
        let mut bad = false;
        if let (Layout::Sparse { indices, sample_offsets }, Values::F32(v)) = (&mut d.layout, &mut d.values) {
            for s in 0..seqs {
                for _ in 0..1 + rnd(3) {
                    for _ in 0..rnd(20) {
                        let i: i64 = match rnd(12) {
                            0 => -1,
                            1 => i64::from(i32::MIN),
                            2 => i64::from(i32::MAX),
                            3 => dim.min(i32::MAX as usize + 1) as i64,
                            _ => rnd(dim.min(i32::MAX as usize) as u64) as i64,
                        };
                        let i = i32::try_from(i).unwrap_or(i32::MAX);
                        bad |= i < 0 || i as i64 >= dim.min(i64::MAX as usize) as i64;
                        indices.push(i);
                        v.push(1.0);
                    }
                    sample_offsets.push(indices.len() as u64);
                }
                d.sequence_offsets.push((sample_offsets.len() - 1) as u64);
                data.keys.push(s as u64);
                data.num_samples.push(1);
            }
        }
        data.streams.push(d);
        let each = (0..seqs).all(|s| check_sequence(&data, s).is_ok());
        let fast = check_chunk_fast(&data);
        assert_eq!(each, !bad, "case {case}, dim {dim}");
        assert_eq!(fast, each, "case {case}, dim {dim}");
    }
}

/// A dense stream of dim 0 takes no bytes a sample, so its records could claim any number of samples in
/// four bytes; the decoder allows at most one sample a byte of the chunk.
#[test]
fn dense_dim_0_records_count_at_most_a_sample_a_byte_of_their_chunk() {
    let y = Schema::new(vec![StreamSpec::new("y", 1, StorageFormat::Dense)]).unwrap();
    let file = |n: u64| {
        let mut data = parse_bytes(b"0 |y 1\n", &y, false, &mut FailFast).unwrap();
        let mut empty = StreamData::new(StorageFormat::Dense, 0, ElementType::F32);
        empty.sequence_offsets.push(n);
        data.streams.insert(0, empty);
        let mut headers = StreamHeader::from_schema(&y);
        headers.insert(
            0,
            StreamHeader { name: "x".into(), format: StorageFormat::Dense, element_type: ElementType::F32, dim: 0 },
        );
        encode_file(&headers, &[data]).unwrap()
    };
    // The chunk: a meta count, the dim-0 record (4 bytes) and y's (8 bytes), then the header (read with it).
    let (h, _) = decode_file(&file(3), &Limits::default()).unwrap();
    let chunk_len = {
        let r = h.chunk_range(0).unwrap();
        r.end - r.start
    };
    let (_, chunks) = decode_file(&file(chunk_len), &Limits::default()).unwrap();
    assert_eq!(chunks[0].streams[0].sequence_offsets, vec![0, chunk_len]);
    let err = decode_file(&file(chunk_len + 1), &Limits::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("dense stream of dim 0") && msg.contains(&format!("{} more samples", chunk_len + 1)), "{msg}");
    let err = decode_file(&file(u32::MAX.into()), &Limits::default()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CbfFormat { .. }), "{err:?}");
}
