//! LayerNormalization: one block per row, statistics in float.

use super::{finish, is_float, load, storage, to_storage, Src};
use graphopt_ir::DType;
use std::fmt::Write;

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
