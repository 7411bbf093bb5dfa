//! Random columnar data for property tests (shared by the CBF and Arrow round trips).

use cntkio_core::{ChunkData, ElementType, Layout, Schema, StorageFormat, StreamSpec, Values};
use proptest::prelude::*;

#[derive(Debug, Clone)]
pub struct StreamShape {
    sparse: bool,
    f64: bool,
    dim: usize,
}

pub fn shape() -> impl Strategy<Value = StreamShape> {
    (any::<bool>(), any::<bool>(), 1usize..7).prop_map(|(sparse, f64, dim)| StreamShape {
        sparse,
        f64,
        dim: if sparse { dim * 7 } else { dim },
    })
}

/// A value: any bits (CBF keeps them all), or only finite values (for CTF).
pub fn value(finite: bool) -> impl Strategy<Value = u64> {
    any::<u64>().prop_map(move |b| if finite && !f64::from_bits(b).is_finite() { b & !(1 << 62) } else { b })
}

/// Random chunk data with `samples` samples per stream and sequence and `sequences` sequences.
pub fn random_data(
    finite: bool,
    samples: std::ops::Range<usize>,
    sequences: std::ops::Range<usize>,
) -> impl Strategy<Value = (Schema, ChunkData)> {
    prop::collection::vec(shape(), 1..4).prop_flat_map(move |shapes| {
        let n = shapes.len();
        let seq = prop::collection::vec((samples.clone(), prop::bool::weighted(0.1)), n);
        let seqs = prop::collection::vec(seq, sequences.clone());
        let pool = prop::collection::vec((value(finite), any::<u32>(), 0usize..5), 600);
        (Just(shapes), seqs, pool).prop_map(move |(shapes, seqs, pool)| build(&shapes, &seqs, &pool, finite))
    })
}

pub fn build(
    shapes: &[StreamShape],
    seqs: &[Vec<(usize, bool)>],
    pool: &[(u64, u32, usize)],
    finite: bool,
) -> (Schema, ChunkData) {
    let schema = Schema::new(
        shapes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let name = format!("s{i}");
                let format = if s.sparse { StorageFormat::Sparse } else { StorageFormat::Dense };
                StreamSpec::new(&name, s.dim, format).alias(&name).element_type(if s.f64 {
                    ElementType::F64
                } else {
                    ElementType::F32
                })
            })
            .collect(),
    )
    .unwrap();
    let mut d = ChunkData::new(&schema);
    let mut p = 0usize;
    let mut next = || {
        let r = pool[p % pool.len()];
        p += 1;
        r
    };
    for (k, seq) in seqs.iter().enumerate() {
        d.keys.push(k as u64 * 3 + 1);
        let mut longest = 0;
        for ((len, long), (sh, sd)) in seq.iter().zip(shapes.iter().zip(d.streams.iter_mut())) {
            let len = if *long { len * 40 } else { *len };
            longest = longest.max(len);
            for _ in 0..len {
                let entries = if sh.sparse { next().2 } else { sh.dim };
                for _ in 0..entries {
                    let (bits, ix, _) = next();
                    let push32 = |b: u64| {
                        let x = f32::from_bits(b as u32);
                        if finite && !x.is_finite() {
                            f32::from_bits(b as u32 & !(1 << 30))
                        } else {
                            x
                        }
                    };
                    match &mut sd.values {
                        Values::F32(v) => v.push(push32(bits)),
                        Values::F64(v) => v.push(f64::from_bits(bits)),
                    }
                    if let Layout::Sparse { indices, .. } = &mut sd.layout {
                        indices.push((ix as usize % sh.dim) as i32);
                    }
                }
                if let Layout::Sparse { indices, sample_offsets } = &mut sd.layout {
                    sample_offsets.push(indices.len() as u64);
                }
            }
            let last = *sd.sequence_offsets.last().unwrap();
            sd.sequence_offsets.push(last + len as u64);
        }
        d.num_samples.push(longest as u32);
    }
    (schema, d)
}
