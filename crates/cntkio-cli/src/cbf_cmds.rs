//! The commands on CBF input.

use crate::output::{push_dump_records, write_stdout, Progress};
use cntkio::cbf::CbfFile;
use cntkio::{ChunkData, Error, Layout, StorageFormat};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// `dump` of a CBF file.
pub fn dump(path: &Path, mmap: bool, w: &mut impl Write, progress: &Progress) -> Result<(), Error> {
    let f = CbfFile::open_with(path, &cntkio::cbf::CbfOptions::default().mmap(mmap))?;
    let schema = f.schema()?;
    let mut rbuf = ryu::Buffer::new();
    let mut out = Vec::with_capacity(1 << 20);
    let mut buf = Vec::new();
    let mut data = ChunkData::new(&schema);
    // The sequences CNTK delivers (CBF.md §3: not those of meta count 0 after the sweep's last sample, and
    // not past one with an empty record).
    let mut delivery = cntkio::cbf::Delivery::new(&f);
    for k in 0..f.chunk_count() {
        if delivery.is_done() {
            break;
        }
        f.read_chunk_into(k, &mut buf, &mut data)?;
        let (count, failed) = delivery.take(&data);
        out.clear();
        push_dump_records(&mut out, &schema, &data, count, &mut rbuf);
        write_stdout(w, &out)?;
        if let Some(e) = failed {
            return Err(e.with_path(path.display().to_string()));
        }
        progress.set(f.chunks()[k].offset);
    }
    Ok(())
}

/// The per-stream totals `inspect` prints beside its JSON report.
pub struct CbfTotals {
    f: CbfFile,
    len: u64,
    samples: Vec<u64>,
    nnz: Vec<u64>,
    /// Sorted meta lengths.
    lengths: Vec<u32>,
    chunks: Vec<serde_json::Value>,
}

/// `inspect` of a CBF file.
pub fn inspect(path: &Path, json_out: bool) -> Result<(), Error> {
    let (report, t) = inspect_report(path)?;
    let CbfTotals { f, len, samples, nnz, lengths, chunks } = t;
    let q = |p: f64| lengths.get(((lengths.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0);
    if json_out {
        out!("{}", serde_json::to_string_pretty(&report).expect("json"))?;
        return Ok(());
    }
    out!("{}: CBF version 1, {} bytes, header at byte {}", path.display(), len, f.header().header_offset())?;
    out!(
        "  sequences {}   samples {}   chunks {}   sequence length: min {}, median {}, p90 {}, max {}",
        report["sequences"],
        report["samples"],
        f.chunk_count(),
        q(0.0),
        q(0.5),
        q(0.9),
        q(1.0)
    )?;
    out!("  streams:")?;
    for (i, s) in f.streams().iter().enumerate() {
        out!(
            "    {:<14} {:<6} {:<6} dim {:<9} samples {:<10}{}",
            s.name,
            s.format.name(),
            s.element_type.cntk_name(),
            s.dim,
            samples[i],
            if s.format == StorageFormat::Sparse { format!(" nnz {}", nnz[i]) } else { String::new() }
        )?;
    }
    out!("  chunks:")?;
    for (k, c) in chunks.iter().enumerate().take(20) {
        out!(
            "    {k:<5} at byte {:<12} {:>12} bytes  {:>8} sequences  {:>9} samples",
            c["offset"],
            c["bytes"],
            c["sequences"],
            c["samples"]
        )?;
    }
    if chunks.len() > 20 {
        out!("    … {} more (see --json)", chunks.len() - 20)?;
    }
    Ok(())
}

/// The report of `inspect --json` on a CBF file, and the totals the text output needs.
pub fn inspect_report(path: &Path) -> Result<(serde_json::Value, CbfTotals), Error> {
    let f = CbfFile::open(path)?;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let schema = f.schema()?;
    let mut data = ChunkData::new(&schema);
    let mut buf = Vec::new();
    let n = schema.len();
    let (mut samples, mut nnz, mut seqs_with) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let mut lengths: Vec<u32> = Vec::new();
    let mut chunks = Vec::new();
    for (k, c) in f.chunks().iter().enumerate() {
        f.read_chunk_into(k, &mut buf, &mut data)?;
        lengths.extend_from_slice(&data.num_samples);
        for (i, st) in data.streams.iter().enumerate() {
            samples[i] += st.num_samples();
            if let Layout::Sparse { indices, .. } = &st.layout {
                nnz[i] += indices.len() as u64;
            }
            seqs_with[i] += (0..st.num_sequences()).filter(|&q| st.sequence_len(q) > 0).count() as u64;
        }
        let end = f.chunks().get(k + 1).map_or(f.header().header_offset(), |d| d.offset);
        chunks.push(json!({"offset": c.offset, "bytes": end - c.offset, "sequences": c.num_sequences, "samples": c.num_samples}));
    }
    lengths.sort_unstable();
    let q = |p: f64| lengths.get(((lengths.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0);
    let streams: Vec<_> = f
        .streams()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({
                "name": s.name,
                "storage": s.format.name(),
                "element_type": s.element_type.cntk_name(),
                "dim": s.dim,
                "samples": samples[i],
                "nnz": if s.format == StorageFormat::Sparse { json!(nnz[i]) } else { json!(null) },
                "sequences": seqs_with[i],
            })
        })
        .collect();
    let report = json!({
        "version": 1,
        "path": path.display().to_string(),
        "format": "cbf",
        "bytes": len,
        "cbf_version": 1,
        "header_offset": f.header().header_offset(),
        "sequences": lengths.len(),
        "samples": lengths.iter().map(|&x| u64::from(x)).sum::<u64>(),
        "sequence_length": {"unit": "meta samples", "min": q(0.0), "p50": q(0.5), "p90": q(0.9), "max": q(1.0)},
        "streams": streams,
        "chunks": chunks,
    });
    Ok((report, CbfTotals { f, len, samples, nnz, lengths, chunks }))
}

/// What [`bench`] measured.
#[derive(Debug, Clone, Copy)]
pub struct BenchResult {
    /// Seconds of the fastest pass.
    pub best_secs: f64,
    /// Seconds of the first pass (its decode buffers freshly allocated).
    pub first_secs: f64,
    /// Bytes one pass decodes: values, sparse indices, sample and sequence offsets.
    pub bytes: u64,
    /// Samples (meta counts) one pass decodes.
    pub samples: u64,
}

/// Decodes every chunk on `threads` threads, `repeat` times. Each thread decodes into its own
/// [`ChunkData`] (and read buffer), kept across chunks and passes as a reader's would be across a
/// sweep and epochs; chunks are handed out in file order.
pub fn bench(path: &Path, mmap: bool, threads: usize, repeat: usize) -> Result<BenchResult, Error> {
    let f = CbfFile::open_with(path, &cntkio::cbf::CbfOptions::default().mmap(mmap))?;
    let schema = f.schema()?;
    let mut states: Vec<(Vec<u8>, ChunkData)> =
        (0..threads.max(1)).map(|_| (Vec::new(), ChunkData::new(&schema))).collect();
    let mut res = BenchResult { best_secs: f64::INFINITY, first_secs: 0.0, bytes: 0, samples: 0 };
    for pass in 0..repeat.max(1) {
        let t = Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Result<(u64, u64), Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = states
                .iter_mut()
                .map(|(buf, data)| {
                    let (f, next) = (&f, &next);
                    s.spawn(move || {
                        let (mut bytes, mut samples) = (0u64, 0u64);
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if k >= f.chunk_count() {
                                return Ok((bytes, samples));
                            }
                            f.read_chunk_into(k, buf, data)?;
                            samples += data.num_samples.iter().map(|&n| u64::from(n)).sum::<u64>();
                            for st in &data.streams {
                                bytes += (st.values.len() * st.values.element_type().size_bytes()) as u64;
                                bytes += (st.sequence_offsets.len() * 8) as u64;
                                if let Layout::Sparse { indices, sample_offsets } = &st.layout {
                                    bytes += (indices.len() * 4 + sample_offsets.len() * 8) as u64;
                                }
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("a decoder thread panicked"))))
                .collect()
        });
        let secs = t.elapsed().as_secs_f64();
        let (mut bytes, mut samples) = (0, 0);
        for r in results {
            let (b, s) = r?;
            bytes += b;
            samples += s;
        }
        if pass == 0 {
            res.first_secs = secs;
        }
        res.best_secs = res.best_secs.min(secs);
        (res.bytes, res.samples) = (bytes, samples);
    }
    Ok(res)
}
