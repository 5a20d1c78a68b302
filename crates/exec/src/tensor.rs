//! Host tensors (the runtime's inputs and outputs) and typed views of raw
//! bytes.

use graphopt_ir::DType;

/// A tensor in host memory: packed little-endian elements.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl HostTensor {
    pub fn from_f32(shape: &[usize], v: &[f32]) -> HostTensor {
        HostTensor {
            dtype: DType::F32,
            shape: shape.to_vec(),
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    pub fn from_i64(shape: &[usize], v: &[i64]) -> HostTensor {
        HostTensor {
            dtype: DType::I64,
            shape: shape.to_vec(),
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    /// The elements as f32 (copied; `None` unless the dtype is f32).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DType::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

mod sealed {
    /// Implemented only here: [`super::cast`] relies on every bit pattern
    /// of the type being a valid value.
    pub trait PlainData {}
    impl PlainData for f32 {}
    impl PlainData for f64 {}
    impl PlainData for i64 {}
    impl PlainData for i32 {}
    impl PlainData for u8 {}
    impl PlainData for i8 {}
    impl PlainData for u16 {}
    impl PlainData for u32 {}
    impl PlainData for u64 {}
}

/// Element types a byte slice may be viewed as (every bit pattern valid).
/// Sealed: no type outside this crate can implement it, so safe code
/// elsewhere cannot make [`cast`] view bytes as a type with invalid bit
/// patterns.
pub trait Elem: sealed::PlainData + Copy + Send + Sync + 'static {}
impl Elem for f32 {}
impl Elem for f64 {}
impl Elem for i64 {}
impl Elem for i32 {}
impl Elem for u8 {}
impl Elem for i8 {}
impl Elem for u16 {}
impl Elem for u32 {}
impl Elem for u64 {}

/// Views bytes as `T`. Panics when misaligned or not a whole number of
/// elements (arena offsets are 64-aligned and weights are aligned on load,
/// so this is a bug, not bad input).
pub fn cast<T: Elem>(b: &[u8]) -> &[T] {
    // SAFETY: `T` is plain old data (every bit pattern valid); align_to
    // only yields the aligned middle, checked to be the whole slice.
    let (pre, mid, post) = unsafe { b.align_to::<T>() };
    assert!(
        pre.is_empty() && post.is_empty(),
        "misaligned or ragged tensor bytes"
    );
    mid
}

/// Mutable [`cast`].
pub fn cast_mut<T: Elem>(b: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `cast`.
    let (pre, mid, post) = unsafe { b.align_to_mut::<T>() };
    assert!(
        pre.is_empty() && post.is_empty(),
        "misaligned or ragged tensor bytes"
    );
    mid
}

/// Bytes per element of the dtypes the runtime handles.
pub fn elem_size(d: DType) -> Option<usize> {
    Some(match d {
        DType::F32 | DType::I32 | DType::U32 => 4,
        DType::F64 | DType::I64 | DType::U64 => 8,
        DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
        DType::U8 | DType::I8 | DType::Bool => 1,
        _ => return None,
    })
}

/// Whether `d` is stored packed, two elements per byte (uint4, int4):
/// such initializers are read in place by Cast, DequantizeLinear and the
/// coded-weight kernels ([`crate::cpu::coded`]) only; no kernel writes
/// them.
pub fn is_packed4(d: DType) -> bool {
    matches!(d, DType::U4 | DType::I4)
}

/// Element `i` of packed 4-bit data, low nibble first (ONNX's `raw_data`
/// layout), as the unsigned value 0..=15.
#[inline]
pub fn nibble(b: &[u8], i: usize) -> u8 {
    (b[i >> 1] >> ((i & 1) << 2)) & 0xF
}

/// A 4-bit value (0..=15) as int4, sign-extended.
#[inline]
pub fn sign4(v: u8) -> i8 {
    ((v << 4) as i8) >> 4
}

/// Row-major strides (in elements) of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}
