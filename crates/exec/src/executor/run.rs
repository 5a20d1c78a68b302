//! Running a bound model: [`Executable::run`] copies the inputs into the
//! arena, runs each step in the plan's schedule (a kernel on arena slices,
//! or a nested program for If, Loop and nodes touching dynamic values),
//! keeps the dynamic store, poisons dead regions when asked, and copies
//! the outputs out.

use super::memory::Loc;
use super::{ExecError, Executable, RunOptions, RunStats};
use crate::backend::{Data, In, KernelIo, Out};
use crate::control::OutSlot;
use crate::tensor::{elem_size, numel, HostTensor};
use graphopt_ir::DType;

/// What [`Executable::run_observed`] hands its observer after a step:
/// `read(k)` copies output `k` out of the arena.
pub type ReadOutput<'a> = dyn Fn(usize) -> Option<HostTensor> + 'a;

/// The observer of [`Executable::run_observed`]: called with the index of
/// the step just run and a [`ReadOutput`].
pub type StepObserver<'a> = dyn FnMut(usize, &ReadOutput) + 'a;

impl Executable {
    /// Runs once on `inputs` (the runtime inputs in graph order, with the
    /// planned dtypes and shapes).
    pub fn run(
        &mut self,
        inputs: &[HostTensor],
        opts: &RunOptions,
    ) -> Result<(Vec<HostTensor>, RunStats), ExecError> {
        let given: Vec<&HostTensor> = inputs.iter().collect();
        self.run_borrowed(&given, opts)
    }

    /// [`Executable::run`] on borrowed inputs (a caller that holds them
    /// elsewhere, such as a training loop's parameters, copies nothing).
    pub fn run_borrowed(
        &mut self,
        inputs: &[&HostTensor],
        opts: &RunOptions,
    ) -> Result<(Vec<HostTensor>, RunStats), ExecError> {
        let given: Vec<Option<&HostTensor>> = inputs.iter().map(|&t| Some(t)).collect();
        let (outs, stats) = self.run_inner(&given, CopyOut::All, opts, None)?;
        Ok((outs.into_iter().flatten().collect(), stats))
    }

    /// [`Executable::run_borrowed`] without copying the outputs out: they
    /// stay in the arena (and the dynamic store) until
    /// [`Executable::take_outputs`], which hands the arena's pages back as
    /// it copies, so no output is ever held beside its arena copy.
    pub fn run_in_place(
        &mut self,
        inputs: &[&HostTensor],
        opts: &RunOptions,
    ) -> Result<RunStats, ExecError> {
        let given: Vec<Option<&HostTensor>> = inputs.iter().map(|&t| Some(t)).collect();
        let (_, stats) = self.run_inner(&given, CopyOut::None, opts, None)?;
        self.outputs_held = true;
        Ok(stats)
    }

    /// The outputs of the last [`Executable::run_in_place`], copied out
    /// 2 MiB at a time, each chunk's pages handed back to the system once
    /// copied (where no later output shares them): the process never holds
    /// an output twice, only the arena it already held and one chunk. The
    /// run's dead intermediates keep their pages, so the next run does not
    /// fault them in again; the outputs' pages come back as it writes
    /// them, as a fresh output buffer's would. The outputs' bytes are gone
    /// from the arena afterwards, so every input must be given again (a
    /// donated one included).
    pub fn take_outputs(&mut self) -> Result<Vec<HostTensor>, ExecError> {
        if !std::mem::take(&mut self.outputs_held) {
            return Err(ExecError::Input(
                "no run has left its outputs in the arena to take".into(),
            ));
        }
        let ranges: Vec<Option<(usize, usize)>> = self
            .outputs
            .iter()
            .map(|(_, l, ti)| match *l {
                Loc::Arena { offset, .. } => Some((
                    offset,
                    offset + numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1),
                )),
                _ => None,
            })
            .collect();
        self.primed.iter_mut().for_each(|p| *p = false);
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for (k, (_, l, ti)) in self.outputs.iter().enumerate() {
            let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
            let data = match *l {
                Loc::Arena { offset, .. } => {
                    // A chunk at a time, each handed back once copied: an
                    // output as large as the arena (a language model's
                    // logits) is never held twice either.
                    let mut d = Vec::with_capacity(n);
                    // Chunks end at multiples of TAKE_CHUNK in the address
                    // space, so every page but the output's first and last
                    // is handed back whole.
                    let base = self.arena.bytes().as_ptr() as usize;
                    let mut c0 = offset;
                    while c0 < offset + n {
                        let c1 = ((base + c0) / TAKE_CHUNK + 1) * TAKE_CHUNK - base;
                        let c1 = c1.min(offset + n);
                        d.extend_from_slice(&self.arena.bytes()[c0..c1]);
                        let shared = ranges[k + 1..]
                            .iter()
                            .flatten()
                            .any(|&(s, e)| s < c1 && c0 < e);
                        if !shared {
                            self.arena.discard(c0..c1);
                        }
                        c0 = c1;
                    }
                    d
                }
                _ => {
                    outputs.push(self.copy_output(k)?);
                    continue;
                }
            };
            outputs.push(HostTensor {
                dtype: ti.dtype,
                shape: ti.shape.clone(),
                data,
            });
        }
        self.dyn_store.iter_mut().for_each(|d| *d = None);
        Ok(outputs)
    }

    /// Output `k` of the run just ended, copied from where it lies (the
    /// arena, a weight, or the dynamic store).
    fn copy_output(&self, k: usize) -> Result<HostTensor, ExecError> {
        let (name, l, ti) = &self.outputs[k];
        let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
        let data = match *l {
            Loc::Arena { offset, .. } => self.arena.bytes()[offset..offset + n].to_vec(),
            Loc::Weight(w) => self.weights[w].bytes()[..n].to_vec(),
            Loc::Dynamic(d) => {
                return self.dyn_store[d].clone().ok_or_else(|| {
                    ExecError::BadPlan(format!("output '{name}' was freed before the end"))
                })
            }
        };
        Ok(HostTensor {
            dtype: ti.dtype,
            shape: ti.shape.clone(),
            data,
        })
    }

    /// [`Executable::run_borrowed`], calling `after(i, read)` after each
    /// step `i` of the schedule: `read(k)` copies output `k` out of the
    /// arena, final once `i` has reached its entry of
    /// [`Executable::output_ready_steps`]. A training loop hands each
    /// gradient on while the rest of the backward pass runs.
    pub fn run_observed(
        &mut self,
        inputs: &[&HostTensor],
        opts: &RunOptions,
        after: &mut StepObserver,
    ) -> Result<(Vec<HostTensor>, RunStats), ExecError> {
        let given: Vec<Option<&HostTensor>> = inputs.iter().map(|&t| Some(t)).collect();
        let (outs, stats) = self.run_inner(&given, CopyOut::All, opts, Some(after))?;
        Ok((outs.into_iter().flatten().collect(), stats))
    }

    /// Per output, the step after which its value is final: the last step
    /// writing its bytes (`None`: final before the first step, as a weight
    /// or an input is, or only at the end, as a value of data-dependent
    /// size is).
    pub fn output_ready_steps(&self) -> Vec<Option<usize>> {
        self.outputs
            .iter()
            .map(|(_, l, ti)| {
                let Loc::Arena { offset, .. } = *l else {
                    return None;
                };
                let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                let hit = |o: usize, len: usize| o < offset + n && offset < o + len;
                self.steps.iter().rposition(|st| {
                    st.outputs.iter().flatten().any(|(o, len, _)| hit(*o, *len))
                        || st.special.as_ref().is_some_and(|sp| {
                            sp.outputs.iter().flatten().any(|slot| match slot {
                                OutSlot::Arena { offset: o, len, .. } => hit(*o, *len),
                                OutSlot::Dynamic { .. } => false,
                            })
                        })
                })
            })
            .collect()
    }

    /// Runs with the plan's donations kept in the arena: an input given as
    /// `None` keeps what its bytes hold (the donated output of the previous
    /// run, or what was last given), and donated outputs are not copied out
    /// (`None`; [`Executable::read_input`] reads them where the next run
    /// reads its input). A training loop gives the parameters and optimizer
    /// state once and then only the data: they are held once, in the arena.
    pub fn run_donated(
        &mut self,
        inputs: &[Option<&HostTensor>],
        opts: &RunOptions,
    ) -> Result<(Vec<Option<HostTensor>>, RunStats), ExecError> {
        self.run_inner(inputs, CopyOut::KeepDonated, opts, None)
    }

    fn run_inner(
        &mut self,
        inputs: &[Option<&HostTensor>],
        copy: CopyOut,
        opts: &RunOptions,
        mut after: Option<&mut StepObserver>,
    ) -> Result<(Vec<Option<HostTensor>>, RunStats), ExecError> {
        if inputs.len() != self.inputs.len() {
            return Err(ExecError::Input(format!(
                "the model has {} inputs, {} given",
                self.inputs.len(),
                inputs.len()
            )));
        }
        self.outputs_held = false;
        let arena = self.arena.bytes_mut();
        for (k, ((name, off, ti), t)) in self.inputs.iter().zip(inputs).enumerate() {
            let Some(t) = t else {
                let kept = self.donated.iter().any(|d| d.0 == k) && self.primed[k];
                if !kept {
                    return Err(ExecError::Input(format!(
                        "input '{name}' must be given: no donated output holds its value"
                    )));
                }
                continue;
            };
            super::check_input(name, t, ti)?;
            arena[*off..*off + t.data.len()].copy_from_slice(&t.data);
            self.primed[k] = true;
        }
        for (off, b) in &self.defaults {
            arena[*off..*off + b.len()].copy_from_slice(b);
        }
        let mut stats = RunStats::default();
        let base = self.arena.ptr.as_ptr();
        let ws_all = self.workspace.bytes_mut();
        let (staging, ws) = ws_all.split_at_mut(self.staging_bytes);
        let weights = &self.weights;
        let out_locs = &self.outputs;
        let dyn_store = &mut self.dyn_store;
        dyn_store.iter_mut().for_each(|d| *d = None);
        let mut dyn_live = 0u64;
        if self.profile {
            stats.step_nanos = vec![0; self.steps.len()];
        }
        let profile = self.profile;
        for (si, step) in self.steps.iter_mut().enumerate() {
            let started = profile.then(std::time::Instant::now);
            if let Some(sp) = step.special.as_mut() {
                let kerr = |msg: String| ExecError::Kernel {
                    op: step.op.clone(),
                    node: step.name.clone(),
                    msg,
                };
                let mut ins = Vec::with_capacity(step.inputs.len());
                for i in &step.inputs {
                    let Some((l, ti)) = i else {
                        ins.push(None);
                        continue;
                    };
                    let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                    let data = match *l {
                        // SAFETY: inside the arena (checked in `new`); no
                        // other reference into the arena is alive here.
                        Loc::Arena { offset, .. } => {
                            unsafe { std::slice::from_raw_parts(base.add(offset), n) }.to_vec()
                        }
                        Loc::Weight(w) => weights[w].bytes()[..n].to_vec(),
                        Loc::Dynamic(k) => {
                            let t = dyn_store[k].clone().ok_or_else(|| {
                                kerr(format!(
                                    "dynamic value '{}' is read after it was freed",
                                    self.dyn_names[k]
                                ))
                            })?;
                            ins.push(Some(t));
                            continue;
                        }
                    };
                    ins.push(Some(HostTensor {
                        dtype: ti.dtype,
                        shape: ti.shape.clone(),
                        data,
                    }));
                }
                let mut sub = RunStats::default();
                let outs = sp.run(ins, opts, &mut sub).map_err(kerr)?;
                stats.poisoned_regions += sub.poisoned_regions;
                stats.kernels_run += sub.kernels_run;
                stats.subgraph_runs += sub.subgraph_runs;
                stats.dynamic_peak_bytes = stats
                    .dynamic_peak_bytes
                    .max(dyn_live + sub.dynamic_peak_bytes);
                for (t, slot) in outs.into_iter().zip(sp.outputs.iter().flatten()) {
                    match slot {
                        OutSlot::Arena {
                            name,
                            offset,
                            len,
                            shape,
                        } => {
                            if t.shape != *shape || t.data.len() != *len {
                                return Err(kerr(format!(
                                    "output '{name}' is {:?} at run time, the plan has {shape:?} ({len} B)",
                                    t.shape
                                )));
                            }
                            // SAFETY: inside the arena; no reference is alive.
                            unsafe { std::slice::from_raw_parts_mut(base.add(*offset), *len) }
                                .copy_from_slice(&t.data);
                        }
                        OutSlot::Dynamic { index } => {
                            dyn_live += t.data.len() as u64;
                            if let Some(old) = dyn_store[*index].replace(t) {
                                dyn_live -= old.data.len() as u64;
                            }
                        }
                    }
                }
                stats.dynamic_peak_bytes = stats.dynamic_peak_bytes.max(dyn_live);
            } else if !step.skip {
                let stage = !step.in_place.is_empty() && !step.kernel.in_place();
                if stage {
                    let (off, len, _) = step.outputs[0].as_ref().expect("in-place output");
                    // SAFETY: inside the arena (checked in `new`); no other
                    // reference into the arena is alive here.
                    let src = unsafe { std::slice::from_raw_parts(base.add(*off), *len) };
                    staging[..*len].copy_from_slice(src);
                }
                let mut ins = Vec::with_capacity(step.inputs.len());
                for (k, i) in step.inputs.iter().enumerate() {
                    ins.push(i.as_ref().map(|(l, ti)| {
                        let data = if step.in_place.contains(&k) {
                            if stage {
                                Data::Bytes(
                                    &staging[..numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1)],
                                )
                            } else {
                                Data::Output0
                            }
                        } else {
                            match *l {
                                // SAFETY: inside the arena, and disjoint from
                                // every output of this node (checked in `new`).
                                Loc::Arena { offset, len } => Data::Bytes(unsafe {
                                    std::slice::from_raw_parts(base.add(offset), len)
                                }),
                                Loc::Weight(w) => Data::Bytes(weights[w].bytes()),
                                // Steps reading a dynamic value are special.
                                Loc::Dynamic(_) => Data::Bytes(&[]),
                            }
                        };
                        In {
                            dtype: ti.dtype,
                            shape: &ti.shape,
                            data,
                        }
                    }));
                }
                let mut outs = Vec::with_capacity(step.outputs.len());
                // Trailing omitted outputs are left out; one followed by a
                // present output is an empty placeholder (f32, shape [0]),
                // so `outputs[k]` stays output k.
                let present = step
                    .outputs
                    .iter()
                    .rposition(|o| o.is_some())
                    .map_or(0, |k| k + 1);
                for o in &step.outputs[..present] {
                    let Some((off, len, ti)) = o else {
                        outs.push(Out {
                            dtype: DType::F32,
                            shape: &[0],
                            data: &mut [],
                        });
                        continue;
                    };
                    // SAFETY: inside the arena; outputs are pairwise
                    // disjoint and disjoint from the inputs handed out as
                    // slices (checked in `new`).
                    outs.push(Out {
                        dtype: ti.dtype,
                        shape: &ti.shape,
                        data: unsafe { std::slice::from_raw_parts_mut(base.add(*off), *len) },
                    });
                }
                let mut io = KernelIo {
                    inputs: ins,
                    outputs: outs,
                    workspace: &mut ws[..],
                    threads: opts.threads.max(1),
                };
                step.kernel.run(&mut io).map_err(|msg| ExecError::Kernel {
                    op: step.op.clone(),
                    node: step.name.clone(),
                    msg,
                })?;
                stats.kernels_run += 1;
            }
            if let Some(t) = started {
                stats.step_nanos[si] = t.elapsed().as_nanos() as u64;
            }
            for &k in &self.dyn_free_after[si] {
                if let Some(t) = dyn_store[k].take() {
                    dyn_live -= t.data.len() as u64;
                }
            }
            if let Some(f) = after.as_mut() {
                let read = |k: usize| -> Option<HostTensor> {
                    let (_, l, ti) = out_locs.get(k)?;
                    let n = numel(&ti.shape) * elem_size(ti.dtype).unwrap_or(1);
                    let data = match *l {
                        // SAFETY: inside the arena; between steps no
                        // reference into it is alive.
                        Loc::Arena { offset, .. } => {
                            unsafe { std::slice::from_raw_parts(base.add(offset), n) }.to_vec()
                        }
                        Loc::Weight(w) => weights[w].bytes()[..n].to_vec(),
                        Loc::Dynamic(_) => return None,
                    };
                    Some(HostTensor {
                        dtype: ti.dtype,
                        shape: ti.shape.clone(),
                        data,
                    })
                };
                f(si, &read);
            }
            if opts.poison {
                for r in &self.poison_after[si] {
                    // SAFETY: inside the arena; no reference is alive.
                    let b = unsafe { std::slice::from_raw_parts_mut(base.add(r.offset), r.len) };
                    if r.float && r.len % 4 == 0 {
                        for c in b.chunks_exact_mut(4) {
                            c.copy_from_slice(&POISON_F32.to_le_bytes());
                        }
                    } else {
                        b.fill(0xA5);
                    }
                    stats.poisoned_regions += 1;
                }
            }
        }
        let mut outputs = Vec::with_capacity(self.outputs.len());
        for &(i, _) in &self.donated {
            self.primed[i] = true;
        }
        if copy == CopyOut::None {
            return Ok((outputs, stats));
        }
        for oi in 0..self.outputs.len() {
            if copy == CopyOut::KeepDonated && self.donated.iter().any(|d| d.1 == oi) {
                outputs.push(None);
                continue;
            }
            outputs.push(Some(self.copy_output(oi)?));
        }
        self.dyn_store.iter_mut().for_each(|d| *d = None);
        Ok((outputs, stats))
    }
}

/// Bytes [`Executable::take_outputs`] copies before it hands their pages
/// back: chunks end at multiples of it in the address space (2 MiB, a
/// huge page, so a transparent huge page is handed back whole).
const TAKE_CHUNK: usize = 2 << 20;

/// Which outputs a run copies out of the arena.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyOut {
    All,
    /// All but the donated ones, which stay where the next run reads them.
    KeepDonated,
    /// None: [`Executable::take_outputs`] takes them later.
    None,
}

/// The f32 poison: a NaN with a recognisable payload.
pub const POISON_F32: u32 = 0x7FA5_A5A5;
