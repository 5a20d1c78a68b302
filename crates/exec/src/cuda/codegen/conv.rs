//! 2-D convolution as an implicit GEMM (the im2col matrix never stored).

use super::{finish, is_float, load, storage, to_storage, Src};
use graphopt_ir::DType;
use std::fmt::Write;

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
