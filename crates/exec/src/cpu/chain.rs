//! The kernel of an `ElementwiseChain` node ([`crate::fuse_chains`]): a
//! chain of elementwise ops with a float32 result run as one loop over
//! tiles of the output, each tile's intermediates in a few kilobytes of
//! scratch that stay in L1, never in the arena.
//!
//! The node's inputs are the chain's external operands, broadcast to the
//! output's shape by numpy's rules; its `ops` attribute names each step's
//! op and `args` gives each step's three operands (an input `i < inputs`,
//! or step `s` as `inputs + s`; `-1` past the op's arity). The last step
//! is the output.
//!
//! Every tile is float32. A boolean (a `Where`'s condition, an `And`'s
//! result) is 1.0 or 0.0 there, and an input of another type (bool,
//! integers, float16, bfloat16, float64; what a `Cast` to float reads) is
//! converted as its tile is loaded, the way the Cast kernel converts it, so
//! `Cast` itself is a copy. Broadcasting composes, so every step is evaluated
//! at the output's positions: step `s` at output element `i` reads each
//! operand at the element `i` broadcasts to.
//!
//! Every step calls the scalar function of the op's own kernel
//! ([`super::elementwise`]), so a chain gives the bits of its nodes run
//! one by one.
//!
//! Before (BERT's GELU, four intermediates of the FFN's width):
//! ```text
//! d = Div(x, 1.4142135); e = Erf(d); a = Add(e, 1); m = Mul(x, a); y = Mul(m, 0.5)
//! ```
//! After:
//! ```text
//! y = graphopt.exec::ElementwiseChain.0(x, 1.4142135, 1, 0.5)
//!       <ops = [Div, Erf, Add, Mul, Mul], args = [0,1,-1, 4,-1,-1, 5,2,-1, 0,6,-1, 7,3,-1]>
//! ```

use std::cell::RefCell;

use super::elementwise::{
    erf, exp_f32, max_f32, merged_dims, min_f32, pow, sigmoid_f32, tanh_f32, to_f32, TO_F32,
};
use super::par;
use crate::activation::Activation;
use crate::backend::{Data, Kernel, KernelIo, NodeCtx};
use crate::tensor::elem_size;
use crate::tensor::{cast, cast_mut, strides};
use graphopt_ir::DType;

/// Output elements per tile: each step's tile is 2 KiB.
const TILE: usize = 512;
/// Most inputs of one chain node (the lowering makes no more; the kernel
/// refuses more).
pub(crate) const MAX_INPUTS: usize = 16;

/// An op a chain may hold, with the arithmetic of its own kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Neg,
    Abs,
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Erf,
    Tanh,
    Sigmoid,
    Relu,
    /// To float32 (the conversion happens as an input's tile is loaded).
    Cast,
    Where,
    Not,
    And,
    Or,
    Xor,
}

/// The element type of a step's operand or result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Float,
    Bool,
    /// Anything [`loadable`] (a Cast's operand).
    Any,
}

/// Whether an input of type `d` can be loaded into a float32 tile
/// ([`to_f32`]'s types).
pub(crate) fn loadable(d: DType) -> bool {
    TO_F32.contains(&d)
}

impl Op {
    /// The op of a default-domain op type, if chains take it.
    pub(crate) fn of(op_type: &str) -> Option<Op> {
        Some(match op_type {
            "Add" => Op::Add,
            "Sub" => Op::Sub,
            "Mul" => Op::Mul,
            "Div" => Op::Div,
            "Pow" => Op::Pow,
            "Max" => Op::Max,
            "Min" => Op::Min,
            "Neg" => Op::Neg,
            "Abs" => Op::Abs,
            "Sqrt" => Op::Sqrt,
            "Reciprocal" => Op::Reciprocal,
            "Exp" => Op::Exp,
            "Log" => Op::Log,
            "Erf" => Op::Erf,
            "Tanh" => Op::Tanh,
            "Sigmoid" => Op::Sigmoid,
            "Relu" => Op::Relu,
            "Cast" => Op::Cast,
            "Where" => Op::Where,
            "Not" => Op::Not,
            "And" => Op::And,
            "Or" => Op::Or,
            "Xor" => Op::Xor,
            _ => return None,
        })
    }

    /// Operands it reads.
    pub(crate) fn arity(self) -> usize {
        self.operands().len()
    }

    /// Its operands' element types.
    pub(crate) fn operands(self) -> &'static [Kind] {
        use Kind::*;
        match self {
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Pow | Op::Max | Op::Min => &[Float, Float],
            Op::And | Op::Or | Op::Xor => &[Bool, Bool],
            Op::Not => &[Bool],
            Op::Where => &[Bool, Float, Float],
            Op::Cast => &[Any],
            _ => &[Float],
        }
    }

    /// Its result's element type.
    pub(crate) fn result(self) -> Kind {
        match self {
            Op::Not | Op::And | Op::Or | Op::Xor => Kind::Bool,
            _ => Kind::Float,
        }
    }
}

/// Where an input of the node is read for an output row.
#[derive(Clone, Debug)]
struct Layout {
    /// Element strides over the merged output dims (0 where broadcast).
    strides: Vec<usize>,
}

/// One step: `op(a, b, c)` (operands past the op's arity unread).
#[derive(Clone, Copy, Debug)]
struct Step {
    op: Op,
    a: usize,
    b: usize,
    c: usize,
}

struct Chain {
    steps: Vec<Step>,
    inputs: Vec<Layout>,
    /// Each input's element type.
    types: Vec<DType>,
    /// The output's dims with runs that every operand reads alike merged.
    dims: Vec<usize>,
}

/// Makes the kernel of an `ElementwiseChain` node.
pub fn kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let n = ctx.inputs.len();
    if n > MAX_INPUTS {
        return Err(format!(
            "ElementwiseChain with {n} inputs (at most {MAX_INPUTS})"
        ));
    }
    let out = ctx
        .outputs
        .first()
        .ok_or("an ElementwiseChain has one output")?;
    if out.dtype != DType::F32 {
        return Err(format!(
            "ElementwiseChain computes float, not {}",
            out.dtype.name()
        ));
    }
    let mut shapes = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        let t = ctx.input(i)?;
        if !loadable(t.dtype) {
            return Err(format!(
                "ElementwiseChain input {i} is {}, which it cannot convert to float",
                t.dtype.name()
            ));
        }
        types.push(t.dtype);
        if t.shape.len() > out.shape.len()
            || t.shape
                .iter()
                .rev()
                .zip(out.shape.iter().rev())
                .any(|(&d, &o)| d != o && d != 1)
        {
            return Err(format!(
                "ElementwiseChain input {i} of shape {:?} does not broadcast to {:?}",
                t.shape, out.shape
            ));
        }
        shapes.push(t.shape.clone());
    }
    let ops: Vec<String> = match ctx.node.attr("ops").map(|a| &a.value) {
        Some(graphopt_ir::AttrValue::Strings(s)) => s
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect(),
        _ => return Err("ElementwiseChain without its `ops` attribute".into()),
    };
    let args = ctx
        .node
        .attr_ints("args")
        .ok_or("ElementwiseChain without its `args` attribute")?;
    if ops.is_empty() || args.len() != 3 * ops.len() {
        return Err(format!(
            "ElementwiseChain: {} ops but {} args (three per op)",
            ops.len(),
            args.len()
        ));
    }
    let mut steps = Vec::with_capacity(ops.len());
    for (s, name) in ops.iter().enumerate() {
        let op = Op::of(name).ok_or_else(|| format!("ElementwiseChain: no step op {name}"))?;
        let operand = |k: usize| -> Result<usize, String> {
            let v = args[3 * s + k];
            if v < 0 || v as usize >= n + s {
                return Err(format!(
                    "ElementwiseChain step {s} ({name}) reads operand {v}, not an input or an earlier step"
                ));
            }
            Ok(v as usize)
        };
        let a = operand(0)?;
        let b = if op.arity() >= 2 { operand(1)? } else { a };
        let c = if op.arity() == 3 { operand(2)? } else { a };
        steps.push(Step { op, a, b, c });
    }
    let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let (dims, st) = merged_dims(&out.shape, &shapes);
    // Merged, an input's innermost dim is its own contiguous one or a
    // broadcast one: each tile reads a run of it or one element.
    if st.iter().any(|s| s.last().is_some_and(|&x| x > 1)) {
        return Err("ElementwiseChain: an input strided along the output's last dim".into());
    }
    let inputs = st.into_iter().map(|strides| Layout { strides }).collect();
    Ok(Box::new(Chain {
        steps,
        inputs,
        types,
        dims,
    }))
}

/// Where an input's elements are read.
#[derive(Clone, Copy)]
enum Src<'a> {
    Float(&'a [f32]),
    /// Elements of another type, converted as they are loaded.
    Other(&'a [u8], DType),
    /// In the output's storage (the plan put the output over it), of this
    /// type (float32, or a 4-byte integer type).
    InPlace(DType),
}

/// An operand of a step over one tile.
#[derive(Clone, Copy)]
enum Opd<'a> {
    Run(&'a [f32]),
    One(f32),
}

thread_local! {
    /// This thread's tiles: one per step, one per gathered or in-place
    /// input.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl Kernel for Chain {
    fn in_place(&self) -> bool {
        true
    }

    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let n = self.inputs.len();
        let mut srcs: Vec<Src> = Vec::with_capacity(n);
        for (i, &d) in self.types.iter().enumerate() {
            let x = io.input(i)?;
            srcs.push(match x.data {
                Data::Bytes(b) if d == DType::F32 => Src::Float(cast(b)),
                Data::Bytes(b) => Src::Other(b, d),
                Data::Output0 if elem_size(d) == Some(4) => Src::InPlace(d),
                Data::Output0 => {
                    return Err(format!(
                        "ElementwiseChain input {i} ({}) is in place over a float output",
                        d.name()
                    ))
                }
            });
        }
        let threads = io.threads;
        let out = &mut io.outputs[0];
        let o: &mut [f32] = cast_mut(out.data);
        let total: usize = self.dims.iter().product();
        if o.len() != total {
            return Err(format!(
                "ElementwiseChain output holds {} elements, its shape {total}",
                o.len()
            ));
        }
        if total == 0 {
            return Ok(());
        }
        for (i, (s, l)) in srcs.iter().zip(&self.inputs).enumerate() {
            let need = self
                .dims
                .iter()
                .zip(&l.strides)
                .map(|(&d, &st)| (d - 1) * st)
                .sum::<usize>()
                + 1;
            let held = match s {
                Src::Float(s) => s.len(),
                Src::Other(b, d) => b.len() / elem_size(*d).unwrap_or(1),
                Src::InPlace(_) => total,
            };
            match s {
                _ if held < need => {
                    return Err(format!(
                        "ElementwiseChain input {i} holds {held} elements, needs {need}"
                    ))
                }
                // Read from the output tile by tile: only a full-sized
                // input (or one element) lies where the output does.
                Src::InPlace(_) if total != 1 && l.strides != strides(&self.dims) => {
                    return Err(format!(
                        "ElementwiseChain input {i} is in place but not of the output's shape"
                    ))
                }
                _ => {}
            }
        }
        let r = self.dims.len() - 1;
        let inner = self.dims[r];
        let run_rows = |first_row: usize, col0: usize, part: &mut [f32]| {
            SCRATCH.with(|sc| {
                let sc = &mut *sc.borrow_mut();
                // A tile per step but the last (written into the output)
                // and per in-place input.
                let want = (self.steps.len() - 1 + n) * TILE;
                if sc.len() < want {
                    sc.resize(want, 0.0);
                }
                // A part is whole rows (first_row..) or, for one row,
                // columns col0.. of it.
                let cols = part.len().min(inner);
                for (j, row) in part.chunks_mut(cols).enumerate() {
                    let i = first_row + j;
                    let mut c = 0;
                    while c < row.len() {
                        let m = TILE.min(row.len() - c);
                        let tile = &mut row[c..c + m];
                        self.tile(&srcs, i, col0 + c, tile, sc);
                        c += m;
                    }
                }
            })
        };
        if r == 0 {
            par::for_chunks_mut(threads, o, 1, par::MIN_ELEMS, |first, part| {
                run_rows(0, first, part)
            });
        } else {
            let min_rows = par::MIN_ELEMS.div_ceil(inner);
            par::for_chunks_mut(threads, o, inner, min_rows, |first, part| {
                run_rows(first, 0, part)
            });
        }
        Ok(())
    }
}

impl Chain {
    /// Output row `row`'s columns `c0..c0 + out.len()`: every step on the
    /// tile, the last into `out`.
    fn tile(&self, srcs: &[Src], row: usize, c0: usize, out: &mut [f32], sc: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::gemm::wide() {
                // SAFETY: the CPU has AVX-512F (checked just above).
                unsafe { self.tile_avx512(srcs, row, c0, out, sc) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { self.tile_avx2(srcs, row, c0, out, sc) };
                return;
            }
        }
        self.tile_body(srcs, row, c0, out, sc)
    }

    /// [`Chain::tile_body`] on sixteen lanes: the same operations per
    /// element, so the same bits.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_avx512(
        &self,
        srcs: &[Src],
        row: usize,
        c0: usize,
        out: &mut [f32],
        sc: &mut [f32],
    ) {
        self.tile_body(srcs, row, c0, out, sc)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn tile_avx2(
        &self,
        srcs: &[Src],
        row: usize,
        c0: usize,
        out: &mut [f32],
        sc: &mut [f32],
    ) {
        self.tile_body(srcs, row, c0, out, sc)
    }

    #[inline(always)]
    fn tile_body(&self, srcs: &[Src], row: usize, c0: usize, out: &mut [f32], sc: &mut [f32]) {
        let m = out.len();
        let n = self.inputs.len();
        let (steps_sc, in_sc) = sc.split_at_mut((self.steps.len() - 1) * TILE);
        // The inputs' operands: a run of the input itself, one element,
        // or a copy of an in-place input (read before `out` is written).
        let r = self.dims.len() - 1;
        let mut opds = [Opd::One(0.0); MAX_INPUTS];
        for (k, ((src, l), buf)) in srcs
            .iter()
            .zip(&self.inputs)
            .zip(in_sc.chunks_mut(TILE))
            .enumerate()
        {
            let (mut rest, mut off) = (row, 0);
            for d in (0..r).rev() {
                off += (rest % self.dims[d]) * l.strides[d];
                rest /= self.dims[d];
            }
            let step = l.strides[r];
            let opd = match *src {
                Src::InPlace(d) => {
                    buf[..m].copy_from_slice(out);
                    if d != DType::F32 {
                        for v in &mut buf[..m] {
                            *v = from_bits(d, v.to_bits());
                        }
                    }
                    Opd::Run(&buf[..m])
                }
                Src::Float(s) if step == 0 => Opd::One(s[off]),
                Src::Float(s) => Opd::Run(&s[off + c0..off + c0 + m]),
                Src::Other(b, d) if step == 0 => {
                    to_f32(d, b, off, &mut buf[..1]);
                    Opd::One(buf[0])
                }
                Src::Other(b, d) => {
                    to_f32(d, b, off + c0, &mut buf[..m]);
                    Opd::Run(&buf[..m])
                }
            };
            opds[k] = opd;
        }
        let last = self.steps.len() - 1;
        for (s, st) in self.steps.iter().enumerate() {
            // Steps before `s` are read; step `s` is written (into `out`
            // for the last).
            let (done, cur) = steps_sc.split_at_mut(s * TILE);
            let at = |v: usize| -> Opd {
                if v < n {
                    opds[v]
                } else {
                    Opd::Run(&done[(v - n) * TILE..][..m])
                }
            };
            let (a, b, c) = (at(st.a), at(st.b), at(st.c));
            let dst: &mut [f32] = if s == last { &mut *out } else { &mut cur[..m] };
            apply(st.op, a, b, c, dst);
        }
    }
}

/// A boolean as a tile holds it.
#[inline(always)]
fn truth(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// `dst = op(a, b, c)` element by element (operands past the op's arity
/// unread).
#[inline(always)]
fn apply(op: Op, a: Opd, b: Opd, c: Opd, dst: &mut [f32]) {
    match op {
        Op::Add => map2(a, b, dst, |x, y| x + y),
        Op::Sub => map2(a, b, dst, |x, y| x - y),
        Op::Mul => map2(a, b, dst, |x, y| x * y),
        Op::Div => map2(a, b, dst, |x, y| x / y),
        Op::Pow => map2(a, b, dst, pow),
        Op::Max => map2(a, b, dst, max_f32),
        Op::Min => map2(a, b, dst, min_f32),
        Op::Neg => map1(a, dst, |x| -x),
        Op::Abs => map1(a, dst, |x| x.abs()),
        Op::Sqrt => map1(a, dst, |x| x.sqrt()),
        Op::Reciprocal => map1(a, dst, |x| 1.0 / x),
        Op::Exp => map1(a, dst, exp_f32),
        Op::Log => map1(a, dst, f32::ln),
        Op::Erf => map1(a, dst, erf),
        Op::Tanh => map1(a, dst, tanh_f32),
        Op::Sigmoid => map1(a, dst, sigmoid_f32),
        Op::Relu => map1(a, dst, |x| Activation::Relu.apply(x)),
        // Converted on the way in.
        Op::Cast => map1(a, dst, |x| x),
        Op::Where => map3(a, b, c, dst, |c, x, y| if c != 0.0 { x } else { y }),
        Op::Not => map1(a, dst, |x| truth(x == 0.0)),
        Op::And => map2(a, b, dst, |x, y| truth(x != 0.0 && y != 0.0)),
        Op::Or => map2(a, b, dst, |x, y| truth(x != 0.0 || y != 0.0)),
        Op::Xor => map2(a, b, dst, |x, y| truth((x != 0.0) != (y != 0.0))),
    }
}

/// An element of a 4-byte type `d` held in an output float's bits (an
/// input the plan put in place), as float32.
#[inline(always)]
fn from_bits(d: DType, bits: u32) -> f32 {
    match d {
        DType::I32 => bits as i32 as f64 as f32,
        DType::U32 => bits as f64 as f32,
        _ => f32::from_bits(bits),
    }
}

// Plain index loops (not iterator adapters, which the compiler may leave
// out of line, compiled without the caller's vector features).

#[inline(always)]
fn map1(a: Opd, dst: &mut [f32], f: impl Fn(f32) -> f32) {
    let m = dst.len();
    match a {
        Opd::Run(x) => {
            let x = &x[..m];
            for j in 0..m {
                dst[j] = f(x[j]);
            }
        }
        Opd::One(x) => dst.fill(f(x)),
    }
}

#[inline(always)]
fn map2(a: Opd, b: Opd, dst: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let m = dst.len();
    match (a, b) {
        (Opd::Run(x), Opd::Run(y)) => {
            let (x, y) = (&x[..m], &y[..m]);
            for j in 0..m {
                dst[j] = f(x[j], y[j]);
            }
        }
        (Opd::Run(x), Opd::One(y)) => {
            let x = &x[..m];
            for j in 0..m {
                dst[j] = f(x[j], y);
            }
        }
        (Opd::One(x), Opd::Run(y)) => {
            let y = &y[..m];
            for j in 0..m {
                dst[j] = f(x, y[j]);
            }
        }
        (Opd::One(x), Opd::One(y)) => dst.fill(f(x, y)),
    }
}

#[inline(always)]
fn map3(a: Opd, b: Opd, c: Opd, dst: &mut [f32], f: impl Fn(f32, f32, f32) -> f32) {
    let m = dst.len();
    match (a, b, c) {
        // The masks of backward graphs: a full condition and value, a
        // scalar otherwise.
        (Opd::Run(x), Opd::Run(y), Opd::One(z)) => {
            let (x, y) = (&x[..m], &y[..m]);
            for j in 0..m {
                dst[j] = f(x[j], y[j], z);
            }
        }
        (Opd::Run(x), Opd::Run(y), Opd::Run(z)) => {
            let (x, y, z) = (&x[..m], &y[..m], &z[..m]);
            for j in 0..m {
                dst[j] = f(x[j], y[j], z[j]);
            }
        }
        _ => {
            let at = |o: Opd, j: usize| match o {
                Opd::Run(x) => x[j],
                Opd::One(v) => v,
            };
            for (j, d) in dst.iter_mut().enumerate() {
                *d = f(at(a, j), at(b, j), at(c, j));
            }
        }
    }
}
