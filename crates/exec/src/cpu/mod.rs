//! The CPU backend: fp32 kernels (plus the integer and bool ops that shape
//! computations use, int8 quantization, [`quant`], and the quantized
//! convolutions and matrix products, [`qlinear`]), one file per op family;
//! fp16/bf16 nodes run them on widened copies ([`lowp`]).
//! Threads: one pool per thread count ([`par`], workers that spin between
//! jobs) serves every kernel, with splits fixed by the sizes and the
//! thread count, so outputs are bit-identical at any thread count. GEMMs
//! split by batch, rows or column blocks ([`matmul::sgemm_with`], which
//! also carries Conv, ConvTranspose and the gate products of LSTM / GRU /
//! RNN);
//! Conv tiles split across threads, depthwise planes, elementwise rows,
//! Softmax blocks, pooling planes and single-run reductions too. The rest
//! run on one thread. The fused nodes of palettized and integer weights
//! (domain [`crate::lower::CODED_DOMAIN`]) have their kernels in
//! [`coded`]. Which kernel serves which node: the one table of
//! [`registry`].

pub(crate) mod chain;
pub mod coded;
pub mod conv;
pub(crate) mod conv_add;
mod conv_flat;
pub mod data_sized;
pub mod einsum;
pub mod elementwise;
#[cfg(target_arch = "x86_64")]
mod gemm;
pub mod loss;
pub mod lowp;
pub mod matmul;
pub mod norm;
pub mod par;
pub mod pool;
pub mod qgemm;
pub mod qlinear;
pub mod quant;
pub mod reduce;
pub mod registry;
pub mod resize;
pub mod rnn;
pub mod sample;
pub mod scatter;
pub mod shape;
pub mod signal;
pub mod window_nd;

use crate::backend::{Backend, Kernel, NodeCtx};

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    /// Whether [`registry::KERNELS`] has the op (at any opset).
    fn has_op(&self, domain: &str, op_type: &str) -> bool {
        registry::has(registry::KERNELS, domain, op_type)
    }

    /// The kernel of the [`registry::KERNELS`] entry for the node's
    /// domain, op and opset, after the entry's input checks.
    fn kernel(&self, ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
        let e = registry::find(
            registry::KERNELS,
            &ctx.node.domain,
            &ctx.node.op_type,
            ctx.opset,
        )?;
        e.check(ctx)?;
        match e.low {
            registry::Low::Widen if lowp::is_low(ctx) => lowp::via_f32(ctx, None, e.make),
            registry::Low::WidenBut(k) if lowp::is_low(ctx) => lowp::via_f32(ctx, Some(k), e.make),
            _ => (e.make)(ctx),
        }
    }
}
