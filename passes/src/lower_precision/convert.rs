//! fp32 → fp16 / bf16 tensor conversion, round-to-nearest-even, with the
//! clamping rule: finite fp32 values beyond fp16's range become ±65504
//! (not ±inf, which turns a `-1e9` attention mask into NaNs after Softmax).
//! bf16 has fp32's exponent range and never needs clamping.

use bytes::Bytes;
use graphopt_ir::{DType, Tensor};

/// The largest finite fp16 value.
pub const F16_MAX: f32 = 65504.0;
/// The smallest positive normal fp16 value; below it precision drops.
const F16_MIN_NORMAL: f32 = 6.103_515_6e-5;

/// What converting one tensor did to its values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Conversion {
    /// Finite values beyond ±65504, clamped.
    pub clamped: u64,
    /// Non-zero values that became zero or subnormal (lost precision).
    pub underflowed: u64,
    pub nonzero: u64,
    /// Relative L2 error of the rounded tensor (finite values).
    pub rel_l2: f64,
}

/// The relative L2 rounding error above which a tensor read only in fp32
/// stays fp32: fp16's own rounding is at most 2^-11 ≈ 4.9e-4 per value, so
/// this only trips on tensors whose values sit mostly below fp16's normal
/// range (tiny epsilons, scaled-down weights), where subnormals lose digits.
pub const MAX_STORE_REL_L2: f64 = 2e-3;

impl Conversion {
    /// True when storing the tensor low and casting it back up is close to
    /// lossless: nothing clamped and the tensor's rounding error is small.
    /// (Counting values below the normal range would be wrong: a weight
    /// with std 0.004 has 1% of them, and they carry almost nothing.)
    pub fn faithful(&self) -> bool {
        self.clamped == 0 && self.rel_l2 <= MAX_STORE_REL_L2
    }
}

/// Converts an fp32 tensor to `low` (F16 or BF16); `None` for other input.
pub fn lower_tensor(t: &Tensor, low: DType) -> Option<(Tensor, Conversion)> {
    if t.dtype != DType::F32 {
        return None;
    }
    let raw = t.raw()?;
    let mut out = Vec::with_capacity(raw.len() / 2);
    let mut c = Conversion::default();
    let (mut num, mut den) = (0f64, 0f64);
    for chunk in raw.chunks_exact(4) {
        let x = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        if x != 0.0 && x.is_finite() {
            c.nonzero += 1;
        }
        let bits = match low {
            DType::F16 => {
                let y = if x.is_finite() && x.abs() > F16_MAX {
                    c.clamped += 1;
                    F16_MAX.copysign(x)
                } else {
                    x
                };
                if y != 0.0 && y.abs() < F16_MIN_NORMAL {
                    c.underflowed += 1;
                }
                f32_to_f16_bits(y)
            }
            DType::BF16 => f32_to_bf16_bits(x),
            _ => return None,
        };
        out.extend_from_slice(&bits.to_le_bytes());
        if x.is_finite() {
            let y = match low {
                DType::F16 => f16_bits_to_f32(bits),
                _ => f32::from_bits((bits as u32) << 16),
            };
            let (x, y) = (x as f64, y as f64);
            num += (x - y) * (x - y);
            den += x * x;
        }
    }
    c.rel_l2 = if den > 0.0 { (num / den).sqrt() } else { 0.0 };
    let mut nt = Tensor::from_raw(low, t.dims.clone(), Bytes::from(out)).ok()?;
    nt.name = t.name.clone();
    nt.doc_string = t.doc_string.clone();
    nt.metadata_props = t.metadata_props.clone();
    Some((nt, c))
}

/// `x` rounded to the nearest fp16 (ties to even); overflow gives ±inf.
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let halfway = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > halfway || (rest == halfway && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        // A carry into the exponent is the correct rounding (up to ±inf).
        r += 1;
    }
    sign | r as u16
}

/// The value of fp16 bits.
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f32;
    match exp {
        0 => sign * man * 2f32.powi(-24),
        0x1f if man == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        e => sign * (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

/// `x` rounded to the nearest bf16 (ties to even); NaN stays NaN.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    (r >> 16) as u16
}

#[cfg(test)]
#[allow(clippy::excessive_precision)] // exact binary fractions, spelled out
mod tests {
    use super::*;

    fn back(t: &Tensor) -> Vec<f64> {
        t.to_f64_vec().unwrap()
    }

    #[test]
    fn fp16_rounding_matches_ieee() {
        let xs = [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            0.1,
            65504.0,
            65519.0,
            1e-5,
            6e-8,
            2.9e-8,
            3.0e-8,
            1e-9,
            f32::INFINITY,
            1.0009766,
            1.00048828125,
            1.0014648,
        ];
        let t = Tensor::from_f32(vec![xs.len() as i64], &xs).unwrap();
        let (l, c) = lower_tensor(&t, DType::F16).unwrap();
        let got = back(&l);
        // Reference values from numpy's float16 (round to nearest even).
        let want = [
            0.0,
            -0.0,
            1.0,
            -2.5,
            0.0999755859375,
            65504.0,
            65504.0,
            1.0013580322265625e-5,
            5.960464477539063e-8,
            0.0,
            5.960464477539063e-8,
            0.0,
            f64::INFINITY,
            1.0009765625,
            1.0,
            1.001953125,
        ];
        assert_eq!(got, want);
        assert_eq!(c.clamped, 1); // 65519 is beyond 65504
        for (&x, &y) in xs.iter().zip(&want) {
            let x = if x.is_finite() { x.min(F16_MAX) } else { x };
            let back = f16_bits_to_f32(f32_to_f16_bits(x));
            assert!(
                back as f64 == y || (y.is_nan() && back.is_nan()),
                "{x}: {back} vs {y}"
            );
        }
        assert!(f32::from_bits(0x7fc0_0000).is_nan());
        assert_eq!(f32_to_f16_bits(f32::NAN) & 0x7c00, 0x7c00);
    }

    #[test]
    fn clamps_out_of_range_values() {
        let t = Tensor::from_f32(vec![3], &[-1e9, 1e5, f32::NEG_INFINITY]).unwrap();
        let (l, c) = lower_tensor(&t, DType::F16).unwrap();
        assert_eq!(back(&l), vec![-65504.0, 65504.0, f64::NEG_INFINITY]);
        assert_eq!(c.clamped, 2);
        assert!(!c.faithful());
        let (b, c) = lower_tensor(&t, DType::BF16).unwrap();
        assert_eq!(c.clamped, 0);
        assert_eq!(back(&b)[0], -998244352.0);
        // Small weights are faithful even with many subnormals; tiny ones are not.
        let small: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 8e-6).collect();
        let t = Tensor::from_f32(vec![1000], &small).unwrap();
        assert!(lower_tensor(&t, DType::F16).unwrap().1.faithful());
        let tiny: Vec<f32> = small.iter().map(|x| x * 1e-3).collect();
        let t = Tensor::from_f32(vec![1000], &tiny).unwrap();
        assert!(!lower_tensor(&t, DType::F16).unwrap().1.faithful());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let t = Tensor::from_f32(vec![3], &[1.0, 1.00390625, 1.01171875]).unwrap();
        let (b, _) = lower_tensor(&t, DType::BF16).unwrap();
        assert_eq!(back(&b), vec![1.0, 1.0, 1.015625]);
    }
}
