//! The reading threads of a forked process. The library parallelises with rayon's global pool, which does
//! not survive `fork`: in the child its threads are gone and the first parallel call waits for them
//! forever — and PyTorch's DataLoader forks its workers after the parent has read. In the process that
//! loaded the extension, calls run as they are (the global pool is its own); in a forked child, they run in
//! a pool the child makes on first use, of which the calling thread is itself a member (so the calls made
//! from that thread run in place, with no hand-over to another thread).

use std::sync::{Arc, Mutex, OnceLock};

static HOME: OnceLock<u32> = OnceLock::new();
static POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

/// Records the process that loaded the extension (its rayon pool is usable); called by the module init.
pub fn init() {
    let _ = HOME.set(std::process::id());
}

fn pool() -> Option<Arc<rayon::ThreadPool>> {
    let mut slot = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((owner, pool)) = slot.as_ref() {
        if *owner == pid {
            return Some(pool.clone());
        }
    }
    if let Some(inherited) = slot.take() {
        // A pool of the parent: its threads do not exist here; dropping it would signal them.
        std::mem::forget(inherited);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let builder = || rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("cntkio-{i}"));
    // The calling thread joins the pool when it can (it cannot when it already belongs to one).
    let made = builder().use_current_thread().build().or_else(|_| builder().build()).map(Arc::new);
    let p = made.ok()?;
    *slot = Some((pid, p.clone()));
    Some(p)
}

/// Runs `f` where rayon's parallel iterators work in this process: directly in the process that loaded the
/// extension, else in this process's own pool (in place when the calling thread belongs to it); on the
/// calling thread alone when no threads can be started.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if HOME.get() == Some(&std::process::id()) {
        return f();
    }
    match pool() {
        Some(p) if p.current_thread_index().is_some() => f(),
        Some(p) => p.install(f),
        None => f(),
    }
}
