//! 2-D max and average pooling, and the global pools (as reductions).

use super::{finish, grid_loop, is_float, load, reduce, storage, to_storage, ReduceKind, Src};
use graphopt_ir::DType;
use std::fmt::Write;

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
