//! The next source of a training loop (its next epoch), started while the source before it is still read
//! ([`MinibatchSource::then`]).

use super::MinibatchSource;
use std::sync::Arc;
use std::time::Duration;

/// When the source given to [`MinibatchSource::then`] starts planning, once the source it follows has
/// planned its last minibatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlanNext {
    /// Then, always.
    Always,
    /// Then, if the process has left at least one core idle on average since `then` was called (its CPU
    /// time at most the elapsed time × (cores − 1); always where the system does not tell a process's CPU
    /// time). Where the reading keeps every core busy, shuffling the next sweep meanwhile only takes the
    /// cores from the last minibatches of this one.
    WhenCoreIdle,
}

/// Whether `cpu` of CPU time over `wall` left at least one of `cores` idle on average.
pub(super) fn left_core_idle(cpu: Duration, wall: Duration, cores: usize) -> bool {
    let spare = u32::try_from(cores.saturating_sub(1)).unwrap_or(u32::MAX);
    wall.checked_mul(spare).is_none_or(|room| cpu <= room)
}

/// The CPU time of this process so far, where the system tells it.
pub(super) fn process_cpu_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        Some(Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0)))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Where the next source of a training loop waits, planning ahead, once the source it follows has planned
/// its last minibatch ([`MinibatchSource::then`]).
#[derive(Debug, Default)]
pub struct NextSource {
    state: std::sync::Mutex<NextState>,
    ready: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct NextState {
    source: Option<MinibatchSource>,
    /// The source is being started (its run begun, its planning thread started) on a thread of its own.
    pending: bool,
}

impl NextSource {
    fn lock(&self) -> std::sync::MutexGuard<'_, NextState> {
        // Nothing panics while holding the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next source, if it is there: with its first minibatches being planned (or planned) by a thread
    /// of its own (waiting while that thread starts). `None` when the source it follows did not get to plan
    /// its last minibatch on a planning thread (it was stopped, asked for another size, restored, or plans
    /// on the caller's thread), or when the source was taken already.
    pub fn take(&self) -> Option<MinibatchSource> {
        let mut st = self.lock();
        while st.pending {
            st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.source.take()
    }

    /// Whether a source waits here (or is being started).
    pub fn is_waiting(&self) -> bool {
        let st = self.lock();
        st.pending || st.source.is_some()
    }

    /// Starts `next` planning minibatches of `size` on a thread of its own, and keeps it here (the slot
    /// stays empty if no thread can be started: the next feed then reads a fresh source).
    pub(super) fn start(self: Arc<Self>, mut next: MinibatchSource, size: u64) {
        self.lock().pending = true;
        let to = self.clone();
        // Starting the run shuffles the first window (READER.md §3.4): not on the thread that runs this
        // hook, which the source it follows may be waiting for.
        let spawned = std::thread::Builder::new().name("cntkio-plan-next".into()).spawn(move || {
            if let Err(e) = next.plan_ahead(size) {
                log::debug!("the next source plans on the caller's thread: {e}");
            }
            to.finish(Some(next));
        });
        if spawned.is_err() {
            self.finish(None);
        }
    }

    /// Ends a start: `source` waits here (if any), and `take` stops waiting.
    fn finish(&self, source: Option<MinibatchSource>) {
        let mut st = self.lock();
        st.source = source;
        st.pending = false;
        drop(st);
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::left_core_idle;
    use std::time::Duration;

    #[test]
    fn the_next_source_starts_when_a_core_was_left_idle() {
        let ms = Duration::from_millis;
        // 2 cores for 100 ms: up to 100 ms of CPU leaves one idle on average.
        assert!(left_core_idle(ms(100), ms(100), 2));
        assert!(!left_core_idle(ms(101), ms(100), 2));
        // 16 cores, 3 of them busy.
        assert!(left_core_idle(ms(300), ms(100), 16));
        // One core: never a core to spare.
        assert!(!left_core_idle(ms(1), ms(100), 1));
        assert!(left_core_idle(ms(0), ms(100), 1));
    }
}
