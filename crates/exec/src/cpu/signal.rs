//! Spectral ops on f32 and f64: DFT (opset 17: the axis an attribute;
//! opset 20: an input) with `inverse`, `onesided` (real to one-sided
//! complex forward, one-sided complex to real inverse) and `dft_length`
//! (the signal cut or zero-padded), and STFT (opset 17: frames of a real
//! or complex signal, an optional window, one-sided or full spectra; a
//! `[batch, length]` signal is real, as onnxruntime takes it).
//! Sums are in f64: a radix-2 FFT for power-of-two lengths, Bluestein's
//! chirp-z (a circular convolution by radix-2 FFTs) for other lengths above
//! [`DIRECT_MAX`], a direct DFT (twiddles tabled) below. Scalars that are inputs (axis,
//! lengths, the frame step) are read when the kernel runs; the output
//! shape, known when it is made, is checked against them.
//! The windows STFT takes: HannWindow, HammingWindow and BlackmanWindow
//! (periodic or symmetric, any numeric `output_datatype`), their length
//! an input (a computed one makes the output a value of data-dependent
//! size, which the executor runs as a one-node program once the length is
//! known).

use crate::backend::{Kernel, KernelIo, NodeCtx, Out};
use crate::tensor::cast_mut;
use graphopt_ir::DType;

type C64 = (f64, f64);

/// Lengths that are not powers of two up to this run as a direct DFT.
const DIRECT_MAX: usize = 32;

fn mul(a: C64, b: C64) -> C64 {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// A complex transform of one length, forward (`e^{-2πi jk/n}`) or
/// inverse (`e^{+2πi jk/n}`, unscaled).
struct Fft {
    n: usize,
    /// `e^{∓2πi k/n}` for `k < n` (radix-2 and direct).
    tw: Vec<C64>,
    blue: Option<Box<Bluestein>>,
}

/// `X_k = c_k Σ_j (x_j c_j) conj(c_{k-j})` with the chirp `c_k =
/// e^{∓πi k²/n}`: the sum a circular convolution of power-of-two length
/// `m >= 2n - 1`.
struct Bluestein {
    chirp: Vec<C64>,
    /// The forward transform of `conj(c)` laid out circularly, over `m`.
    fb: Vec<C64>,
    fwd: Fft,
    inv: Fft,
}

impl Fft {
    fn new(n: usize, inverse: bool) -> Fft {
        let sign = if inverse { 1.0 } else { -1.0 };
        let pi = std::f64::consts::PI;
        if n.is_power_of_two() || n <= DIRECT_MAX {
            let tw = (0..n)
                .map(|k| {
                    let a = 2.0 * pi * k as f64 / n as f64;
                    (a.cos(), sign * a.sin())
                })
                .collect();
            return Fft { n, tw, blue: None };
        }
        let m = (2 * n - 1).next_power_of_two();
        let chirp: Vec<C64> = (0..n)
            .map(|k| {
                // k² mod 2n keeps the angle exact for large k.
                let a = pi * ((k * k) % (2 * n)) as f64 / n as f64;
                (a.cos(), sign * a.sin())
            })
            .collect();
        let (fwd, inv) = (Fft::new(m, false), Fft::new(m, true));
        let mut fb = vec![(0.0, 0.0); m];
        for (k, c) in chirp.iter().enumerate() {
            fb[k] = (c.0, -c.1);
            if k > 0 {
                fb[m - k] = (c.0, -c.1);
            }
        }
        fwd.run(&mut fb, &mut Vec::new());
        let blue = Bluestein {
            chirp,
            fb,
            fwd,
            inv,
        };
        Fft {
            n,
            tw: Vec::new(),
            blue: Some(Box::new(blue)),
        }
    }

    /// Transforms `x` (length `n`) in place; `scratch` is used by the
    /// direct DFT.
    fn run(&self, x: &mut [C64], scratch: &mut Vec<C64>) {
        let n = self.n;
        if n <= 1 {
            return;
        }
        if let Some(b) = &self.blue {
            let m = b.fwd.n;
            scratch.clear();
            scratch.resize(m, (0.0, 0.0));
            for (s, (v, c)) in scratch.iter_mut().zip(x.iter().zip(&b.chirp)) {
                *s = mul(*v, *c);
            }
            let mut none = Vec::new();
            b.fwd.run(scratch, &mut none);
            for (s, f) in scratch.iter_mut().zip(&b.fb) {
                *s = mul(*s, *f);
            }
            b.inv.run(scratch, &mut none);
            let scale = 1.0 / m as f64;
            for (v, (s, c)) in x.iter_mut().zip(scratch.iter().zip(&b.chirp)) {
                let y = mul(*s, *c);
                *v = (y.0 * scale, y.1 * scale);
            }
            return;
        }
        if n.is_power_of_two() {
            let bits = n.trailing_zeros();
            for i in 0..n {
                let j = i.reverse_bits() >> (usize::BITS - bits);
                if j > i {
                    x.swap(i, j);
                }
            }
            let mut len = 2;
            while len <= n {
                let (half, step) = (len / 2, n / len);
                for start in (0..n).step_by(len) {
                    for k in 0..half {
                        let w = self.tw[k * step];
                        let (a, b) = (x[start + k], x[start + k + half]);
                        let t = mul(b, w);
                        x[start + k] = (a.0 + t.0, a.1 + t.1);
                        x[start + k + half] = (a.0 - t.0, a.1 - t.1);
                    }
                }
                len *= 2;
            }
        } else {
            scratch.clear();
            scratch.extend_from_slice(x);
            for (k, y) in x.iter_mut().enumerate() {
                let mut s = (0.0, 0.0);
                let mut at = 0;
                for v in scratch.iter() {
                    let t = mul(*v, self.tw[at]);
                    s.0 += t.0;
                    s.1 += t.1;
                    at += k;
                    if at >= n {
                        at -= n;
                    }
                }
                *y = s;
            }
        }
    }
}

/// Writes `v` into a float output, rounding to its type.
fn store(o: &mut Out, v: &[f64]) -> Result<(), String> {
    match o.dtype {
        DType::F32 => {
            for (d, s) in cast_mut::<f32>(o.data).iter_mut().zip(v) {
                *d = *s as f32;
            }
        }
        DType::F64 => cast_mut::<f64>(o.data).copy_from_slice(v),
        d => return Err(format!("expected float or double output, got {}", d.name())),
    }
    Ok(())
}

/// A scalar integer input (a one-element tensor).
fn scalar(io: &KernelIo, i: usize, what: &str) -> Result<Option<i64>, String> {
    let Some(t) = io.inputs.get(i).copied().flatten() else {
        return Ok(None);
    };
    match t.ints()?.as_slice() {
        [v] => Ok(Some(*v)),
        v => Err(format!(
            "{what} must be one integer, got {} values",
            v.len()
        )),
    }
}

fn float_only(ctx: &NodeCtx) -> Result<(), String> {
    let x = ctx.input(0)?;
    if !matches!(x.dtype, DType::F32 | DType::F64) {
        return Err(format!(
            "{} on {} is not implemented",
            ctx.node.op_type,
            x.dtype.name()
        ));
    }
    Ok(())
}

/// DFT along one axis of `[..., n, 1 or 2]`.
struct Dft {
    /// The axis attribute (opset 17-19); from opset 20 input 2, or -2.
    attr_axis: Option<i64>,
    inverse: bool,
    onesided: bool,
}

impl Kernel for Dft {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?;
        let shape = x.shape;
        let r = shape.len();
        let c_in = *shape.last().ok_or("the input is a scalar")?;
        if r < 2 || !(c_in == 1 || c_in == 2) {
            return Err(format!(
                "the input must be [..., n, 1 or 2], got {:?}",
                shape
            ));
        }
        let axis = match self.attr_axis {
            Some(a) => a,
            None => scalar(io, 2, "axis")?.unwrap_or(-2),
        };
        let ax = if axis < 0 { axis + r as i64 } else { axis };
        if !(0..r as i64 - 1).contains(&ax) {
            return Err(format!("axis {axis} is out of range for rank {r}"));
        }
        let ax = ax as usize;
        let n_in = shape[ax];
        let irfft = self.inverse && self.onesided;
        let len = match scalar(io, 1, "dft_length")? {
            Some(l) if l < 1 => return Err(format!("dft_length {l} is not positive")),
            Some(l) => l as usize,
            None if irfft => 2 * n_in.saturating_sub(1),
            None => n_in,
        };
        let n_out = if self.onesided && !self.inverse {
            len / 2 + 1
        } else {
            len
        };
        let c_out = if irfft { 1 } else { 2 };
        let mut want = shape.to_vec();
        want[ax] = n_out;
        want[r - 1] = c_out;
        let out = io.outputs.first_mut().ok_or("no output")?;
        if out.shape != want.as_slice() {
            return Err(format!(
                "the output is planned as {:?}, the transform gives {:?}",
                out.shape, want
            ));
        }
        let outer: usize = shape[..ax].iter().product();
        let inner: usize = shape[ax + 1..r - 1].iter().product();
        let xs = x.floats()?;
        let fft = Fft::new(len, self.inverse);
        let scale = if self.inverse { 1.0 / len as f64 } else { 1.0 };
        let mut res = vec![0.0; outer * n_out * inner * c_out];
        let (mut buf, mut scratch) = (vec![(0.0, 0.0); len], Vec::new());
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| -> C64 {
                    if j >= n_in {
                        return (0.0, 0.0);
                    }
                    let p = ((o * n_in + j) * inner + i) * c_in;
                    (xs[p], if c_in == 2 { xs[p + 1] } else { 0.0 })
                };
                for (k, b) in buf.iter_mut().enumerate() {
                    *b = if irfft && k > len / 2 {
                        // The Hermitian half the one-sided input leaves out.
                        let v = at(len - k);
                        (v.0, -v.1)
                    } else {
                        at(k)
                    };
                }
                fft.run(&mut buf, &mut scratch);
                for (k, v) in buf.iter().take(n_out).enumerate() {
                    let p = ((o * n_out + k) * inner + i) * c_out;
                    res[p] = v.0 * scale;
                    if c_out == 2 {
                        res[p + 1] = v.1 * scale;
                    }
                }
            }
        }
        store(out, &res)
    }
}

pub fn dft(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    float_only(ctx)?;
    let n = ctx.node;
    Ok(Box::new(Dft {
        attr_axis: (ctx.opset < 20).then(|| n.attr_int("axis").unwrap_or(1)),
        inverse: n.attr_int("inverse").unwrap_or(0) != 0,
        onesided: n.attr_int("onesided").unwrap_or(0) != 0,
    }))
}

/// STFT of `[batch, length, 1 or 2]` (or `[batch, length]`, real, as
/// onnxruntime takes it) into `[batch, frames, bins, 2]`.
struct Stft {
    onesided: bool,
}

impl Kernel for Stft {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let x = io.input(0)?;
        let (batch, n, c) = match *x.shape {
            [b, n, c] if c == 1 || c == 2 => (b, n, c),
            [b, n] => (b, n, 1),
            _ => {
                return Err(format!(
                    "the signal must be [batch, length(, 1 or 2)], got {:?}",
                    x.shape
                ))
            }
        };
        let step = match scalar(io, 1, "frame_step")? {
            Some(s) if s >= 1 => s as usize,
            s => return Err(format!("frame_step {s:?} is not positive")),
        };
        let window = match io.inputs.get(2).copied().flatten() {
            Some(w) => {
                if w.shape.len() != 1 {
                    return Err(format!("the window must be 1-D, got {:?}", w.shape));
                }
                Some(w.floats()?)
            }
            None => None,
        };
        let fl = match scalar(io, 3, "frame_length")? {
            Some(l) if l < 1 => return Err(format!("frame_length {l} is not positive")),
            Some(l) => l as usize,
            None => window.as_ref().map_or(n, |w| w.len()),
        };
        if let Some(w) = &window {
            if w.len() != fl {
                return Err(format!(
                    "the window has {} elements, the frame length is {fl}",
                    w.len()
                ));
            }
        }
        if fl > n {
            return Err(format!("the frame length {fl} exceeds the signal's {n}"));
        }
        let frames = 1 + (n - fl) / step;
        let bins = if self.onesided { fl / 2 + 1 } else { fl };
        let want = [batch, frames, bins, 2];
        let out = io.outputs.first_mut().ok_or("no output")?;
        if out.shape != want {
            return Err(format!(
                "the output is planned as {:?}, the transform gives {:?}",
                out.shape, want
            ));
        }
        let xs = x.floats()?;
        let fft = Fft::new(fl, false);
        let mut res = vec![0.0; batch * frames * bins * 2];
        let (mut buf, mut scratch) = (vec![(0.0, 0.0); fl], Vec::new());
        for b in 0..batch {
            for f in 0..frames {
                for (j, v) in buf.iter_mut().enumerate() {
                    let p = (b * n + f * step + j) * c;
                    let w = window.as_ref().map_or(1.0, |w| w[j]);
                    *v = (xs[p] * w, if c == 2 { xs[p + 1] * w } else { 0.0 });
                }
                fft.run(&mut buf, &mut scratch);
                let at = (b * frames + f) * bins * 2;
                for (k, v) in buf.iter().take(bins).enumerate() {
                    res[at + 2 * k] = v.0;
                    res[at + 2 * k + 1] = v.1;
                }
            }
        }
        store(out, &res)
    }
}

pub fn stft(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    float_only(ctx)?;
    Ok(Box::new(Stft {
        onesided: ctx.node.attr_int("onesided").unwrap_or(1) != 0,
    }))
}

/// HannWindow, HammingWindow and BlackmanWindow: `size` (input 0, a scalar
/// read at run time and checked against the output length) cosine-sum
/// samples in f64, periodic (denominator `size`) or symmetric (`size - 1`;
/// a symmetric window of one sample is `[1]`), stored in the output's
/// element type (`output_datatype`: floats rounded, integers truncated).
struct Window {
    /// `a0 - a1 cos(2πn/N) + a2 cos(4πn/N)`.
    coef: [f64; 3],
    periodic: bool,
    len: usize,
}

impl Kernel for Window {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let size = scalar(io, 0, "the window size")?.ok_or("input 0 is missing")?;
        if size < 0 || size as u64 != self.len as u64 {
            return Err(format!(
                "window size {size} does not match the output length {}",
                self.len
            ));
        }
        let n = self.len;
        let denom = if self.periodic {
            n
        } else {
            n.saturating_sub(1)
        };
        let [a0, a1, a2] = self.coef;
        let tau = 2.0 * std::f64::consts::PI;
        let v: Vec<f64> = (0..n)
            .map(|i| {
                if denom == 0 {
                    return 1.0;
                }
                let t = tau * i as f64 / denom as f64;
                a0 - a1 * t.cos() + a2 * (2.0 * t).cos()
            })
            .collect();
        let o = &mut io.outputs[0];
        match o.dtype {
            DType::F32 | DType::F64 => store(o, &v)?,
            DType::F16 => {
                for (d, s) in cast_mut::<u16>(o.data).iter_mut().zip(&v) {
                    *d = half::f16::from_f64(*s).to_bits();
                }
            }
            DType::BF16 => {
                for (d, s) in cast_mut::<u16>(o.data).iter_mut().zip(&v) {
                    *d = half::bf16::from_f64(*s).to_bits();
                }
            }
            d => {
                // Integers: the truncated value (0, or 1 where a sample is
                // exactly 1), in the type's width.
                let es = crate::tensor::elem_size(d)
                    .filter(|_| d != DType::Bool)
                    .ok_or_else(|| format!("windows of {} are not implemented", d.name()))?;
                for (d, s) in o.data.chunks_exact_mut(es).zip(&v) {
                    d.copy_from_slice(&(*s as i64).to_le_bytes()[..es]);
                }
            }
        }
        Ok(())
    }
}

pub fn window(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let size = ctx.input(0)?;
    if !matches!(size.dtype, DType::I64 | DType::I32) || size.shape.iter().product::<usize>() != 1 {
        return Err("the window size must be one int32 or int64".into());
    }
    let y = &ctx.outputs[0];
    let &[len] = y.shape.as_slice() else {
        return Err(format!(
            "a window is 1-D, the output has rank {}",
            y.shape.len()
        ));
    };
    let coef = match ctx.node.op_type.as_str() {
        // sin²(πn/N) = 0.5 - 0.5 cos(2πn/N).
        "HannWindow" => [0.5, 0.5, 0.0],
        "HammingWindow" => [25.0 / 46.0, 21.0 / 46.0, 0.0],
        "BlackmanWindow" => [0.42, 0.5, 0.08],
        op => return Err(format!("{op} is not a window")),
    };
    Ok(Box::new(Window {
        coef,
        periodic: ctx.node.attr_int("periodic").unwrap_or(1) != 0,
        len,
    }))
}
