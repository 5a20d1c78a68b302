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

/// One input of an elementwise kernel: its shape (broadcast to the
/// output's) and dtype.
#[derive(Clone, Debug)]
pub struct EwIn {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

/// `out = expr(v0, v1, ...)` with numpy broadcasting; `vK` is input K
/// loaded as its compute type, and `expr` is computed in C++'s usual
/// conversions, then stored as the output dtype.
pub fn elementwise(
    family: &str,
    out_shape: &[usize],
    out: DType,
    ins: &[EwIn],
    expr: &str,
) -> Result<Src, String> {
    let n: usize = out_shape.iter().product();
    let mut st = Vec::new();
    for x in ins {
        st.push(broadcast_strides(&x.shape, out_shape)?);
    }
    let (dims, st) = collapse(out_shape, &st);
    let mut c = String::new();
    let params: Vec<String> = (0..ins.len())
        .map(|k| format!("const void* __restrict__ p{k}"))
        .chain(std::iter::once("void* __restrict__ py".to_string()))
        .collect();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL({}) {{",
        params.join(", ")
    )
    .unwrap();
    for (k, x) in ins.iter().enumerate() {
        let t = storage(x.dtype)?;
        writeln!(c, "  const {t}* a{k} = (const {t}*)p{k};").unwrap();
    }
    let ot = storage(out)?;
    writeln!(c, "  {ot}* y = ({ot}*)py;").unwrap();
    c += &grid_loop(n);
    // Same-shape operands index with i directly.
    let direct: Vec<bool> = st
        .iter()
        .map(|s| dims.len() == 1 && s[0] == 1 || dims.is_empty())
        .collect();
    if direct.iter().all(|&d| d) {
        for (k, x) in ins.iter().enumerate() {
            let idx = if dims.is_empty() { "0" } else { "i" };
            writeln!(
                c,
                "    {} v{k} = {};",
                compute(x.dtype)?,
                load(x.dtype, &format!("a{k}"), idx)
            )
            .unwrap();
        }
    } else {
        c += &offsets(&dims, &st, "    ");
        for (k, x) in ins.iter().enumerate() {
            writeln!(
                c,
                "    {} v{k} = {};",
                compute(x.dtype)?,
                load(x.dtype, &format!("a{k}"), &format!("o{k}"))
            )
            .unwrap();
        }
    }
    writeln!(c, "    y[i] = {};", to_storage(out, expr)).unwrap();
    c += "  }\n}\n";
    Ok(finish(family, c))
}

/// A strided copy of `dims` elements of `elem` bytes: element `i` of the
/// iteration goes from `src[src_off + sum c_j*src_strides_j]` to
/// `dst[dst_off + sum c_j*dst_strides_j]` (Transpose, Slice, Concat,
/// Split, Expand).
pub fn strided_copy(
    family: &str,
    elem: usize,
    dims: &[usize],
    src_strides: &[i64],
    src_off: i64,
    dst_strides: &[i64],
    dst_off: i64,
) -> Result<Src, String> {
    let n: usize = dims.iter().product();
    let (d, st) = collapse(dims, &[src_strides.to_vec(), dst_strides.to_vec()]);
    let t = bits(elem)?;
    let mut c = String::new();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL(const void* __restrict__ ps, void* __restrict__ pd) {{"
    )
    .unwrap();
    writeln!(c, "  const {t}* s = (const {t}*)ps + {src_off}LL;").unwrap();
    writeln!(c, "  {t}* d = ({t}*)pd + {dst_off}LL;").unwrap();
    c += &grid_loop(n);
    c += &offsets(&d, &st, "    ");
    c += "    d[o1] = s[o0];\n  }\n}\n";
    Ok(finish(family, c))
}

/// Slice whose starts (and axes, steps) are computed at run time: each
/// thread reads the `n` starts from the device and derives the base
/// offset and strides (clamped as ONNX says) before indexing; `axes` and
/// `steps` are the dtypes of those inputs when present. Pointers: x,
/// starts, [axes], [steps], y.
pub fn slice_dynamic(
    elem: usize,
    in_shape: &[usize],
    out_shape: &[usize],
    n: usize,
    starts: DType,
    axes: Option<DType>,
    steps: Option<DType>,
) -> Result<Src, String> {
    let t = bits(elem)?;
    let r = in_shape.len();
    let total: usize = out_shape.iter().product();
    let list = |v: &[i64]| {
        v.iter()
            .map(|x| format!("{x}LL"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let shape: Vec<i64> = in_shape.iter().map(|&d| d as i64).collect();
    let own = strides_of(in_shape);
    let mut c = String::new();
    let mut params = vec![
        "const void* __restrict__ px".to_string(),
        "const void* __restrict__ ps".to_string(),
    ];
    if axes.is_some() {
        params.push("const void* __restrict__ pa".into());
    }
    if steps.is_some() {
        params.push("const void* __restrict__ pt".into());
    }
    params.push("void* __restrict__ py".into());
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL({}) {{",
        params.join(", ")
    )
    .unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    writeln!(c, "  const long long shape[{r}] = {{{}}};", list(&shape)).unwrap();
    writeln!(c, "  const long long own[{r}] = {{{}}};", list(&own)).unwrap();
    writeln!(c, "  long long st[{r}] = {{{}}};", list(&own)).unwrap();
    writeln!(c, "  long long base = 0;").unwrap();
    writeln!(c, "  for (int q = 0; q < {n}; ++q) {{").unwrap();
    match axes {
        Some(d) => writeln!(
            c,
            "    long long a = (long long)(({})pa)[q]; if (a < 0) a += {r};",
            format_args!("const {}*", storage(d)?)
        )
        .unwrap(),
        None => writeln!(c, "    long long a = q;").unwrap(),
    }
    writeln!(c, "    if (a < 0 || a >= {r}) continue;").unwrap();
    match steps {
        Some(d) => writeln!(
            c,
            "    long long step = (long long)((const {}*)pt)[q];",
            storage(d)?
        )
        .unwrap(),
        None => writeln!(c, "    long long step = 1;").unwrap(),
    }
    writeln!(
        c,
        "    long long dim = shape[a], s = (long long)((const {}*)ps)[q];",
        storage(starts)?
    )
    .unwrap();
    c += "    if (s < 0) s += dim;
";
    c += "    if (step > 0) s = s < 0 ? 0 : (s > dim ? dim : s);
";
    c += "    else s = s < 0 ? 0 : (s > dim - 1 ? dim - 1 : s);
";
    c += "    base += s * own[a];
    st[a] = step * own[a];
  }
";
    c += &grid_loop(total);
    c += "    long long r = i, o = base;
";
    for j in (0..out_shape.len()).rev() {
        if j == 0 {
            writeln!(c, "    o += r * st[0];").unwrap();
        } else {
            writeln!(
                c,
                "    o += (r % {d}) * st[{j}]; r /= {d};",
                d = out_shape[j]
            )
            .unwrap();
        }
    }
    c += "    y[i] = x[o];
  }
}
";
    Ok(finish("slice_dyn", c))
}

/// Gather along an axis: data viewed as `[outer, axis_dim, inner]`,
/// `n_idx` indices (negative ones count from the end; out-of-range ones
/// are clamped, not read out of bounds).
pub fn gather(
    elem: usize,
    idx: DType,
    outer: usize,
    axis_dim: usize,
    n_idx: usize,
    inner: usize,
) -> Result<Src, String> {
    let t = bits(elem)?;
    let it = storage(idx)?;
    let n = outer * n_idx * inner;
    let mut c = String::new();
    writeln!(c, "extern \"C\" __global__ void KERNEL(const void* __restrict__ pd, const void* __restrict__ pi, void* __restrict__ py) {{").unwrap();
    writeln!(c, "  const {t}* d = (const {t}*)pd;").unwrap();
    writeln!(c, "  const {it}* ix = (const {it}*)pi;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    c += &grid_loop(n);
    writeln!(c, "    long long in = i % {inner}LL, r = i / {inner}LL;").unwrap();
    writeln!(c, "    long long j = r % {n_idx}LL, o = r / {n_idx}LL;").unwrap();
    writeln!(c, "    long long k = (long long)ix[j];").unwrap();
    writeln!(c, "    if (k < 0) k += {axis_dim}LL;").unwrap();
    writeln!(
        c,
        "    k = k < 0 ? 0 : (k >= {axis_dim}LL ? {} : k);",
        axis_dim as i64 - 1
    )
    .unwrap();
    writeln!(c, "    y[i] = d[(o * {axis_dim}LL + k) * {inner}LL + in];").unwrap();
    c += "  }\n}\n";
    Ok(finish("gather", c))
}

/// GatherND: data `[B..., D_b .. D_{b+last-1}, S...]`, indices of
/// `nb * tuples` tuples of `last` entries; output element `(t, s)` is the
/// slice element `s` at the tuple's offset (negative entries count from
/// the end; out-of-range ones are clamped, not read out of bounds).
pub fn gather_nd(
    elem: usize,
    idx: DType,
    data: &[usize],
    batch: usize,
    tuples: usize,
    last: usize,
) -> Result<Src, String> {
    let t = bits(elem)?;
    let it = storage(idx)?;
    let st = strides_of(data);
    let nb: usize = data[..batch].iter().product();
    let slice: usize = data[batch + last..].iter().product();
    let per_batch: usize = data[batch..].iter().product();
    let n = nb * tuples * slice;
    let mut c = String::new();
    writeln!(c, "extern \"C\" __global__ void KERNEL(const void* __restrict__ pd, const void* __restrict__ pi, void* __restrict__ py) {{").unwrap();
    writeln!(c, "  const {t}* d = (const {t}*)pd;").unwrap();
    writeln!(c, "  const {it}* ix = (const {it}*)pi;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    c += &grid_loop(n);
    writeln!(
        c,
        "    long long s = i % {slice}LL, tup = i / {slice}LL, bi = tup / {tuples}LL;"
    )
    .unwrap();
    writeln!(c, "    long long off = bi * {per_batch}LL;").unwrap();
    for k in 0..last {
        let dim = data[batch + k];
        writeln!(
            c,
            "    {{ long long v = (long long)ix[tup * {last}LL + {k}]; if (v < 0) v += {dim}LL; v = v < 0 ? 0 : (v >= {dim}LL ? {} : v); off += v * {}LL; }}",
            dim as i64 - 1,
            st[batch + k]
        )
        .unwrap();
    }
    c += "    y[i] = d[off + s];\n  }\n}\n";
    Ok(finish("gathernd", c))
}

/// How a reduction combines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
}

/// Reduces `in_shape` over `axes` (sorted, unique): one warp per output
/// element, the output laid out over the kept dims in order.
pub fn reduce(
    in_shape: &[usize],
    dtype: DType,
    axes: &[usize],
    kind: ReduceKind,
) -> Result<Src, String> {
    let st = strides_of(in_shape);
    let keep: Vec<usize> = (0..in_shape.len()).filter(|a| !axes.contains(a)).collect();
    let kdims: Vec<usize> = keep.iter().map(|&a| in_shape[a]).collect();
    let kst: Vec<i64> = keep.iter().map(|&a| st[a]).collect();
    let rdims: Vec<usize> = axes.iter().map(|&a| in_shape[a]).collect();
    let rst: Vec<i64> = axes.iter().map(|&a| st[a]).collect();
    let n_out: usize = kdims.iter().product();
    let n_red: usize = rdims.iter().product();
    let (kd, ks) = collapse(&kdims, &[kst]);
    let (rd, rs) = collapse(&rdims, &[rst]);
    let t = storage(dtype)?;
    let float = is_float(dtype);
    let acc = if float { "float" } else { compute(dtype)? };
    if dtype == DType::F64 || dtype == DType::Bool {
        return Err(format!("no CUDA reduction for {}", dtype.name()));
    }
    let (init, comb) = match (kind, float) {
        (ReduceKind::Sum | ReduceKind::Mean, _) => ("0", "a + b"),
        (ReduceKind::Max, true) => ("-GO_INF", "fmaxf(a, b)"),
        (ReduceKind::Min, true) => ("GO_INF", "fminf(a, b)"),
        (ReduceKind::Max, false) => ("(-9223372036854775807LL - 1)", "(a > b ? a : b)"),
        (ReduceKind::Min, false) => ("9223372036854775807LL", "(a < b ? a : b)"),
    };
    let mut c = String::new();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL(const void* __restrict__ px, void* __restrict__ py) {{"
    )
    .unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    writeln!(c, "  int lane = threadIdx.x & 31;").unwrap();
    writeln!(
        c,
        "  long long warps = (long long)gridDim.x * (blockDim.x >> 5);"
    )
    .unwrap();
    writeln!(
        c,
        "  for (long long i = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); i < {n_out}LL; i += warps) {{"
    )
    .unwrap();
    c += &offsets(&kd, &ks, "    ");
    writeln!(c, "    long long base = o0;").unwrap();
    writeln!(c, "    {acc} a = ({acc}){init};").unwrap();
    writeln!(c, "    for (long long q = lane; q < {n_red}LL; q += 32) {{").unwrap();
    // Reuse `offsets` for the reduced index: rename i -> q, o0 -> p0.
    let red = offsets(&rd, &rs, "      ")
        .replace("long long r = i;", "long long r = q;")
        .replace("o0", "p0");
    c += &red;
    writeln!(
        c,
        "      {acc} b = ({acc}){};",
        load(dtype, "x", "base + p0")
    )
    .unwrap();
    writeln!(c, "      a = {comb};").unwrap();
    c += "    }\n";
    writeln!(c, "    for (int o = 16; o > 0; o >>= 1) {{").unwrap();
    writeln!(c, "      {acc} b = __shfl_xor_sync(0xffffffffu, a, o);").unwrap();
    writeln!(c, "      a = {comb};").unwrap();
    c += "    }\n";
    let v = if kind == ReduceKind::Mean {
        format!("a / ({acc}){n_red}")
    } else {
        "a".to_string()
    };
    writeln!(c, "    if (lane == 0) y[i] = {};", to_storage(dtype, &v)).unwrap();
    c += "  }\n}\n";
    Ok(finish("reduce", c))
}

/// Softmax (or LogSoftmax) over the middle dim of `[outer, len, inner]`:
/// one block per (outer, inner) row, three passes (max, sum, write).
pub fn softmax(
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
    log: bool,
) -> Result<Src, String> {
    if !is_float(dtype) || dtype == DType::F64 {
        return Err(format!("no CUDA Softmax for {}", dtype.name()));
    }
    let t = storage(dtype)?;
    let rows = outer * inner;
    let mut c = String::new();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL(const void* __restrict__ px, void* __restrict__ py) {{"
    )
    .unwrap();
    writeln!(c, "  __shared__ float sh[32];").unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    writeln!(
        c,
        "  for (long long row = blockIdx.x; row < {rows}LL; row += gridDim.x) {{"
    )
    .unwrap();
    writeln!(
        c,
        "    long long base = (row / {inner}LL) * {}LL + row % {inner}LL;",
        len * inner
    )
    .unwrap();
    writeln!(c, "    float m = -GO_INF;").unwrap();
    writeln!(
        c,
        "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) m = fmaxf(m, {});",
        load(dtype, "x", &format!("base + j * {inner}LL"))
    )
    .unwrap();
    writeln!(c, "    m = block_max(m, sh);").unwrap();
    writeln!(c, "    float s = 0.f;").unwrap();
    writeln!(
        c,
        "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) s += expf({} - m);",
        load(dtype, "x", &format!("base + j * {inner}LL"))
    )
    .unwrap();
    writeln!(c, "    s = block_sum(s, sh);").unwrap();
    let v = if log {
        format!(
            "{} - m - logf(s)",
            load(dtype, "x", &format!("base + j * {inner}LL"))
        )
    } else {
        format!(
            "expf({} - m) / s",
            load(dtype, "x", &format!("base + j * {inner}LL"))
        )
    };
    writeln!(
        c,
        "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) y[base + j * {inner}LL] = {};",
        to_storage(dtype, &v)
    )
    .unwrap();
    c += "  }\n}\n";
    Ok(finish(if log { "logsoftmax" } else { "softmax" }, c))
}

/// LayerNormalization of `rows` rows of `len`: one block per row, mean and
/// variance in float (two passes over the row). Pointers: x, scale, bias
/// (when `bias`), y, then mean and inverse std-dev (float) when asked.
pub fn layer_norm(
    dtype: DType,
    scale_dtype: DType,
    rows: usize,
    len: usize,
    eps: f32,
    bias: bool,
    stats: bool,
) -> Result<Src, String> {
    if !is_float(dtype) || dtype == DType::F64 {
        return Err(format!("no CUDA LayerNormalization for {}", dtype.name()));
    }
    let t = storage(dtype)?;
    let st = storage(scale_dtype)?;
    let mut c = String::new();
    let mut params = vec!["const void* __restrict__ px", "const void* __restrict__ pg"];
    if bias {
        params.push("const void* __restrict__ pb");
    }
    params.push("void* __restrict__ py");
    if stats {
        params.push("void* __restrict__ pm");
        params.push("void* __restrict__ pr");
    }
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL({}) {{",
        params.join(", ")
    )
    .unwrap();
    writeln!(c, "  __shared__ float sh[32];").unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  const {st}* g = (const {st}*)pg;").unwrap();
    if bias {
        writeln!(c, "  const {st}* b = (const {st}*)pb;").unwrap();
    }
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    writeln!(
        c,
        "  for (long long row = blockIdx.x; row < {rows}LL; row += gridDim.x) {{"
    )
    .unwrap();
    writeln!(c, "    long long base = row * {len}LL;").unwrap();
    writeln!(c, "    float s = 0.f;").unwrap();
    writeln!(
        c,
        "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) s += {};",
        load(dtype, "x", "base + j")
    )
    .unwrap();
    writeln!(c, "    float mean = block_sum(s, sh) / {len}.f;").unwrap();
    writeln!(c, "    float v = 0.f;").unwrap();
    writeln!(c, "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) {{ float d = {} - mean; v += d * d; }}", load(dtype, "x", "base + j")).unwrap();
    writeln!(
        c,
        "    float rstd = rsqrtf(block_sum(v, sh) / {len}.f + {eps:e}f);"
    )
    .unwrap();
    let b = if bias {
        format!(" + {}", load(scale_dtype, "b", "j"))
    } else {
        String::new()
    };
    let e = format!(
        "({} - mean) * rstd * {}{b}",
        load(dtype, "x", "base + j"),
        load(scale_dtype, "g", "j")
    );
    writeln!(
        c,
        "    for (long long j = threadIdx.x; j < {len}LL; j += blockDim.x) y[base + j] = {};",
        to_storage(dtype, &e)
    )
    .unwrap();
    if stats {
        writeln!(
            c,
            "    if (threadIdx.x == 0) {{ ((float*)pm)[row] = mean; ((float*)pr)[row] = rstd; }}"
        )
        .unwrap();
    }
    c += "  }\n}\n";
    Ok(finish("layernorm", c))
}

/// A 2-D convolution (NCHW, groups) with everything baked in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub oc: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
    pub group: usize,
}

/// Conv as an implicit GEMM: per group, `out[oc, p] = sum_k W[oc, k] *
/// im2col(X)[k, p]` with `p` over (n, oh, ow) and `k` over (c, kh, kw),
/// the im2col matrix never stored. 64x64 output tiles, 16-deep K slices
/// staged in shared memory, 256 threads with 4x4 accumulators each; float
/// accumulation. Grid: (ceil(P/64), ceil(OC_g/64), group). Pointers: x, w,
/// bias (when `bias`), y.
pub fn conv2d(dtype: DType, s: &ConvShape, bias: bool) -> Result<Src, String> {
    if !is_float(dtype) || dtype == DType::F64 {
        return Err(format!("no CUDA Conv for {}", dtype.name()));
    }
    let t = storage(dtype)?;
    let cg = s.c / s.group;
    let ocg = s.oc / s.group;
    let kk = cg * s.kh * s.kw;
    let p = s.n * s.oh * s.ow;
    let mut c = String::new();
    let bparam = if bias {
        ", const void* __restrict__ pb"
    } else {
        ""
    };
    writeln!(c, "extern \"C\" __global__ void __launch_bounds__(256) KERNEL(const void* __restrict__ px, const void* __restrict__ pw{bparam}, void* __restrict__ py) {{").unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  const {t}* w = (const {t}*)pw;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    c += "  __shared__ float As[16][64];\n  __shared__ float Bs[16][65];\n";
    c += "  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;\n";
    c += "  long long p0 = (long long)blockIdx.x * 64;\n";
    c += "  int m0 = blockIdx.y * 64, g = blockIdx.z;\n";
    c += "  float acc[4][4];\n";
    c += "  for (int a = 0; a < 4; ++a) for (int b = 0; b < 4; ++b) acc[a][b] = 0.f;\n";
    writeln!(c, "  for (int k0 = 0; k0 < {kk}; k0 += 16) {{").unwrap();
    // Load A (weights) 64x16 and B (im2col) 16x64: 4 elements per thread each.
    c += "    for (int e = threadIdx.x; e < 1024; e += 256) {\n";
    c += "      int am = e >> 4, ak = e & 15;\n";
    c += "      int m = m0 + am, k = k0 + ak;\n";
    writeln!(
        c,
        "      As[ak][am] = (m < {ocg} && k < {kk}) ? (float){} : 0.f;",
        load(
            dtype,
            "w",
            &format!("(long long)(g * {ocg} + m) * {kk} + k")
        )
    )
    .unwrap();
    c += "      int bk = e >> 6, bp = e & 63;\n";
    c += "      long long pp = p0 + bp; int kb = k0 + bk;\n";
    c += "      float v = 0.f;\n";
    writeln!(c, "      if (pp < {p}LL && kb < {kk}) {{").unwrap();
    writeln!(
        c,
        "        int ci = kb / {khw}, r = kb % {khw}, ki = r / {kw}, kj = r % {kw};",
        khw = s.kh * s.kw,
        kw = s.kw
    )
    .unwrap();
    writeln!(
        c,
        "        long long ow = pp % {ow}, t = pp / {ow}; long long oh = t % {oh}, nb = t / {oh};",
        ow = s.ow,
        oh = s.oh
    )
    .unwrap();
    writeln!(
        c,
        "        long long ih = oh * {} - {} + ki * {}, iw = ow * {} - {} + kj * {};",
        s.stride[0], s.pad[0], s.dilation[0], s.stride[1], s.pad[1], s.dilation[1]
    )
    .unwrap();
    writeln!(
        c,
        "        if (ih >= 0 && ih < {h} && iw >= 0 && iw < {w}) v = (float){};",
        load(
            dtype,
            "x",
            &format!(
                "((nb * {c} + g * {cg} + ci) * {h} + ih) * {w} + iw",
                c = s.c,
                h = s.h,
                w = s.w
            )
        ),
        h = s.h,
        w = s.w
    )
    .unwrap();
    c += "      }\n      Bs[bk][bp] = v;\n    }\n";
    c += "    __syncthreads();\n";
    c += "    for (int k = 0; k < 16; ++k) {\n";
    c += "      float a[4], b[4];\n";
    c += "      for (int q = 0; q < 4; ++q) { a[q] = As[k][ty * 4 + q]; b[q] = Bs[k][tx * 4 + q]; }\n";
    c +=
        "      for (int q = 0; q < 4; ++q) for (int r = 0; r < 4; ++r) acc[q][r] += a[q] * b[r];\n";
    c += "    }\n    __syncthreads();\n  }\n";
    c += "  for (int q = 0; q < 4; ++q) {\n";
    c += "    int m = m0 + ty * 4 + q;\n";
    writeln!(c, "    if (m >= {ocg}) continue;").unwrap();
    writeln!(c, "    int oc = g * {ocg} + m;").unwrap();
    if bias {
        writeln!(
            c,
            "    float bv = (float){};",
            load(dtype, "((const {t}*)pb)", "oc").replace("{t}", t)
        )
        .unwrap();
    } else {
        c += "    float bv = 0.f;\n";
    }
    c += "    for (int r = 0; r < 4; ++r) {\n";
    c += "      long long pp = p0 + tx * 4 + r;\n";
    writeln!(c, "      if (pp >= {p}LL) continue;").unwrap();
    writeln!(
        c,
        "      long long hw = pp % {hw}, nb = pp / {hw};",
        hw = s.oh * s.ow
    )
    .unwrap();
    writeln!(
        c,
        "      y[(nb * {oc} + oc) * {hw}LL + hw] = {};",
        to_storage(dtype, "acc[q][r] + bv"),
        oc = s.oc,
        hw = s.oh * s.ow
    )
    .unwrap();
    c += "    }\n  }\n}\n";
    Ok(finish("conv2d", c))
}

/// 2-D max or average pooling (NCHW), one thread per output element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub nc: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub k: [usize; 2],
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dilation: [usize; 2],
    /// Average: divide by the full window (else by the elements inside).
    pub count_include_pad: bool,
}

pub fn pool2d(dtype: DType, s: &PoolShape, max: bool) -> Result<Src, String> {
    if !is_float(dtype) || dtype == DType::F64 {
        return Err(format!("no CUDA pooling for {}", dtype.name()));
    }
    let t = storage(dtype)?;
    let n = s.nc * s.oh * s.ow;
    let mut c = String::new();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL(const void* __restrict__ px, void* __restrict__ py) {{"
    )
    .unwrap();
    writeln!(c, "  const {t}* x = (const {t}*)px;").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    c += &grid_loop(n);
    writeln!(
        c,
        "    long long ow = i % {ow}, t = i / {ow}; long long oh = t % {oh}, nc = t / {oh};",
        ow = s.ow,
        oh = s.oh
    )
    .unwrap();
    writeln!(
        c,
        "    float a = {}; int cnt = 0;",
        if max { "-GO_INF" } else { "0.f" }
    )
    .unwrap();
    writeln!(
        c,
        "    for (int ki = 0; ki < {}; ++ki) for (int kj = 0; kj < {}; ++kj) {{",
        s.k[0], s.k[1]
    )
    .unwrap();
    writeln!(
        c,
        "      long long ih = oh * {} - {} + ki * {}, iw = ow * {} - {} + kj * {};",
        s.stride[0], s.pad[0], s.dilation[0], s.stride[1], s.pad[1], s.dilation[1]
    )
    .unwrap();
    writeln!(
        c,
        "      if (ih < 0 || ih >= {} || iw < 0 || iw >= {}) continue;",
        s.h, s.w
    )
    .unwrap();
    let v = load(dtype, "x", &format!("(nc * {} + ih) * {} + iw", s.h, s.w));
    if max {
        writeln!(c, "      a = fmaxf(a, {v}); ++cnt;").unwrap();
    } else {
        writeln!(c, "      a += {v}; ++cnt;").unwrap();
    }
    c += "    }\n";
    let out = if max {
        "a".to_string()
    } else if s.count_include_pad {
        format!("a / {}.f", s.k[0] * s.k[1])
    } else {
        "a / (float)(cnt > 0 ? cnt : 1)".to_string()
    };
    writeln!(c, "    y[i] = {};", to_storage(dtype, &out)).unwrap();
    c += "  }\n}\n";
    Ok(finish(if max { "maxpool" } else { "avgpool" }, c))
}

/// GlobalAveragePool / GlobalMaxPool: one warp per (n, c) plane of `hw`.
pub fn global_pool(dtype: DType, nc: usize, hw: usize, max: bool) -> Result<Src, String> {
    let src = reduce(
        &[nc, hw],
        dtype,
        &[1],
        if max {
            ReduceKind::Max
        } else {
            ReduceKind::Mean
        },
    )?;
    Ok(src)
}

/// Writes one constant element pattern (`value`: the element's bytes,
/// little-endian) `n` times (ConstantOfShape).
pub fn fill(value: &[u8], n: usize) -> Result<Src, String> {
    let t = bits(value.len())?;
    let mut v: u64 = 0;
    for (i, b) in value.iter().enumerate() {
        v |= (*b as u64) << (8 * i);
    }
    let mut c = String::new();
    writeln!(
        c,
        "extern \"C\" __global__ void KERNEL(void* __restrict__ py) {{"
    )
    .unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    c += &grid_loop(n);
    writeln!(c, "    y[i] = ({t}){v}ULL;").unwrap();
    c += "  }\n}\n";
    Ok(finish("fill", c))
}

/// Range: `y[i] = start[0] + i * delta[0]` for `n` elements.
pub fn range(dtype: DType, n: usize) -> Result<Src, String> {
    let t = storage(dtype)?;
    let ct = compute(dtype)?;
    let mut c = String::new();
    writeln!(c, "extern \"C\" __global__ void KERNEL(const void* __restrict__ ps, const void* __restrict__ pd, void* __restrict__ py) {{").unwrap();
    writeln!(c, "  {t}* y = ({t}*)py;").unwrap();
    writeln!(
        c,
        "  {ct} s = {}, d = {};",
        load(dtype, "((const {t}*)ps)", "0"),
        load(dtype, "((const {t}*)pd)", "0")
    )
    .unwrap();
    c += &grid_loop(n);
    writeln!(
        c,
        "    y[i] = {};",
        to_storage(dtype, &format!("s + ({ct})i * d"))
    )
    .unwrap();
    c += "  }\n}\n";
    Ok(finish("range", c.replace("{t}", t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ew(shape: &[usize], d: DType) -> EwIn {
        EwIn {
            shape: shape.to_vec(),
            dtype: d,
        }
    }

    #[test]
    fn collapse_merges_contiguous_dims_and_drops_ones() {
        let (d, s) = collapse(&[2, 1, 3, 4], &[vec![12, 12, 4, 1], vec![0, 0, 4, 1]]);
        assert_eq!(d, vec![2, 12]);
        assert_eq!(s, vec![vec![12, 1], vec![0, 1]]);
        let (d, _) = collapse(&[2, 3, 4], &[strides_of(&[2, 3, 4])]);
        assert_eq!(d, vec![24]);
    }

    #[test]
    fn broadcast_strides_follow_numpy() {
        assert_eq!(
            broadcast_strides(&[3, 1], &[2, 3, 4]).unwrap(),
            vec![0, 1, 0]
        );
        assert_eq!(broadcast_strides(&[4], &[2, 3, 4]).unwrap(), vec![0, 0, 1]);
        assert!(broadcast_strides(&[5], &[2, 3, 4]).is_err());
    }

    #[test]
    fn same_source_same_name_and_different_source_different_name() {
        let a = elementwise(
            "add",
            &[8],
            DType::F32,
            &[ew(&[8], DType::F32), ew(&[8], DType::F32)],
            "v0 + v1",
        )
        .unwrap();
        let b = elementwise(
            "add",
            &[8],
            DType::F32,
            &[ew(&[8], DType::F32), ew(&[8], DType::F32)],
            "v0 + v1",
        )
        .unwrap();
        let c = elementwise(
            "add",
            &[9],
            DType::F32,
            &[ew(&[9], DType::F32), ew(&[9], DType::F32)],
            "v0 + v1",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_ne!(a.name, c.name);
        assert!(a.code.contains(&format!("void {}(", a.name)));
    }

    /// One kernel per family and dtype (the snapshots under `snapshots/`).
    fn samples() -> Vec<(&'static str, Src)> {
        use DType::*;
        let conv = ConvShape {
            n: 2,
            c: 4,
            h: 8,
            w: 8,
            oc: 8,
            kh: 3,
            kw: 3,
            oh: 8,
            ow: 8,
            stride: [1, 1],
            pad: [1, 1],
            dilation: [1, 1],
            group: 1,
        };
        let pool = PoolShape {
            nc: 8,
            h: 8,
            w: 8,
            oh: 4,
            ow: 4,
            k: [3, 3],
            stride: [2, 2],
            pad: [1, 1],
            dilation: [1, 1],
            count_include_pad: false,
        };
        vec![
            (
                "elementwise_add_f32_broadcast",
                elementwise(
                    "add",
                    &[2, 3, 4],
                    F32,
                    &[ew(&[2, 3, 4], F32), ew(&[3, 1], F32)],
                    "v0 + v1",
                )
                .unwrap(),
            ),
            (
                "elementwise_gelu_f16",
                elementwise(
                    "gelu",
                    &[64],
                    F16,
                    &[ew(&[64], F16)],
                    "0.5f * v0 * (1 + erff(v0 * 0.7071067812f))",
                )
                .unwrap(),
            ),
            (
                "elementwise_where_bf16",
                elementwise(
                    "where",
                    &[2, 8],
                    BF16,
                    &[ew(&[1, 8], Bool), ew(&[2, 8], BF16), ew(&[], BF16)],
                    "v0 ? v1 : v2",
                )
                .unwrap(),
            ),
            (
                "elementwise_cast_f32_i64",
                elementwise("cast", &[16], I64, &[ew(&[16], F32)], "v0").unwrap(),
            ),
            (
                "copy_transpose_u32",
                strided_copy("transpose", 4, &[2, 4, 3], &[12, 1, 4], 0, &[12, 3, 1], 0).unwrap(),
            ),
            (
                "copy_concat_u16",
                strided_copy("concat", 2, &[2, 3], &[3, 1], 0, &[5, 1], 2).unwrap(),
            ),
            ("gather_u32_i64", gather(4, I64, 1, 100, 6, 16).unwrap()),
            (
                "slice_dynamic_f32",
                slice_dynamic(4, &[4, 6], &[4, 3], 1, I64, Some(I64), None).unwrap(),
            ),
            (
                "reduce_mean_f32",
                reduce(&[2, 3, 4], F32, &[1], ReduceKind::Mean).unwrap(),
            ),
            (
                "reduce_max_f16",
                reduce(&[4, 32], F16, &[1], ReduceKind::Max).unwrap(),
            ),
            (
                "reduce_sum_i64",
                reduce(&[3, 5], I64, &[0, 1], ReduceKind::Sum).unwrap(),
            ),
            ("softmax_f32", softmax(F32, 8, 128, 1, false).unwrap()),
            (
                "logsoftmax_bf16_inner",
                softmax(BF16, 2, 10, 3, true).unwrap(),
            ),
            (
                "layernorm_f32_bias",
                layer_norm(F32, F32, 16, 768, 1e-5, true, false).unwrap(),
            ),
            (
                "layernorm_f16_stats",
                layer_norm(F16, F16, 16, 64, 1e-12, false, true).unwrap(),
            ),
            ("conv2d_f32_bias", conv2d(F32, &conv, true).unwrap()),
            (
                "conv2d_f16_grouped",
                conv2d(
                    F16,
                    &ConvShape {
                        group: 4,
                        oc: 4,
                        ..conv.clone()
                    },
                    false,
                )
                .unwrap(),
            ),
            ("maxpool_f32", pool2d(F32, &pool, true).unwrap()),
            ("avgpool_f16", pool2d(F16, &pool, false).unwrap()),
            ("fill_f32", fill(&1.5f32.to_le_bytes(), 10).unwrap()),
            ("range_i64", range(I64, 7).unwrap()),
        ]
    }

    #[test]
    fn generated_sources_snapshots() {
        insta::assert_snapshot!("prelude", PRELUDE);
        for (name, src) in samples() {
            insta::assert_snapshot!(name, src.code);
        }
    }

    /// The snapshots (and the prelude) parse as C++ with the emulation's
    /// stand-ins for CUDA's built-ins: a cheap check that NVRTC will at
    /// least see well-formed code.
    #[test]
    fn generated_sources_parse_as_cpp() {
        if super::super::emulate::skip_without_gxx() {
            return;
        }
        let srcs: Vec<Src> = samples().into_iter().map(|s| s.1).collect();
        let dir = tempfile::tempdir().unwrap();
        super::super::emulate::gxx(
            &super::super::emulate::emulation_source(&srcs),
            dir.path(),
            &["-fsyntax-only"],
        )
        .unwrap();
    }

    #[test]
    fn unsupported_dtypes_are_refused_not_generated() {
        assert!(softmax(DType::I64, 1, 4, 1, false).is_err());
        assert!(conv2d(
            DType::F64,
            &ConvShape {
                n: 1,
                c: 1,
                h: 1,
                w: 1,
                oc: 1,
                kh: 1,
                kw: 1,
                oh: 1,
                ow: 1,
                stride: [1, 1],
                pad: [0, 0],
                dilation: [1, 1],
                group: 1
            },
            false
        )
        .is_err());
        assert!(storage(DType::String).is_err());
    }
}
