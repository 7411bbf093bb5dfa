//! The CBF writer's per-chunk work on checked data, in memory: the record encoder as the conversion's
//! staging thread runs it (sparse rows of 25-35 entries, the sparse benchmark file's shape, a run of
//! records at a time into 2 MiB pieces) and the structural check of a parsed chunk.
//! `cargo bench -p cntkio-core --bench encode`.
#![allow(missing_docs)] // criterion's macros generate undocumented functions

use cntkio_core::internal::{check_parsed_chunk_fast, encode_checked_records_to};
use cntkio_core::schema::{ElementType, StorageFormat};
use cntkio_core::{ChunkData, Layout, StreamData, Values};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn sparse_rows(rows: usize) -> StreamData {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut d = StreamData::new(StorageFormat::Sparse, 100_000, ElementType::F32);
    for r in 0..rows {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = 25 + (x % 11) as usize;
        if let (Layout::Sparse { indices, sample_offsets }, Values::F32(v)) = (&mut d.layout, &mut d.values) {
            for k in 0..n {
                indices.push((((x >> 20) as usize + k * 3001) % 100_000) as i32);
                v.push(1.0);
            }
            sample_offsets.push(indices.len() as u64);
        }
        d.sequence_offsets.push(r as u64 + 1);
    }
    d
}

fn benches(c: &mut Criterion) {
    let rows = 100_000;
    let d = sparse_rows(rows);
    let mut dst = vec![0u8; 64 << 20];
    let mut g = c.benchmark_group("cbf");
    let (_, bytes) = encode_checked_records_to(&d, 0..rows, &mut dst).expect("encodes");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("encode_sparse_rows", |b| {
        b.iter(|| {
            // In 2 MiB pieces, as into staging buffers.
            let (mut s, mut at) = (0, 0);
            while s < rows {
                let end = (at + (2 << 20)).min(dst.len());
                let (k, n) = encode_checked_records_to(&d, s..rows, &mut dst[at..end]).expect("encodes");
                s += k;
                at += n;
                if k == 0 {
                    at = end;
                }
            }
            at
        })
    });
    // The check the writer makes of every parsed chunk before taking it (the labels stream beside).
    let mut chunk = ChunkData {
        keys: (0..rows as u64).collect(),
        num_samples: std::iter::repeat_n(1, rows).collect(),
        streams: vec![d],
    };
    let mut labels = sparse_rows(rows);
    labels.dim = 100_000;
    chunk.streams.push(labels);
    g.throughput(Throughput::Elements(rows as u64));
    g.bench_function("check_parsed_chunk", |b| b.iter(|| check_parsed_chunk_fast(&chunk)));
    g.finish();
}

criterion_group!(encode, benches);
criterion_main!(encode);
