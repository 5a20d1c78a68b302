//! CUDA C source for the CUDA backend's kernels: pure functions from shapes
//! and dtypes to source text, compiled later by NVRTC (see `runtime`).
//!
//! Every shape, stride and attribute is baked into the source as a
//! constant (divisions by constants compile to multiplies), and a kernel's
//! name is its family plus a hash of its body, so two nodes of the same
//! shape share one kernel and one module holds every distinct kernel of a
//! model (one NVRTC compile per model).
//!
//! Conventions of the generated code:
//! - no `#include`: fp16 and bf16 are stored as `unsigned short` bits and
//!   converted with `h2f`/`f2h`/`bf2f`/`f2bf` from the [`PRELUDE`]; all
//!   floating arithmetic is in `float` (`double` for f64);
//! - every kernel takes only device pointers (`void*` cast inside) and
//!   loops grid-stride over `long long` indices, so any grid size is
//!   correct and launch sizes are only a performance choice;
//! - data movement (Transpose, Slice, Concat, Gather...) copies elements as
//!   unsigned integers of the element's size, whatever the dtype.
//!
//! The unit tests snapshot one kernel per family and dtype, and check that
//! every snapshot parses as C++ (`g++ -fsyntax-only` with a small header
//! that stands in for CUDA's built-ins, when g++ is present).
//!
//! Layout: this file holds what every family shares (the prelude, dtype
//! spelling, index arithmetic, kernel naming); each op family has its own
//! file, named as in `crate::cpu` and in `super::ops` (which turns a node
//! into launches of these kernels), so a family's CPU kernel, CUDA source
//! and launch plan sit in files of one name:
//! - `elementwise`: [`elementwise`] (unary, binary, Where, Cast, ...);
//! - `shape`: data movement and generated values ([`strided_copy`],
//!   [`slice_dynamic`], [`gather`], [`gather_nd`], [`fill`], [`range`]);
//! - `reduce`: [`reduce`] and [`softmax`];
//! - `norm`: [`layer_norm`];
//! - `conv`: [`conv2d`];
//! - `pool`: [`pool2d`], [`global_pool`];
//! - `tests`: the snapshots of every family (one test module, so the
//!   snapshot names stay `cuda__codegen__tests__*`).

mod conv;
mod elementwise;
mod norm;
mod pool;
mod reduce;
mod shape;
#[cfg(test)]
mod tests;

pub use conv::{conv2d, ConvShape};
pub use elementwise::{elementwise, EwIn};
pub use norm::layer_norm;
pub use pool::{global_pool, pool2d, PoolShape};
pub use reduce::{reduce, softmax, ReduceKind};
pub use shape::{fill, gather, gather_nd, range, slice_dynamic, strided_copy};

use graphopt_ir::DType;
use std::fmt::Write;

/// A kernel: its entry point and the source defining it (after the
/// [`PRELUDE`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Src {
    pub name: String,
    pub code: String,
}

/// Definitions every generated module starts with.
pub const PRELUDE: &str = r#"// graphopt: generated CUDA C (NVRTC, no headers)
#define GO_DEV __device__ __forceinline__
#define GO_INF (__int_as_float(0x7f800000))
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
GO_DEV float h2f(unsigned short h) { float f; asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h)); return f; }
GO_DEV unsigned short f2h(float f) { unsigned short h; asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f)); return h; }
#else
float h2f(unsigned short h);
unsigned short f2h(float f);
#endif
GO_DEV float bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
GO_DEV unsigned short f2bf(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
GO_DEV float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
GO_DEV float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the total. `sh` holds 32 floats.
GO_DEV float block_sum(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return warp_sum(lane < nw ? sh[lane] : 0.f);
}
GO_DEV float block_max(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  return warp_max(lane < nw ? sh[lane] : -GO_INF);
}
"#;

/// The whole module: the prelude and each kernel once, in order.
pub fn module(kernels: &[Src]) -> String {
    let mut s = String::from(PRELUDE);
    for k in kernels {
        s.push('\n');
        s.push_str(&k.code);
    }
    s
}

/// Threads per block of the elementwise and copy kernels.
pub const BLOCK: u32 = 256;

/// Storage type of a dtype in generated code.
pub fn storage(d: DType) -> Result<&'static str, String> {
    Ok(match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 | DType::U16 => "unsigned short",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::U32 => "unsigned int",
        DType::I64 => "long long",
        DType::U64 => "unsigned long long",
        DType::I8 => "signed char",
        DType::U8 | DType::Bool => "unsigned char",
        d => return Err(format!("{} has no CUDA kernels", d.name())),
    })
}

/// The type arithmetic happens in.
pub fn compute(d: DType) -> Result<&'static str, String> {
    Ok(match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::Bool => "bool",
        d => storage(d)?,
    })
}

pub fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// `p[i]` read as the compute type.
pub fn load(d: DType, p: &str, i: &str) -> String {
    match d {
        DType::F16 => format!("h2f({p}[{i}])"),
        DType::BF16 => format!("bf2f({p}[{i}])"),
        DType::Bool => format!("({p}[{i}] != 0)"),
        _ => format!("{p}[{i}]"),
    }
}

/// A compute-type value converted for storing as `d`.
pub fn to_storage(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("f2h((float)({v}))"),
        DType::BF16 => format!("f2bf((float)({v}))"),
        DType::Bool => format!("(unsigned char)(({v}) ? 1 : 0)"),
        d => format!("({})({v})", storage(d).unwrap_or("float")),
    }
}

/// Unsigned integer type of `bytes` bytes (data movement).
pub fn bits(bytes: usize) -> Result<&'static str, String> {
    Ok(match bytes {
        1 => "unsigned char",
        2 => "unsigned short",
        4 => "unsigned int",
        8 => "unsigned long long",
        n => return Err(format!("no copy kernel for {n}-byte elements")),
    })
}

/// A math function of the compute type `ct` (`exp` -> `expf` for float).
pub fn math(name: &str, ct: &str) -> String {
    if ct == "float" {
        format!("{name}f")
    } else {
        name.to_string()
    }
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Names the kernel written with the placeholder `KERNEL` after its body.
fn finish(family: &str, body: String) -> Src {
    let name = format!("{family}_{:016x}", fnv(&body));
    Src {
        code: body.replace("KERNEL", &name),
        name,
    }
}

/// An iteration shape with one stride vector per operand, with size-1
/// dims dropped and dims merged where every operand is contiguous across
/// them (so `[2,3,4]` copied contiguously is one dim of 24).
pub fn collapse(dims: &[usize], strides: &[Vec<i64>]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let mut d: Vec<usize> = Vec::new();
    let mut s: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for (j, &n) in dims.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merge = !d.is_empty()
            && strides
                .iter()
                .zip(&s)
                .all(|(st, acc)| *acc.last().unwrap() == st[j] * n as i64);
        if merge {
            *d.last_mut().unwrap() *= n;
            for (st, acc) in strides.iter().zip(s.iter_mut()) {
                *acc.last_mut().unwrap() = st[j];
            }
        } else {
            d.push(n);
            for (st, acc) in strides.iter().zip(s.iter_mut()) {
                acc.push(st[j]);
            }
        }
    }
    (d, s)
}

/// Code that splits the flat index `i` over `dims` (row-major) and sums
/// each operand's offset `oK` (declared here) from its strides.
pub fn offsets(dims: &[usize], strides: &[Vec<i64>], indent: &str) -> String {
    let mut c = String::new();
    let names: Vec<String> = (0..strides.len()).map(|k| format!("o{k}")).collect();
    writeln!(
        c,
        "{indent}long long {};",
        names
            .iter()
            .map(|n| format!("{n} = 0"))
            .collect::<Vec<_>>()
            .join(", ")
    )
    .unwrap();
    if dims.is_empty() {
        return c;
    }
    writeln!(c, "{indent}long long r = i;").unwrap();
    for j in (0..dims.len()).rev() {
        let terms: Vec<String> = strides
            .iter()
            .enumerate()
            .filter(|(_, s)| s[j] != 0)
            .map(|(k, s)| {
                if s[j] == 1 {
                    format!("o{k} += c;")
                } else {
                    format!("o{k} += c * {}LL;", s[j])
                }
            })
            .collect();
        if j == 0 {
            writeln!(c, "{indent}{{ long long c = r; {} }}", terms.join(" ")).unwrap();
        } else {
            writeln!(
                c,
                "{indent}{{ long long c = r % {d}; r /= {d}; {} }}",
                terms.join(" "),
                d = dims[j]
            )
            .unwrap();
        }
    }
    c
}

/// Row-major strides in elements.
pub fn strides_of(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as i64;
    }
    s
}

/// Strides of `shape` broadcast (numpy rules) to `out` (0 on broadcast dims).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Result<Vec<i64>, String> {
    if shape.len() > out.len() {
        return Err(format!("cannot broadcast {shape:?} to {out:?}"));
    }
    let own = strides_of(shape);
    let lead = out.len() - shape.len();
    let mut s = vec![0i64; out.len()];
    for (j, &n) in shape.iter().enumerate() {
        if n == out[lead + j] {
            s[lead + j] = if n == 1 { 0 } else { own[j] };
        } else if n != 1 {
            return Err(format!("cannot broadcast {shape:?} to {out:?}"));
        }
    }
    Ok(s)
}

fn grid_loop(n: usize) -> String {
    format!(
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {n}LL; i += (long long)gridDim.x * blockDim.x) {{\n"
    )
}
