//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod random;
pub mod testdata;

use cntkio::{Schema, StorageFormat, StreamSpec};
use std::sync::Arc;

/// C's `printf("%g", v)`: 6 significant digits, trailing zeros removed, exponent with at least 2 digits.
pub fn fmt_g(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let sci = format!("{v:.5e}");
    let (mant, exp) = sci.split_once('e').expect("an exponent");
    let x: i32 = exp.parse().expect("an integer exponent");
    if !(-4..6).contains(&x) {
        let m = strip_zeros(mant);
        format!("{m}e{}{:02}", if x < 0 { '-' } else { '+' }, x.abs())
    } else {
        let decimals = (5 - x) as usize;
        strip_zeros(&format!("{v:.decimals$}")).to_string()
    }
}

fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// CNTK's first-fit packing of sequences into parallel rows (READER.md §5.1): returns the width, the
/// number of rows, and for each sequence its (row, start column).
pub fn layout_packed(lengths: &[u64]) -> (u64, usize, Vec<(usize, u64)>) {
    let width = lengths.iter().copied().max().unwrap_or(0);
    let mut rows: Vec<u64> = Vec::new();
    let mut place = Vec::with_capacity(lengths.len());
    for &l in lengths {
        let r = match rows.iter().position(|&used| used + l <= width) {
            Some(r) => r,
            None => {
                rows.push(0);
                rows.len() - 1
            }
        };
        place.push((r, rows[r]));
        rows[r] += l;
    }
    (width, rows.len(), place)
}

#[test]
fn printf_g() {
    for (v, s) in [
        (1.0, "1"),
        (0.5, "0.5"),
        (-6.4265e20, "-6.4265e+20"),
        (1e-5, "1e-05"),
        (-1.15459e-9, "-1.15459e-09"),
        (123456.0, "123456"),
        (1234567.0, "1.23457e+06"),
        (0.0001, "0.0001"),
        (0.000123456789, "0.000123457"),
        (-0.0, "-0"),
        (100.0, "100"),
        (999999.5, "1e+06"),
    ] {
        assert_eq!(fmt_g(v), s, "{v}");
    }
}

/// An in-memory deserializer: chunks of sequences `(declared length, key)`; one dense stream `a` of dim 1 whose samples hold the key.
pub struct Mem {
    pub chunks: Vec<cntkio::randomize::ChunkInfo>,
    pub seqs: Vec<Vec<u32>>,
    pub first_key: Vec<u64>,
    pub streams: Vec<StreamSpec>,
}

impl Mem {
    pub fn new(lens: Vec<Vec<u32>>) -> Mem {
        let mut first_key = Vec::new();
        let mut k = 0u64;
        for c in &lens {
            first_key.push(k);
            k += c.len() as u64;
        }
        Mem {
            chunks: lens
                .iter()
                .map(|c| cntkio::randomize::ChunkInfo {
                    num_samples: c.iter().map(|&l| u64::from(l)).sum(),
                    num_sequences: c.len() as u32,
                })
                .collect(),
            seqs: lens,
            first_key,
            streams: vec![StreamSpec::new("a", 1, StorageFormat::Dense)],
        }
    }
    pub fn num_sequences(&self) -> u64 {
        self.seqs.iter().map(|c| c.len() as u64).sum()
    }
}

impl cntkio::randomize::SequenceSource for Mem {
    fn chunks(&self) -> &[cntkio::randomize::ChunkInfo] {
        &self.chunks
    }
    fn sequences(&self, chunk: u32, out: &mut Vec<cntkio::randomize::SequenceInfo>) -> Result<(), cntkio::Error> {
        let c = chunk as usize;
        out.extend(
            self.seqs[c]
                .iter()
                .enumerate()
                .map(|(i, &l)| cntkio::randomize::SequenceInfo { num_samples: l, key: self.first_key[c] + i as u64 }),
        );
        Ok(())
    }
}

impl cntkio::source::Deserializer for Mem {
    fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }
    fn load_chunk(&self, chunk: u32) -> Result<Arc<cntkio::ChunkData>, cntkio::Error> {
        let c = chunk as usize;
        let mut d = cntkio::ChunkData::new(&Schema::new(self.streams.clone()).unwrap());
        for (i, &l) in self.seqs[c].iter().enumerate() {
            let key = self.first_key[c] + i as u64;
            d.keys.push(key);
            d.num_samples.push(l);
            let s = &mut d.streams[0];
            for _ in 0..l {
                s.values.push_f64(key as f64);
            }
            let last = *s.sequence_offsets.last().unwrap();
            s.sequence_offsets.push(last + u64::from(l));
        }
        Ok(Arc::new(d))
    }
}
