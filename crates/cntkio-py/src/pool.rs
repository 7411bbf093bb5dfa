//! The reading threads of this process. The library parallelises with rayon; rayon's global pool does not
//! survive `fork` (its threads are gone in the child, which then waits for them forever), and PyTorch's
//! DataLoader forks its workers after the parent has read. Every call into the library that may use rayon
//! runs in a pool made by this process (made again, the parent's one abandoned, in a forked child).

use std::sync::{Arc, Mutex};

static POOL: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>> = Mutex::new(None);

fn pool() -> Option<Arc<rayon::ThreadPool>> {
    let mut slot = POOL.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((owner, pool)) = slot.as_ref() {
        if *owner == pid {
            return Some(pool.clone());
        }
    }
    if let Some(inherited) = slot.take() {
        // The parent's pool: its threads do not exist here; dropping it would signal them.
        std::mem::forget(inherited);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let made = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("cntkio-{i}"))
        .build()
        .map(Arc::new);
    let p = made.ok()?;
    *slot = Some((pid, p.clone()));
    Some(p)
}

/// Runs `f` in this process's pool (rayon's parallel iterators inside it use that pool).
/// Runs `f` in this process's pool (rayon's parallel iterators inside it use that pool); on the calling
/// thread when no threads can be started.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(p) => p.install(f),
        None => f(),
    }
}
