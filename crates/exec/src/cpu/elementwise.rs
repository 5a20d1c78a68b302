//! Elementwise ops with numpy broadcasting: arithmetic, comparisons, logic,
//! `Where`, `Cast`, and unary math.
//!
//! In place: a same-dtype op whose output the plan puts over an input
//! reads that input from the output (element `i` is read before it is
//! written, and an in-place input has the output's shape, so the indices
//! agree). Ops changing the dtype (comparisons) get staging instead.

use crate::backend::{Activation, Data, In, Kernel, KernelIo, NodeCtx};
use crate::cpu::par;
use crate::tensor::{cast, cast_mut, numel, sign4, strides, Elem};
use graphopt_ir::DType;

/// Calls `f(out_index, [input indices])` for every output element, with
/// numpy broadcasting of each input shape to `out`.
pub fn for_each_bcast<const N: usize>(
    out: &[usize],
    ins: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let n = numel(out);
    if n == 0 {
        return;
    }
    let rank = out.len();
    // Fast path: every input full-size or scalar.
    if ins.iter().all(|s| numel(s) == n || numel(s) == 1) {
        let full: [bool; N] = std::array::from_fn(|k| numel(ins[k]) == n);
        for i in 0..n {
            f(i, std::array::from_fn(|k| if full[k] { i } else { 0 }));
        }
        return;
    }
    // Per-input strides aligned to the output's rank, 0 on broadcast dims.
    let st: [Vec<usize>; N] = std::array::from_fn(|k| {
        let s = ins[k];
        let own = strides(s);
        (0..rank)
            .map(|d| {
                let off = rank - s.len();
                if d < off || s[d - off] == 1 {
                    0
                } else {
                    own[d - off]
                }
            })
            .collect()
    });
    let mut idx = vec![0usize; rank];
    let mut pos = [0usize; N];
    let last = rank - 1;
    let inner = out[last];
    let mut i = 0;
    while i < n {
        for j in 0..inner {
            f(i + j, std::array::from_fn(|k| pos[k] + j * st[k][last]));
        }
        i += inner;
        // Advance the odometer over the outer dims.
        let mut d = last;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for k in 0..N {
                pos[k] += st[k][d];
            }
            if idx[d] < out[d] {
                break;
            }
            for k in 0..N {
                pos[k] -= st[k][d] * out[d];
            }
            idx[d] = 0;
        }
    }
}

fn slice<'a, T: Elem>(x: &In<'a>) -> Option<&'a [T]> {
    match x.data {
        Data::Bytes(b) => Some(cast(b)),
        Data::Output0 => None,
    }
}

/// `out = f(a, b)` with a, b, out of one dtype `T`; either input may be
/// in place.
fn binary_same<T: Elem>(io: &mut KernelIo, f: impl Fn(T, T) -> T) -> Result<(), String> {
    let (a, b) = (io.input(0)?, io.input(1)?);
    let (sa, sb) = (slice::<T>(&a), slice::<T>(&b));
    let out = &mut io.outputs[0];
    let shape = out.shape;
    let o: &mut [T] = cast_mut(out.data);
    for_each_bcast(shape, [a.shape, b.shape], |i, [ia, ib]| {
        let x = sa.map_or(o[i], |s| s[ia]);
        let y = sb.map_or(o[i], |s| s[ib]);
        o[i] = f(x, y);
    });
    Ok(())
}

/// Where one operand of a row of [`binary_f32`] comes from.
#[derive(Clone, Copy)]
enum Src<'a> {
    /// The output itself (the operand is in place).
    Out,
    /// `row` contiguous elements.
    Row(&'a [f32]),
    /// One element repeated along the row.
    Bcast(f32),
    /// Elements `s[first + j·step]`.
    Strided(&'a [f32], usize, usize),
}

impl<'a> Src<'a> {
    /// Columns `c0..c0 + n` of this row's operand.
    fn cols(self, c0: usize, n: usize) -> Src<'a> {
        match self {
            Src::Out => Src::Out,
            Src::Row(r) => Src::Row(&r[c0..c0 + n]),
            Src::Bcast(v) => Src::Bcast(v),
            Src::Strided(s, first, step) => Src::Strided(s, first + c0 * step, step),
        }
    }
}

/// One row of `out = f(a, b)`: the common layouts as plain loops the
/// compiler vectorizes, the rest by index.
fn binary_row(o: &mut [f32], a: Src, b: Src, f: impl Fn(f32, f32) -> f32 + Copy) {
    use Src::*;
    match (a, b) {
        (Row(a), Row(b)) => o
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(o, (&x, &y))| *o = f(x, y)),
        (Row(a), Bcast(y)) => o.iter_mut().zip(a).for_each(|(o, &x)| *o = f(x, y)),
        (Bcast(x), Row(b)) => o.iter_mut().zip(b).for_each(|(o, &y)| *o = f(x, y)),
        (Out, Row(b)) => o.iter_mut().zip(b).for_each(|(o, &y)| *o = f(*o, y)),
        (Row(a), Out) => o.iter_mut().zip(a).for_each(|(o, &x)| *o = f(x, *o)),
        (Out, Bcast(y)) => o.iter_mut().for_each(|o| *o = f(*o, y)),
        (Bcast(x), Out) => o.iter_mut().for_each(|o| *o = f(x, *o)),
        (Out, Out) => o.iter_mut().for_each(|o| *o = f(*o, *o)),
        (Bcast(x), Bcast(y)) => o.fill(f(x, y)),
        _ => {
            let at = |s: Src, o: &[f32], j: usize| match s {
                Out => o[j],
                Row(r) => r[j],
                Bcast(v) => v,
                Strided(r, first, step) => r[first + j * step],
            };
            for j in 0..o.len() {
                let (x, y) = (at(a, o, j), at(b, o, j));
                o[j] = f(x, y);
            }
        }
    }
}

/// Where row `row` of an operand with strides `st` over the merged output
/// `dims` reads (`None`: the output itself).
fn row_src<'a>(s: Option<&'a [f32]>, st: &[usize], dims: &[usize], row: usize) -> Src<'a> {
    let Some(s) = s else { return Src::Out };
    let r = dims.len() - 1;
    let inner = dims[r];
    // The element offset of this row's first element.
    let (mut rest, mut off) = (row, 0);
    for d in (0..r).rev() {
        off += (rest % dims[d]) * st[d];
        rest /= dims[d];
    }
    match st[r] {
        0 => Src::Bcast(s[off]),
        1 => Src::Row(&s[off..off + inner]),
        step => Src::Strided(s, off, step),
    }
}

/// `shape`'s dims with adjacent dims merged where every input is
/// contiguous across them or broadcast along both (size-1 dims dropped;
/// one dim of 1 if none is left), and each input's element strides over
/// them (0 where it is broadcast). Inputs broadcast to `shape` (numpy's
/// rules).
pub(crate) fn merged_dims(shape: &[usize], inputs: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let aligned = |s: &[usize]| -> Vec<usize> {
        let own = strides(s);
        let off = shape.len() - s.len();
        (0..shape.len())
            .map(|d| {
                if d < off || s[d - off] == 1 {
                    0
                } else {
                    own[d - off]
                }
            })
            .collect()
    };
    let full: Vec<Vec<usize>> = inputs.iter().map(|s| aligned(s)).collect();
    let mut dims: Vec<usize> = Vec::new();
    let mut st: Vec<Vec<usize>> = vec![Vec::new(); inputs.len()];
    for (d, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        if let Some(&pd) = dims.last() {
            let joins = |p: usize, c: usize| (p == 0 && c == 0) || (c != 0 && p == c * size);
            if st
                .iter()
                .zip(&full)
                .all(|(s, f)| joins(*s.last().unwrap_or(&0), f[d]))
            {
                let k = dims.len() - 1;
                dims[k] = pd * size;
                for (s, f) in st.iter_mut().zip(&full) {
                    s[k] = f[d];
                }
                continue;
            }
        }
        dims.push(size);
        for (s, f) in st.iter_mut().zip(&full) {
            s.push(f[d]);
        }
    }
    if dims.is_empty() {
        dims.push(1);
        for s in &mut st {
            s.push(0);
        }
    }
    (dims, st)
}

/// `out = f(a, b)` on f32 with numpy broadcasting, either input possibly
/// in place. Dims are merged where every operand is contiguous across
/// them (or broadcast along both); the output is then rows of the last
/// merged dim, split across threads ([`par`]), or a single row's columns
/// when everything merges into one, each row one of the layouts of
/// [`binary_row`].
fn binary_f32(io: &mut KernelIo, f: impl Fn(f32, f32) -> f32 + Copy + Sync) -> Result<(), String> {
    let (a, b) = (io.input(0)?, io.input(1)?);
    let (sa, sb) = (slice::<f32>(&a), slice::<f32>(&b));
    let threads = io.threads;
    let out = &mut io.outputs[0];
    let shape = out.shape.to_vec();
    let o: &mut [f32] = cast_mut(out.data);
    let n = numel(&shape);
    if n == 0 {
        return Ok(());
    }
    let (dims, st) = merged_dims(&shape, &[a.shape, b.shape]);
    let (st_a, st_b) = (&st[0], &st[1]);
    let r = dims.len() - 1;
    let inner = dims[r];
    let src = |s, st: &[usize], row| row_src(s, st, &dims, row);
    if r == 0 {
        // One row (same-shape operands merge into one): columns split
        // across threads instead.
        let (a, b) = (src(sa, st_a, 0), src(sb, st_b, 0));
        par::for_chunks_mut(threads, o, 1, par::MIN_ELEMS, |first, part| {
            let n = part.len();
            binary_row(part, a.cols(first, n), b.cols(first, n), f);
        });
        return Ok(());
    }
    let min_rows = par::MIN_ELEMS.div_ceil(inner);
    par::for_chunks_mut(threads, o, inner, min_rows, |first, part| {
        for (j, row) in part.chunks_mut(inner).enumerate() {
            let i = first + j;
            binary_row(row, src(sa, st_a, i), src(sb, st_b, i), f);
        }
    });
    Ok(())
}

/// `out = f(a, b)` into another dtype (no in-place: staged).
fn binary_to<T: Elem, U: Elem>(
    io: &mut KernelIo,
    f: impl Fn(T, T) -> U + Sync,
) -> Result<(), String> {
    let (a, b) = (io.input(0)?, io.input(1)?);
    let (sa, sb): (&[T], &[T]) = (cast(a.bytes()?), cast(b.bytes()?));
    let threads = io.threads;
    let out = &mut io.outputs[0];
    let shape = out.shape;
    let o: &mut [U] = cast_mut(out.data);
    let n = o.len();
    if (sa.len() == n || sa.len() == 1) && (sb.len() == n || sb.len() == 1) && n > 0 {
        // Full-size or scalar operands: chunks across threads, one plain
        // loop per layout (which the compiler vectorizes).
        let (fa, fb) = (sa.len() == n, sb.len() == n);
        par::for_chunks_mut(threads, o, 1, par::MIN_ELEMS, |first, part| {
            let m = part.len();
            match (fa, fb) {
                (true, true) => {
                    let (a, b) = (&sa[first..first + m], &sb[first..first + m]);
                    for j in 0..m {
                        part[j] = f(a[j], b[j]);
                    }
                }
                (true, false) => {
                    let (a, y) = (&sa[first..first + m], sb[0]);
                    for j in 0..m {
                        part[j] = f(a[j], y);
                    }
                }
                (false, true) => {
                    let (x, b) = (sa[0], &sb[first..first + m]);
                    for j in 0..m {
                        part[j] = f(x, b[j]);
                    }
                }
                (false, false) => part.fill(f(sa[0], sb[0])),
            }
        });
        return Ok(());
    }
    for_each_bcast(shape, [a.shape, b.shape], |i, [ia, ib]| {
        o[i] = f(sa[ia], sb[ib])
    });
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Mod,
    And,
    Or,
    Xor,
    PRelu,
    BitAnd,
    BitOr,
    BitXor,
    ShiftLeft,
    ShiftRight,
    Equal,
    Less,
    Greater,
    LessEq,
    GreaterEq,
}

struct Binary {
    op: Bin,
    dtype: DType,
    fmod: bool,
}

impl Kernel for Binary {
    fn in_place(&self) -> bool {
        !matches!(
            self.op,
            Bin::Equal | Bin::Less | Bin::Greater | Bin::LessEq | Bin::GreaterEq
        ) && !narrow_int(self.dtype)
            && !bitwise(self.op)
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        use Bin::*;
        let op = self.op;
        // One closure per comparison (not a match per element), so the
        // loops vectorize.
        macro_rules! cmp {
            ($t:ty) => {
                match op {
                    Equal => binary_to::<$t, u8>(io, |x, y| (x == y) as u8),
                    Less => binary_to::<$t, u8>(io, |x, y| (x < y) as u8),
                    Greater => binary_to::<$t, u8>(io, |x, y| (x > y) as u8),
                    LessEq => binary_to::<$t, u8>(io, |x, y| (x <= y) as u8),
                    _ => binary_to::<$t, u8>(io, |x, y| (x >= y) as u8),
                }
            };
        }
        match (self.dtype, op) {
            (d, _) if bitwise(op) => binary_narrow(io, op, self.fmod, d),
            (DType::F32, Equal | Less | Greater | LessEq | GreaterEq) => cmp!(f32),
            (DType::F64, Equal | Less | Greater | LessEq | GreaterEq) => cmp!(f64),
            // f64: what optimizers compute in double (AdamW's bias
            // corrections) and the double node tests.
            (DType::F64, Add | Sub | Mul | Div | Pow | Max | Min | Mod) => {
                let fmod = self.fmod;
                binary_same::<f64>(io, move |x, y| match op {
                    Add => x + y,
                    Sub => x - y,
                    Mul => x * y,
                    Div => x / y,
                    Pow => x.powf(y),
                    _ if x.is_nan() || y.is_nan() => f64::NAN,
                    Max => x.max(y),
                    Min => x.min(y),
                    _ if fmod => x % y,
                    _ => {
                        let r = x % y;
                        if r != 0.0 {
                            if (y < 0.0) != (r < 0.0) {
                                r + y
                            } else {
                                r
                            }
                        } else {
                            0f64.copysign(y)
                        }
                    }
                })
            }
            (DType::I64, Equal | Less | Greater | LessEq | GreaterEq) => cmp!(i64),
            (DType::I32, Equal | Less | Greater | LessEq | GreaterEq) => cmp!(i32),
            (DType::Bool, Equal) => cmp!(u8),
            (DType::F32, _) => match op {
                Add => binary_f32(io, |x, y| x + y),
                Sub => binary_f32(io, |x, y| x - y),
                Mul => binary_f32(io, |x, y| x * y),
                Div => binary_f32(io, |x, y| x / y),
                PRelu => binary_f32(io, |x, y| if x < 0.0 { x * y } else { x }),
                Pow => binary_f32(io, pow),
                Max => binary_f32(io, max_f32),
                Min => binary_f32(io, min_f32),
                _ if self.fmod => binary_f32(io, |x, y| x % y),
                _ => binary_f32(io, py_mod),
            },
            (DType::I64, _) => {
                let fmod = self.fmod;
                binary_same::<i64>(io, move |x, y| int_op(op, fmod, x, y))
            }
            (DType::I32, _) => {
                let fmod = self.fmod;
                binary_same::<i32>(io, move |x, y| int_op(op, fmod, x as i64, y as i64) as i32)
            }
            (DType::Bool, And | Or | Xor) => binary_same::<u8>(io, move |x, y| match op {
                And => x & y,
                Or => x | y,
                _ => x ^ y,
            }),
            (d, _) if narrow_int(d) => binary_narrow(io, op, self.fmod, d),
            (d, _) => Err(format!("{op:?} on {} is not implemented", d.name())),
        }
    }
}

/// Bitwise ops and shifts: on the widened path for every integer type.
fn bitwise(op: Bin) -> bool {
    matches!(
        op,
        Bin::BitAnd | Bin::BitOr | Bin::BitXor | Bin::ShiftLeft | Bin::ShiftRight
    )
}

/// Integer types without a native path: computed widened to i128 (exact
/// for every one of them), stored back truncated (wrapping, as C does).
fn narrow_int(d: DType) -> bool {
    matches!(
        d,
        DType::I8 | DType::I16 | DType::U8 | DType::U16 | DType::U32 | DType::U64
    )
}

fn read_wide(d: DType, b: &[u8]) -> Vec<i128> {
    match d {
        DType::I8 => cast::<i8>(b).iter().map(|&v| v as i128).collect(),
        DType::U8 => b.iter().map(|&v| v as i128).collect(),
        DType::I16 => cast::<u16>(b).iter().map(|&v| v as i16 as i128).collect(),
        DType::U16 => cast::<u16>(b).iter().map(|&v| v as i128).collect(),
        DType::U32 => cast::<i32>(b).iter().map(|&v| v as u32 as i128).collect(),
        DType::I32 => cast::<i32>(b).iter().map(|&v| v as i128).collect(),
        DType::I64 => cast::<i64>(b).iter().map(|&v| v as i128).collect(),
        _ => cast::<i64>(b).iter().map(|&v| v as u64 as i128).collect(),
    }
}

fn write_wide(d: DType, v: i128, o: &mut [u8], i: usize) {
    let es = crate::tensor::elem_size(d).unwrap_or(1);
    o[i * es..(i + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
}

fn binary_narrow(io: &mut KernelIo, op: Bin, fmod: bool, d: DType) -> Result<(), String> {
    use Bin::*;
    let (a, b) = (io.input(0)?, io.input(1)?);
    let (va, vb) = (read_wide(d, a.bytes()?), read_wide(d, b.bytes()?));
    let bits = 8 * crate::tensor::elem_size(d).unwrap_or(8) as i128;
    let out = &mut io.outputs[0];
    let shape = out.shape;
    let o = &mut *out.data;
    let mut bad = None;
    for_each_bcast(shape, [a.shape, b.shape], |i, [ia, ib]| {
        let (x, y) = (va[ia], vb[ib]);
        let c = match op {
            Equal => Some(x == y),
            Less => Some(x < y),
            Greater => Some(x > y),
            LessEq => Some(x <= y),
            GreaterEq => Some(x >= y),
            _ => None,
        };
        if let Some(c) = c {
            o[i] = c as u8;
            return;
        }
        let v = match op {
            Add => x + y,
            Sub => x - y,
            Mul => x.wrapping_mul(y),
            Max => x.max(y),
            Min => x.min(y),
            Div | Mod if y == 0 => {
                bad = Some("integer division by zero");
                0
            }
            Div => x / y,
            BitAnd => x & y,
            BitOr => x | y,
            BitXor => x ^ y,
            // Shifts are of unsigned types: by the width or more gives 0.
            ShiftLeft | ShiftRight if !(0..bits).contains(&y) => 0,
            ShiftLeft => x << y,
            ShiftRight => x >> y,
            Mod if fmod => x % y,
            Mod => {
                let r = x % y;
                if r != 0 && (r < 0) != (y < 0) {
                    r + y
                } else {
                    r
                }
            }
            _ => {
                bad = Some("not an integer op");
                0
            }
        };
        write_wide(d, v, o, i);
    });
    match bad {
        Some(b) => Err(b.into()),
        None => Ok(()),
    }
}

/// Max of two floats, NaN if either is (ONNX's Max).
#[inline(always)]
pub(crate) fn max_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.max(y)
    }
}

/// Min of two floats, NaN if either is (ONNX's Min).
#[inline(always)]
pub(crate) fn min_f32(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.min(y)
    }
}

/// `x^y` as onnxruntime computes it: squares and square roots exactly.
#[inline]
pub(crate) fn pow(x: f32, y: f32) -> f32 {
    if y == 2.0 {
        x * x
    } else if y == 0.5 {
        x.sqrt()
    } else if y == 1.0 {
        x
    } else if y == 3.0 {
        x * x * x
    } else {
        x.powf(y)
    }
}

/// Float `Mod` with fmod=0: numpy's `mod` (the remainder takes the
/// divisor's sign; a zero remainder is a zero of the divisor's sign).
fn py_mod(x: f32, y: f32) -> f32 {
    let r = x % y;
    if r != 0.0 {
        if (y < 0.0) != (r < 0.0) {
            r + y
        } else {
            r
        }
    } else {
        0f32.copysign(y)
    }
}

fn int_op(op: Bin, fmod: bool, x: i64, y: i64) -> i64 {
    match op {
        Bin::Add => x.wrapping_add(y),
        Bin::Sub => x.wrapping_sub(y),
        Bin::Mul => x.wrapping_mul(y),
        // ONNX integer division truncates (C semantics).
        Bin::Div => {
            if y == 0 {
                0
            } else {
                x.wrapping_div(y)
            }
        }
        Bin::Pow => (x as f64).powf(y as f64) as i64,
        Bin::Max => x.max(y),
        Bin::Min => x.min(y),
        // fmod=1: C's remainder (the dividend's sign); fmod=0: the
        // remainder takes the divisor's sign (Python's %).
        Bin::Mod if fmod => {
            if y == 0 {
                0
            } else {
                x.wrapping_rem(y)
            }
        }
        Bin::Mod => {
            if y == 0 {
                0
            } else {
                let r = x.wrapping_rem(y);
                if r != 0 && (r < 0) != (y < 0) {
                    r + y
                } else {
                    r
                }
            }
        }
        _ => 0,
    }
}

/// The kernel for a binary op, if it is one.
pub fn binary(ctx: &NodeCtx) -> Option<Result<Box<dyn Kernel>, String>> {
    let op = match ctx.node.op_type.as_str() {
        "Add" | "Sum" | "Mean" => Bin::Add,
        "PRelu" => Bin::PRelu,
        "Sub" => Bin::Sub,
        "Mul" => Bin::Mul,
        "Div" => Bin::Div,
        "Pow" => Bin::Pow,
        "Max" => Bin::Max,
        "Min" => Bin::Min,
        "Mod" => Bin::Mod,
        "And" => Bin::And,
        "Or" => Bin::Or,
        "Xor" => Bin::Xor,
        "BitwiseAnd" => Bin::BitAnd,
        "BitwiseOr" => Bin::BitOr,
        "BitwiseXor" => Bin::BitXor,
        "BitShift" => {
            if ctx.node.attr_str("direction") == Some("LEFT") {
                Bin::ShiftLeft
            } else {
                Bin::ShiftRight
            }
        }
        "Equal" => Bin::Equal,
        "Less" => Bin::Less,
        "Greater" => Bin::Greater,
        "LessOrEqual" => Bin::LessEq,
        "GreaterOrEqual" => Bin::GreaterEq,
        _ => return None,
    };
    Some((|| {
        if (ctx.inputs.len() != 2 && matches!(ctx.node.op_type.as_str(), "Sum" | "Max" | "Min"))
            || ctx.node.op_type == "Mean"
        {
            return variadic(ctx, op);
        }
        if ctx.inputs.len() != 2 {
            return Err(format!(
                "{} inputs (only 2 are implemented)",
                ctx.inputs.len()
            ));
        }
        let a = ctx.input(0)?;
        let b = ctx.input(1)?;
        if a.dtype != b.dtype && op != Bin::Pow {
            return Err("mixed input dtypes".into());
        }
        if op == Bin::Pow && a.dtype != b.dtype {
            return pow_mixed(a.dtype, b.dtype);
        }
        let ok = matches!(
            (a.dtype, op),
            (DType::F32 | DType::I64 | DType::I32, _)
                | (
                    DType::F64,
                    Bin::Add
                        | Bin::Sub
                        | Bin::Mul
                        | Bin::Div
                        | Bin::Pow
                        | Bin::Max
                        | Bin::Min
                        | Bin::Mod
                        | Bin::Equal
                        | Bin::Less
                        | Bin::Greater
                        | Bin::LessEq
                        | Bin::GreaterEq
                )
                | (DType::Bool, Bin::And | Bin::Or | Bin::Xor | Bin::Equal)
        ) && !(a.dtype == DType::F32 && matches!(op, Bin::And | Bin::Or | Bin::Xor))
            && !(a.dtype != DType::F32
                && a.dtype != DType::Bool
                && matches!(op, Bin::And | Bin::Or | Bin::Xor))
            || (narrow_int(a.dtype)
                && !matches!(op, Bin::And | Bin::Or | Bin::Xor | Bin::Pow | Bin::PRelu));
        let ok = ok && !(op == Bin::PRelu && a.dtype != DType::F32);
        let int = narrow_int(a.dtype) || matches!(a.dtype, DType::I64 | DType::I32);
        let ok = if bitwise(op) {
            int && !(matches!(op, Bin::ShiftLeft | Bin::ShiftRight)
                && matches!(a.dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64))
        } else {
            ok
        };
        if !ok {
            return Err(format!("{op:?} on {} is not implemented", a.dtype.name()));
        }
        Ok(Box::new(Binary {
            op,
            dtype: a.dtype,
            fmod: ctx.node.attr_int("fmod") == Some(1),
        }) as Box<dyn Kernel>)
    })())
}

/// Sum / Max / Min of one or of three and more inputs: input 0
/// broadcast into the output, then each further input folded in.
struct Variadic {
    op: Bin,
    dtype: DType,
    /// Mean: the sum divided by the input count.
    mean: bool,
}

fn fold<T: Elem>(io: &mut KernelIo, f: impl Fn(T, T) -> T) -> Result<(), String> {
    let ins: Vec<(&[usize], &[T])> = (0..io.inputs.len())
        .map(|k| {
            let i = io.input(k)?;
            Ok((i.shape, cast::<T>(i.bytes()?)))
        })
        .collect::<Result<_, String>>()?;
    let out = &mut io.outputs[0];
    let shape = out.shape;
    let o: &mut [T] = cast_mut(out.data);
    for_each_bcast(shape, [ins[0].0], |i, [j]| o[i] = ins[0].1[j]);
    for (s, x) in &ins[1..] {
        for_each_bcast(shape, [*s], |i, [j]| o[i] = f(o[i], x[j]));
    }
    Ok(())
}

impl Kernel for Variadic {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let op = self.op;
        match self.dtype {
            DType::F32 => {
                fold::<f32>(io, move |x, y| match op {
                    Bin::Add => x + y,
                    _ if x.is_nan() || y.is_nan() => f32::NAN,
                    Bin::Max => x.max(y),
                    _ => x.min(y),
                })?;
                if self.mean {
                    let n = io.inputs.len() as f32;
                    io.outputs[0].f32()?.iter_mut().for_each(|v| *v /= n);
                }
                Ok(())
            }
            DType::I64 => fold::<i64>(io, move |x, y| int_op(op, false, x, y)),
            DType::I32 => fold::<i32>(io, move |x, y| int_op(op, false, x as i64, y as i64) as i32),
            d => Err(format!("{op:?} on {}", d.name())),
        }
    }
}

fn variadic(ctx: &NodeCtx, op: Bin) -> Result<Box<dyn Kernel>, String> {
    let d = ctx.input(0)?.dtype;
    for k in 0..ctx.inputs.len() {
        if ctx.input(k)?.dtype != d {
            return Err("mixed input dtypes".into());
        }
    }
    let mean = ctx.node.op_type == "Mean";
    if !matches!(d, DType::F32 | DType::I64 | DType::I32) || (mean && d != DType::F32) {
        return Err(format!(
            "{} on {} is not implemented",
            ctx.node.op_type,
            d.name()
        ));
    }
    Ok(Box::new(Variadic { op, dtype: d, mean }))
}

/// Where one branch of a [`select_part`] comes from.
#[derive(Clone, Copy)]
enum Pick<'a, T> {
    /// The output itself (the branch is in place).
    Out,
    /// One value for every element.
    One(T),
    /// One value per element.
    All(&'a [T]),
}

/// A branch of `Where` for elements `first..first + m`: in place (`None`),
/// a scalar, or full-size.
fn pick<T: Copy>(s: Option<&[T]>, first: usize, m: usize) -> Pick<'_, T> {
    match s {
        None => Pick::Out,
        Some(s) if s.len() == 1 => Pick::One(s[0]),
        Some(s) => Pick::All(&s[first..first + m]),
    }
}

/// `o[j] = if c[j] != 0 { x } else { y }` for branches laid out as
/// [`Pick`]s: one plain loop per layout, which the compiler vectorizes.
fn select_part<T: Copy>(c: &[u8], x: Pick<T>, y: Pick<T>, o: &mut [T]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { select_avx2(c, x, y, o) };
        return;
    }
    select_body(c, x, y, o);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn select_avx2<T: Copy>(c: &[u8], x: Pick<T>, y: Pick<T>, o: &mut [T]) {
    select_body(c, x, y, o);
}

/// [`select_part`]'s loops, indexed so that they compile inside the
/// caller's target features.
#[inline(always)]
fn select_body<T: Copy>(c: &[u8], x: Pick<T>, y: Pick<T>, o: &mut [T]) {
    use Pick::*;
    let n = o.len();
    // Every slice cut to `n`, so that no bounds check stays in the loop.
    let c = &c[..n];
    macro_rules! sel {
        (|$j:ident| $a:expr, $b:expr) => {
            for $j in 0..n {
                // Both branches read first: a select, not a branch.
                let (x, y) = ($a, $b);
                o[$j] = if c[$j] != 0 { x } else { y };
            }
        };
    }
    match (x, y) {
        (All(a), All(b)) => {
            let (a, b) = (&a[..n], &b[..n]);
            sel!(|j| a[j], b[j])
        }
        (All(a), One(v)) => {
            let a = &a[..n];
            sel!(|j| a[j], v)
        }
        (One(v), All(b)) => {
            let b = &b[..n];
            sel!(|j| v, b[j])
        }
        (One(v), One(w)) => sel!(|j| v, w),
        (Out, All(b)) => {
            let b = &b[..n];
            sel!(|j| o[j], b[j])
        }
        (Out, One(w)) => sel!(|j| o[j], w),
        (All(a), Out) => {
            let a = &a[..n];
            sel!(|j| a[j], o[j])
        }
        (One(v), Out) => sel!(|j| v, o[j]),
        (Out, Out) => {}
    }
}

/// `Where(cond, x, y)`; x or y may be in place.
struct Where {
    dtype: DType,
}

fn where_t<T: Elem>(io: &mut KernelIo) -> Result<(), String> {
    let (c, x, y) = (io.input(0)?, io.input(1)?, io.input(2)?);
    if matches!(c.data, Data::Output0) {
        // The plan put a 1-byte output over the condition (same shape):
        // element i of the condition is read before it is overwritten.
        let (sx, sy) = (slice::<u8>(&x), slice::<u8>(&y));
        let out = &mut io.outputs[0];
        let shape = out.shape;
        let o: &mut [u8] = out.data;
        if std::mem::size_of::<T>() != 1 || sx.is_none() || sy.is_none() {
            return Err("condition in place with x or y".into());
        }
        let (sx, sy) = (sx.unwrap_or_default(), sy.unwrap_or_default());
        for_each_bcast(shape, [x.shape, y.shape], |i, [ix, iy]| {
            o[i] = if o[i] != 0 { sx[ix] } else { sy[iy] };
        });
        return Ok(());
    }
    let sc: &[u8] = cast(c.bytes()?);
    let (sx, sy) = (slice::<T>(&x), slice::<T>(&y));
    let threads = io.threads;
    let out = &mut io.outputs[0];
    let shape = out.shape;
    let o: &mut [T] = cast_mut(out.data);
    let n = o.len();
    let full_or_one = |s: &[usize]| numel(s) == n || numel(s) == 1;
    if full_or_one(c.shape) && full_or_one(x.shape) && full_or_one(y.shape) {
        // Every operand full-size or a scalar (ReLU's backward mask):
        // chunks across threads, in-place operands read from the output,
        // one plain loop per layout ([`select_part`]).
        let cfull = sc.len() == n;
        par::for_chunks_mut(threads, o, 1, par::MIN_ELEMS, |first, part| {
            let m = part.len();
            if !cfull {
                // One condition for all: the chunk is x's or y's.
                let (pick, _) = if sc[0] != 0 { (sx, sy) } else { (sy, sx) };
                match pick {
                    None => {}
                    Some(s) if s.len() == 1 => part.fill(s[0]),
                    Some(s) => part.copy_from_slice(&s[first..first + m]),
                }
                return;
            }
            let (px, py) = (pick(sx, first, m), pick(sy, first, m));
            select_part(&sc[first..first + m], px, py, part);
        });
        return Ok(());
    }
    for_each_bcast(shape, [c.shape, x.shape, y.shape], |i, [ic, ix, iy]| {
        o[i] = if sc[ic] != 0 {
            sx.map_or(o[i], |s| s[ix])
        } else {
            sy.map_or(o[i], |s| s[iy])
        };
    });
    Ok(())
}

impl Kernel for Where {
    fn in_place(&self) -> bool {
        true
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        match crate::tensor::elem_size(self.dtype) {
            Some(4) => where_t::<i32>(io),
            Some(8) => where_t::<i64>(io),
            Some(1) => where_t::<u8>(io),
            Some(2) => where_t::<u16>(io),
            _ => Err(format!("Where on {}", self.dtype.name())),
        }
    }
}

pub fn where_(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    if ctx.input(0)?.dtype != DType::Bool {
        return Err("condition is not bool".into());
    }
    Ok(Box::new(Where {
        dtype: ctx.outputs[0].dtype,
    }))
}

/// A unary f32 function, in place when the plan says so.
pub struct Unary<F: Fn(f32) -> f32 + Send + Sync>(pub F);

impl<F: Fn(f32) -> f32 + Send + Sync> Kernel for Unary<F> {
    fn in_place(&self) -> bool {
        true
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let f = &self.0;
        unary_chunks(io, |x, o| match x {
            Some(s) => o.iter_mut().zip(s).for_each(|(o, &v)| *o = f(v)),
            None => o.iter_mut().for_each(|o| *o = f(*o)),
        })
    }
}

/// A unary f32 kernel's run: the output in chunks across threads, each
/// `chunk(x, o)` with its elements of the input (`None`: in place, `o`
/// holds them).
fn unary_chunks(
    io: &mut KernelIo,
    chunk: impl Fn(Option<&[f32]>, &mut [f32]) + Sync,
) -> Result<(), String> {
    let x = io.input(0)?;
    let sx = slice::<f32>(&x);
    let threads = io.threads;
    let o = io.outputs[0].f32()?;
    par::for_chunks_mut(threads, o, 1, par::MIN_ELEMS, |first, o| {
        chunk(sx.map(|s| &s[first..first + o.len()]), o)
    });
    Ok(())
}

/// A unary f64 function (the few that optimizers and double node tests
/// use), in place when the plan says so.
struct UnaryF64(fn(f64) -> f64);

impl Kernel for UnaryF64 {
    fn in_place(&self) -> bool {
        true
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?;
        let sx = slice::<f64>(&x);
        let o: &mut [f64] = cast_mut(io.outputs[0].data);
        match sx {
            Some(s) => o.iter_mut().zip(s).for_each(|(o, &v)| *o = (self.0)(v)),
            None => o.iter_mut().for_each(|o| *o = (self.0)(*o)),
        }
        Ok(())
    }
}

/// Relu on f32 ([`Activation::Relu`]'s arithmetic), fusable into the
/// kernel that produces its input.
struct Relu;

impl Kernel for Relu {
    fn in_place(&self) -> bool {
        true
    }
    fn activation(&self) -> Option<Activation> {
        Some(Activation::Relu)
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        Unary(|x: f32| Activation::Relu.apply(x)).run(io)
    }
}

/// Clip on f32: bounds from the attributes (opset < 11) or the optional
/// inputs 1 and 2 (scalars, read at run time).
struct Clip {
    lo: f32,
    hi: f32,
}

impl Kernel for Clip {
    fn in_place(&self) -> bool {
        true
    }
    fn activation(&self) -> Option<Activation> {
        Some(Activation::Clip {
            lo: self.lo,
            hi: self.hi,
        })
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        // A bound the plan put under the (then one-element) output is
        // read from there before anything is written.
        let first_out = io.outputs[0].f32()?.first().copied();
        let bound = |k: usize, d: f32| -> Result<f32, String> {
            match io.inputs.get(k).copied().flatten() {
                Some(t) if matches!(t.data, Data::Output0) => {
                    first_out.ok_or_else(|| format!("input {k} is empty"))
                }
                Some(t) => t
                    .f32()?
                    .first()
                    .copied()
                    .ok_or_else(|| format!("input {k} is empty")),
                None => Ok(d),
            }
        };
        let (lo, hi) = (bound(1, self.lo)?, bound(2, self.hi)?);
        Unary(move |x: f32| Activation::Clip { lo, hi }.apply(x)).run(io)
    }
}

/// `Not` on bool, `Neg`/`Abs` on integers.
struct IntUnary {
    op: &'static str,
    dtype: DType,
}

impl Kernel for IntUnary {
    fn in_place(&self) -> bool {
        true
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?;
        macro_rules! go {
            ($t:ty, $f:expr) => {{
                let sx = slice::<$t>(&x);
                let o: &mut [$t] = cast_mut(io.outputs[0].data);
                let f = $f;
                match sx {
                    Some(s) => o.iter_mut().zip(s).for_each(|(o, &v)| *o = f(v)),
                    None => o.iter_mut().for_each(|o| *o = f(*o)),
                }
            }};
        }
        match (self.op, self.dtype) {
            ("Not", DType::Bool) => go!(u8, |v: u8| (v == 0) as u8),
            ("Neg", DType::I64) => go!(i64, |v: i64| v.wrapping_neg()),
            ("Abs", DType::I64) => go!(i64, |v: i64| v.wrapping_abs()),
            (op, d) => return Err(format!("{op} on {}", d.name())),
        }
        Ok(())
    }
}

/// ln(1 + eˣ) without overflow for large x.
fn softplus(x: f32) -> f32 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// A unary f32 kernel `$kernel` (in place where the plan says so) whose
/// loop inlines the branch-free `$f`, so that it vectorizes: chunks across
/// threads, each through `$slice(x, o)` (`x = None`: in place), which runs
/// on AVX2 lanes where the CPU has them (the same operations, no FMA, so
/// the same bits), else SSE2's. The loops are indexed, so that they
/// compile inside the AVX2 function's target features.
macro_rules! lanes_kernel {
    ($(#[$doc:meta])* $kernel:ident, $slice:ident, $f:ident) => {
        $(#[$doc])*
        struct $kernel;

        impl Kernel for $kernel {
            fn in_place(&self) -> bool {
                true
            }
            fn run(&self, io: &mut KernelIo) -> Result<(), String> {
                unary_chunks(io, $slice)
            }
        }

        pub(crate) fn $slice(x: Option<&[f32]>, o: &mut [f32]) {
            #[inline(always)]
            fn body(x: Option<&[f32]>, o: &mut [f32]) {
                match x {
                    Some(s) => {
                        let s = &s[..o.len()];
                        for i in 0..o.len() {
                            o[i] = $f(s[i]);
                        }
                    }
                    None => {
                        for v in o {
                            *v = $f(*v);
                        }
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            unsafe fn avx2(x: Option<&[f32]>, o: &mut [f32]) {
                body(x, o);
            }
            // Sixteen lanes and 32 registers (the polynomials' constants
            // stay in them): the same operations per lane, so the same
            // bits.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512(x: Option<&[f32]>, o: &mut [f32]) {
                body(x, o);
            }
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::gemm::wide() {
                // SAFETY: the CPU has AVX-512F (checked just above).
                unsafe { avx512(x, o) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { avx2(x, o) };
                return;
            }
            body(x, o);
        }
    };
}

/// erf(x) on f32 without branches (so a loop over a tensor vectorizes),
/// within 2 ulp of erf (test: `erf_f32_is_within_two_ulps`,
/// against a reference accurate to 1e-14): the Taylor series to x¹⁹ below
/// |x| = 0.84 (truncation below 4e-10) and, above it, Numerical Recipes'
/// Chebyshev fit of erfc (fractional error < 1.2e-7) with [`exp_f32`].
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    // (-1)^k / (k! (2k + 1)), k = 0..9.
    const TAYLOR: [f32; 10] = [
        1.0,
        -1.0 / 3.0,
        1.0 / 10.0,
        -1.0 / 42.0,
        1.0 / 216.0,
        -1.0 / 1320.0,
        1.0 / 9360.0,
        -1.0 / 75600.0,
        1.0 / 685_440.0,
        -1.0 / 6_894_720.0,
    ];
    // Where the series takes over from 1 - erfc (which loses bits to the
    // cancellation as erfc grows).
    const SMALL: f32 = 0.84;
    let z = x.abs();
    let z2 = z * z;
    let series = TAYLOR.iter().rev().fold(0.0, |acc, &c| acc * z2 + c);
    let small = z * series * std::f32::consts::FRAC_2_SQRT_PI;
    let t = 1.0 / (1.0 + 0.5 * z);
    let erfc = t * exp_f32(
        -z2 - 1.265_512_2
            + t * (1.000_023_7
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_204
                                    + t * (1.488_515_9
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))),
    );
    let large = (1.0 - erfc).min(1.0);
    odd_select(x, z < SMALL, small, large)
}

lanes_kernel!(
    /// Erf on f32: its own loop around the inlined, branch-free [`erf`].
    Erf,
    erf_slice,
    erf
);

/// An odd function's value at `x` from its two pieces at |x|: `small`
/// where `use_small`, else `large`, with `x`'s sign; NaN where `x` is.
/// Selections by bit masks, not branches, so that a loop over a tensor
/// vectorizes.
#[inline(always)]
fn odd_select(x: f32, use_small: bool, small: f32, large: f32) -> f32 {
    let m = (use_small as u32).wrapping_neg();
    let r = f32::from_bits((small.to_bits() & m) | (large.to_bits() & !m)).copysign(x);
    let nan = (x.is_nan() as u32).wrapping_neg();
    f32::from_bits((x.to_bits() & nan) | (r.to_bits() & !nan))
}

/// eˣ on f32 without branches or libm (so a loop over a tensor
/// vectorizes), within 1 ulp of the correctly rounded result over the
/// normal range (test: `exp_f32_is_within_one_ulp`): x = n·ln 2 + r
/// (ln 2 in two parts), |r| ≤ ln 2 / 2, eʳ by Cephes' degree-7 expf
/// polynomial, times 2ⁿ applied as two powers of two so that results
/// near the ends of the range (overflow to +inf above 88.72, gradual
/// underflow below -87.3, within one subnormal step of libm's) come out
/// as libm's do. NaN passes through.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Outside [-104, 89] the result is 0 or +inf either way.
    let x = x.clamp(-104.0, 89.0);
    // n = round(x / ln 2): the rounding of the magic-number sum, then its
    // integer from the low mantissa bits (no float-to-int conversion).
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // 2ⁿ = 2^(n/2) · 2^(n - n/2): each factor a normal float for n in
    // [-151, 129].
    let h = ni >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    y * pow2(h) * pow2(ni - h)
}

lanes_kernel!(
    /// Exp on f32: its own loop around the inlined, branch-free [`exp_f32`].
    Exp,
    exp_slice,
    exp_f32
);

/// tanh(x) on f32 without branches (so a loop over a tensor vectorizes),
/// within 1 ulp of f64's on a dense sweep (test:
/// `tanh_f32_is_within_one_ulp`; near |x| = 0.625 the bound is about 1.5
/// ulp by analysis): Cephes'
/// tanhf, an odd polynomial below |x| = 0.625 and `1 - 2 / (e^2|x| + 1)`
/// with [`exp_f32`] above. NaN passes through.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let z = x.abs();
    let z2 = x * x;
    let p = -5.704_988_7e-3;
    let p = p * z2 + 2.063_909e-2;
    let p = p * z2 - 5.373_971_6e-2;
    let p = p * z2 + 1.333_144_2e-1;
    let p = p * z2 - 3.333_328e-1;
    let small = p * z2 * z + z;
    let large = 1.0 - 2.0 / (exp_f32(2.0 * z) + 1.0);
    odd_select(x, z < 0.625, small, large)
}

lanes_kernel!(
    /// Tanh on f32: its own loop around the inlined, branch-free
    /// [`tanh_f32`].
    Tanh,
    tanh_slice,
    tanh_f32
);

/// The logistic function `1 / (1 + e⁻ˣ)` with [`exp_f32`].
#[inline(always)]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

lanes_kernel!(
    /// Sigmoid on f32, around the inlined [`sigmoid_f32`].
    Sigmoid,
    sigmoid_slice,
    sigmoid_f32
);

/// GELU, `x/2 · (1 + erf(x/√2))`, with [`erf`].
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`,
/// with [`tanh_f32`].
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let k = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + tanh_f32(k * (x + 0.044715 * x * x * x)))
}

lanes_kernel!(
    /// Gelu (`approximate="none"`) on f32, around the inlined [`gelu_erf`].
    GeluErf,
    gelu_erf_slice,
    gelu_erf
);

lanes_kernel!(
    /// Gelu (`approximate="tanh"`) on f32, around the inlined [`gelu_tanh`].
    GeluTanh,
    gelu_tanh_slice,
    gelu_tanh
);

fn attr_f(ctx: &NodeCtx, name: &str, d: f32) -> f32 {
    ctx.node.attr_float(name).unwrap_or(d)
}

/// Unary ops and activations; `None` when the op is not one.
pub fn unary(ctx: &NodeCtx) -> Option<Result<Box<dyn Kernel>, String>> {
    let op = ctx.node.op_type.as_str();
    const UNARY: &[&str] = &[
        "Abs",
        "Acos",
        "Acosh",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "Ceil",
        "Celu",
        "Clip",
        "Cos",
        "Cosh",
        "Elu",
        "Erf",
        "Exp",
        "Floor",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Log",
        "Mish",
        "Neg",
        "Not",
        "Reciprocal",
        "Relu",
        "Round",
        "Selu",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Softplus",
        "Softsign",
        "Sqrt",
        "Swish",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
    ];
    if !UNARY.contains(&op) {
        return None;
    }
    let dt = match ctx.input(0) {
        Ok(t) => t.dtype,
        Err(e) => return Some(Err(e)),
    };
    if matches!(op, "Not") || (dt == DType::I64 && matches!(op, "Neg" | "Abs")) {
        return Some(Ok(Box::new(IntUnary {
            op: if op == "Not" {
                "Not"
            } else if op == "Neg" {
                "Neg"
            } else {
                "Abs"
            },
            dtype: dt,
        })));
    }
    if dt == DType::F64 {
        let f: fn(f64) -> f64 = match op {
            "Sqrt" => f64::sqrt,
            "Exp" => f64::exp,
            "Log" => f64::ln,
            "Neg" => |x| -x,
            "Abs" => f64::abs,
            "Reciprocal" => |x| 1.0 / x,
            "Floor" => f64::floor,
            "Ceil" => f64::ceil,
            _ => return Some(Err(format!("{op} on double is not implemented"))),
        };
        return Some(Ok(Box::new(UnaryF64(f))));
    }
    let k: Box<dyn Kernel> = match op {
        "Sqrt" => Box::new(Unary(|x: f32| x.sqrt())),
        "Exp" => Box::new(Exp),
        "Log" => Box::new(Unary(f32::ln)),
        "Neg" => Box::new(Unary(|x: f32| -x)),
        "Abs" => Box::new(Unary(|x: f32| x.abs())),
        "Reciprocal" => Box::new(Unary(|x: f32| 1.0 / x)),
        "Floor" => Box::new(Unary(f32::floor)),
        "Ceil" => Box::new(Unary(f32::ceil)),
        // Their own kernels (`lanes_kernel!`), vectorized.
        "Erf" => Box::new(Erf),
        "Tanh" => Box::new(Tanh),
        "Tan" => Box::new(Unary(f32::tan)),
        "Asin" => Box::new(Unary(f32::asin)),
        "Acos" => Box::new(Unary(f32::acos)),
        "Atan" => Box::new(Unary(f32::atan)),
        "Sinh" => Box::new(Unary(f32::sinh)),
        "Cosh" => Box::new(Unary(f32::cosh)),
        "Asinh" => Box::new(Unary(f32::asinh)),
        "Acosh" => Box::new(Unary(f32::acosh)),
        "Atanh" => Box::new(Unary(f32::atanh)),
        // Half to even, as ONNX specifies.
        "Round" => Box::new(Unary(f32::round_ties_even)),
        // 0 for ±0 (and NaN for NaN), unlike `signum`.
        "Sign" => Box::new(Unary(|x: f32| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x * 0.0
            }
        })),
        "Softsign" => Box::new(Unary(|x: f32| x / (1.0 + x.abs()))),
        "Softplus" => Box::new(Unary(softplus)),
        "Mish" => Box::new(Unary(|x: f32| x * softplus(x).tanh())),
        "Elu" => {
            let a = attr_f(ctx, "alpha", 1.0);
            Box::new(Unary(
                move |x: f32| if x > 0.0 { x } else { a * x.exp_m1() },
            ))
        }
        "Celu" => {
            let a = attr_f(ctx, "alpha", 1.0);
            Box::new(Unary(move |x: f32| {
                x.max(0.0) + (a * (x / a).exp_m1()).min(0.0)
            }))
        }
        "Selu" => {
            let a = attr_f(ctx, "alpha", 1.673_263_2);
            let g = attr_f(ctx, "gamma", 1.050_701);
            Box::new(Unary(move |x: f32| {
                g * if x > 0.0 { x } else { a * x.exp_m1() }
            }))
        }
        "ThresholdedRelu" => {
            let a = attr_f(ctx, "alpha", 1.0);
            Box::new(Unary(move |x: f32| if x > a { x } else { 0.0 }))
        }
        "Shrink" => {
            let (b, l) = (attr_f(ctx, "bias", 0.0), attr_f(ctx, "lambd", 0.5));
            Box::new(Unary(move |x: f32| {
                if x < -l {
                    x + b
                } else if x > l {
                    x - b
                } else {
                    0.0
                }
            }))
        }
        "Sin" => Box::new(Unary(f32::sin)),
        "Cos" => Box::new(Unary(f32::cos)),
        "Sigmoid" => Box::new(Sigmoid),
        "Relu" => Box::new(Relu),
        "LeakyRelu" => {
            let a = attr_f(ctx, "alpha", 0.01);
            Box::new(Unary(move |x: f32| if x >= 0.0 { x } else { a * x }))
        }
        "HardSigmoid" => {
            let (a, b) = (attr_f(ctx, "alpha", 0.2), attr_f(ctx, "beta", 0.5));
            Box::new(Unary(move |x: f32| (a * x + b).clamp(0.0, 1.0)))
        }
        "HardSwish" => Box::new(Unary(|x: f32| x * (x / 6.0 + 0.5).clamp(0.0, 1.0))),
        "Swish" => {
            let a = attr_f(ctx, "alpha", 1.0);
            Box::new(Unary(move |x: f32| x * (1.0 / (1.0 + (-a * x).exp()))))
        }
        "Gelu" => {
            if ctx.node.attr_str("approximate") == Some("tanh") {
                Box::new(GeluTanh)
            } else {
                Box::new(GeluErf)
            }
        }
        "Clip" => Box::new(Clip {
            // Opset < 11: min/max attributes; since 11: optional inputs,
            // read at run time.
            lo: attr_f(ctx, "min", f32::NEG_INFINITY),
            hi: attr_f(ctx, "max", f32::INFINITY),
        }),
        _ => return None,
    };
    if dt != DType::F32 {
        return Some(Err(format!("{op} on {} is not implemented", dt.name())));
    }
    Some(Ok(k))
}

/// BitwiseNot on any integer type: every byte inverted.
struct BitNot;

impl Kernel for BitNot {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.bytes()?;
        for (o, &v) in io.outputs[0].data.iter_mut().zip(x) {
            *o = !v;
        }
        Ok(())
    }
}

pub fn bit_not(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let d = ctx.input(0)?.dtype;
    if !(narrow_int(d) || matches!(d, DType::I64 | DType::I32)) {
        return Err(format!("BitwiseNot on {} is not implemented", d.name()));
    }
    Ok(Box::new(BitNot))
}

/// IsNaN / IsInf (detect_negative, detect_positive) on f32: bool out.
struct Classify {
    nan: bool,
    neg: bool,
    pos: bool,
}

impl Kernel for Classify {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?.f32()?;
        for (o, &v) in io.outputs[0].data.iter_mut().zip(x) {
            *o = if self.nan {
                v.is_nan()
            } else {
                v.is_infinite() && ((v > 0.0 && self.pos) || (v < 0.0 && self.neg))
            } as u8;
        }
        Ok(())
    }
}

pub fn classify(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let d = ctx.input(0)?.dtype;
    if d != DType::F32 {
        return Err(format!(
            "{} on {} is not implemented",
            ctx.node.op_type,
            d.name()
        ));
    }
    Ok(Box::new(Classify {
        nan: ctx.node.op_type == "IsNaN",
        neg: ctx.node.attr_int("detect_negative") != Some(0),
        pos: ctx.node.attr_int("detect_positive") != Some(0),
    }))
}

/// Pow whose exponent has another dtype than its base (ONNX's T1: a
/// float base with an int64 exponent, as resampling windows write), in
/// f64 with numpy broadcasting; the result in the base's dtype (integer
/// bases truncate, as onnxruntime's cast of `std::pow`).
struct PowMixed {
    base: DType,
    exp: DType,
}

fn pow_mixed(base: DType, exp: DType) -> Result<Box<dyn Kernel>, String> {
    let number = |d: DType| {
        matches!(
            d,
            DType::F32
                | DType::F64
                | DType::I64
                | DType::I32
                | DType::I8
                | DType::U8
                | DType::U32
                | DType::U64
        )
    };
    if !matches!(base, DType::F32 | DType::F64 | DType::I64 | DType::I32) || !number(exp) {
        return Err(format!(
            "Pow of {} to a {} exponent is not implemented",
            base.name(),
            exp.name()
        ));
    }
    Ok(Box::new(PowMixed { base, exp }))
}

impl Kernel for PowMixed {
    fn in_place(&self) -> bool {
        true
    }
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (a, b) = (io.input(0)?, io.input(1)?);
        // Both operands are read whole before the output is written (the
        // plan may have put the output over the base).
        let read = |x: &In, d: DType, out: &[u8]| match x.data {
            Data::Bytes(bytes) => read_as_f64(d, bytes),
            Data::Output0 => read_as_f64(d, out),
        };
        let xs = read(&a, self.base, io.outputs[0].data)?;
        let ys = read(&b, self.exp, io.outputs[0].data)?;
        let out = &mut io.outputs[0];
        let shape = out.shape;
        let mut v = vec![0f64; numel(shape)];
        for_each_bcast(shape, [a.shape, b.shape], |i, [ia, ib]| {
            v[i] = xs[ia].powf(ys[ib])
        });
        write_from_f64(self.base, &v, out.data)
    }
}

/// `Cast` between f32, f64, i64, i32, i8, u8, bool, f16 and bf16; from
/// packed uint4/int4 initializers to any of those; u16 and i16 to int32 and
/// int64.
struct Cast {
    from: DType,
    to: DType,
}

/// The types [`to_f32`] converts.
pub(crate) const TO_F32: &[DType] = &[
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::U32,
    DType::I8,
    DType::U8,
    DType::Bool,
];

/// Elements `off..off + dst.len()` of `b` (of type `d`, one of
/// [`TO_F32`]) as float32: Cast's conversion to float (the Cast kernel
/// and the fused chains' loads both call it). Through float64, exact for
/// all but 64-bit integers, which round there first, then rounded once;
/// float16 and bfloat16 widen exactly. Another type gives NaN.
pub(crate) fn to_f32(d: DType, b: &[u8], off: usize, dst: &mut [f32]) {
    let m = dst.len();
    macro_rules! each {
        ($t:ty, $f:expr) => {{
            let s: &[$t] = cast(b);
            let s = &s[off..off + m];
            for j in 0..m {
                dst[j] = $f(s[j]);
            }
        }};
    }
    match d {
        DType::F32 => each!(f32, |x: f32| x),
        DType::F64 => each!(f64, |x: f64| x as f32),
        DType::F16 => each!(u16, |x: u16| half::f16::from_bits(x).to_f32()),
        DType::BF16 => each!(u16, |x: u16| half::bf16::from_bits(x).to_f32()),
        DType::I64 => each!(i64, |x: i64| x as f64 as f32),
        DType::I32 => each!(i32, |x: i32| x as f64 as f32),
        DType::U32 => each!(u32, |x: u32| x as f64 as f32),
        DType::I8 => each!(i8, |x: i8| x as f32),
        DType::U8 | DType::Bool => each!(u8, |x: u8| x as f32),
        _ => dst.fill(f32::NAN),
    }
}

fn read_as_f64(d: DType, b: &[u8]) -> Result<Vec<f64>, String> {
    Ok(match d {
        DType::F32 => cast::<f32>(b).iter().map(|&x| x as f64).collect(),
        DType::F64 => cast::<f64>(b).to_vec(),
        DType::I64 => cast::<i64>(b).iter().map(|&x| x as f64).collect(),
        DType::I32 => cast::<i32>(b).iter().map(|&x| x as f64).collect(),
        DType::I8 => cast::<i8>(b).iter().map(|&x| x as f64).collect(),
        DType::U32 => cast::<u32>(b).iter().map(|&x| x as f64).collect(),
        DType::U64 => cast::<u64>(b).iter().map(|&x| x as f64).collect(),
        DType::U8 | DType::Bool => b.iter().map(|&x| x as f64).collect(),
        // Packed 4-bit (initializers): two per byte, low nibble first; a
        // trailing pad nibble is dropped by the caller's zip.
        DType::U4 => (0..2 * b.len())
            .map(|i| crate::tensor::nibble(b, i) as f64)
            .collect(),
        DType::I4 => (0..2 * b.len())
            .map(|i| sign4(crate::tensor::nibble(b, i)) as f64)
            .collect(),
        DType::F16 => cast::<u16>(b)
            .iter()
            .map(|&x| half::f16::from_bits(x).to_f64())
            .collect(),
        DType::BF16 => cast::<u16>(b)
            .iter()
            .map(|&x| half::bf16::from_bits(x).to_f64())
            .collect(),
        d => return Err(format!("Cast from {}", d.name())),
    })
}

/// Writes `n` values `f(i)` as int32 or int64 into `o`.
fn store_ints(to: DType, o: &mut [u8], f: impl Fn(usize) -> i64) {
    if to == DType::I32 {
        for (i, x) in cast_mut::<i32>(o).iter_mut().enumerate() {
            *x = f(i) as i32;
        }
    } else {
        for (i, x) in cast_mut::<i64>(o).iter_mut().enumerate() {
            *x = f(i);
        }
    }
}

/// Integers (8-bit, 16-bit, packed 4-bit, int32) to int32 or int64 exactly,
/// without the f64 copy: index tensors such as palette indices (uint8 or
/// uint4, issue 23). `false` for other pairs.
fn int_to_index(from: DType, to: DType, b: &[u8], o: &mut [u8]) -> bool {
    if !matches!(to, DType::I32 | DType::I64) {
        return false;
    }
    match from {
        DType::U8 => store_ints(to, o, |i| b[i] as i64),
        DType::I8 => store_ints(to, o, |i| b[i] as i8 as i64),
        DType::U4 => store_ints(to, o, |i| crate::tensor::nibble(b, i) as i64),
        DType::I4 => store_ints(to, o, |i| sign4(crate::tensor::nibble(b, i)) as i64),
        DType::U16 => {
            let s: &[u16] = cast(b);
            store_ints(to, o, |i| s[i] as i64)
        }
        DType::I16 => {
            let s: &[u16] = cast(b);
            store_ints(to, o, |i| s[i] as i16 as i64)
        }
        DType::I32 if to == DType::I64 => {
            let s: &[i32] = cast(b);
            store_ints(to, o, |i| s[i] as i64)
        }
        _ => return false,
    }
    true
}

impl Kernel for Cast {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let threads = io.threads;
        let x = io.input(0)?;
        let b = x.bytes()?;
        let o = &mut io.outputs[0];
        if self.from == self.to {
            o.data.copy_from_slice(b);
            return Ok(());
        }
        // fp16/bf16 to and from f32 as the widened nodes convert (split
        // across threads, F16C where the CPU has it; the same values as
        // the f64 path: widening is exact, narrowing rounds to nearest
        // even either way).
        match (self.from, self.to) {
            (DType::F16 | DType::BF16, DType::F32) => {
                super::lowp::widen(threads, self.from, b, cast_mut(o.data));
                return Ok(());
            }
            (DType::F32, DType::F16 | DType::BF16) => {
                super::lowp::narrow(threads, self.to, cast(b), o.data);
                return Ok(());
            }
            _ => {}
        }
        if self.to == DType::F32 && TO_F32.contains(&self.from) {
            let o: &mut [f32] = cast_mut(o.data);
            to_f32(self.from, b, 0, o);
            return Ok(());
        }
        if int_to_index(self.from, self.to, b, o.data) {
            return Ok(());
        }
        // Integer to integer exactly (i64 does not fit f64 beyond 2^53).
        if self.from == DType::I64 && self.to == DType::I32 {
            let s: &[i64] = cast(b);
            cast_mut::<i32>(o.data)
                .iter_mut()
                .zip(s)
                .for_each(|(o, &v)| *o = v as i32);
            return Ok(());
        }
        if self.from == DType::I64 && self.to == DType::Bool {
            let s: &[i64] = cast(b);
            o.data
                .iter_mut()
                .zip(s)
                .for_each(|(o, &v)| *o = (v != 0) as u8);
            return Ok(());
        }
        let v = read_as_f64(self.from, b)?;
        write_from_f64(self.to, &v, o.data)
    }
}

/// Writes f64 values as `to` (Rust's `as` conversions: integers truncate
/// toward zero and saturate; f16/bf16 through f32).
fn write_from_f64(to: DType, v: &[f64], o: &mut [u8]) -> Result<(), String> {
    match to {
        DType::F32 => cast_mut::<f32>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = x as f32),
        DType::F64 => cast_mut::<f64>(o).copy_from_slice(v),
        DType::I64 => cast_mut::<i64>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = x as i64),
        DType::I32 => cast_mut::<i32>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = x as i32),
        DType::I8 => cast_mut::<i8>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = x as i8),
        DType::U8 => o.iter_mut().zip(v).for_each(|(o, &x)| *o = x as u8),
        DType::Bool => o
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = (x != 0.0) as u8),
        // Through f32: exact for every source but f64 and large ints,
        // where f64 -> f32 -> f16 may round twice.
        DType::F16 => cast_mut::<u16>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = half::f16::from_f32(x as f32).to_bits()),
        DType::BF16 => cast_mut::<u16>(o)
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| *o = half::bf16::from_f32(x as f32).to_bits()),
        d => return Err(format!("Cast to {}", d.name())),
    }
    Ok(())
}

pub fn cast_kernel(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    Ok(Box::new(Cast {
        from: ctx.input(0)?.dtype,
        to: ctx.outputs[0].dtype,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf to about 1e-14, independent of [`erf`]'s formula: its Taylor
    /// series summed to convergence below |x| = 2.5, and above it
    /// `1 - e^(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`,
    /// erfc's continued fraction, to 80 terms.
    fn erf_ref(x: f64) -> f64 {
        let z = x.abs();
        let r = if z < 2.5 {
            let (mut sum, mut term, mut n) = (0.0, z, 0.0);
            loop {
                let t = term / (2.0 * n + 1.0);
                sum += t;
                if t.abs() <= 1e-17 * sum.abs() {
                    break;
                }
                n += 1.0;
                term *= -z * z / n;
            }
            std::f64::consts::FRAC_2_SQRT_PI * sum
        } else {
            let mut t = z;
            for k in (1..=80).rev() {
                t = z + (k as f64 / 2.0) / t;
            }
            1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / t
        };
        if x.is_nan() {
            x
        } else {
            r.copysign(x)
        }
    }

    /// [`to_f32`] (Cast to float and the chains' loads) gives the values of
    /// the general path through float64, on every type it takes: int64s
    /// past 2^53 and 2^24 (rounded twice), float64s past float32's range
    /// and between its steps, the extremes of each integer type.
    #[test]
    fn to_f32_gives_the_float64_paths_values() {
        let cases: Vec<(DType, Vec<u8>)> = vec![
            (
                DType::I64,
                [
                    i64::MIN,
                    -(1 << 53) - 1,
                    -1,
                    0,
                    (1 << 24) + 1,
                    (1 << 53) + 3,
                    // Through float64 this goes down (a tie there, then one
                    // in float32); rounded once it would go up.
                    (1 << 53) + (1 << 29) + 1,
                    i64::MAX,
                ]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            ),
            (
                DType::F64,
                [1e40, -1e-50, 0.1, 1.0 + 1e-12, f64::NAN, f64::INFINITY]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            (
                DType::I32,
                [i32::MIN, -1, (1 << 24) + 1, i32::MAX]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            (
                DType::U32,
                [0u32, (1 << 24) + 1, u32::MAX]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            (DType::I8, vec![0x80, 0xff, 0, 0x7f]),
            (DType::U8, vec![0, 1, 200, 255]),
            (DType::Bool, vec![0, 1]),
            (
                DType::F16,
                [0x3c00u16, 0x7c00, 0x0001, 0xfbff]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            (
                DType::BF16,
                [0x3f80u16, 0x0001, 0xff80]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            (
                DType::F32,
                [1.5f32, -0.0, f32::MAX]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        ];
        for (d, b) in cases {
            assert!(TO_F32.contains(&d));
            let want: Vec<f32> = read_as_f64(d, &b)
                .unwrap()
                .iter()
                .map(|&x| x as f32)
                .collect();
            let mut got = vec![0f32; want.len()];
            to_f32(d, &b, 0, &mut got);
            assert!(graphopt_testutil::same_bits(&got, &want), "{}", d.name());
            // From an offset, as a chain's tile reads.
            let mut tail = vec![0f32; want.len() - 1];
            to_f32(d, &b, 1, &mut tail);
            assert!(
                graphopt_testutil::same_bits(&tail, &want[1..]),
                "{} at 1",
                d.name()
            );
        }
    }

    #[test]
    fn erf_reference_matches_libm() {
        // Python's math.erf (libm's, correct to about 1 ulp).
        let cases = [
            (0.0, 0.0),
            (1e-4, 1.128_379_163_334_248_7e-4),
            (0.1, 0.112_462_916_018_284_9),
            (0.49, 0.511_668_261_188_523),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (-0.3, -0.328_626_759_459_127_4),
            (6.0, 1.0),
            (1e30, 1.0),
        ];
        for (x, want) in cases {
            let got = erf_ref(x);
            assert!(
                (got - want).abs() <= 1e-14 * want.abs().max(1e-30),
                "erf({x}) = {got}, want {want}"
            );
        }
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
    }

    /// Each lane loop (sixteen lanes where the CPU has AVX-512F, eight on
    /// AVX2) gives the scalar function's bits on every element, specials
    /// and the polynomials' switch points included, with and without a
    /// separate input.
    #[test]
    fn lane_loops_give_the_scalar_bits() {
        let mut xs: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.00731).collect();
        xs.extend([
            0.0,
            -0.0,
            0.625,
            -0.625,
            0.84,
            -0.84,
            88.8,
            -104.5,
            1e-40,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
        ]);
        type Lanes = fn(Option<&[f32]>, &mut [f32]);
        type Scalar = fn(f32) -> f32;
        let loops: [(&str, Lanes, Scalar); 6] = [
            ("erf", erf_slice, erf),
            ("exp", exp_slice, exp_f32),
            ("tanh", tanh_slice, tanh_f32),
            ("sigmoid", sigmoid_slice, sigmoid_f32),
            ("gelu", gelu_erf_slice, gelu_erf),
            ("gelu tanh", gelu_tanh_slice, gelu_tanh),
        ];
        for (name, lanes, scalar) in loops {
            let want: Vec<f32> = xs.iter().map(|&x| scalar(x)).collect();
            let mut out = vec![0f32; xs.len()];
            lanes(Some(&xs), &mut out);
            assert!(graphopt_testutil::same_bits(&out, &want), "{name}");
            let mut inplace = xs.clone();
            lanes(None, &mut inplace);
            assert!(
                graphopt_testutil::same_bits(&inplace, &want),
                "{name} in place"
            );
        }
    }

    #[test]
    fn erf_f32_is_within_two_ulps() {
        let ulps = |got: f32, want: f32| (got.to_bits() as i64 - want.to_bits() as i64).abs();
        let mut worst = (0, 0.0);
        let mut x = -6.0f32;
        while x <= 6.0 {
            let e = ulps(erf(x), erf_ref(x as f64) as f32);
            if e > worst.0 {
                worst = (e, x);
            }
            x += 0.000_13;
        }
        for x in [1e-30f32, 1e-6, -1e-3, 0.839_999, 0.84, 0.840_001] {
            let e = ulps(erf(x), erf_ref(x as f64) as f32);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 2, "worst error {} ulps at {}", worst.0, worst.1);
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(-1e30), -1.0);
    }

    #[test]
    fn tanh_f32_is_within_one_ulp() {
        let ulps = |got: f32, want: f32| (got.to_bits() as i64 - want.to_bits() as i64).abs();
        let mut worst = (0, 0.0);
        let mut x = -10.0f32;
        while x <= 10.0 {
            let e = ulps(tanh_f32(x), (x as f64).tanh() as f32);
            if e > worst.0 {
                worst = (e, x);
            }
            x += 0.000_21;
        }
        for x in [1e-30f32, 1e-6, -1e-3, 0.624_999, 0.625, 0.625_001, 50.0] {
            let e = ulps(tanh_f32(x), (x as f64).tanh() as f32);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        assert!(worst.0 <= 1, "worst error {} ulps at {}", worst.0, worst.1);
        assert!(tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(f32::INFINITY), 1.0);
        assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn exp_f32_is_within_one_ulp() {
        // Against f64's exp rounded to f32, on a dense sweep of [-87.3,
        // 88.7] (results normal) and every edge.
        let ulps = |got: f32, want: f32| (got.to_bits() as i64 - want.to_bits() as i64).abs();
        let mut worst = 0;
        let mut x = -87.3f32;
        while x <= 88.72 {
            let want = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp_f32(x), want));
            x += 0.000_37;
        }
        assert!(worst <= 1, "worst error {worst} ulps");
        // Gradual underflow: denormal results close to libm's.
        for x in [-88.0f32, -95.0, -100.0, -103.0] {
            let want = (x as f64).exp() as f32;
            let got = exp_f32(x);
            assert!(
                (got - want).abs() <= 2e-45,
                "exp({x}) = {got:e}, want {want:e}"
            );
        }
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert_eq!(exp_f32(88.8), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72).is_finite());
    }
}
