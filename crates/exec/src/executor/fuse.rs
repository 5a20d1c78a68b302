//! Activations fused into the kernel that produces their input.
//!
//! A Relu or Clip (f32, constant bounds) whose output the plan put in
//! place over its input, where that input is output 0 of a kernel that
//! can apply it ([`Kernel::fuse_activation`]: Conv) and nothing reads that
//! output in between, is applied by the producer to each tile while it is
//! in cache; its own step is skipped. The plan is unchanged: the value
//! lives where it did, and the fused output has the activation's bits.
//!
//! Before (two steps, one extra pass over the output):
//! ```text
//! y = Conv(x, w, b)      [arena 0..4096]
//! z = Relu(y)            [arena 0..4096, in place]
//! ```
//! After: `Conv+Relu` writes `z` at 0..4096; the Relu step is skipped.

use super::bind::Step;
use super::memory::{Loc, Weight};
use crate::backend::{Activation, Kernel};
use crate::control::OutSlot;
use graphopt_ir::DType;

/// Fuses what it can; returns how many activations were fused.
pub(crate) fn fuse_activations(steps: &mut [Step<Box<dyn Kernel>>], weights: &[Weight]) -> usize {
    let mut fused = 0;
    for j in 0..steps.len() {
        let Some(act) = fusable(&steps[j], weights) else {
            continue;
        };
        let Some(Some((Loc::Arena { offset, len }, _))) = steps[j].inputs.first() else {
            continue;
        };
        let (offset, len) = (*offset, *len);
        let hit = |o: usize, l: usize| o < offset + len && offset < o + l;
        // The producer: the last step before j writing these bytes (an
        // If/Loop or a node run alone lists its writes apart).
        let Some(i) = (0..j).rev().find(|&i| {
            steps[i]
                .outputs
                .iter()
                .flatten()
                .any(|(o, l, _)| hit(*o, *l))
                || steps[i].special.as_ref().is_some_and(|sp| {
                    sp.outputs.iter().flatten().any(|slot| match slot {
                        OutSlot::Arena {
                            offset: o, len: l, ..
                        } => hit(*o, *l),
                        OutSlot::Dynamic { .. } => false,
                    })
                })
        }) else {
            continue;
        };
        let exact = matches!(steps[i].outputs.first(), Some(Some((o, l, t))) if *o == offset && *l == len && t.dtype == DType::F32);
        if !exact || steps[i].skip || steps[i].special.is_some() {
            continue;
        }
        // Nobody may read the value before the activation between them.
        let read_between = steps[i + 1..j].iter().any(|s| {
            s.inputs.iter().flatten().any(|(l, _)| match l {
                Loc::Arena { offset: o, len: n } => hit(*o, *n),
                _ => false,
            })
        });
        if !read_between && steps[i].kernel.fuse_activation(act) {
            steps[j].skip = true;
            fused += 1;
        }
    }
    fused
}

/// The activation step `s` computes, if the executor may fuse it: f32,
/// output 0 in place over input 0, and a Clip's bound inputs absent or
/// constant one-element f32 weights.
fn fusable(s: &Step<Box<dyn Kernel>>, weights: &[Weight]) -> Option<Activation> {
    if s.skip || s.special.is_some() || !s.in_place.contains(&0) {
        return None;
    }
    let act = s.kernel.activation()?;
    let (Some((Loc::Arena { offset, .. }, ti)), Some((o, _, _))) =
        (s.inputs.first()?.as_ref(), s.outputs.first()?.as_ref())
    else {
        return None;
    };
    if ti.dtype != DType::F32 || offset != o {
        return None;
    }
    let Activation::Clip { mut lo, mut hi } = act else {
        return Some(act);
    };
    for (k, bound) in [(1, &mut lo), (2, &mut hi)] {
        match s.inputs.get(k) {
            None | Some(None) => {}
            Some(Some((Loc::Weight(w), t))) if t.dtype == DType::F32 => {
                let b = weights[*w].bytes();
                if b.len() != 4 {
                    return None;
                }
                *bound = f32::from_le_bytes(b.try_into().ok()?);
            }
            _ => return None,
        }
    }
    Some(Activation::Clip { lo, hi })
}
