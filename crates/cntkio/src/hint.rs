//! A hint to the processor: bring memory into the cache ahead of use (the second module of cntkio with
//! `unsafe` code, one line of it).
//!
//! Minibatches copy sequences from random places of loaded chunks; a copy that waits for each miss in turn
//! runs at memory latency. Asking for the next sequences' lines while copying the current one keeps
//! several misses in flight (measured: `cntkio batches … --bench` from CBF, see the README).

#![allow(unsafe_code)]

/// At most this many bytes of a slice are asked for (the first lines of a long sequence are what the copy
/// needs first; the hardware prefetcher follows the rest).
const MAX_BYTES: usize = 2048;

/// Asks for the cache lines of (the start of) `s`. Changes nothing but timing.
#[inline]
pub(crate) fn prefetch<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = s.as_ptr().cast::<i8>();
        let len = std::mem::size_of_val(s).min(MAX_BYTES);
        let mut off = 0;
        while off < len {
            // SAFETY: a prefetch never faults and has no effect other than on the cache; the address is in
            // `s` (off < its size in bytes), so the pointer arithmetic stays within one allocation. SSE is
            // part of the x86_64 baseline, so the instruction exists.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefetch_any_slice() {
        // Empty, short, unaligned and long slices: a hint, nothing to observe but that it returns.
        let v: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        super::prefetch::<u8>(&[]);
        super::prefetch(&v[3..5]);
        super::prefetch(&v[1..]);
        let f = vec![1.5f64; 1000];
        super::prefetch(&f[7..]);
        assert_eq!(v[9_999], (9_999u32 % 256) as u8);
    }
}
