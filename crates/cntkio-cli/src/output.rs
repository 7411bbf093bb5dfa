//! Writing data to stdout, numbers in JSON, and progress bars.

use cntkio::{ChunkData, Error, Layout, Schema, Values};
use std::io::{IsTerminal, Write};

/// `println!` that returns an error instead of panicking when stdout is closed (`cntkio … | head`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(crate::output::stdout_error)
    }};
}

/// True if the error is a closed stdout (`cntkio dump … | head`).
pub fn is_broken_pipe(e: &Error) -> bool {
    matches!(e.kind(), cntkio::ErrorKind::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Wraps an I/O error on stdout.
pub fn stdout_error(e: std::io::Error) -> Error {
    Error::io("cannot write to standard output", e)
}

/// Appends a number so that it parses back to the same bits of its type; inf and NaN as strings.
pub fn push_f32(out: &mut Vec<u8>, x: f32, buf: &mut ryu::Buffer) {
    if x.is_finite() {
        push_trimmed(out, buf.format_finite(x));
    } else {
        push_special(out, f64::from(x));
    }
}

/// As [`push_f32`] for doubles.
pub fn push_f64(out: &mut Vec<u8>, x: f64, buf: &mut ryu::Buffer) {
    if x.is_finite() {
        push_trimmed(out, buf.format_finite(x));
    } else {
        push_special(out, x);
    }
}

fn push_trimmed(out: &mut Vec<u8>, s: &str) {
    // "3.0" → "3" (same value when parsed), but keep "-0.0": "-0" reads as the integer 0 in many parsers.
    match s.strip_suffix(".0") {
        Some(t) if t != "-0" => out.extend_from_slice(t.as_bytes()),
        _ => out.extend_from_slice(s.as_bytes()),
    }
}

fn push_special(out: &mut Vec<u8>, x: f64) {
    out.extend_from_slice(if x.is_nan() {
        b"\"nan\""
    } else if x > 0.0 {
        b"\"inf\""
    } else {
        b"\"-inf\""
    });
}

fn push_value(out: &mut Vec<u8>, v: &Values, i: usize, buf: &mut ryu::Buffer) {
    match v {
        Values::F32(a) => push_f32(out, a[i], buf),
        Values::F64(a) => push_f64(out, a[i], buf),
    }
}

/// Appends a JSON string.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(serde_json::to_string(s).expect("a string serializes").as_bytes());
}

/// Appends the samples of sequence `seq` of one stream: dense samples as lists of `dim` numbers, sparse
/// samples as lists of `[index, value]` pairs in file order.
pub fn push_sequence_samples(out: &mut Vec<u8>, data: &ChunkData, stream: usize, seq: usize, buf: &mut ryu::Buffer) {
    let d = &data.streams[stream];
    out.push(b'[');
    for (n, k) in d.sequence_samples(seq).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.push(b'[');
        let r = d.sample_value_range(k);
        match &d.layout {
            Layout::Dense => {
                for (j, i) in r.enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    push_value(out, &d.values, i, buf);
                }
            }
            Layout::Sparse { indices, .. } => {
                for (j, i) in r.enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.push(b'[');
                    out.extend_from_slice(itoa_u64(indices[i] as u64).as_bytes());
                    out.push(b',');
                    push_value(out, &d.values, i, buf);
                    out.push(b']');
                }
            }
        }
        out.push(b']');
    }
    out.push(b']');
}

fn itoa_u64(v: u64) -> String {
    v.to_string()
}

/// Appends one JSON Lines record per sequence of `data`.
pub fn push_dump_records(out: &mut Vec<u8>, schema: &Schema, data: &ChunkData, count: usize, buf: &mut ryu::Buffer) {
    let names: Vec<Vec<u8>> = schema
        .streams()
        .iter()
        .map(|s| {
            let mut v = Vec::new();
            push_json_str(&mut v, &s.name);
            v
        })
        .collect();
    for seq in 0..count.min(data.num_sequences()) {
        out.extend_from_slice(b"{\"key\":");
        out.extend_from_slice(data.keys.get(seq).to_string().as_bytes());
        out.extend_from_slice(b",\"streams\":{");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(name);
            out.push(b':');
            push_sequence_samples(out, data, i, seq, buf);
        }
        out.extend_from_slice(b"}}\n");
    }
}

/// A byte progress bar on stderr, shown only when stderr is a terminal and not quiet.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A bar for `total` bytes (0: not known, as a gzip stream's length is not before it is read; then
    /// the bytes done and the rate only).
    pub fn bytes(total: u64, label: &str, quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(if total == 0 {
                "{prefix} {bytes} {bytes_per_sec}"
            } else {
                "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
            })
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Progress { bar: Some(bar) }
    }
    /// A bar for `total` chunks.
    pub fn chunks(total: u64, label: &str, quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} chunks eta {eta}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Progress { bar: Some(bar) }
    }
    /// Sets the position.
    pub fn set(&self, pos: u64) {
        if let Some(b) = &self.bar {
            b.set_position(pos);
        }
    }
    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Writes `bytes` to stdout.
pub fn write_stdout(w: &mut impl Write, bytes: &[u8]) -> Result<(), Error> {
    w.write_all(bytes).map_err(stdout_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_specials() {
        let mut b = ryu::Buffer::new();
        let mut o = Vec::new();
        for x in [0.1f32, 3.0, -0.0, 1e-45, f32::MAX, f32::INFINITY, f32::NAN] {
            push_f32(&mut o, x, &mut b);
            o.push(b' ');
        }
        let s = String::from_utf8(o).unwrap();
        assert_eq!(s, "0.1 3 -0.0 1e-45 3.4028235e38 \"inf\" \"nan\" ");
        for t in s.split(' ').take(5) {
            let _: f32 = t.parse().unwrap();
        }
    }
}
