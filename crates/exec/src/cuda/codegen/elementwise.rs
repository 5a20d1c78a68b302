//! Elementwise kernels: `out = expr(v0, v1, ...)` over broadcast inputs
//! (the expression itself comes from `super::super::ops::elementwise`).

use super::{
    broadcast_strides, collapse, compute, finish, grid_loop, load, offsets, storage, to_storage,
    Src,
};
use graphopt_ir::DType;
use std::fmt::Write;

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
