//! Schema-less reading for `inspect`: which inputs a file mentions, dense or sparse, their dims and counts.
//!
//! This is a tolerant tokenizer, not a validator: a sample `|name tokens` is sparse if any token has a
//! `:`, its dim is the largest index + 1 (sparse) or the largest number of values (dense).

use super::is_non_printable;

/// What was seen of one input name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// The name written after `|` (CNTK's alias).
    pub alias: String,
    /// Samples with at least one `index:value` token.
    pub sparse_samples: u64,
    /// Samples without any.
    pub dense_samples: u64,
    /// Largest number of values in a dense sample.
    pub max_values: u64,
    /// Smallest number of values in a non-empty dense sample.
    pub min_values: u64,
    /// Largest sparse index (+1 = the smallest possible dim), if any sparse sample.
    pub max_index: Option<u64>,
    /// Total sparse entries.
    pub nnz: u64,
    /// Samples with no value at all.
    pub empty_samples: u64,
    /// Sequences in which the input appears.
    pub sequences: u64,
    /// Largest number of samples in one sequence.
    pub max_per_sequence: u64,
}

impl StreamStats {
    /// Total samples.
    pub fn samples(&self) -> u64 {
        self.sparse_samples + self.dense_samples
    }
    /// True if any sample looked sparse.
    pub fn is_sparse(&self) -> bool {
        self.sparse_samples > 0
    }
    /// The smallest dim the data allows.
    pub fn min_dim(&self) -> u64 {
        if self.is_sparse() {
            self.max_index.map_or(0, |m| m.saturating_add(1))
        } else {
            self.max_values
        }
    }
}

/// Accumulates statistics over sequences.
#[derive(Debug, Clone, Default)]
pub struct Inferrer {
    /// Per input, in order of first appearance.
    pub streams: Vec<StreamStats>,
    /// Rows seen.
    pub rows: u64,
    /// Rows without any sample (blank, comment-only).
    pub empty_rows: u64,
    /// Comments seen.
    pub comments: u64,
    per_seq: Vec<u64>,
}

impl Inferrer {
    /// A fresh accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    fn stream(&mut self, name: &[u8]) -> usize {
        if let Some(i) = self.streams.iter().position(|s| s.alias.as_bytes() == name) {
            return i;
        }
        self.streams.push(StreamStats {
            alias: String::from_utf8_lossy(name).into_owned(),
            min_values: u64::MAX,
            ..Default::default()
        });
        self.per_seq.push(0);
        self.streams.len() - 1
    }

    /// Adds one sequence's bytes; returns its number of rows.
    pub fn add_sequence(&mut self, s: &[u8]) -> u64 {
        for c in self.per_seq.iter_mut() {
            *c = 0;
        }
        let mut rows = 0;
        for row in s.split_inclusive(|&c| c == b'\n') {
            rows += 1;
            self.rows += 1;
            let mut samples = 0;
            let mut p = row.iter().take_while(|c| c.is_ascii_digit()).count();
            while let Some(k) = memchr::memchr(b'|', &row[p..]) {
                p += k + 1;
                if row.get(p) == Some(&b'#') {
                    self.comments += 1;
                    p = memchr::memchr(b'|', &row[p..]).map_or(row.len(), |k| p + k);
                    continue;
                }
                let ns = p;
                while p < row.len() && !(row[p] == b' ' || row[p] == b'|' || is_non_printable(row[p])) {
                    p += 1;
                }
                if p == ns {
                    continue;
                }
                let i = self.stream(&row[ns..p]);
                let end = memchr::memchr(b'|', &row[p..]).map_or(row.len(), |k| p + k);
                let body = &row[p..end];
                p = end;
                samples += 1;
                self.per_seq[i] += 1;
                let st = &mut self.streams[i];
                let mut count = 0u64;
                let mut sparse = false;
                for tok in body.split(|&c| c == b' ' || is_non_printable(c)).filter(|t| !t.is_empty()) {
                    count += 1;
                    if let Some(colon) = memchr::memchr(b':', tok) {
                        sparse = true;
                        if let Ok(ix) = std::str::from_utf8(&tok[..colon]).unwrap_or("").parse::<u64>() {
                            st.max_index = Some(st.max_index.map_or(ix, |m| m.max(ix)));
                        }
                    }
                }
                if count == 0 {
                    st.empty_samples += 1;
                    st.dense_samples += 1;
                } else if sparse {
                    st.sparse_samples += 1;
                    st.nnz += count;
                } else {
                    st.dense_samples += 1;
                    st.max_values = st.max_values.max(count);
                    st.min_values = st.min_values.min(count);
                }
            }
            if samples == 0 {
                self.empty_rows += 1;
            }
        }
        for (st, &c) in self.streams.iter_mut().zip(&self.per_seq) {
            if c > 0 {
                st.sequences += 1;
                st.max_per_sequence = st.max_per_sequence.max(c);
            }
        }
        rows
    }

    /// Merges another accumulator's counts (streams matched by name).
    pub fn merge(&mut self, other: &Inferrer) {
        self.rows += other.rows;
        self.empty_rows += other.empty_rows;
        self.comments += other.comments;
        for o in &other.streams {
            let i = self.stream(o.alias.as_bytes());
            let s = &mut self.streams[i];
            s.sparse_samples += o.sparse_samples;
            s.dense_samples += o.dense_samples;
            s.max_values = s.max_values.max(o.max_values);
            s.min_values = s.min_values.min(o.min_values);
            s.max_index = match (s.max_index, o.max_index) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            s.nnz += o.nnz;
            s.empty_samples += o.empty_samples;
            s.sequences += o.sequences;
            s.max_per_sequence = s.max_per_sequence.max(o.max_per_sequence);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infers_dense_and_sparse() {
        let mut inf = Inferrer::new();
        inf.add_sequence(b"0\t|S0 178:1 |# BOS\t|S1 14:1 |# x\n0\t|S0 479:1 |# i\t\t|S2 3:1\n");
        inf.add_sequence(b"1 |y 1 0 0 |S0 2:1 5:1\n");
        let names: Vec<&str> = inf.streams.iter().map(|s| s.alias.as_str()).collect();
        assert_eq!(names, ["S0", "S1", "S2", "y"]);
        let s0 = &inf.streams[0];
        assert!(s0.is_sparse());
        assert_eq!((s0.min_dim(), s0.samples(), s0.nnz, s0.sequences, s0.max_per_sequence), (480, 3, 4, 2, 2));
        let y = &inf.streams[3];
        assert!(!y.is_sparse());
        assert_eq!(y.min_dim(), 3);
        assert_eq!(inf.comments, 3);
        assert_eq!(inf.rows, 3);
    }
}
