//! A slow, obviously-correct reference model of CNTK 2.7's CTF indexer and parser.
//!
//! This is a byte-at-a-time transliteration of `testdata/model/ctfref.py` (the Python model that
//! agrees with the real CNTK 2.7 binaries), including its `btr` ("bytes to read") bookkeeping and its
//! `maxErrors` budget (`err()` fails when the budget is used up). It deliberately shares **no code** with
//! the fast path in `cntkio_core`: the number state machine (CTF.md §5.3) is written again here with plain
//! f64 accumulation and `10f64.powf`, and sub-string searches are naive loops.
//!
//! Included by `cntkio-core/tests/ctf_reference.rs` and (via `#[path]`) by `cntkio/tests/ctf_model.rs`.
#![allow(dead_code)]

pub mod gen;

/// One configured input stream, as the Python model takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCfg {
    /// Stream name (messages only).
    pub name: String,
    /// The name written in the file after `|`.
    pub alias: String,
    /// Dense (true) or sparse.
    pub dense: bool,
    /// Sample dimension.
    pub dim: usize,
    /// `definesMBSize`.
    pub defines: bool,
}

/// Element type of the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl Elem {
    /// The bits of `x` after conversion to this element type (f32 bits are zero-extended).
    pub fn bits(self, x: f64) -> u64 {
        match self {
            Elem::F32 => u64::from((x as f32).to_bits()),
            Elem::F64 => x.to_bits(),
        }
    }
}

/// A sequence as the indexer found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefSeq {
    /// Key (numeric id or 0-based line number).
    pub key: u64,
    /// Declared number of samples.
    pub ns: u64,
    /// Absolute byte offset.
    pub off: u64,
    /// Size in bytes.
    pub size: u64,
}

/// A chunk: `[start, end)` and its sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefChunk {
    /// Offset of its first sequence.
    pub start: u64,
    /// End of its last sequence.
    pub end: u64,
    /// Sum of declared counts.
    pub ns: u64,
    /// Its sequences.
    pub seqs: Vec<RefSeq>,
}

/// Fatal errors of the indexer (CTF.md §1–§2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexError {
    /// `FF FE` at the start.
    Utf16Bom,
    /// Nothing but a BOM and whitespace.
    Empty,
    /// Id mode and the first row has no id; the offset after the BOM/whitespace skip.
    MissingId(u64),
    /// A sequence id overflows 64 bits.
    IdOverflow,
}

/// Why parsing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fatal {
    /// `Reached the maximum number of allowed errors …`.
    MaxErrors,
    /// `Malformed input file. Bailing out.` (a stream is empty in a sequence).
    EmptyStream,
}

/// One stream of one parsed sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamOut {
    /// Number of samples.
    pub n: u64,
    /// Values as bits of the element type. Dense: exactly `n × dim` values.
    pub values: Vec<u64>,
    /// Sparse: index of each entry.
    pub indices: Vec<u64>,
    /// Sparse: entries per sample.
    pub nnz: Vec<u64>,
}

/// One parsed sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqOut {
    /// Key.
    pub key: u64,
    /// Declared number of samples.
    pub ns: u64,
    /// Per configured stream.
    pub streams: Vec<StreamOut>,
}

/// Everything the model says about one file and configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The index, or the fatal indexing error.
    pub index: Result<Vec<RefChunk>, IndexError>,
    /// Sequences parsed completely, in file order (all chunks loaded once, in order).
    pub seqs: Vec<SeqOut>,
    /// Counted errors that did not stop parsing.
    pub errors: u64,
    /// What stopped parsing, if anything.
    pub fatal: Option<Fatal>,
}

impl Outcome {
    /// Number of leading chunks whose every sequence was parsed.
    pub fn complete_chunks(&self) -> usize {
        let mut left = self.seqs.len();
        let mut k = 0;
        if let Ok(chunks) = &self.index {
            for c in chunks {
                if c.seqs.len() > left {
                    break;
                }
                left -= c.seqs.len();
                k += 1;
            }
        }
        k
    }
}

fn isspace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Printable in CNTK's signed-`char` sense: 0x20..0x80.
fn isprint(c: u8) -> bool {
    (0x20..0x80).contains(&c)
}

fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

// ------------------------------------------------------------------------------------------------
// Indexer

fn skip_bom_ws(data: &[u8]) -> (usize, u64) {
    let n = data.len();
    let mut pos = 0usize;
    let mut line = 0u64;
    for ch in [0xEFu8, 0xBB, 0xBF] {
        if pos < n && data[pos] == ch {
            pos += 1;
        } else {
            break;
        }
    }
    while pos < n && isspace(data[pos]) {
        if data[pos] == b'\n' {
            line += 1;
        }
        pos += 1;
    }
    (pos, line)
}

struct Chunker {
    max: u64,
    chunks: Vec<RefChunk>,
}

impl Chunker {
    fn add(&mut self, s: RefSeq) {
        assert!(s.ns != 0, "Invalid sequence: number of samples == 0");
        let cur = self.chunks.last().map_or(0, |c| c.end - c.start);
        if cur == 0 || cur + s.size > self.max {
            self.chunks.push(RefChunk { start: s.off, end: s.off, ns: 0, seqs: Vec::new() });
        }
        let c = self.chunks.last_mut().unwrap();
        c.seqs.push(s);
        c.ns += s.ns;
        c.end = s.off + s.size;
    }
}

/// Position of `pat` inside `data[from..to]` (naive search).
fn find(data: &[u8], pat: &[u8], from: usize, to: usize) -> Option<usize> {
    if to < from || to - from < pat.len() {
        return None;
    }
    (from..=to - pat.len()).find(|&k| &data[k..k + pat.len()] == pat)
}

fn find_byte(data: &[u8], b: u8, from: usize) -> Option<usize> {
    (from..data.len()).find(|&k| data[k] == b)
}

/// True if the line starting at `p` mentions `|<alias>` followed by whitespace, `|`, a control byte, a
/// byte ≥ 0x80 or the end of the file (always true without a main stream).
fn find_main(data: &[u8], pat: Option<&[u8]>, p: usize) -> bool {
    let pat = match pat {
        None => return true,
        Some(p) => p,
    };
    let n = data.len();
    let e = find_byte(data, b'\n', p).unwrap_or(n);
    let mut q = p;
    loop {
        let k = match find(data, pat, q, e) {
            None => return false,
            Some(k) => k,
        };
        let after = k + pat.len();
        if after >= n || isspace(data[after]) || data[after] == b'|' || data[after] < 0x20 || data[after] >= 0x80 {
            return true;
        }
        q = k + 1;
    }
}

/// Digits at `p` → (found, value, new position); digits running into the end of the file are "not found".
fn get_id(data: &[u8], p: usize) -> Result<(bool, u64, usize), IndexError> {
    let n = data.len();
    let mut q = p;
    let mut v = 0u64;
    let mut found = false;
    while q < n {
        let c = data[q];
        if !is_digit(c) {
            return Ok((found, v, q));
        }
        // Wrapping arithmetic and CNTK's incomplete `new < old` overflow test, as in the model.
        let t = v;
        v = v.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
        if t > v {
            return Err(IndexError::IdOverflow);
        }
        found = true;
        q += 1;
    }
    Ok((false, v, q))
}

/// `ctfref.index`: the chunks of a file.
pub fn index(data: &[u8], skip_ids: bool, main: Option<&str>, chunk_size: u64) -> Result<Vec<RefChunk>, IndexError> {
    let n = data.len();
    if n >= 2 && data[0] == 0xFF && data[1] == 0xFE {
        return Err(IndexError::Utf16Bom);
    }
    if n == 0 {
        return Err(IndexError::Empty);
    }
    let (mut pos, mut line) = skip_bom_ws(data);
    if pos >= n {
        return Err(IndexError::Empty);
    }
    let mut ch = Chunker { max: chunk_size.min(n as u64), chunks: Vec::new() };
    let pat: Option<Vec<u8>> = main.map(|m| {
        let mut v = vec![b'|'];
        v.extend_from_slice(m.as_bytes());
        v
    });
    let pat = pat.as_deref();
    if skip_ids || data[pos] == b'|' {
        while pos < n {
            let off = pos;
            let e = find_byte(data, b'\n', pos);
            let nxt = e.map_or(n, |e| e + 1);
            if find_main(data, pat, pos) {
                ch.add(RefSeq { key: line, ns: 1, off: off as u64, size: (nxt - off) as u64 });
            }
            pos = nxt;
            if e.is_some() {
                line += 1;
            }
        }
        return Ok(ch.chunks);
    }
    let mut prev_off = pos;
    let (ok, mut prev, p) = get_id(data, pos)?;
    pos = p;
    if !ok {
        return Err(IndexError::MissingId(prev_off as u64));
    }
    let mut nsamp = 0u64;
    let mut fm = false;
    while pos < n {
        if find_main(data, pat, pos) {
            nsamp += 1;
            fm = true;
        }
        pos = find_byte(data, b'\n', pos).map_or(n, |e| e + 1);
        let off = pos;
        let (ok, nid, p) = get_id(data, pos)?;
        pos = p;
        if ok && nid != prev {
            let s = RefSeq { key: prev, ns: nsamp, off: prev_off as u64, size: (off - prev_off) as u64 };
            prev = nid;
            prev_off = off;
            nsamp = 0;
            if fm {
                ch.add(s);
            }
            fm = false;
        }
    }
    if prev_off < n && fm {
        ch.add(RefSeq { key: prev, ns: nsamp, off: prev_off as u64, size: (n - prev_off) as u64 });
    }
    Ok(ch.chunks)
}

// ------------------------------------------------------------------------------------------------
// Parser

#[derive(Debug, Clone, Default)]
struct Buf {
    n: u64,
    vals: Vec<f64>,
    idx: Vec<u64>,
    nnz: Vec<u64>,
}

/// `ctfref.Parser`: one budget of errors for its whole life.
pub struct Parser<'a> {
    d: &'a [u8],
    n: usize,
    streams: Vec<StreamCfg>,
    maxalias: usize,
    errors_left: u64,
    /// Calls of `err()` that did not fail.
    pub counted: u64,
    use_max: bool,
    p: usize,
    btr: u64,
    bufs: Vec<Buf>,
}

impl<'a> Parser<'a> {
    /// A parser over the whole file `data`.
    pub fn new(data: &'a [u8], streams: &[StreamCfg], max_errors: u64) -> Parser<'a> {
        Parser {
            d: data,
            n: data.len(),
            streams: streams.to_vec(),
            maxalias: streams.iter().map(|s| s.alias.len()).max().unwrap_or(0),
            errors_left: max_errors,
            counted: 0,
            use_max: !streams.iter().any(|s| s.defines),
            p: 0,
            btr: 0,
            bufs: Vec::new(),
        }
    }

    fn alias(&self, name: &[u8]) -> Option<usize> {
        self.streams.iter().position(|s| s.alias.as_bytes() == name)
    }

    fn err(&mut self) -> Result<(), Fatal> {
        if self.errors_left == 0 {
            return Err(Fatal::MaxErrors);
        }
        self.errors_left -= 1;
        self.counted += 1;
        Ok(())
    }

    fn can(&self) -> bool {
        self.p < self.n
    }

    fn peek(&self) -> u8 {
        self.d[self.p]
    }

    fn pop(&mut self) {
        self.p += 1;
        self.btr -= 1;
    }

    fn more(&self) -> bool {
        self.btr > 0 && self.can()
    }

    /// Loads one sequence; values are converted to `elem`.
    pub fn load(&mut self, seq: &RefSeq, elem: Elem) -> Result<SeqOut, Fatal> {
        self.p = seq.off as usize;
        self.btr = seq.size;
        self.bufs = vec![Buf::default(); self.streams.len()];
        let mut rows = 0u64;
        while self.btr > 0 {
            if self.read_row()? {
                rows += 1;
            } else {
                self.err()?;
            }
        }
        let _ = rows; // only in a warning
        let mut empty = false;
        let mut dup = false;
        let mut overall = 0u64;
        for (i, b) in self.bufs.iter().enumerate() {
            if b.n == 0 {
                empty = true;
            }
            if !(self.use_max || self.streams[i].defines) {
                continue;
            }
            overall = overall.max(b.n);
            if b.n > seq.ns {
                dup = true;
            }
        }
        if empty {
            return Err(Fatal::EmptyStream);
        }
        // One error for "more samples than declared", else one for "fewer than declared".
        if dup || overall < seq.ns {
            self.err()?;
        }
        let streams = self
            .bufs
            .iter()
            .zip(&self.streams)
            .map(|(b, s)| {
                let mut vals: &[f64] = &b.vals;
                if s.dense {
                    // A too-long dense sample on a last row without `\n` keeps all its values in the
                    // model; the packer (and cntkio) only ever read `n × dim` of them.
                    vals = &vals[..vals.len().min(b.n as usize * s.dim)];
                }
                StreamOut {
                    n: b.n,
                    values: vals.iter().map(|&x| elem.bits(x)).collect(),
                    indices: b.idx.clone(),
                    nnz: b.nnz.clone(),
                }
            })
            .collect();
        Ok(SeqOut { key: seq.key, ns: seq.ns, streams })
    }

    fn read_row(&mut self) -> Result<bool, Fatal> {
        while self.more() && is_digit(self.peek()) {
            self.pop();
        }
        let mut nread = 0usize;
        while self.more() {
            let c = self.peek();
            if c == b'\n' {
                self.pop();
                return Ok(nread > 0);
            }
            if c == b' ' || c == b'\t' || (!isprint(c) && c != b'\n') {
                self.pop();
                continue;
            }
            if self.read_sample()? {
                nread += 1;
            } else {
                self.skip_to_next();
            }
        }
        Ok(self.btr == 0)
    }

    fn skip_to_next(&mut self) {
        while self.more() {
            if self.peek() == b'|' || self.peek() == b'\n' {
                return;
            }
            self.pop();
        }
    }

    fn read_sample(&mut self) -> Result<bool, Fatal> {
        if self.peek() != b'|' {
            self.err()?;
            return Ok(false);
        }
        self.pop();
        if self.more() && self.peek() == b'#' {
            self.pop();
            return Ok(false);
        }
        let sid = match self.get_id()? {
            None => return Ok(false),
            Some(s) => s,
        };
        let dim = self.streams[sid].dim;
        let mut b = std::mem::take(&mut self.bufs[sid]);
        let size = b.vals.len();
        let ok = if self.streams[sid].dense {
            let ok = self.read_dense(&mut b.vals, dim);
            if ok {
                b.n += 1;
            } else {
                b.vals.truncate(size);
            }
            ok
        } else {
            let ok = self.read_sparse(&mut b.vals, &mut b.idx, dim);
            if ok {
                b.n += 1;
                b.nnz.push((b.vals.len() - size) as u64);
            } else {
                b.vals.truncate(size);
                b.idx.truncate(size);
            }
            ok
        };
        self.bufs[sid] = b;
        if !ok {
            self.err()?;
        }
        Ok(ok)
    }

    fn get_id(&mut self) -> Result<Option<usize>, Fatal> {
        let mut name: Vec<u8> = Vec::new();
        while self.more() {
            let c = self.peek();
            if c == b' ' || c == b'\t' || c == b'|' || !isprint(c) {
                if !name.is_empty() {
                    return Ok(self.alias(&name)); // unknown: skipped without an error
                }
                break; // `|` followed by an invalid character
            } else if name.len() < self.maxalias {
                name.push(c);
            } else {
                return Ok(None); // longer than every alias: skipped without an error
            }
            self.pop();
        }
        self.err()?;
        Ok(None)
    }

    fn read_dense(&mut self, vals: &mut Vec<f64>, dim: usize) -> bool {
        let mut cnt = 0usize;
        while self.more() {
            let c = self.peek();
            if c == b' ' || c == b'\t' {
                self.pop();
                continue;
            }
            if !isprint(c) || c == b'|' {
                if cnt > dim {
                    return false;
                }
                if cnt < dim {
                    vals.resize(vals.len() + (dim - cnt), 0.0);
                }
                return true;
            }
            match self.read_real() {
                None => return false,
                Some(v) => {
                    vals.push(v);
                    cnt += 1;
                }
            }
        }
        // End of the sequence's bytes without `\n`: no dim check; the model zero-pads a short sample.
        let ok = self.btr > 0 || cnt > 0;
        if ok && 0 < cnt && cnt < dim {
            vals.resize(vals.len() + (dim - cnt), 0.0);
        }
        ok
    }

    fn read_sparse(&mut self, vals: &mut Vec<f64>, idx: &mut Vec<u64>, dim: usize) -> bool {
        while self.more() {
            let c = self.peek();
            if c == b' ' || c == b'\t' {
                self.pop();
                continue;
            }
            if !isprint(c) || c == b'|' {
                return true;
            }
            let i = match self.read_uint() {
                None => return false,
                Some(i) => i,
            };
            if i >= dim as u64 {
                return false;
            }
            if self.peek() != b':' {
                return false;
            }
            self.pop();
            match self.read_real() {
                None => return false,
                Some(v) => {
                    vals.push(v);
                    idx.push(i);
                }
            }
        }
        // End of the bytes: accepted if this sequence's buffer of the stream holds any value.
        self.btr > 0 || !vals.is_empty()
    }

    fn read_uint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        let mut found = false;
        while self.more() {
            let c = self.peek();
            if !is_digit(c) {
                return if found { Some(v) } else { None };
            }
            found = true;
            let t = v;
            v = v.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
            if t > v {
                return None;
            }
            self.pop();
        }
        None
    }

    /// CNTK's number state machine (CTF.md §5.3), every digit through an f64.
    fn read_real(&mut self) -> Option<f64> {
        #[derive(Clone, Copy, PartialEq)]
        enum S {
            Init,
            Sign,
            Int,
            Period,
            Frac,
            E,
            ESign,
            Exp,
        }
        let pow10 = |e: f64| 10f64.powf(e);
        let (mut st, mut coef, mut num, mut div, mut neg) = (S::Init, 0.0f64, 0.0f64, 0.0f64, false);
        while self.more() {
            let c = self.peek();
            let dig = is_digit(c);
            let d = f64::from(c.wrapping_sub(b'0'));
            match st {
                S::Init => {
                    if dig {
                        st = S::Int;
                        num = d;
                    } else if c == b'+' || c == b'-' {
                        st = S::Sign;
                        neg = c == b'-';
                    } else {
                        return None;
                    }
                }
                S::Sign => {
                    if dig {
                        st = S::Int;
                        num = d;
                    } else {
                        return None;
                    }
                }
                S::Int => {
                    if dig {
                        num = num * 10.0 + d;
                    } else if c == b'.' {
                        st = S::Period;
                    } else if c == b'e' || c == b'E' {
                        st = S::E;
                        coef = if neg { -num } else { num };
                        num = 0.0;
                    } else {
                        return Some(if neg { -num } else { num });
                    }
                }
                S::Period => {
                    if dig {
                        st = S::Frac;
                        coef = num;
                        num = d;
                        div = 10.0;
                    } else {
                        return Some(if neg { -num } else { num });
                    }
                }
                S::Frac => {
                    if dig {
                        num = num * 10.0 + d;
                        div *= 10.0;
                    } else if c == b'e' || c == b'E' {
                        st = S::E;
                        coef += num / div;
                        if neg {
                            coef = -coef;
                        }
                    } else {
                        coef += num / div;
                        return Some(if neg { -coef } else { coef });
                    }
                }
                S::E => {
                    if dig {
                        st = S::Exp;
                        neg = false;
                        num = d;
                    } else if c == b'+' || c == b'-' {
                        st = S::ESign;
                        neg = c == b'-';
                    } else {
                        return None;
                    }
                }
                S::ESign => {
                    if dig {
                        st = S::Exp;
                        num = d;
                    } else {
                        return None;
                    }
                }
                S::Exp => {
                    if dig {
                        num = num * 10.0 + d;
                    } else {
                        return Some(coef * pow10(if neg { -num } else { num }));
                    }
                }
            }
            self.pop();
        }
        if self.btr == 0 {
            return match st {
                S::Int | S::Period => Some(if neg { -num } else { num }),
                S::Frac => {
                    coef += num / div;
                    Some(if neg { -coef } else { coef })
                }
                S::Exp => Some(coef * pow10(if neg { -num } else { num })),
                _ => None,
            };
        }
        None
    }
}

/// Runs the model on a whole file: index, then every chunk in order with one parser (one budget).
pub fn run(
    data: &[u8],
    streams: &[StreamCfg],
    skip_ids: bool,
    chunk_size: u64,
    max_errors: u64,
    elem: Elem,
) -> Outcome {
    let main = streams.iter().find(|s| s.defines).map(|s| s.alias.as_str());
    let index = index(data, skip_ids, main, chunk_size);
    let mut out = Outcome { index: index.clone(), seqs: Vec::new(), errors: 0, fatal: None };
    let chunks = match index {
        Ok(c) => c,
        Err(_) => return out,
    };
    let mut p = Parser::new(data, streams, max_errors);
    'all: for c in &chunks {
        for s in &c.seqs {
            match p.load(s, elem) {
                Ok(r) => out.seqs.push(r),
                Err(f) => {
                    out.fatal = Some(f);
                    break 'all;
                }
            }
        }
    }
    out.errors = p.counted;
    out
}
