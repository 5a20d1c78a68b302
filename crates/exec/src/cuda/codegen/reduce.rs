//! Reductions (Sum, Mean, Max, Min over any axes: one warp per output
//! element) and Softmax / LogSoftmax (one block per row).

use super::{
    collapse, compute, finish, is_float, load, offsets, storage, strides_of, to_storage, Src,
};
use graphopt_ir::DType;
use std::fmt::Write;

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
