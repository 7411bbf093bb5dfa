//! Columnar chunk data: what a parsed chunk holds, per stream, ready for the CBF writer and the
//! minibatch source without copying.

use crate::schema::{ElementType, Schema, StorageFormat};

/// A stream's values, in its element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// 32-bit values.
    F32(Vec<f32>),
    /// 64-bit values.
    F64(Vec<f64>),
}

impl Values {
    /// Empty values of the given type.
    pub fn new(t: ElementType) -> Values {
        match t {
            ElementType::F32 => Values::F32(Vec::new()),
            ElementType::F64 => Values::F64(Vec::new()),
        }
    }
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Number of values the vector holds without reallocating.
    pub fn capacity(&self) -> usize {
        match self {
            Values::F32(v) => v.capacity(),
            Values::F64(v) => v.capacity(),
        }
    }
    /// Room for at least `additional` more values, with no more allocated than that ([`Vec::reserve_exact`]).
    pub fn reserve_exact(&mut self, additional: usize) {
        match self {
            Values::F32(v) => v.reserve_exact(additional),
            Values::F64(v) => v.reserve_exact(additional),
        }
    }
    /// The element type.
    pub fn element_type(&self) -> ElementType {
        match self {
            Values::F32(_) => ElementType::F32,
            Values::F64(_) => ElementType::F64,
        }
    }
    /// Value `i` widened to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Values::F32(v) => f64::from(v[i]),
            Values::F64(v) => v[i],
        }
    }
    /// Drops every value from `len` on.
    pub fn truncate(&mut self, len: usize) {
        match self {
            Values::F32(v) => v.truncate(len),
            Values::F64(v) => v.truncate(len),
        }
    }
    /// Removes all values, keeping the allocation.
    pub fn clear(&mut self) {
        self.truncate(0)
    }
    /// Appends `n` zeros.
    pub fn push_zeros(&mut self, n: usize) {
        match self {
            Values::F32(v) => v.resize(v.len() + n, 0.0),
            Values::F64(v) => v.resize(v.len() + n, 0.0),
        }
    }
    /// Appends a value given as f64 (rounded to f32 for f32 values).
    pub fn push_f64(&mut self, x: f64) {
        match self {
            Values::F32(v) => v.push(x as f32),
            Values::F64(v) => v.push(x),
        }
    }
    /// Appends `other[range]`; both must have the same element type.
    pub fn extend_from(&mut self, other: &Values, range: std::ops::Range<usize>) {
        match (self, other) {
            (Values::F32(a), Values::F32(b)) => a.extend_from_slice(&b[range]),
            (Values::F64(a), Values::F64(b)) => a.extend_from_slice(&b[range]),
            (Values::F32(a), Values::F64(b)) => a.extend(b[range].iter().map(|&x| x as f32)),
            (Values::F64(a), Values::F32(b)) => a.extend(b[range].iter().map(|&x| f64::from(x))),
        }
    }
}

/// The integers a [`Column`] holds: keys (`u64`) and declared lengths (`u32`).
pub trait Entry: Copy + PartialEq + std::fmt::Debug + private::Sealed {
    /// The value widened to `u64`.
    fn wide(self) -> u64;
    /// A value given widened; only values that [`wide`](Entry::wide) made are given back.
    fn narrow(v: u64) -> Self;
}

mod private {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

impl Entry for u64 {
    fn wide(self) -> u64 {
        self
    }
    fn narrow(v: u64) -> u64 {
        v
    }
}

impl Entry for u32 {
    fn wide(self) -> u64 {
        u64::from(self)
    }
    fn narrow(v: u64) -> u32 {
        v as u32
    }
}

/// One number per sequence (its key, its declared length), stored as a progression — `len` values
/// `first`, `first + step`, … — while the values follow it, and as a list from the first value that does
/// not. A chunk of a line-mode file has consecutive keys and, for rows of one sample, lengths that are all
/// 1: it then stores no number per sequence at all, where a list would take 12 bytes per sequence, more
/// than twice the text of a row like `|a 1`.
#[derive(Clone)]
pub struct Column<T> {
    /// The progression's step: 1 for keys, 0 for lengths.
    step: u64,
    repr: Repr<T>,
}

#[derive(Clone)]
enum Repr<T> {
    /// `len` values `first + i × step`.
    Run {
        first: u64,
        len: usize,
    },
    List(Vec<T>),
}

/// Sequence keys: consecutive keys are stored as the first and the count.
pub type Keys = Column<u64>;
/// Declared sequence lengths (samples): equal lengths are stored as the length and the count.
pub type Lengths = Column<u32>;

impl Keys {
    /// No keys; consecutive keys take no room.
    pub fn new() -> Keys {
        Column { step: 1, repr: Repr::Run { first: 0, len: 0 } }
    }
}

impl Lengths {
    /// No lengths; equal lengths take no room.
    pub fn new() -> Lengths {
        Column { step: 0, repr: Repr::Run { first: 0, len: 0 } }
    }
}

impl FromIterator<u64> for Keys {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Keys {
        let mut c = Keys::new();
        c.extend(iter);
        c
    }
}

impl FromIterator<u32> for Lengths {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Lengths {
        let mut c = Lengths::new();
        c.extend(iter);
        c
    }
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new()
    }
}

impl Default for Lengths {
    fn default() -> Lengths {
        Lengths::new()
    }
}

impl<T: Entry> Column<T> {
    /// The same kind of column, empty, that keeps its values in a list from the start: a minibatch's,
    /// whose values are handed out as one array ([`as_slice`](Self::as_slice)).
    pub fn listed(&self) -> Column<T> {
        Column { step: self.step, repr: Repr::List(Vec::new()) }
    }
    /// Number of values.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Run { len, .. } => *len,
            Repr::List(v) => v.len(),
        }
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Value `i`; panics if `i >= len`, as indexing a slice does.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        match &self.repr {
            Repr::Run { first, len } => {
                assert!(i < *len, "index {i} out of range for a column of {len}");
                T::narrow(first.wrapping_add((i as u64).wrapping_mul(self.step)))
            }
            Repr::List(v) => v[i],
        }
    }
    /// The values in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + Clone + '_ {
        self.range(0..self.len())
    }
    /// Values `range`, in order; panics if the range goes past the end, as slicing does.
    pub fn range(&self, range: std::ops::Range<usize>) -> impl ExactSizeIterator<Item = T> + Clone + '_ {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "range {range:?} out of a column of {}",
            self.len()
        );
        match &self.repr {
            Repr::Run { first, .. } => ColumnValues::Run {
                next: first.wrapping_add((range.start as u64).wrapping_mul(self.step)),
                step: self.step,
                left: range.len(),
                entry: std::marker::PhantomData,
            },
            Repr::List(v) => ColumnValues::List(v[range].iter()),
        }
    }
    /// The values as one slice when they are kept in a list, `None` while they are a progression.
    pub fn as_slice(&self) -> Option<&[T]> {
        match &self.repr {
            Repr::Run { .. } => None,
            Repr::List(v) => Some(v),
        }
    }
    /// The values as a vector.
    pub fn to_vec(&self) -> Vec<T> {
        self.iter().collect()
    }
    /// Appends a value.
    #[inline]
    pub fn push(&mut self, x: T) {
        match &mut self.repr {
            // The next of the progression, modulo 2^64 as `get` computes it: a key after u64::MAX
            // continues a progression from 0, and is given back as it came.
            Repr::Run { first, len }
                if *len > 0 && first.wrapping_add((*len as u64).wrapping_mul(self.step)) == x.wide() =>
            {
                *len += 1
            }
            Repr::List(v) => v.push(x),
            _ => self.push_first_or_break(x),
        }
    }
    /// [`push`](Self::push) of the first value of a progression, or of one that ends it.
    #[cold]
    #[inline(never)]
    fn push_first_or_break(&mut self, x: T) {
        if let Repr::Run { first, len: len @ 0 } = &mut self.repr {
            (*first, *len) = (x.wide(), 1);
            return;
        }
        let mut v = Vec::with_capacity(self.len() + 1);
        v.extend(self.iter());
        v.push(x);
        self.repr = Repr::List(v);
    }
    /// Adds `by` to every value (wrapping).
    pub fn shift(&mut self, by: T) {
        match &mut self.repr {
            Repr::Run { first, .. } => *first = T::narrow(first.wrapping_add(by.wide())).wide(),
            Repr::List(v) => v.iter_mut().for_each(|x| *x = T::narrow(x.wide().wrapping_add(by.wide()))),
        }
    }
    /// Drops every value from `len` on.
    pub fn truncate(&mut self, len: usize) {
        match &mut self.repr {
            Repr::Run { len: n, .. } => *n = (*n).min(len),
            Repr::List(v) => v.truncate(len),
        }
    }
    /// Removes all values. A list keeps its allocation and stays a list.
    pub fn clear(&mut self) {
        self.truncate(0)
    }
    /// Number of values the list holds without reallocating (0 while a progression).
    pub fn capacity(&self) -> usize {
        self.as_list().map_or(0, Vec::capacity)
    }
    /// Room in the list for at least `additional` more values, with no more allocated than that; nothing
    /// while a progression, which needs none.
    pub fn reserve_exact(&mut self, additional: usize) {
        if let Repr::List(v) = &mut self.repr {
            v.reserve_exact(additional)
        }
    }
    /// As [`reserve_exact`](Self::reserve_exact), but a request the allocator declines is ignored.
    pub fn try_reserve(&mut self, additional: usize) {
        if let Repr::List(v) = &mut self.repr {
            let _ = v.try_reserve(additional);
        }
    }
    /// The list, while the values are kept in one (its address and capacity, for pinning).
    pub fn as_list(&self) -> Option<&Vec<T>> {
        match &self.repr {
            Repr::Run { .. } => None,
            Repr::List(v) => Some(v),
        }
    }
    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

/// The values of (a range of) a [`Column`], in order: one iterator per representation, so that a loop over
/// them does not look up each value apart.
#[derive(Clone)]
enum ColumnValues<'a, T> {
    Run { next: u64, step: u64, left: usize, entry: std::marker::PhantomData<T> },
    List(std::slice::Iter<'a, T>),
}

impl<T: Entry> Iterator for ColumnValues<'_, T> {
    type Item = T;
    #[inline]
    fn next(&mut self) -> Option<T> {
        match self {
            ColumnValues::Run { next, step, left, .. } => {
                if *left == 0 {
                    return None;
                }
                let x = T::narrow(*next);
                (*next, *left) = (next.wrapping_add(*step), *left - 1);
                Some(x)
            }
            ColumnValues::List(it) => it.next().copied(),
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            ColumnValues::Run { left, .. } => *left,
            ColumnValues::List(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl<T: Entry> ExactSizeIterator for ColumnValues<'_, T> {}

impl<T: Entry> Extend<T> for Column<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        let mut iter = iter.into_iter();
        // Value by value while a progression; once a list, the rest at once.
        while let Repr::Run { .. } = self.repr {
            match iter.next() {
                Some(x) => self.push(x),
                None => return,
            }
        }
        if let Repr::List(v) = &mut self.repr {
            v.extend(iter);
        }
    }
}

impl<T: Entry> From<Column<T>> for Vec<T> {
    fn from(c: Column<T>) -> Vec<T> {
        match c.repr {
            Repr::List(v) => v,
            Repr::Run { .. } => c.to_vec(),
        }
    }
}

impl<T: Entry> PartialEq for Column<T> {
    /// Equal values, however they are stored.
    fn eq(&self, other: &Column<T>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Entry, const N: usize> PartialEq<[T; N]> for Column<T> {
    fn eq(&self, other: &[T; N]) -> bool {
        self.len() == N && self.iter().eq(other.iter().copied())
    }
}

impl<T: Entry> PartialEq<Vec<T>> for Column<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl<T: Entry> PartialEq<Column<T>> for Vec<T> {
    fn eq(&self, other: &Column<T>) -> bool {
        other == self
    }
}

impl<T: Entry> std::fmt::Debug for Column<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One stream's data in a chunk: all samples of all sequences, sequence after sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamData {
    /// Dense or sparse, with the layout-specific parts.
    pub layout: Layout,
    /// The sample dimension.
    pub dim: usize,
    /// All values. Dense: `num_samples × dim`, sample-major. Sparse: every entry's value.
    pub values: Values,
    /// `sequence_offsets[s]..sequence_offsets[s+1]` are sequence `s`'s samples of this stream
    /// (length = number of sequences + 1, starting at 0).
    pub sequence_offsets: Vec<u64>,
}

/// The parts of a stream's data that depend on its storage format.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `dim` values per sample.
    Dense,
    /// Compressed samples (CSR with samples as rows; CSC in CNTK's words).
    Sparse {
        /// Index of each entry, in file order (not sorted; duplicates kept), each `< dim`.
        indices: Vec<i32>,
        /// `sample_offsets[k]..sample_offsets[k+1]` are sample `k`'s entries (len = samples + 1).
        sample_offsets: Vec<u64>,
    },
}

impl StreamData {
    /// Empty data for a stream.
    pub fn new(format: StorageFormat, dim: usize, t: ElementType) -> StreamData {
        StreamData {
            layout: match format {
                StorageFormat::Dense => Layout::Dense,
                StorageFormat::Sparse => Layout::Sparse { indices: Vec::new(), sample_offsets: vec![0] },
            },
            dim,
            values: Values::new(t),
            sequence_offsets: vec![0],
        }
    }
    /// Dense or sparse.
    pub fn format(&self) -> StorageFormat {
        match self.layout {
            Layout::Dense => StorageFormat::Dense,
            Layout::Sparse { .. } => StorageFormat::Sparse,
        }
    }
    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        self.sequence_offsets.len() - 1
    }
    /// Total number of samples.
    pub fn num_samples(&self) -> u64 {
        *self.sequence_offsets.last().unwrap_or(&0)
    }
    /// Number of samples of sequence `s`.
    pub fn sequence_len(&self, s: usize) -> u64 {
        self.sequence_offsets[s + 1] - self.sequence_offsets[s]
    }
    /// Samples `[a, b)` of sequence `s` as global sample indices.
    pub fn sequence_samples(&self, s: usize) -> std::ops::Range<u64> {
        self.sequence_offsets[s]..self.sequence_offsets[s + 1]
    }
    /// Range of `values` (and, for sparse, `indices`) holding sample `k`.
    pub fn sample_value_range(&self, k: u64) -> std::ops::Range<usize> {
        match &self.layout {
            Layout::Dense => (k as usize * self.dim)..((k as usize + 1) * self.dim),
            Layout::Sparse { sample_offsets, .. } => {
                sample_offsets[k as usize] as usize..sample_offsets[k as usize + 1] as usize
            }
        }
    }
    /// Number of stored values (dense: samples × dim; sparse: non-zero entries).
    pub fn num_values(&self) -> usize {
        self.values.len()
    }
    /// Removes all data, keeping allocations.
    pub fn clear(&mut self) {
        self.values.clear();
        self.sequence_offsets.clear();
        self.sequence_offsets.push(0);
        if let Layout::Sparse { indices, sample_offsets } = &mut self.layout {
            indices.clear();
            sample_offsets.clear();
            sample_offsets.push(0);
        }
    }
}

/// A parsed chunk: its sequences and, per stream, their samples.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChunkData {
    /// Sequence keys, in chunk order.
    pub keys: Keys,
    /// Each sequence's declared length in samples (what minibatch sizes count; CNTK's "number of samples").
    pub num_samples: Lengths,
    /// One entry per schema stream, in schema order.
    pub streams: Vec<StreamData>,
}

impl ChunkData {
    /// Empty chunk data for a schema.
    pub fn new(schema: &Schema) -> ChunkData {
        ChunkData {
            keys: Keys::new(),
            num_samples: Lengths::new(),
            streams: schema.streams().iter().map(|s| StreamData::new(s.format, s.dim, s.element_type)).collect(),
        }
    }
    /// Number of sequences.
    pub fn num_sequences(&self) -> usize {
        self.keys.len()
    }
    /// Removes all data, keeping allocations.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.num_samples.clear();
        for s in &mut self.streams {
            s.clear();
        }
    }
    /// The lengths of its vectors, for [`reserve_like`](Self::reserve_like).
    pub fn sizes(&self) -> Sizes {
        let mut v = vec![self.keys.len(), self.num_samples.len()];
        for s in &self.streams {
            v.push(s.values.len());
            v.push(s.sequence_offsets.len());
            if let Layout::Sparse { indices, sample_offsets } = &s.layout {
                v.push(indices.len());
                v.push(sample_offsets.len());
            }
        }
        Sizes(v)
    }
    /// Makes room at once for a little more than a chunk of `like`'s sizes (from chunk data of the same
    /// schema), so that parsing a similar chunk into it does not grow its vectors step by step: each
    /// step copies what is there and touches fresh memory. Vectors already large enough are left alone;
    /// sizes of another schema are ignored.
    pub fn reserve_like(&mut self, like: &Sizes) {
        // Room for `n` and an eighth more, beyond the `len` there are.
        fn more(n: usize, len: usize) -> usize {
            n.saturating_add(n / 8).saturating_sub(len)
        }
        fn room<T>(v: &mut Vec<T>, n: usize) {
            // A hint: if the allocator declines (an address space or overcommit limit), the vector grows
            // as it is filled instead of ending the process.
            let _ = v.try_reserve(more(n, v.len()));
        }
        // The vectors in the order `sizes` lists them: another schema lists another number of them.
        if like.0.len() != self.sizes().0.len() {
            return;
        }
        let mut n = like.0.iter().copied();
        let mut next = || n.next().unwrap_or(0);
        let (keys, lengths) = (next(), next());
        self.keys.try_reserve(more(keys, self.keys.len()));
        self.num_samples.try_reserve(more(lengths, self.num_samples.len()));
        for s in &mut self.streams {
            match &mut s.values {
                Values::F32(v) => room(v, next()),
                Values::F64(v) => room(v, next()),
            }
            room(&mut s.sequence_offsets, next());
            if let Layout::Sparse { indices, sample_offsets } = &mut s.layout {
                room(indices, next());
                room(sample_offsets, next());
            }
        }
    }
    /// Approximate heap size in bytes.
    pub fn heap_bytes(&self) -> usize {
        let mut n = self.keys.heap_bytes() + self.num_samples.heap_bytes();
        for s in &self.streams {
            n += s.sequence_offsets.capacity() * 8;
            n += match &s.values {
                Values::F32(v) => v.capacity() * 4,
                Values::F64(v) => v.capacity() * 8,
            };
            if let Layout::Sparse { indices, sample_offsets } = &s.layout {
                n += indices.capacity() * 4 + sample_offsets.capacity() * 8;
            }
        }
        n
    }
}

/// The lengths of a chunk data's vectors ([`ChunkData::sizes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sizes(Vec<usize>);

impl Sizes {
    /// Every length times `num / den` (rounded up), as for a chunk of `num` bytes from one of `den`, and
    /// at most `num + 1`: no vector of a chunk parsed from text has more elements than the text has bytes
    /// (plus the leading offset), so a dense small chunk followed by a huge sparse one (a long sequence of
    /// comments, say) asks for no more than its text could fill.
    pub fn scaled(&self, num: u64, den: u64) -> Sizes {
        let den = u128::from(den.max(1));
        let most = usize::try_from(num).unwrap_or(usize::MAX).saturating_add(1);
        let scale =
            |n: usize| usize::try_from((n as u128 * u128::from(num)).div_ceil(den)).unwrap_or(usize::MAX).min(most);
        Sizes(self.0.iter().map(|&n| scale(n)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::StreamSpec;

    fn schema(formats: &[StorageFormat]) -> Schema {
        let streams = formats.iter().enumerate().map(|(i, &f)| StreamSpec::new(format!("s{i}"), 4, f)).collect();
        Schema::new(streams).unwrap()
    }

    /// A chunk with `n` sequences of one sample, each with 4 dense values or 2 sparse entries.
    fn filled(schema: &Schema, n: usize) -> ChunkData {
        let mut d = ChunkData::new(schema);
        fill(&mut d, n);
        d
    }

    fn fill(d: &mut ChunkData, n: usize) {
        for k in 0..n {
            d.keys.push(k as u64);
            d.num_samples.push(1);
            for s in &mut d.streams {
                match &mut s.layout {
                    Layout::Dense => s.values.push_zeros(4),
                    Layout::Sparse { indices, sample_offsets } => {
                        indices.extend([0, 1]);
                        s.values.push_zeros(2);
                        sample_offsets.push(indices.len() as u64);
                    }
                }
                s.sequence_offsets.push(k as u64 + 1);
            }
        }
    }

    #[test]
    fn reserve_like_makes_room_for_a_similar_chunk() {
        let schema = schema(&[StorageFormat::Dense, StorageFormat::Sparse]);
        let full = filled(&schema, 1000);
        let mut d = ChunkData::new(&schema);
        d.reserve_like(&full.sizes());
        // Consecutive keys and equal lengths are progressions, which need no room.
        assert_eq!((d.keys.capacity(), d.num_samples.capacity()), (0, 0));
        for (s, f) in d.streams.iter().zip(&full.streams) {
            assert!(s.sequence_offsets.capacity() >= f.sequence_offsets.len() * 9 / 8);
            let cap = match &s.values {
                Values::F32(v) => v.capacity(),
                Values::F64(v) => v.capacity(),
            };
            assert!(cap >= f.values.len() * 9 / 8, "{cap}");
            if let (Layout::Sparse { indices, sample_offsets }, Layout::Sparse { indices: fi, .. }) =
                (&s.layout, &f.layout)
            {
                assert!(indices.capacity() >= fi.len() * 9 / 8 && sample_offsets.capacity() >= 1125);
            }
        }
        // Nothing was added, and parsing a chunk like it into it moves no vector.
        assert_eq!(d.num_sequences(), 0);
        let before = d.heap_bytes();
        let at = |d: &ChunkData| match &d.streams[1].values {
            Values::F32(v) => v.as_ptr() as usize,
            Values::F64(v) => v.as_ptr() as usize,
        };
        let ptr = at(&d);
        fill(&mut d, 1000);
        assert_eq!((d.heap_bytes(), at(&d)), (before, ptr));
        assert_eq!(d, full);
    }

    #[test]
    fn columns_are_progressions_until_a_value_breaks_them() {
        let mut keys: Keys = (7..1007).collect();
        let mut lengths: Lengths = std::iter::repeat_n(1, 1000).collect();
        assert_eq!((keys.heap_bytes(), lengths.heap_bytes(), keys.as_slice()), (0, 0, None));
        assert_eq!((keys.len(), keys.get(0), keys.get(999), lengths.get(500)), (1000, 7, 1006, 1));
        assert_eq!(keys.range(10..13).collect::<Vec<_>>(), [17, 18, 19]);
        keys.shift(3);
        assert_eq!((keys.get(0), keys.get(999)), (10, 1009));
        // A key that skips one, a length that differs: from there on a list, with the same values.
        keys.push(2000);
        lengths.push(2);
        let want: Vec<u64> = (10..1010).chain([2000]).collect();
        assert_eq!(keys, want);
        assert_eq!(keys.as_slice(), Some(want.as_slice()));
        assert_eq!(lengths.get(1000), 2);
        assert!(keys.heap_bytes() >= 1001 * 8 && lengths.heap_bytes() >= 1001 * 4);
        keys.shift(1);
        assert_eq!((keys.get(0), keys.get(1000)), (11, 2001));
        // Equal whether stored as a list or as a progression.
        let run: Keys = (11..1011).collect();
        keys.truncate(1000);
        assert_eq!(keys, run);
        // Keys across u64::MAX.
        let mut top: Keys = [u64::MAX - 1, u64::MAX, 0, 1].into_iter().collect();
        assert_eq!(
            (top.to_vec(), top.range(1..3).collect::<Vec<_>>()),
            (vec![u64::MAX - 1, u64::MAX, 0, 1], vec![u64::MAX, 0])
        );
        top.push(7);
        assert_eq!(top.to_vec(), [u64::MAX - 1, u64::MAX, 0, 1, 7]);
        top.clear();
        assert_eq!((top.len(), top.as_slice()), (0, Some([].as_slice())), "a list stays a list");
        // A minibatch's columns are lists from the start, even of consecutive keys.
        let mut listed = run.listed();
        listed.extend(run.iter());
        assert_eq!((listed.as_slice().map(<[u64]>::len), &listed), (Some(1000), &run));
        assert_eq!(Vec::from(listed), run.to_vec());
        assert_eq!(format!("{:?}", lengths.range(998..1001).collect::<Lengths>()), "[1, 1, 2]");
    }

    #[test]
    fn sizes_of_another_schema_are_ignored_and_scaling_rounds_up() {
        let sparse = filled(&schema(&[StorageFormat::Sparse]), 10);
        let mut dense = ChunkData::new(&schema(&[StorageFormat::Dense]));
        dense.reserve_like(&sparse.sizes());
        assert_eq!(dense.heap_bytes(), ChunkData::new(&schema(&[StorageFormat::Dense])).heap_bytes());
        assert_eq!(sparse.sizes().scaled(100, 300), Sizes(vec![4, 4, 7, 4, 7, 4]));
        assert_eq!(sparse.sizes().scaled(200, 100), Sizes(vec![20, 20, 40, 22, 40, 22]));
        // Never more elements than a chunk of `num` bytes could hold, however dense the chunk measured.
        assert_eq!(sparse.sizes().scaled(20, 2), Sizes(vec![21; 6]));
        assert_eq!(sparse.sizes().scaled(u64::MAX, 0).0.len(), 6);
        // A request the allocator cannot meet is declined, not fatal.
        let mut d = ChunkData::new(&schema(&[StorageFormat::Sparse]));
        d.reserve_like(&Sizes(vec![usize::MAX / 2; 6]));
        assert_eq!(d.num_sequences(), 0);
    }
}
