//! The window: a stream decompressed in order, by a thread of its own, into a few blocks of memory that
//! reads copy from, for a caller that reads the data from front to back (a validation, the first pass over
//! a gzip stream). Nothing is written to disk, and the decompressor writes straight into the blocks. The
//! thread stays at most [`BLOCKS`] blocks ahead of what was dropped and [`AHEAD`] bytes ahead of the
//! furthest read, and drops a block only once the furthest read has passed it by [`HISTORY`] bytes; a read that starts before the oldest block kept is a
//! miss, which the caller serves otherwise (see [`super::Decompressed`] and [`super::points`]).

use crate::Error;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Bytes per block (small in tests, so that they go past the window).
pub(super) const BLOCK: usize = if cfg!(test) { 64 << 10 } else { 4 << 20 };
/// Blocks kept at most.
const BLOCKS: usize = 12;
/// How far behind the furthest read a block is still kept (reads on several threads are not in order).
const HISTORY: u64 = 4 * BLOCK as u64;
/// How far ahead of the furthest read the thread decompresses: enough to keep a reader in order from
/// waiting, and no more (a view opened to read a file's first bytes costs a few blocks, not the window).
const AHEAD: u64 = 4 * BLOCK as u64;

/// A decompressor that fills buffers with a stream's next bytes, fewer only at the stream's end.
pub(crate) trait Fill {
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Error>;
}

/// Makes the decompressor, on the window's thread.
pub(crate) type MakeFill = Box<dyn FnOnce() -> Result<Box<dyn Fill>, Error> + Send>;

/// A stream decompressed into a window of memory.
pub(crate) struct Window {
    shared: Arc<Shared>,
    /// What makes the decompressor, until the thread takes it (at the first read).
    start: Mutex<Option<MakeFill>>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window").field("shared", &self.shared).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    /// Set when the window is dropped or given up: the thread stops.
    stop: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Offset of the first block kept.
    first: u64,
    /// The blocks kept, in order; every one but the stream's last holds [`BLOCK`] bytes.
    blocks: VecDeque<Arc<Vec<u8>>>,
    /// Bytes decompressed.
    done: u64,
    finished: bool,
    error: Option<Error>,
    /// The largest offset a read has asked for.
    furthest: u64,
    /// Dropped blocks, for reuse.
    spare: Vec<Vec<u8>>,
    /// Given up: every read is a miss.
    gone: bool,
}

impl Window {
    /// A window on the stream that `make`'s decompressor gives; starts no thread.
    pub(crate) fn new(make: MakeFill) -> Window {
        let shared = Shared { state: Mutex::new(State::default()), cond: Condvar::new(), stop: AtomicBool::new(false) };
        Window { shared: Arc::new(shared), start: Mutex::new(Some(make)) }
    }

    /// Bytes decompressed so far (none of them may be kept any more).
    pub(crate) fn front(&self) -> u64 {
        self.shared.state.lock().expect("lock").done
    }

    /// Lets the thread run to the stream's end, dropping blocks as it goes, and waits for it: the stream's
    /// length, and the error that stopped it early, if any.
    pub(crate) fn finish(&self) -> (u64, Option<Error>) {
        self.start_thread();
        let mut s = self.shared.state.lock().expect("lock");
        s.furthest = u64::MAX;
        self.shared.cond.notify_all();
        while !s.finished {
            s = self.shared.cond.wait(s).expect("lock");
        }
        (s.done, s.error.clone())
    }

    /// Fills `buf` with the bytes at `offset` (fewer at the end of the stream), waiting for the thread to
    /// decompress them; `None` when a part of them was dropped already, or the window was given up (the
    /// caller then reads them otherwise, `buf` whole).
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        self.start_thread();
        let mut filled = 0usize;
        while filled < buf.len() {
            let pos = offset + filled as u64;
            let mut s = self.shared.state.lock().expect("lock");
            if pos > s.furthest {
                s.furthest = pos;
                self.shared.cond.notify_all();
            }
            while s.done <= pos && !s.finished && pos >= s.first && !s.gone {
                s = self.shared.cond.wait(s).expect("lock");
            }
            if pos < s.first || s.gone {
                return Ok(None);
            }
            if s.done <= pos {
                match &s.error {
                    Some(e) => return Err(e.clone()),
                    None => break,
                }
            }
            let end = s.done.min(offset + buf.len() as u64);
            let (i, j) = (((pos - s.first) as usize) / BLOCK, ((end - 1 - s.first) as usize) / BLOCK);
            let parts: Vec<(u64, Arc<Vec<u8>>)> =
                (i..=j).map(|k| (s.first + (k * BLOCK) as u64, s.blocks[k].clone())).collect();
            drop(s);
            for (at, block) in parts {
                let from = (pos.max(at) - at) as usize;
                let to = (end.min(at + BLOCK as u64) - at) as usize;
                let into = (at + from as u64 - offset) as usize;
                buf[into..into + to - from].copy_from_slice(&block[from..to]);
            }
            filled = (end - offset) as usize;
        }
        Ok(Some(filled))
    }

    /// Stops the thread: the window is not read any more.
    pub(crate) fn give_up(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let mut s = self.shared.state.lock().expect("lock");
        s.gone = true;
        s.blocks.clear();
        s.spare.clear();
        self.shared.cond.notify_all();
    }

    /// Starts the decompressing thread, once.
    fn start_thread(&self) {
        let Some(make) = self.start.lock().expect("lock").take() else { return };
        let (worker, shared) = (self.shared.clone(), self.shared.clone());
        super::spawn(
            move || decompress(&worker, make),
            move |r| {
                let mut s = shared.state.lock().expect("lock");
                s.finished = true;
                s.error = r.err();
                shared.cond.notify_all();
            },
        );
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.give_up();
    }
}

/// The thread's work: decompresses the stream block by block, each once there is room for it.
fn decompress(shared: &Shared, make: MakeFill) -> Result<(), Error> {
    let mut stream = make()?;
    loop {
        let mut block = {
            let mut s = shared.state.lock().expect("lock");
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                if s.done >= s.furthest.saturating_add(AHEAD) {
                    s = shared.cond.wait(s).expect("lock");
                    continue;
                }
                if s.blocks.len() < BLOCKS {
                    break;
                }
                if s.first + BLOCK as u64 + HISTORY <= s.furthest {
                    let old = s.blocks.pop_front().expect("full");
                    s.first += BLOCK as u64;
                    if let Ok(v) = Arc::try_unwrap(old) {
                        s.spare.push(v);
                    }
                    break;
                }
                s = shared.cond.wait(s).expect("lock");
            }
            s.spare.pop().unwrap_or_else(|| vec![0u8; BLOCK])
        };
        let n = stream.fill(&mut block)?;
        let mut s = shared.state.lock().expect("lock");
        s.blocks.push_back(Arc::new(block));
        s.done += n as u64;
        shared.cond.notify_all();
        if n < BLOCK {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A stream of `len` bytes (`k as u8` at offset k), counting what it has produced.
    struct Counting {
        len: u64,
        at: u64,
        made: Arc<AtomicU64>,
    }

    impl Fill for Counting {
        fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
            let n = (self.len - self.at).min(buf.len() as u64) as usize;
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = (self.at + k as u64) as u8;
            }
            self.at += n as u64;
            self.made.store(self.at, Ordering::SeqCst);
            Ok(n)
        }
    }

    /// The thread decompresses a few blocks ahead of the reads, not the whole window, and reaches the end
    /// when asked to.
    #[test]
    fn the_thread_stays_a_few_blocks_ahead_of_the_reads() {
        let len = 40 * BLOCK as u64;
        let made = Arc::new(AtomicU64::new(0));
        let theirs = made.clone();
        let w = Window::new(Box::new(move || Ok(Box::new(Counting { len, at: 0, made: theirs }) as Box<dyn Fill>)));
        let settled = |at_most: u64| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let m = made.load(Ordering::SeqCst);
            assert!(m <= at_most, "{m} bytes made, at most {at_most} expected");
            m
        };
        let mut buf = [0u8; 10];
        assert_eq!(w.read(0, &mut buf).unwrap(), Some(10));
        assert!(settled(AHEAD + BLOCK as u64) >= AHEAD);
        let at = 3 * BLOCK as u64 + 5;
        assert_eq!(w.read(at, &mut buf).unwrap(), Some(10));
        assert_eq!(buf[0], at as u8);
        assert!(settled(at + AHEAD + BLOCK as u64) >= at + AHEAD);
        let (done, error) = w.finish();
        assert!(done == len && error.is_none(), "{done} {error:?}");
        assert_eq!(made.load(Ordering::SeqCst), len);
    }
}
