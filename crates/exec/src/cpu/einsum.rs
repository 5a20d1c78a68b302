//! Einsum on f32, f64, i64 and i32: any number of operands, explicit or
//! implicit output (`->` absent: the ellipsis dims, then the labels seen
//! once, in alphabetical order), `...` (broadcast, right-aligned), a label
//! repeated within an operand (its diagonal; within the output too), and
//! sums over the labels the output lacks.
//!
//! Two f32 operands whose every label is a batch, left, right or summed
//! one (no label summed over one operand alone) run as a batched GEMM
//! ([`product`]) on packed copies; anything else (one or three operands,
//! f64, integers) runs as one loop nest over every label (output labels
//! outermost), each product accumulated into its output element.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::matmul::product;
use crate::tensor::{cast, cast_mut, numel, strides, Elem};
use graphopt_ir::DType;
use std::ops::{Add, Mul};

/// A parsed equation bound to input shapes: labels are numbered (ellipsis
/// dims first, then letters in order of appearance).
#[derive(Debug)]
struct Plan {
    /// Size of each label.
    sizes: Vec<usize>,
    /// Per operand, the stride (in elements) of each label (0 when the
    /// operand lacks it or broadcasts it; summed over repeats: a diagonal).
    op_strides: Vec<Vec<usize>>,
    /// The output labels in order (a repeated one once per position).
    out: Vec<usize>,
}

/// Reads one term (`ab...c`) into labels: `None` marks where the ellipsis
/// goes.
fn term(t: &str) -> Result<Vec<Option<char>>, String> {
    let mut v = Vec::new();
    let mut rest = t;
    let mut seen = false;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            if seen {
                return Err(format!("two ellipses in '{t}'"));
            }
            seen = true;
            v.push(None);
            rest = r;
            continue;
        }
        let c = rest.chars().next().unwrap_or(' ');
        if !c.is_ascii_alphabetic() {
            return Err(format!("bad label '{c}' in '{t}'"));
        }
        v.push(Some(c));
        rest = &rest[1..];
    }
    Ok(v)
}

fn plan(eq: &str, shapes: &[Vec<usize>]) -> Result<Plan, String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<Vec<Option<char>>> = lhs.split(',').map(term).collect::<Result<_, _>>()?;
    if terms.len() != shapes.len() {
        return Err(format!(
            "{} terms for {} inputs in '{eq}'",
            terms.len(),
            shapes.len()
        ));
    }
    // Ellipsis rank: the most dims any operand's `...` covers.
    let mut ell = 0usize;
    for (t, s) in terms.iter().zip(shapes) {
        let named = t.iter().filter(|l| l.is_some()).count();
        let has = t.len() > named;
        if s.len() < named || (!has && s.len() != named) {
            return Err(format!("term of rank {named} for an input of shape {s:?}"));
        }
        if has {
            ell = ell.max(s.len() - named);
        }
    }
    let mut letters: Vec<char> = Vec::new();
    let mut count: Vec<usize> = Vec::new();
    let mut sizes: Vec<usize> = vec![1; ell];
    let label =
        |c: char, letters: &mut Vec<char>, count: &mut Vec<usize>, sizes: &mut Vec<usize>| {
            match letters.iter().position(|&l| l == c) {
                Some(p) => ell + p,
                None => {
                    letters.push(c);
                    count.push(0);
                    sizes.push(1);
                    ell + letters.len() - 1
                }
            }
        };
    let mut op_strides = Vec::new();
    for (t, s) in terms.iter().zip(shapes) {
        let st = strides(s);
        let named = t.iter().filter(|l| l.is_some()).count();
        let ne = s.len() - named;
        let mut ls = Vec::new();
        let mut d = 0;
        for l in t {
            match l {
                None => {
                    for e in 0..ne {
                        ls.push((ell - ne + e, d));
                        d += 1;
                    }
                }
                Some(c) => {
                    let id = label(*c, &mut letters, &mut count, &mut sizes);
                    count[id - ell] += 1;
                    ls.push((id, d));
                    d += 1;
                }
            }
        }
        let mut strd = Vec::new();
        for (id, d) in ls {
            if strd.len() <= id {
                strd.resize(id + 1, 0usize);
            }
            let n = s[d];
            if n != 1 {
                if sizes[id] != 1 && sizes[id] != n {
                    return Err(format!(
                        "label sizes differ ({} vs {n}) in '{eq}'",
                        sizes[id]
                    ));
                }
                sizes[id] = n;
                strd[id] += st[d];
            }
        }
        op_strides.push(strd);
    }
    let out: Vec<usize> = match rhs {
        Some(r) => {
            let mut o = Vec::new();
            for l in term(r)? {
                match l {
                    None => o.extend(0..ell),
                    Some(c) => match letters.iter().position(|&l| l == c) {
                        Some(p) => o.push(ell + p),
                        None => return Err(format!("output label '{c}' is in no input")),
                    },
                }
            }
            o
        }
        None => {
            let mut once: Vec<(char, usize)> = letters
                .iter()
                .enumerate()
                .filter(|(p, _)| count[*p] == 1)
                .map(|(p, &c)| (c, ell + p))
                .collect();
            once.sort();
            (0..ell).chain(once.into_iter().map(|(_, id)| id)).collect()
        }
    };
    for s in &mut op_strides {
        s.resize(sizes.len(), 0);
    }
    Ok(Plan {
        sizes,
        op_strides,
        out,
    })
}

/// Element types Einsum computes on.
trait Num: Elem + Default + Add<Output = Self> + Mul<Output = Self> {
    fn one() -> Self;
}
impl Num for f32 {
    fn one() -> f32 {
        1.0
    }
}
impl Num for f64 {
    fn one() -> f64 {
        1.0
    }
}
impl Num for i64 {
    fn one() -> i64 {
        1
    }
}
impl Num for i32 {
    fn one() -> i32 {
        1
    }
}

struct Einsum {
    dtype: DType,
    plan: Plan,
    out_shape: Vec<usize>,
    /// Two f32 operands whose labels all group as below: a batched GEMM.
    gemm: Option<Groups>,
}

/// The labels (of size above 1) of a two-operand contraction by role:
/// batch (both operands, output), left (first operand and output), right
/// (second operand and output), summed (both operands, not the output).
/// A label's role follows its strides: an operand broadcasting it (size
/// 1) does not vary along it.
#[derive(Debug)]
struct Groups {
    batch: Vec<usize>,
    left: Vec<usize>,
    right: Vec<usize>,
    sum: Vec<usize>,
}

fn groups(p: &Plan) -> Option<Groups> {
    if p.op_strides.len() != 2 {
        return None;
    }
    let (sa, sb) = (&p.op_strides[0], &p.op_strides[1]);
    let mut g = Groups {
        batch: vec![],
        left: vec![],
        right: vec![],
        sum: vec![],
    };
    for l in 0..p.sizes.len() {
        if p.sizes[l] == 1 {
            continue;
        }
        match (sa[l] != 0, sb[l] != 0, p.out.contains(&l)) {
            (true, true, true) => g.batch.push(l),
            (true, false, true) => g.left.push(l),
            (false, true, true) => g.right.push(l),
            (true, true, false) => g.sum.push(l),
            // Summed over one operand only, or in the output alone.
            _ => return None,
        }
    }
    Some(g)
}

/// Calls `f(i, offset)` for every index `i` (row-major, last label
/// fastest) over `labels`, with `offset = Σ index_l · strides[l]`.
fn walk(labels: &[usize], sizes: &[usize], strides: &[usize], mut f: impl FnMut(usize, usize)) {
    let n: usize = labels.iter().map(|&l| sizes[l]).product();
    let mut idx = vec![0usize; labels.len()];
    let mut off = 0usize;
    for i in 0..n {
        f(i, off);
        for k in (0..labels.len()).rev() {
            let l = labels[k];
            idx[k] += 1;
            if idx[k] < sizes[l] {
                off += strides[l];
                break;
            }
            off -= strides[l] * (idx[k] - 1);
            idx[k] = 0;
        }
    }
}

impl Einsum {
    /// The loop nest: output labels outermost, summed labels inside.
    fn generic<T: Num>(&self, xs: &[&[T]], y: &mut [T]) {
        let p = &self.plan;
        let nl = p.sizes.len();
        y.fill(T::default());
        // Output strides per label (a label repeated in the output: its
        // diagonal, the rest stays zero).
        let ost = strides(&self.out_shape);
        let mut ystr = vec![0usize; nl];
        for (k, &l) in p.out.iter().enumerate() {
            ystr[l] += ost[k];
        }
        let mut order: Vec<usize> = Vec::new();
        for &l in &p.out {
            if !order.contains(&l) {
                order.push(l);
            }
        }
        order.extend((0..nl).filter(|l| !p.out.contains(l)));
        let total: usize = order.iter().map(|&l| p.sizes[l]).product();
        if total == 0 {
            return;
        }
        let nop = xs.len();
        let mut idx = vec![0usize; order.len()];
        let mut offs = vec![0usize; nop];
        let mut yo = 0usize;
        for _ in 0..total {
            let mut v = T::one();
            for (x, &o) in xs.iter().zip(&offs) {
                v = v * x[o];
            }
            y[yo] = y[yo] + v;
            // Advance the odometer, updating offsets incrementally.
            for k in (0..order.len()).rev() {
                let l = order[k];
                idx[k] += 1;
                if idx[k] < p.sizes[l] {
                    for (o, s) in offs.iter_mut().zip(&p.op_strides) {
                        *o += s[l];
                    }
                    yo += ystr[l];
                    break;
                }
                let back = idx[k] - 1;
                idx[k] = 0;
                for (o, s) in offs.iter_mut().zip(&p.op_strides) {
                    *o -= s[l] * back;
                }
                yo -= ystr[l] * back;
            }
        }
    }

    /// The batched GEMM: both operands packed as [batch, m, k] and
    /// [batch, k, n] (diagonals and broadcasts fall out of the strides),
    /// multiplied, and the [batch, m, n] product placed in the output.
    fn gemm(&self, g: &Groups, a: &[f32], b: &[f32], y: &mut [f32], threads: usize) {
        let p = &self.plan;
        let size = |ls: &[usize]| -> usize { ls.iter().map(|&l| p.sizes[l]).product() };
        let (nb, m, n, k) = (size(&g.batch), size(&g.left), size(&g.right), size(&g.sum));
        let cat = |x: &[usize], y: &[usize], z: &[usize]| -> Vec<usize> {
            x.iter().chain(y).chain(z).copied().collect()
        };
        let mut pa = vec![0.0f32; nb * m * k];
        walk(
            &cat(&g.batch, &g.left, &g.sum),
            &p.sizes,
            &p.op_strides[0],
            |i, o| pa[i] = a[o],
        );
        let mut pb = vec![0.0f32; nb * k * n];
        walk(
            &cat(&g.batch, &g.sum, &g.right),
            &p.sizes,
            &p.op_strides[1],
            |i, o| pb[i] = b[o],
        );
        let mut pc = vec![0.0f32; nb * m * n];
        if nb * m * n * k > 0 {
            for ((c, a), b) in pc
                .chunks_mut(m * n)
                .zip(pa.chunks(m * k))
                .zip(pb.chunks(k * n))
            {
                product(m, k, n, 1.0, a, (k, 1), b, (n, 1), 0.0, c, n, threads);
            }
        }
        // Output strides per label (a label repeated in the output: its
        // diagonal; the rest of the output stays zero).
        let ost = strides(&self.out_shape);
        let mut ys = vec![0usize; p.sizes.len()];
        for (j, &l) in p.out.iter().enumerate() {
            ys[l] += ost[j];
        }
        y.fill(0.0);
        walk(&cat(&g.batch, &g.left, &g.right), &p.sizes, &ys, |i, o| {
            y[o] = pc[i]
        });
    }

    fn run_t<T: Num>(&self, io: &mut KernelIo) -> Result<(), String> {
        let mut xs: Vec<&[T]> = Vec::new();
        for i in 0..self.plan.op_strides.len() {
            xs.push(cast(io.input(i)?.bytes()?));
        }
        let y: &mut [T] = cast_mut(io.outputs[0].data);
        if y.len() != numel(&self.out_shape) {
            return Err(format!("output holds {} elements", y.len()));
        }
        self.generic(&xs, y);
        Ok(())
    }
}

impl Kernel for Einsum {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        match self.dtype {
            DType::F32 => match &self.gemm {
                Some(g) => {
                    let (a, b) = (io.input(0)?.f32()?, io.input(1)?.f32()?);
                    let threads = io.threads;
                    let y = io.outputs[0].f32()?;
                    if y.len() != numel(&self.out_shape) {
                        return Err(format!("output holds {} elements", y.len()));
                    }
                    self.gemm(g, a, b, y, threads);
                    Ok(())
                }
                None => self.run_t::<f32>(io),
            },
            DType::F64 => self.run_t::<f64>(io),
            DType::I64 => self.run_t::<i64>(io),
            DType::I32 => self.run_t::<i32>(io),
            d => Err(format!("Einsum on {}", d.name())),
        }
    }
}

pub fn einsum(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let eq = ctx
        .node
        .attr_str("equation")
        .ok_or("Einsum without an equation")?;
    let mut shapes = Vec::new();
    let mut dtype = None;
    for i in 0..ctx.inputs.len() {
        let t = ctx.input(i)?;
        if dtype.is_some_and(|d| d != t.dtype) {
            return Err("Einsum inputs of different types".into());
        }
        dtype = Some(t.dtype);
        shapes.push(t.shape.clone());
    }
    let dtype = dtype.ok_or("Einsum without inputs")?;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::I64 | DType::I32) {
        return Err(format!("Einsum on {} is not implemented", dtype.name()));
    }
    let plan = plan(eq, &shapes)?;
    let out_shape: Vec<usize> = plan.out.iter().map(|&l| plan.sizes[l]).collect();
    if out_shape != ctx.outputs[0].shape {
        return Err(format!(
            "output shape {out_shape:?} differs from the inferred {:?}",
            ctx.outputs[0].shape
        ));
    }
    let gemm = if dtype == DType::F32 {
        groups(&plan)
    } else {
        None
    };
    Ok(Box::new(Einsum {
        dtype,
        plan,
        out_shape,
        gemm,
    }))
}
