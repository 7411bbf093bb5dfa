//! Hints to the processor and copies that cost one `memcpy` (the second module of cntkio with `unsafe`
//! code: one line to bring memory into the cache, and one byte copy per element type).
//!
//! Minibatches copy sequences from random places of loaded chunks; a copy that waits for each miss in turn
//! runs at memory latency. Asking for the next sequences' lines while copying the current one keeps
//! several misses in flight (`cntkio batches … --bench` from CBF shows the effect).

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

/// Defines a function appending the little-endian values of a byte slice to a `Vec` of a float type.
macro_rules! extend_le {
    ($name:ident, $t:ty, $size:literal) => {
        /// Appends the little-endian values in `raw` (whose length must be a multiple of the value size) to
        /// `v`: on little-endian targets one copy of the bytes (a dense minibatch's values are its bulk, and
        /// an element-by-element copy is slower than one `memcpy`).
        ///
        /// # Panics
        ///
        /// If `raw.len()` is not a multiple of the value size.
        #[inline]
        pub(crate) fn $name(v: &mut Vec<$t>, raw: &[u8]) {
            assert!(raw.len() % $size == 0, "a whole number of values");
            let n = raw.len() / $size;
            #[cfg(target_endian = "little")]
            {
                v.reserve(n);
                let len = v.len();
                // SAFETY: `reserve` made room for `n` more values after the `len` initialized ones, so the
                // destination (`n * $size == raw.len()` bytes from the end of the initialized part) lies in
                // `v`'s allocation, and it cannot overlap `raw` (which `v` does not own while borrowed
                // mutably). Every bit pattern is a valid float, and on a little-endian target the bytes of a
                // little-endian value are its in-memory representation, so the `n` values after `len` are
                // initialized to exactly what `from_le_bytes` would give before `set_len` exposes them.
                unsafe {
                    std::ptr::copy_nonoverlapping(raw.as_ptr(), v.as_mut_ptr().add(len).cast::<u8>(), raw.len());
                    v.set_len(len + n);
                }
            }
            #[cfg(not(target_endian = "little"))]
            v.extend(raw.chunks_exact($size).map(|c| <$t>::from_le_bytes(c.try_into().expect("value size"))));
        }
    };
}

extend_le!(extend_f32_le, f32, 4);
extend_le!(extend_f64_le, f64, 8);

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

    #[test]
    fn extend_le_is_from_le_bytes() {
        // Every kind of bit pattern (NaNs with payloads, infinities, subnormals, -0), at unaligned offsets,
        // appended after existing values, with and without spare capacity.
        let raw: Vec<u8> = (0..4099u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for off in 0..8 {
            for len in [0usize, 8, 16, 64, 4000] {
                let b = &raw[off..off + len];
                let mut f = vec![1.5f32, -2.0];
                let mut want = f.clone();
                super::extend_f32_le(&mut f, b);
                want.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                assert_eq!(
                    f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
                let mut d = Vec::with_capacity(1000);
                d.push(7.0f64);
                let mut want = d.clone();
                super::extend_f64_le(&mut d, b);
                want.extend(b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())));
                assert_eq!(
                    d.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
            }
        }
        let specials =
            [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MIN_POSITIVE / 2.0, f32::from_bits(0x7fc0_1234)];
        let b: Vec<u8> = specials.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut f = Vec::new();
        super::extend_f32_le(&mut f, &b);
        assert_eq!(
            f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            specials.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    #[should_panic(expected = "a whole number of values")]
    fn extend_le_refuses_a_partial_value() {
        super::extend_f32_le(&mut Vec::new(), &[1, 2, 3]);
    }
}
