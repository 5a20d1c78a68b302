//! Recurrent layers on f32: LSTM, GRU and RNN (ONNX opsets 7 and 14):
//! forward, reverse and bidirectional; optional bias, `sequence_lens`
//! (each batch entry runs its own length; reverse runs reversed within it;
//! Y is zero past it and Y_h / Y_c hold its last step, zeros for length 0
//! as in onnxruntime), initial states,
//! LSTM peepholes and `input_forget`, GRU `linear_before_reset`, `layout`
//! 0 and 1, `clip`, and the ONNX activation functions (with
//! `activation_alpha` / `activation_beta` taken in order by those that
//! use them). Any output may be omitted.
//!
//! Per direction the input projection of every step is one GEMM
//! (`X · Wᵀ`, [`product`]); each step then multiplies the state by `Rᵀ`
//! (one GEMM over the batch) and applies the gates.

use crate::backend::{Kernel, KernelIo, NodeCtx};
use crate::cpu::matmul::product;
use graphopt_ir::{AttrValue, DType};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    /// Gates per direction.
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }
    /// Activation functions per direction, and their defaults.
    fn default_acts(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An RNN activation function (ONNX's list, with alpha and beta bound).
#[derive(Clone, Copy, Debug)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
    HardSigmoid(f32, f32),
    LeakyRelu(f32),
    ThresholdedRelu(f32),
    ScaledTanh(f32, f32),
    Affine(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl Act {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Tanh => x.tanh(),
            Act::Relu => x.max(0.0),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::LeakyRelu(a) => {
                if x < 0.0 {
                    a * x
                } else {
                    x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * (b * x).tanh(),
            Act::Affine(a, b) => a * x + b,
            Act::Elu(a) => {
                if x < 0.0 {
                    a * (x.exp() - 1.0)
                } else {
                    x
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => {
                if x > 20.0 {
                    x
                } else {
                    x.exp().ln_1p()
                }
            }
        }
    }
}

/// The activations of a node, `per` per direction, from `activations`,
/// `activation_alpha` and `activation_beta` (defaults when absent; a
/// bidirectional node given one direction's list uses it for both).
fn activations(ctx: &NodeCtx, cell: Cell, dirs: usize) -> Result<Vec<Vec<Act>>, String> {
    let per = cell.default_acts().len();
    let names: Vec<String> = match ctx.node.attr("activations").map(|a| &a.value) {
        Some(AttrValue::Strings(v)) => v
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        _ => cell.default_acts().iter().map(|s| s.to_string()).collect(),
    };
    let names: Vec<String> = if names.len() == per && dirs == 2 {
        names.iter().chain(names.iter()).cloned().collect()
    } else {
        names
    };
    if names.len() != per * dirs {
        return Err(format!(
            "{} activations for {dirs} direction(s) of {per} each",
            names.len()
        ));
    }
    let floats = |n: &str| match ctx.node.attr(n).map(|a| &a.value) {
        Some(AttrValue::Floats(v)) => v.clone(),
        _ => Vec::new(),
    };
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let (mut ai, mut bi) = (alphas.iter().copied(), betas.iter().copied());
    let mut out = Vec::new();
    for name in &names {
        let mut a = |d: f32| ai.next().unwrap_or(d);
        let act = match name.to_ascii_lowercase().as_str() {
            "sigmoid" => Act::Sigmoid,
            "tanh" => Act::Tanh,
            "relu" => Act::Relu,
            "hardsigmoid" => {
                let x = a(0.2);
                Act::HardSigmoid(x, bi.next().unwrap_or(0.5))
            }
            "leakyrelu" => Act::LeakyRelu(a(0.01)),
            "thresholdedrelu" => Act::ThresholdedRelu(a(1.0)),
            "scaledtanh" => {
                let x = a(1.0);
                Act::ScaledTanh(x, bi.next().unwrap_or(1.0))
            }
            "affine" => {
                let x = a(1.0);
                Act::Affine(x, bi.next().unwrap_or(0.0))
            }
            "elu" => Act::Elu(a(1.0)),
            "softsign" => Act::Softsign,
            "softplus" => Act::Softplus,
            _ => return Err(format!("activation {name} is not implemented")),
        };
        out.push(act);
    }
    Ok(out.chunks(per).map(|c| c.to_vec()).collect())
}

struct Rnn {
    cell: Cell,
    dirs: usize,
    /// A single direction that runs backwards (`direction = reverse`).
    reverse: bool,
    /// `layout = 1`: batch first (X [batch, seq, in], states [batch, dirs, h]).
    batch_first: bool,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    acts: Vec<Vec<Act>>,
    clip: Option<f32>,
    input_forget: bool,
    linear_before_reset: bool,
    /// Which of Y, Y_h, Y_c the node has.
    outputs: [bool; 3],
}

impl Rnn {
    /// Element offset of a state row (`initial_h`, Y_h, ...) of direction
    /// `d` and batch entry `b`.
    fn state_at(&self, d: usize, b: usize) -> usize {
        if self.batch_first {
            (b * self.dirs + d) * self.hidden
        } else {
            (d * self.batch + b) * self.hidden
        }
    }
    /// Element offset of Y at time `t`, direction `d`, batch entry `b`.
    fn y_at(&self, t: usize, d: usize, b: usize) -> usize {
        if self.batch_first {
            ((b * self.seq + t) * self.dirs + d) * self.hidden
        } else {
            ((t * self.dirs + d) * self.batch + b) * self.hidden
        }
    }
    /// Row of X (and of its projection) at time `t`, batch entry `b`.
    fn x_row(&self, t: usize, b: usize) -> usize {
        if self.batch_first {
            b * self.seq + t
        } else {
            t * self.batch + b
        }
    }
}

/// Optional f32 input `i` of a running kernel.
fn opt_f32<'a>(io: &KernelIo<'a>, i: usize) -> Result<Option<&'a [f32]>, String> {
    match io.inputs.get(i).copied().flatten() {
        Some(t) => Ok(Some(t.f32()?)),
        None => Ok(None),
    }
}

impl Kernel for Rnn {
    fn run(&self, io: &mut KernelIo) -> Result<(), String> {
        let (x, w, r) = (
            io.input(0)?.f32()?,
            io.input(1)?.f32()?,
            io.input(2)?.f32()?,
        );
        let bias = opt_f32(io, 3)?;
        let lens: Vec<usize> = match io.inputs.get(4).copied().flatten() {
            Some(t) => {
                let v = t.ints()?;
                if v.len() != self.batch {
                    return Err(format!(
                        "sequence_lens has {} entries for batch {}",
                        v.len(),
                        self.batch
                    ));
                }
                v.iter()
                    .map(|&l| {
                        if l < 0 || l as usize > self.seq {
                            Err(format!("sequence length {l} outside 0..={}", self.seq))
                        } else {
                            Ok(l as usize)
                        }
                    })
                    .collect::<Result<_, _>>()?
            }
            None => vec![self.seq; self.batch],
        };
        let h0 = opt_f32(io, 5)?;
        let (c0, peep) = if self.cell == Cell::Lstm {
            (opt_f32(io, 6)?, opt_f32(io, 7)?)
        } else {
            (None, None)
        };
        let threads = io.threads;
        let (hid, bat, inp, seq) = (self.hidden, self.batch, self.input, self.seq);
        let ng = self.cell.gates();
        let gh = ng * hid;
        let state_len = self.dirs * bat * hid;
        for (what, len, want) in [
            ("X", x.len(), seq * bat * inp),
            ("W", w.len(), self.dirs * gh * inp),
            ("R", r.len(), self.dirs * gh * hid),
        ] {
            if len != want {
                return Err(format!("{what} holds {len} elements, expected {want}"));
            }
        }
        for (what, t, want) in [
            ("B", bias, self.dirs * 2 * gh),
            ("initial_h", h0, state_len),
            ("initial_c", c0, state_len),
            ("P", peep, self.dirs * 3 * hid),
        ] {
            if let Some(t) = t {
                if t.len() != want {
                    return Err(format!(
                        "{what} holds {} elements, expected {want}",
                        t.len()
                    ));
                }
            }
        }
        // Output slots (an omitted one before a present one is an empty
        // placeholder).
        let mut slots: [Option<&mut [f32]>; 3] = [None, None, None];
        for (k, o) in io.outputs.iter_mut().enumerate().take(3) {
            if self.outputs[k] {
                slots[k] = Some(o.f32()?);
            }
        }
        let [mut y, mut yh, mut yc] = slots;
        if let Some(y) = y.as_deref_mut() {
            if y.len() != seq * self.dirs * bat * hid {
                return Err(format!("Y holds {} elements", y.len()));
            }
            y.fill(0.0);
        }
        for s in [yh.as_deref(), yc.as_deref()].into_iter().flatten() {
            if s.len() != state_len {
                return Err(format!("Y_h or Y_c holds {} elements", s.len()));
            }
        }
        let zeros = vec![0.0f32; 2 * gh];
        let mut xw = vec![0.0f32; seq * bat * gh];
        let mut hr = vec![0.0f32; bat * gh];
        let mut h = vec![0.0f32; bat * hid];
        let mut c = vec![0.0f32; bat * hid];
        // GRU without linear_before_reset: z, r, then (r ⊙ h) · Rₕᵀ.
        let mut rh = vec![0.0f32; bat * hid];
        let mut hh = vec![0.0f32; bat * hid];
        let mut z = vec![0.0f32; bat * hid];
        let clip = |v: f32| match self.clip {
            Some(cl) => v.clamp(-cl, cl),
            None => v,
        };
        let mut t_of = vec![None; bat];
        for d in 0..self.dirs {
            let rev = if self.dirs == 2 { d == 1 } else { self.reverse };
            let acts = &self.acts[d];
            let (f, g) = (acts[0], acts.get(1).copied().unwrap_or(acts[0]));
            let hact = acts.get(2).copied().unwrap_or(Act::Tanh);
            let wd = &w[d * gh * inp..(d + 1) * gh * inp];
            let rd = &r[d * gh * hid..(d + 1) * gh * hid];
            let bd = bias.map_or(&zeros[..], |b| &b[d * 2 * gh..(d + 1) * 2 * gh]);
            let (wb, rb) = bd.split_at(gh);
            // Input projections of every step: X · Wᵀ + biases.
            product(
                seq * bat,
                inp,
                gh,
                1.0,
                x,
                (inp, 1),
                wd,
                (1, inp),
                0.0,
                &mut xw,
                gh,
                threads,
            );
            // GRU's recurrent h bias goes in after the recurrent product.
            let folded = if self.cell == Cell::Gru { 2 * hid } else { gh };
            for row in xw.chunks_mut(gh) {
                for (j, v) in row.iter_mut().enumerate() {
                    *v += wb[j] + if j < folded { rb[j] } else { 0.0 };
                }
            }
            let rbh = &rb[folded.min(gh)..];
            for b in 0..bat {
                let at = self.state_at(d, b);
                let hs = &mut h[b * hid..(b + 1) * hid];
                match h0 {
                    Some(h0) => hs.copy_from_slice(&h0[at..at + hid]),
                    None => hs.fill(0.0),
                }
                let cs = &mut c[b * hid..(b + 1) * hid];
                match c0 {
                    Some(c0) => cs.copy_from_slice(&c0[at..at + hid]),
                    None => cs.fill(0.0),
                }
            }
            let pd = peep.map(|p| &p[d * 3 * hid..(d + 1) * 3 * hid]);
            for s in 0..seq {
                for b in 0..bat {
                    t_of[b] = (s < lens[b]).then(|| if rev { lens[b] - 1 - s } else { s });
                }
                if t_of.iter().all(|t| t.is_none()) {
                    break;
                }
                // H · Rᵀ (GRU without linear_before_reset: z and r only).
                let n = if self.cell == Cell::Gru && !self.linear_before_reset {
                    2 * hid
                } else {
                    gh
                };
                product(
                    bat,
                    hid,
                    n,
                    1.0,
                    &h,
                    (hid, 1),
                    rd,
                    (1, hid),
                    0.0,
                    &mut hr,
                    gh,
                    threads,
                );
                for b in 0..bat {
                    let Some(t) = t_of[b] else { continue };
                    let xg = &xw[self.x_row(t, b) * gh..][..gh];
                    let hg = &hr[b * gh..][..gh];
                    let hs = &mut h[b * hid..(b + 1) * hid];
                    match self.cell {
                        Cell::Rnn => {
                            for j in 0..hid {
                                hs[j] = f.apply(clip(xg[j] + hg[j]));
                            }
                        }
                        Cell::Lstm => {
                            let cs = &mut c[b * hid..(b + 1) * hid];
                            for j in 0..hid {
                                let (pi, po, pf) = match pd {
                                    Some(p) => (p[j], p[hid + j], p[2 * hid + j]),
                                    None => (0.0, 0.0, 0.0),
                                };
                                let cp = cs[j];
                                let i = f.apply(clip(xg[j] + hg[j] + pi * cp));
                                let fg = if self.input_forget {
                                    1.0 - i
                                } else {
                                    f.apply(clip(xg[2 * hid + j] + hg[2 * hid + j] + pf * cp))
                                };
                                let cc = g.apply(clip(xg[3 * hid + j] + hg[3 * hid + j]));
                                let cn = fg * cp + i * cc;
                                let o = f.apply(clip(xg[hid + j] + hg[hid + j] + po * cn));
                                cs[j] = cn;
                                hs[j] = o * hact.apply(cn);
                            }
                        }
                        Cell::Gru => {
                            for j in 0..hid {
                                let zj = f.apply(clip(xg[j] + hg[j]));
                                let rj = f.apply(clip(xg[hid + j] + hg[hid + j]));
                                if self.linear_before_reset {
                                    let ht = g.apply(clip(
                                        xg[2 * hid + j] + rj * (hg[2 * hid + j] + rbh[j]),
                                    ));
                                    hs[j] = (1.0 - zj) * ht + zj * hs[j];
                                } else {
                                    z[b * hid + j] = zj;
                                    rh[b * hid + j] = rj * hs[j];
                                }
                            }
                        }
                    }
                }
                if self.cell == Cell::Gru && !self.linear_before_reset {
                    // (r ⊙ H) · Rₕᵀ, then the candidate and the update.
                    product(
                        bat,
                        hid,
                        hid,
                        1.0,
                        &rh,
                        (hid, 1),
                        &rd[2 * hid * hid..],
                        (1, hid),
                        0.0,
                        &mut hh,
                        hid,
                        threads,
                    );
                    for b in 0..bat {
                        let Some(t) = t_of[b] else { continue };
                        let xg = &xw[self.x_row(t, b) * gh..][..gh];
                        for j in 0..hid {
                            let k = b * hid + j;
                            let ht = g.apply(clip(xg[2 * hid + j] + hh[k] + rbh[j]));
                            h[k] = (1.0 - z[k]) * ht + z[k] * h[k];
                        }
                    }
                }
                if let Some(y) = y.as_deref_mut() {
                    for b in 0..bat {
                        if let Some(t) = t_of[b] {
                            let at = self.y_at(t, d, b);
                            y[at..at + hid].copy_from_slice(&h[b * hid..(b + 1) * hid]);
                        }
                    }
                }
            }
            for b in 0..bat {
                let at = self.state_at(d, b);
                // A batch entry of length 0 ends in zeros (as onnxruntime
                // has it), not in its initial state.
                let (hs, cs) = if lens[b] == 0 {
                    (&zeros[..hid], &zeros[..hid])
                } else {
                    (&h[b * hid..(b + 1) * hid], &c[b * hid..(b + 1) * hid])
                };
                if let Some(yh) = yh.as_deref_mut() {
                    yh[at..at + hid].copy_from_slice(hs);
                }
                if let Some(yc) = yc.as_deref_mut() {
                    yc[at..at + hid].copy_from_slice(cs);
                }
            }
        }
        Ok(())
    }
}

/// LSTM, GRU or RNN.
pub fn rnn(ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String> {
    let n = ctx.node;
    let cell = match n.op_type.as_str() {
        "LSTM" => Cell::Lstm,
        "GRU" => Cell::Gru,
        _ => Cell::Rnn,
    };
    let x = ctx.input(0)?;
    let r = ctx.input(2)?;
    if x.dtype != DType::F32 {
        return Err(format!(
            "{} on {} is not implemented",
            n.op_type,
            x.dtype.name()
        ));
    }
    let (dirs, reverse) = match n.attr_str("direction").unwrap_or("forward") {
        "forward" => (1, false),
        "reverse" => (1, true),
        "bidirectional" => (2, false),
        d => return Err(format!("direction {d}")),
    };
    let batch_first = n.attr_int("layout").unwrap_or(0) != 0;
    if x.shape.len() != 3 || r.shape.len() != 3 {
        return Err(format!("X {:?} and R {:?} must be 3-D", x.shape, r.shape));
    }
    let (seq, batch) = if batch_first {
        (x.shape[1], x.shape[0])
    } else {
        (x.shape[0], x.shape[1])
    };
    let hidden = match n.attr_int("hidden_size") {
        Some(h) if h >= 0 => h as usize,
        Some(h) => return Err(format!("hidden_size {h}")),
        None => r.shape[2],
    };
    if r.shape != [dirs, cell.gates() * hidden, hidden] {
        return Err(format!(
            "R is {:?}, expected [{dirs}, {}, {hidden}]",
            r.shape,
            cell.gates() * hidden
        ));
    }
    let outputs = [0, 1, 2].map(|k| n.output(k).is_some() && (k < 2 || cell == Cell::Lstm));
    Ok(Box::new(Rnn {
        cell,
        dirs,
        reverse,
        batch_first,
        seq,
        batch,
        input: x.shape[2],
        hidden,
        acts: activations(ctx, cell, dirs)?,
        clip: n.attr_float("clip").filter(|c| *c > 0.0),
        input_forget: n.attr_int("input_forget").unwrap_or(0) != 0,
        linear_before_reset: n.attr_int("linear_before_reset").unwrap_or(0) != 0,
        outputs,
    }))
}
