//! Data movement, element-size generic (strided copies for Transpose,
//! Slice, Concat, Split, Expand; Slice with run-time starts; Gather and
//! GatherND), and generated values (ConstantOfShape's fill, Range).

use super::{
    bits, collapse, compute, finish, grid_loop, load, offsets, storage, strides_of, to_storage, Src,
};
use graphopt_ir::DType;
use std::fmt::Write;

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
