//! The gradient side of a step that splits its batch (micro-batches, ranks
//! or both): the parameters laid end to end in one flat `f32` vector, the
//! gradients summed into it, and under zero1/zero2 the slice of it each
//! rank updates (see [`crate::distributed`]).
//!
//! One process with micro-batches is the case of one rank: the same code,
//! with [`Solo`](crate::distributed::Solo) as the communicator.

use super::State;
use crate::distributed::{Collective, Scheme};
use crate::error::{Error, Result};
use graphopt_exec::HostTensor;
use graphopt_ir::DType;
use std::ops::Range;

/// The name of the one "parameter" of a zero1/zero2 update graph: this
/// rank's slice of the flat parameters. Its optimizer state is
/// `__shard_m`, `__shard_v` (AdamW).
pub(super) const SHARD: &str = "__shard";

/// Where each parameter lies in the flat vector, and this rank's slice.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    pub(super) scheme: Scheme,
    pub(super) rank: usize,
    pub(super) ranks: usize,
    /// (parameter, offset, shape), in the order of the step's parameters.
    pub(super) params: Vec<(String, usize, Vec<usize>)>,
    /// Elements per rank's slice (`shard * ranks >= total`; the tail of
    /// the last slices is padding that stays zero).
    pub(super) shard: usize,
}

impl Layout {
    /// The layout of `params` (f32 tensors in `state`).
    pub(super) fn new(
        scheme: Scheme,
        rank: usize,
        ranks: usize,
        params: &[String],
        state: &State,
    ) -> Result<Layout> {
        let mut laid = Vec::with_capacity(params.len());
        let mut total = 0;
        for p in params {
            let t = state
                .get(p)
                .ok_or_else(|| Error::new(format!("parameter '{p}' has no value")))?;
            if t.dtype != DType::F32 {
                return Err(Error::unsupported(format!(
                    "micro-batches and ranks sum float32 gradients; parameter '{p}' is {}",
                    t.dtype.name()
                )));
            }
            laid.push((p.clone(), total, t.shape.clone()));
            total += t.shape.iter().product::<usize>();
        }
        Ok(Layout {
            scheme,
            rank,
            ranks,
            params: laid,
            shard: graphopt_exec::collective::shard_len(total, ranks),
        })
    }

    pub(super) fn padded(&self) -> usize {
        self.shard * self.ranks
    }

    /// This rank's slice of the flat vector.
    pub(super) fn mine(&self) -> Range<usize> {
        self.rank * self.shard..(self.rank + 1) * self.shard
    }

    /// Whether the update runs on this rank's slice (zero1, zero2).
    pub(super) fn sharded(&self) -> bool {
        self.scheme.shards_state()
    }

    /// Gradient buckets of at least `bytes` each (the last may be less):
    /// the parameters taken from the last (whose gradients a backward pass
    /// makes first), each bucket a contiguous range of the flat vector and
    /// the parameters in it.
    pub(super) fn buckets(&self, bytes: u64) -> Vec<(Range<usize>, Vec<usize>)> {
        let want = (bytes / 4).max(1) as usize;
        let mut out: Vec<(Range<usize>, Vec<usize>)> = Vec::new();
        for (i, (_, off, shape)) in self.params.iter().enumerate().rev() {
            let n: usize = shape.iter().product();
            match out.last_mut() {
                Some((r, ps)) if r.len() < want => {
                    r.start = *off;
                    ps.push(i);
                }
                _ => out.push((*off..off + n, vec![i])),
            }
        }
        out
    }

    /// Elements of the gradient accumulator: the whole flat vector, or the
    /// slice under zero2.
    pub(super) fn accumulator_len(&self) -> usize {
        if self.scheme == Scheme::Zero2 {
            self.shard
        } else {
            self.padded()
        }
    }

    /// `range` of the flat vector of the tensors `<p><suffix>` in `state`
    /// (zeros where padding).
    pub(super) fn flatten(
        &self,
        state: &State,
        suffix: &str,
        range: Range<usize>,
    ) -> Result<Vec<f32>> {
        let mut out = vec![0f32; range.len()];
        for (p, off, shape) in &self.params {
            let len: usize = shape.iter().product();
            let (lo, hi) = (range.start.max(*off), range.end.min(off + len));
            if lo >= hi {
                continue;
            }
            let name = format!("{p}{suffix}");
            let t = state
                .get(&name)
                .ok_or_else(|| Error::new(format!("no value for '{name}'")))?;
            let v = f32s(t, &name)?;
            out[lo - range.start..hi - range.start].copy_from_slice(&v[lo - off..hi - off]);
        }
        Ok(out)
    }

    /// The tensors `<p><suffix>` of the whole flat vector `flat` into
    /// `state`.
    pub(super) fn unflatten(&self, flat: &[f32], suffix: &str, state: &mut State) {
        for (p, off, shape) in &self.params {
            let len: usize = shape.iter().product();
            state.insert(
                format!("{p}{suffix}"),
                HostTensor::from_f32(shape, &flat[*off..off + len]),
            );
        }
    }

    /// Adds the gradient outputs `<p>_grad` of one run into `acc` (the
    /// whole flat vector).
    pub(super) fn add_grads(
        &self,
        acc: &mut [f32],
        grad: &mut dyn FnMut(&str) -> Result<HostTensor>,
    ) -> Result<()> {
        for (p, off, shape) in &self.params {
            let t = grad(p)?;
            let v = f32s(&t, &format!("{p}_grad"))?;
            let len: usize = shape.iter().product();
            if v.len() != len {
                return Err(Error::new(format!(
                    "the gradient of '{p}' has {} elements, the parameter {len}",
                    v.len()
                )));
            }
            acc[*off..off + len]
                .iter_mut()
                .zip(&v)
                .for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    /// The sliced optimizer state in `state` (`__shard_m`, ...) gathered
    /// from every rank and laid out per parameter (`<p>_m`, ...), as one
    /// process holds it: what a checkpoint stores. Every rank must call it.
    pub(super) fn gather_state(&self, comm: &dyn Collective, state: &State) -> Result<State> {
        let mut out = State::new();
        let mut full = vec![0f32; self.padded()];
        for (k, t) in state {
            let Some(suffix) = k.strip_prefix(SHARD) else {
                out.insert(k.clone(), t.clone());
                continue;
            };
            let v = f32s(t, k)?;
            comm.all_gather(&v, &mut full)
                .map_err(|e| Error::runtime(e.0))?;
            self.unflatten(&full, suffix, &mut out);
        }
        Ok(out)
    }

    /// The per-parameter form of `state` (zeros for the sliced state), for
    /// a checkpoint to be read into.
    pub(super) fn unsliced_like(&self, state: &State) -> State {
        let mut out = State::new();
        for (k, t) in state {
            match k.strip_prefix(SHARD) {
                Some(suffix) => {
                    for (p, _, shape) in &self.params {
                        let n: usize = shape.iter().product();
                        out.insert(
                            format!("{p}{suffix}"),
                            HostTensor::from_f32(shape, &vec![0.0; n]),
                        );
                    }
                }
                None => {
                    out.insert(k.clone(), t.clone());
                }
            }
        }
        out
    }

    /// This rank's slices of a per-parameter `full` state, in the form of
    /// `like` (the sliced state).
    pub(super) fn slice_state(&self, full: State, like: &State) -> Result<State> {
        let mut out = State::new();
        for k in like.keys() {
            if let Some(suffix) = k.strip_prefix(SHARD) {
                let v = self.flatten(&full, suffix, self.mine())?;
                out.insert(k.clone(), HostTensor::from_f32(&[self.shard], &v));
            }
        }
        for (k, t) in full {
            if !self.params.iter().any(|(p, _, _)| {
                k.strip_prefix(p.as_str())
                    .is_some_and(|s| !s.is_empty() && like.contains_key(&format!("{SHARD}{s}")))
            }) {
                out.insert(k, t);
            }
        }
        Ok(out)
    }
}

fn f32s(t: &HostTensor, name: &str) -> Result<Vec<f32>> {
    if t.dtype != DType::F32 {
        return Err(Error::unsupported(format!(
            "'{name}' is {}, micro-batches and ranks need float32",
            t.dtype.name()
        )));
    }
    t.to_f32()
        .ok_or_else(|| Error::new(format!("'{name}' is not float32")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        let mut s = State::new();
        s.insert(
            "a".into(),
            HostTensor::from_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
        );
        s.insert("b".into(), HostTensor::from_f32(&[3], &[5.0, 6.0, 7.0]));
        s.insert(
            "a_m".into(),
            HostTensor::from_f32(&[2, 2], &[0.1, 0.2, 0.3, 0.4]),
        );
        s.insert("b_m".into(), HostTensor::from_f32(&[3], &[0.5, 0.6, 0.7]));
        s.insert("step".into(), HostTensor::from_f32(&[], &[9.0]));
        s
    }

    #[test]
    fn slices_pad_and_round_trip() {
        let s = state();
        let names = vec!["a".to_string(), "b".to_string()];
        let l1 = Layout::new(Scheme::Zero1, 1, 2, &names, &s).unwrap();
        assert_eq!((l1.shard, l1.padded()), (4, 8));
        // Rank 1 holds elements 4..8: b, then one padding zero.
        assert_eq!(l1.flatten(&s, "", l1.mine()).unwrap(), [5.0, 6.0, 7.0, 0.0]);
        let mut like = State::new();
        like.insert("__shard_m".into(), HostTensor::from_f32(&[4], &[0.0; 4]));
        like.insert("step".into(), HostTensor::from_f32(&[], &[0.0]));
        let full = s.clone();
        let sliced = l1.slice_state(full, &like).unwrap();
        assert_eq!(sliced["__shard_m"].to_f32().unwrap(), [0.5, 0.6, 0.7, 0.0]);
        assert!(sliced.contains_key("step") && sliced.contains_key("a"));
        assert!(!sliced.contains_key("a_m"), "the sliced state replaces a_m");
        // One rank gathers what it holds back into the per-parameter form.
        let l0 = Layout::new(Scheme::Zero1, 0, 1, &names, &s).unwrap();
        let mut mine = State::new();
        mine.insert(
            "__shard_m".into(),
            HostTensor::from_f32(&[7], &l0.flatten(&s, "_m", 0..7).unwrap()),
        );
        let back = l0.gather_state(&crate::distributed::Solo, &mine).unwrap();
        assert_eq!(back["a_m"].to_f32().unwrap(), [0.1, 0.2, 0.3, 0.4]);
        assert_eq!(back["b_m"].shape, vec![3]);
    }

    #[test]
    fn buckets_are_contiguous_from_the_last_parameter() {
        let s = state();
        let names = vec!["a".to_string(), "b".to_string()];
        let l = Layout::new(Scheme::Dp, 0, 1, &names, &s).unwrap();
        // b (3 elements) then a (4): 8 bytes a bucket puts each alone.
        assert_eq!(l.buckets(8), vec![(4..7, vec![1]), (0..4, vec![0])]);
        assert_eq!(l.buckets(1 << 20), vec![(0..7, vec![1, 0])]);
    }

    #[test]
    fn gradients_sum_into_place() {
        let s = state();
        let names = vec!["a".to_string(), "b".to_string()];
        let l = Layout::new(Scheme::Dp, 0, 1, &names, &s).unwrap();
        let mut acc = vec![0f32; l.accumulator_len()];
        for _ in 0..2 {
            l.add_grads(&mut acc, &mut |p| Ok(s[p].clone())).unwrap();
        }
        assert_eq!(acc, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]);
        let mut bad = s.clone();
        bad.insert("a".into(), HostTensor::from_f32(&[3], &[1.0; 3]));
        let e = l
            .add_grads(&mut acc, &mut |p| Ok(bad[p].clone()))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the gradient of 'a' has 3 elements, the parameter 4"
        );
    }
}
