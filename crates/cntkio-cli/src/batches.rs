//! `cntkio batches`: minibatches of CNTK's V2 minibatch source as JSON Lines, one minibatch per line:
//! `{"mb": i, "sweep_end": bool, "streams": {"NAME": {"keys": [...], "sequences": [SAMPLES, …]}}}` with
//! samples as in `dump`, and `{"state": …}` after `--checkpoint-after M` minibatches. With `--truncation T`
//! every stream is dense, each entry of "sequences" is a fragment of the sequence with that key, and the
//! line also has `"bptt": {"rows": P, "columns": T, "fragments": [[ROW, COLUMN, OFFSET, SEQUENCE_LEN], …]}`
//! (OFFSET: samples of the sequence delivered before; the fragment ends it iff OFFSET + its length =
//! SEQUENCE_LEN).

use crate::args::BatchesArgs;
use crate::output::{push_json_str, push_sequence_samples, write_stdout};
use crate::EXIT_OK;
use cntkio::randomize::Window;
use cntkio::source::{Batch, Feed, FeedConfig, MinibatchConfig, MinibatchSource, RunLength, SourceState};
use cntkio::{Error, StreamSpec};
use std::io::Write;

/// The source configuration given by the flags.
pub fn config(a: &BatchesArgs) -> MinibatchConfig {
    MinibatchConfig {
        randomize: a.randomize,
        window: match (a.window_samples, a.window_chunks) {
            (Some(w), _) => Window::Samples(w),
            (None, Some(w)) => Window::Chunks(w),
            (None, None) => Window::Chunks(128),
        },
        seed: a.seed,
        run_length: match (a.max_sweeps, a.max_samples) {
            (_, Some(n)) => RunLength::Samples(n),
            (Some(k), None) => RunLength::Sweeps(k),
            (None, None) => RunLength::Sweeps(1),
        },
        frame_mode: a.frame_mode,
        workers: a.workers,
        rank: a.rank,
        cntk_restore_quirk: a.cntk_restore,
        balanced_workers: a.balanced_workers,
        threads: a.read.threads,
        prefetch: None,
        truncation_length: a.truncation.unwrap_or(0),
        elastic_resume: None,
    }
}

/// Reads a state from a file: the first line that starts with `{"state":` (so the whole output of a run
/// with `--checkpoint-after` will do), or the bare state object.
pub fn read_state(path: &std::path::Path) -> Result<SourceState, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let bad = |m: String| Error::state(m).with_path(path.display().to_string());
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("{\"state\""))
        .or_else(|| text.lines().find(|l| l.trim_start().starts_with('{')))
        .ok_or_else(|| bad("no {\"state\": …} line".into()))?;
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let st = v.get("state").unwrap_or(&v);
    SourceState::from_json(&st.to_string()).map_err(|e| e.with_path(path.display().to_string()))
}

/// Appends one minibatch as a JSON line.
pub fn push_batch_line(out: &mut Vec<u8>, mb: u64, batch: &Batch, streams: &[StreamSpec], buf: &mut ryu::Buffer) {
    out.extend_from_slice(b"{\"mb\":");
    out.extend_from_slice(mb.to_string().as_bytes());
    out.extend_from_slice(if batch.end_of_sweep { b",\"sweep_end\":true" } else { b",\"sweep_end\":false" });
    if let Some(l) = &batch.bptt {
        out.extend_from_slice(
            format!(",\"bptt\":{{\"rows\":{},\"columns\":{},\"fragments\":[", l.rows, l.columns).as_bytes(),
        );
        for (i, f) in l.fragments.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(format!("[{},{},{},{}]", f.row, f.column, f.offset, f.sequence_len).as_bytes());
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b",\"streams\":{");
    let keys = batch.data.keys.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(",");
    for (i, s) in streams.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json_str(out, &s.name);
        out.extend_from_slice(b":{\"keys\":[");
        out.extend_from_slice(keys.as_bytes());
        out.extend_from_slice(b"],\"sequences\":[");
        for seq in 0..batch.num_sequences() {
            if seq > 0 {
                out.push(b',');
            }
            push_sequence_samples(out, &batch.data, i, seq, buf);
        }
        out.extend_from_slice(b"]}");
    }
    out.extend_from_slice(b"}}\n");
}

/// Appends the state line.
pub fn push_state_line(out: &mut Vec<u8>, state: &SourceState) {
    out.extend_from_slice(b"{\"state\":");
    out.extend_from_slice(state.to_json().as_bytes());
    out.extend_from_slice(b"}\n");
}

/// Runs `batches`.
pub fn run(a: &BatchesArgs, _quiet: bool) -> Result<u8, Error> {
    if a.mb_size == 0 {
        return Err(Error::option("--mb-size", "must be > 0"));
    }
    let jobs = a.read.jobs(&a.files)?;
    let source = cntkio::inputs::open_all(&jobs, a.read.mapping(), a.read.threads())?;
    let mut src = MinibatchSource::new(source, config(a))?;
    if let Some(p) = &a.restore {
        src.restore(&read_state(p)?)?;
    }
    if a.bench {
        return bench(src, a.mb_size, a.read.threads());
    }
    let streams = src.streams().to_vec();
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut buf = ryu::Buffer::new();
    let mut out = Vec::with_capacity(1 << 20);
    let mut batch = Batch::new(&streams);
    let mut printed = 0u64;
    loop {
        out.clear();
        if a.checkpoint_after == Some(printed) {
            push_state_line(&mut out, &src.state());
        }
        let got = src.next_minibatch_into(a.mb_size, &mut batch);
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                write_stdout(&mut w, &out)?;
                w.flush().map_err(crate::output::stdout_error)?;
                return Err(e);
            }
        };
        if got {
            push_batch_line(&mut out, src.minibatches() - 1, &batch, &streams, &mut buf);
            printed += 1;
        }
        write_stdout(&mut w, &out)?;
        if !got {
            break;
        }
    }
    w.flush().map_err(crate::output::stdout_error)?;
    Ok(EXIT_OK)
}

/// `--bench`: reads the run without printing minibatches, assembled by `threads` threads with several
/// minibatches in flight (the feed of a training loop, [`Feed`]); reports minibatches, samples, samples/s
/// and peak memory on stdout as one JSON object, with `sweeps`: the samples, seconds and samples/s up to
/// each minibatch that ends a sweep (a later sweep of a run finds its window's chunks loaded already).
fn bench(src: MinibatchSource, mb_size: u64, threads: usize) -> Result<u8, Error> {
    let t = std::time::Instant::now();
    let mut feed = Feed::start(src, FeedConfig { size: mb_size, threads, ahead: 2 * threads + 2, group: 1 })?;
    let (mut minibatches, mut samples, mut sequences) = (0u64, 0u64, 0u64);
    let mut sweeps = Vec::new();
    let (mut sweep_start, mut sweep_samples) = (0.0, 0u64);
    while let Some(fed) = feed.next_batch()? {
        minibatches += fed.parts.len() as u64;
        samples += fed.batch.num_declared_samples();
        sequences += fed.batch.num_sequences() as u64;
        if fed.parts.iter().any(|p| p.end_of_sweep) {
            let now = t.elapsed().as_secs_f64();
            let (n, secs) = (samples - sweep_samples, now - sweep_start);
            sweeps.push(serde_json::json!({"samples": n, "seconds": secs, "samples_per_second": rate(n, secs)}));
            (sweep_start, sweep_samples) = (now, samples);
        }
        feed.recycle(fed.batch);
    }
    let secs = t.elapsed().as_secs_f64();
    let line = serde_json::json!({
        "minibatches": minibatches,
        "sequences": sequences,
        "samples": samples,
        "seconds": secs,
        "samples_per_second": rate(samples, secs),
        "sweeps": sweeps,
        "threads": threads,
        "peak_rss_bytes": peak_rss_bytes(),
    });
    let mut out = line.to_string().into_bytes();
    out.push(b'\n');
    write_stdout(&mut std::io::stdout().lock(), &out)?;
    Ok(EXIT_OK)
}

fn rate(samples: u64, secs: f64) -> f64 {
    samples as f64 / secs.max(1e-9)
}

/// The process's peak resident set size (Linux `VmHWM`), if known.
fn peak_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
