//! The elementwise activations a kernel may apply to its output as it
//! computes it ([`crate::backend::Kernel::fuse_activation`]). On their own
//! (no other crate items), so that benches/gemm_candidates compiles the
//! GEMM with them as is.

/// An elementwise activation fused into the kernel that produces its
/// input ([`crate::backend::Kernel::fuse_activation`]): the same arithmetic as its own
/// kernel, so a fused output has the same bits.
///
/// Both are written as the x86 `max`/`min` instructions compute them
/// (`max(a, b) = a > b ? a : b`, the second operand on a tie or a NaN),
/// so that a kernel's vector epilogue ([`Activation::apply_m256`]) and the
/// scalar form give the same bits, signed zeros and NaNs included.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `x > 0 ? x : 0` (a NaN becomes 0; the CPU Relu kernel's arithmetic).
    Relu,
    /// `m = lo > x ? lo : x; hi < m ? hi : m` (a NaN passes through; the
    /// CPU Clip kernel's).
    Clip { lo: f32, hi: f32 },
}

impl Activation {
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => {
                if x > 0.0 {
                    x
                } else {
                    0.0
                }
            }
            Activation::Clip { lo, hi } => {
                let m = if lo > x { lo } else { x };
                if hi < m {
                    hi
                } else {
                    m
                }
            }
        }
    }

    /// [`Activation::apply`] to eight lanes: `max(x, 0)` for Relu,
    /// `min(hi, max(lo, x))` for Clip (the operand order that gives
    /// [`Activation::apply`]'s result on ties and NaNs).
    ///
    /// # Safety
    /// The CPU has AVX.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx")]
    pub unsafe fn apply_m256(self, x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        match self {
            Activation::Relu => _mm256_max_ps(x, _mm256_setzero_ps()),
            Activation::Clip { lo, hi } => {
                _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x))
            }
        }
    }

    /// [`Activation::apply`] to every element (eight at a time where the
    /// CPU has AVX: the same bits).
    pub fn apply_all(self, xs: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX (checked just above).
            unsafe { self.apply_all_avx(xs) };
            return;
        }
        xs.iter_mut().for_each(|x| *x = self.apply(*x));
    }

    /// [`Activation::apply_all`] in vectors of eight, the tail one by one.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx")]
    unsafe fn apply_all_avx(self, xs: &mut [f32]) {
        use std::arch::x86_64::*;
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` is 8 floats.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(c.as_mut_ptr(), self.apply_m256(v));
            }
        }
        for x in chunks.into_remainder() {
            *x = self.apply(*x);
        }
    }
}
