//! Minibatch plans made ahead: the sequence enumerator (randomization and packing, READER.md §3–§6) runs on
//! a thread of its own while the caller copies the sequences of earlier minibatches.
//!
//! A [`MinibatchSource`](super::MinibatchSource) hands its enumerator to an [`Ahead`] once the same
//! minibatch size has been asked for twice in a row: the thread then asks the enumerator for one minibatch
//! after another, with that size, and queues the plans (the sequences each minibatch takes, its flags and
//! the position after it) up to a bound. The source takes the plans in order; they are exactly what its
//! own calls would have returned, because they are the same calls in the same order.
//!
//! When the caller asks for another size, restores, or the run ends, the source takes the enumerator back
//! ([`Ahead::finish`]). If plans were made that the source did not use, the enumerator has moved past the
//! position of the last minibatch handed out, and the source moves it back by an exact restore to that
//! position (which continues exactly as the uninterrupted run; see the module docs of
//! [`source`](super)). Making plans ahead therefore never changes a minibatch.
//!
//! A thread that has planned the last minibatch of the run then runs the hook given to [`Ahead::then`], if
//! any: a training loop's next epoch starts planning there ([`MinibatchSource::then`](super::MinibatchSource::then)).

use super::Enumerator;
use crate::randomize::Minibatch;
use crate::Error;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// At most this many sequences are planned ahead (24 bytes each), and always at least one minibatch. Enough
/// for the thread to shuffle the next sweep's window while the caller still has sequences to copy.
const MAX_AHEAD: usize = 1 << 20;

/// What a planning thread runs once it has planned the last minibatch of the run (not when stopped).
pub(super) type Then = Box<dyn FnOnce() + Send>;

/// A minibatch planned ahead.
pub(super) struct Planned {
    /// What the enumerator returned.
    pub result: Result<Minibatch, Error>,
    /// The enumerator's position after it.
    pub position: u64,
}

#[derive(Default)]
struct Queue {
    plans: VecDeque<Planned>,
    /// Sequences in `plans`.
    sequences: usize,
    /// Plans made by the thread (including one it dropped because it was stopped).
    made: u64,
    /// The source asks the thread to stop.
    stop: bool,
    /// The thread has stopped (after its last plan, or when asked).
    done: bool,
    /// The source waits for a plan; the thread waits for room (each is woken only when waiting: a wake-up
    /// is a system call).
    source_waits: bool,
    thread_waits: bool,
    /// The thread planned the last minibatch of the run (it was not stopped before).
    reached: bool,
    /// What the thread runs after that ([`Ahead::then`]).
    then: Option<Then>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a plan is queued or taken, and when the thread stops or is asked to.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The thread never panics while holding the lock; the queue stays consistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The enumerator, running ahead on its own thread for one minibatch size.
pub(super) struct Ahead {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<Enumerator>>,
    /// The process that started the thread (a forked child has no such thread and must not join it).
    pid: u32,
    /// The minibatch size asked for (the thread plans with the worker's share of it).
    pub size: u64,
    /// The position after the last plan taken (where the source is).
    pub position: u64,
    /// Plans taken.
    taken: u64,
}

impl Ahead {
    /// Starts planning minibatches of `local` samples for this worker (requested size `size`) from
    /// `position`, where `enumerator` is. Gives the enumerator back if no thread can be started.
    pub fn start(enumerator: Enumerator, size: u64, local: u64, position: u64) -> Result<Ahead, Enumerator> {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), changed: Condvar::new() });
        // The enumerator goes to the thread through a slot, so that it comes back if the thread cannot start.
        let slot = Arc::new(Mutex::new(Some(enumerator)));
        let (sh, sl) = (shared.clone(), slot.clone());
        let spawned = std::thread::Builder::new().name("cntkio-plan".into()).spawn(move || {
            let e = sl.lock().unwrap_or_else(|e| e.into_inner()).take().expect("the enumerator is handed over once");
            run(e, local, &sh)
        });
        match spawned {
            Ok(handle) => Ok(Ahead { shared, handle: Some(handle), pid: std::process::id(), size, position, taken: 0 }),
            Err(e) => {
                log::warn!("minibatches are planned on the caller's thread: no planning thread ({e})");
                Err(slot.lock().unwrap_or_else(|e| e.into_inner()).take().expect("the thread did not start"))
            }
        }
    }

    /// Runs `then` once the thread has planned the last minibatch of the run (now, if it has); never if
    /// the thread stops before that.
    pub fn then(&self, then: Then) {
        let mut q = self.shared.lock();
        if !q.done {
            q.then = Some(then);
        } else if q.reached {
            drop(q);
            then();
        }
    }

    /// The next plan, waiting for it; `None` if the thread stopped without making one (it stops only after
    /// the last plan of the run, an error, or when asked).
    pub fn next(&mut self) -> Option<Planned> {
        let mut q = self.shared.lock();
        loop {
            if let Some(p) = q.plans.pop_front() {
                q.sequences -= p.result.as_ref().map_or(0, |m| m.picks.len());
                let wake = q.thread_waits;
                drop(q);
                if wake {
                    self.shared.changed.notify_all();
                }
                self.taken += 1;
                self.position = p.position;
                return Some(p);
            }
            if q.done {
                return None;
            }
            q.source_waits = true;
            q = self.shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            q.source_waits = false;
        }
    }

    /// Stops the thread and takes the enumerator back, with whether it has moved past
    /// [`position`](Self::position) (plans were made that were not taken). Errors: the thread panicked (the
    /// enumerator is lost).
    pub fn finish(mut self) -> Result<(Enumerator, bool), Error> {
        {
            let mut q = self.shared.lock();
            q.stop = true;
            q.plans.clear();
        }
        self.shared.changed.notify_all();
        let handle = self.handle.take().expect("joined once");
        let e = handle.join().map_err(|_| Error::internal("the minibatch planning thread panicked"))?;
        let made = self.shared.lock().made;
        Ok((e, made != self.taken))
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else { return };
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if std::process::id() == self.pid {
            let _ = handle.join();
        }
        // In a forked child the thread does not exist: joining it would wait forever. Its handle is let go.
    }
}

/// The thread: plans minibatches until the last one of the run, an error, or a stop; then runs the
/// [`Ahead::then`] hook if it planned the last one.
fn run(mut e: Enumerator, local: u64, shared: &Shared) -> Enumerator {
    let mut reached = false;
    loop {
        let result = e.get_next(u64::MAX, local);
        let last = result.as_ref().map_or(true, |m| m.end_of_epoch || m.picks.is_empty());
        let position = e.get_state();
        let n = result.as_ref().map_or(0, |m| m.picks.len());
        let mut q = shared.lock();
        q.made += 1;
        while !q.stop && !q.plans.is_empty() && q.sequences + n > MAX_AHEAD {
            q.thread_waits = true;
            q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            q.thread_waits = false;
        }
        if q.stop {
            break;
        }
        q.plans.push_back(Planned { result, position });
        q.sequences += n;
        let wake = q.source_waits;
        drop(q);
        if wake {
            shared.changed.notify_all();
        }
        if last {
            reached = true;
            break;
        }
    }
    let then = {
        let mut q = shared.lock();
        q.done = true;
        q.reached = reached;
        q.then.take().filter(|_| reached)
    };
    shared.changed.notify_all();
    if let Some(f) = then {
        f();
    }
    e
}
