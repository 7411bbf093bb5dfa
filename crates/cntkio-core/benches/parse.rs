//! Parser throughput on the real files of `testdata/real` and on generated files shaped like the
//! issue's benchmark data (in memory: no I/O). `cargo bench -p cntkio-core`.
#![allow(missing_docs)] // criterion's macros generate undocumented functions

use cntkio_core::ctf::index::index_bytes;
use cntkio_core::ctf::parse::{CtfParser, FailFast};
use cntkio_core::{ChunkData, Schema, StorageFormat, StreamSpec};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[path = "../../cntkio/tests/common/testdata.rs"]
mod testdata;

fn s(name: &str, alias: &str, dim: usize, sparse: bool) -> StreamSpec {
    StreamSpec::new(name, dim, if sparse { StorageFormat::Sparse } else { StorageFormat::Dense }).alias(alias)
}

/// Deterministic generator (xorshift) of the files: dense = 100 floats of 6 significant digits and
/// a one-hot label of 10 per line; sparse = ~30 `index:1` pairs in dim 100000 and a `k:1` label.
fn generated(dense: bool, bytes: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(bytes + 4096);
    while out.len() < bytes {
        if dense {
            out.extend_from_slice(b"|features");
            for _ in 0..100 {
                let v = (next() % 2_000_000) as f64 / 1e5 - 10.0;
                out.extend_from_slice(format!(" {}", format_g6(v)).as_bytes());
            }
            let k = next() % 10;
            out.extend_from_slice(b" |labels");
            for i in 0..10 {
                out.extend_from_slice(if i == k { b" 1" } else { b" 0" });
            }
        } else {
            out.extend_from_slice(b"|features");
            let n = 25 + next() % 11;
            let mut idx: Vec<u64> = (0..n).map(|_| next() % 100_000).collect();
            idx.sort_unstable();
            for i in idx {
                out.extend_from_slice(format!(" {i}:1").as_bytes());
            }
            out.extend_from_slice(format!(" |labels {}:1", next() % 10).as_bytes());
        }
        out.push(b'\n');
    }
    out
}

/// Up to 6 significant digits, as `%g` writes them for values of this range.
fn format_g6(v: f64) -> String {
    format!("{}", (v * 1e5).round() / 1e5)
}

fn bench_file(c: &mut Criterion, name: &str, data: &[u8], schema: Schema, skip_ids: bool) {
    let main = schema.main_stream().map(|i| schema.streams()[i].alias.clone());
    let chunks = index_bytes(data, skip_ids, main.as_deref(), 32 << 20).expect("indexes");
    let parser = CtfParser::new(&schema);
    let mut g = c.benchmark_group("ctf");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_function(name, |b| {
        let mut out = ChunkData::new(&schema);
        b.iter(|| {
            out.clear();
            for ch in &chunks {
                parser.parse_sequences(data, 0, &ch.sequences, &mut out, &mut FailFast).expect("parses");
            }
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let dense = generated(true, 64 << 20);
    bench_file(
        c,
        "generated_dense_64MB",
        &dense,
        Schema::new(vec![s("f", "features", 100, false), s("l", "labels", 10, false)]).unwrap(),
        false,
    );
    let sparse = generated(false, 64 << 20);
    bench_file(
        c,
        "generated_sparse_64MB",
        &sparse,
        Schema::new(vec![s("f", "features", 100_000, true), s("l", "labels", 10, true)]).unwrap(),
        false,
    );
    let real = testdata::real_dir();
    let atis = testdata::read(&real.join("atis/atis.train.ctf"));
    let sc = Schema::new(vec![s("q", "S0", 943, true), s("i", "S1", 26, true), s("s", "S2", 129, true)]).unwrap();
    // ATIS has intents on the first row only: the query stream defines the length.
    let sc = Schema::new(sc.streams().iter().cloned().enumerate().map(|(i, x)| x.defines_mb_size(i == 0)).collect())
        .unwrap();
    bench_file(c, "atis_train", &atis, sc, false);
    let mnist = testdata::read(&real.join("mnist/MNIST_dense.ctf"));
    let sc = Schema::new(vec![s("f", "F", 784, false), s("l", "L", 10, false)]).unwrap();
    bench_file(c, "mnist_dense", &mnist, sc, false);
}

criterion_group!(parse, benches);
criterion_main!(parse);
