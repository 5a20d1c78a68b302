//! The bytes of the ops whose output is known when the kernel is made
//! (Constant, ConstantOfShape's fill value, Shape), shared by the CPU
//! kernels ([`crate::cpu::shape`]) and the CUDA uploads
//! ([`crate::cuda`]), so both backends read the attributes alike.

use crate::backend::NodeCtx;
use graphopt_ir::AttrValue;

/// Constant's value as little-endian bytes (its one attribute: a tensor,
/// or a float, int, floats or ints value).
pub(crate) fn constant(ctx: &NodeCtx) -> Result<Vec<u8>, String> {
    let a = ctx.node.attributes.first().ok_or("no value")?;
    Ok(match &a.value {
        AttrValue::Tensor(t) => t.raw().ok_or("string value")?.to_vec(),
        AttrValue::Float(f) => f.to_le_bytes().to_vec(),
        AttrValue::Int(i) => i.to_le_bytes().to_vec(),
        AttrValue::Floats(f) => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
        AttrValue::Ints(f) => f.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => return Err(format!("Constant {} is not implemented", a.name)),
    })
}

/// ConstantOfShape's fill element (`value`, default one float 0).
pub(crate) fn fill_value(ctx: &NodeCtx) -> Result<Vec<u8>, String> {
    Ok(match ctx.node.attr_tensor("value") {
        Some(t) => t.raw().ok_or("string value")?.to_vec(),
        None => 0f32.to_le_bytes().to_vec(),
    })
}

/// Shape's output: input 0's dims `start..end` (negative from the end,
/// clamped) as int64 bytes.
pub(crate) fn shape(ctx: &NodeCtx) -> Result<Vec<u8>, String> {
    let s = &ctx.input(0)?.shape;
    let r = s.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clampi(ctx.node.attr_int("start").unwrap_or(0));
    let end = clampi(ctx.node.attr_int("end").unwrap_or(r));
    Ok(s[start..end.max(start)]
        .iter()
        .flat_map(|&d| (d as i64).to_le_bytes())
        .collect())
}
