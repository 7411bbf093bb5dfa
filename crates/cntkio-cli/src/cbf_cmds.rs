//! The commands on CBF input.

use crate::output::{push_dump_records, write_stdout, Progress};
use cntkio::cbf::CbfFile;
use cntkio::{ChunkData, Error, Layout};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// `dump` of a CBF file.
pub fn dump(
    path: &Path,
    options: &cntkio::cbf::CbfOptions,
    w: &mut impl Write,
    progress: &Progress,
) -> Result<(), Error> {
    let f = CbfFile::open_with(path, options)?;
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
                            samples += data.num_samples.iter().map(u64::from).sum::<u64>();
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
