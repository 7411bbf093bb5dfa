//! The spool: a stream decompressed once, in order, by a thread of its own into an unlinked temporary
//! file, which reads wait on and then read.

use super::window::Fill;
use super::{read_exact_at, Compression, Source, Stream};
use crate::Error;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// What the decompressing thread writes at a time (and then tells the readers about).
const STEP: usize = 4 << 20;
/// Room left free in the temporary directory: the spool stops with an error rather than fill it.
const RESERVE: u64 = 256 << 20;

/// A stream decompressed into a temporary file.
#[derive(Debug)]
pub(crate) struct Spool {
    shared: Arc<Shared>,
    /// The compressed file, until the thread takes it (at the first read).
    start: Mutex<Option<Source>>,
    /// The decompressed length, when the frames declare it.
    known_len: Option<u64>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    /// Set when the view is dropped: the thread stops at its next step.
    stop: AtomicBool,
    out: File,
    path: String,
    compression: Compression,
    /// The most the spool may hold (the temporary directory's free space less [`RESERVE`]).
    limit: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes decompressed and written to `out`.
    done: u64,
    finished: bool,
    error: Option<Error>,
}

impl Spool {
    /// A spool for `file`; `len` is the decompressed length if known. Creates the temporary file, and
    /// fails when the temporary directory lacks room for `len` bytes; starts no thread.
    pub(crate) fn new(file: Source, compression: Compression, len: Option<u64>, path: String) -> Result<Spool, Error> {
        let dir = std::env::temp_dir();
        let out = tempfile::tempfile_in(&dir).map_err(|e| {
            Error::io(format!("cannot create a temporary file in {} to decompress {path} into", dir.display()), e)
        })?;
        let room = crate::output::free_bytes(&out).map_or(u64::MAX, |free| free.saturating_sub(RESERVE));
        if let Some(len) = len.filter(|&l| l > room) {
            return Err(no_room(&path, &dir, len, room));
        }
        Ok(Spool::with_limit(file, compression, len, path, out, room))
    }

    fn with_limit(
        file: Source,
        compression: Compression,
        known_len: Option<u64>,
        path: String,
        out: File,
        limit: u64,
    ) -> Spool {
        let shared = Shared {
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            out,
            path,
            compression,
            limit,
        };
        Spool { shared: Arc::new(shared), start: Mutex::new(Some(file)), known_len }
    }

    /// The decompressed length: declared, or known once the whole stream is decompressed (one byte more
    /// than was decompressed if that failed, so that reading to the end meets the error).
    pub(crate) fn len(&self) -> u64 {
        if let Some(n) = self.known_len {
            return n;
        }
        let s = self.wait(u64::MAX);
        s.done + u64::from(s.error.is_some())
    }

    /// True once a read has started the decompressing thread.
    pub(crate) fn started(&self) -> bool {
        self.start.lock().expect("lock").is_none()
    }

    /// Reads up to `buf.len()` bytes at `offset`, waiting for the thread to decompress them.
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        let end = offset.saturating_add(buf.len() as u64);
        let s = self.wait(end);
        let n = s.done.saturating_sub(offset).min(buf.len() as u64) as usize;
        if n < buf.len() {
            if let Some(e) = s.error {
                return Err(e);
            }
        }
        read_exact_at(&self.shared.out, &mut buf[..n], offset)
            .map_err(|e| Error::io(format!("cannot read the decompressed copy of {}", self.shared.path), e))?;
        Ok(n)
    }

    /// Waits until `end` bytes are decompressed or the stream has ended; returns the state then.
    fn wait(&self, end: u64) -> State {
        self.start_thread();
        let mut s = self.shared.state.lock().expect("lock");
        while s.done < end && !s.finished {
            s = self.shared.cond.wait(s).expect("lock");
        }
        State { done: s.done, finished: s.finished, error: s.error.clone() }
    }

    /// Starts the decompressing thread, once.
    fn start_thread(&self) {
        let Some(file) = self.start.lock().expect("lock").take() else { return };
        let (worker, shared) = (self.shared.clone(), self.shared.clone());
        super::spawn(
            move || decompress(&worker, file),
            move |r| {
                let mut s = shared.state.lock().expect("lock");
                s.finished = true;
                s.error = r.err();
                shared.cond.notify_all();
            },
        );
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// The thread's work: decompresses the stream into `shared.out` step by step, telling readers after each.
fn decompress(shared: &Shared, file: Source) -> Result<(), Error> {
    let mut stream = Stream::new(file, shared.compression, &shared.path)?;
    let mut buf = vec![0u8; STEP];
    let mut out = &shared.out;
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let done = shared.state.lock().expect("lock").done;
        let n = stream.fill(&mut buf)?;
        if done + n as u64 > shared.limit {
            let dir = std::env::temp_dir();
            return Err(no_room(&shared.path, &dir, done + n as u64, shared.limit));
        }
        out.write_all(&buf[..n]).map_err(|e| {
            Error::io(
                format!("cannot write the decompressed copy of {} in {}", shared.path, std::env::temp_dir().display()),
                e,
            )
        })?;
        let mut s = shared.state.lock().expect("lock");
        s.done += n as u64;
        shared.cond.notify_all();
        if n < buf.len() {
            return Ok(());
        }
    }
}

/// The error for damaged data, `done` bytes into the decompressed stream.
pub(super) fn bad(compression: Compression, path: &str, done: u64, e: &std::io::Error) -> Error {
    let what = match e.kind() {
        std::io::ErrorKind::UnexpectedEof => TRUNCATED.to_string(),
        _ => e.to_string(),
    };
    damaged(compression, path, done, &what)
}

/// What a stream that ends in the middle of its compressed data is told.
pub(super) const TRUNCATED: &str = "the compressed data ends early (is the file truncated?)";

/// The error for damaged data (`what` is wrong), `done` bytes into the decompressed stream.
pub(super) fn damaged(compression: Compression, path: &str, done: u64, what: &str) -> Error {
    Error::compressed(compression.name(), None, format!("{what}, after {done} decompressed bytes"))
        .with_path(path.to_string())
}

/// The error for a decompressed copy that the temporary directory has no room for.
fn no_room(path: &str, dir: &std::path::Path, need: u64, room: u64) -> Error {
    Error::io(
        format!(
            "cannot decompress {path}: reading it needs a decompressed copy of at least {need} bytes in {}, which has room for {room} (it keeps {RESERVE} bytes free); set TMPDIR to a directory with more room, or decompress the file first",
            dir.display()
        ),
        std::io::Error::from(std::io::ErrorKind::StorageFull),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zstd(data: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        let mut e = zstd::stream::Encoder::new(&mut f, 1).unwrap();
        e.write_all(data).unwrap();
        e.finish().unwrap();
        f
    }

    /// A stream that decompresses to more than the spool may hold stops with an error once it has
    /// written that much: a decompression bomb fills neither memory nor the temporary directory.
    #[test]
    fn a_stream_larger_than_the_room_stops_with_an_error() {
        let zeros = vec![0u8; 3 * STEP + 5];
        let spool = |limit| {
            let out = tempfile::tempfile().unwrap();
            Spool::with_limit(
                Source::File(Arc::new(zstd(&zeros))),
                Compression::Zstd,
                None,
                "bomb.zst".into(),
                out,
                limit,
            )
        };
        let s = spool(2 * STEP as u64);
        let mut buf = vec![0u8; 16];
        assert_eq!(s.read_some(0, &mut buf).unwrap(), 16);
        let e = s.read_some(2 * STEP as u64, &mut buf).unwrap_err();
        assert!(e.is_io() && e.to_string().contains("set TMPDIR"), "{e}");
        assert_eq!(s.shared.out.metadata().unwrap().len(), 2 * STEP as u64, "it stopped at the limit");
        assert_eq!(s.len(), 2 * STEP as u64 + 1, "a failed stream's length makes reading to the end fail");

        let s = spool(u64::MAX);
        assert_eq!(s.len(), zeros.len() as u64);
        assert_eq!(s.read_some(zeros.len() as u64 - 3, &mut buf).unwrap(), 3);
    }
}
