//! The eval pass after each epoch.

use super::data::{batch_dims, to_feed, DataSource};
use super::step::Stepper;
use super::{Metric, State, TrainOptions};
use crate::error::{Error, Result};
use graphopt_exec::{CpuBackend, Executable, HostTensor};
use graphopt_ir::{DType, Model};
use graphopt_plan::PlanOptions;

/// Runs the eval data through the current weights: the inference model
/// (parameters as inputs) for accuracy, the step's loss graph for the
/// loss. Plans are made once per batch size.
#[derive(Default)]
pub(super) struct EvalRunner {
    pub(super) plans: Vec<(usize, Executable, Vec<String>)>,
}

impl EvalRunner {
    pub(super) fn measure(
        &mut self,
        model: &Model,
        stepper: &mut Stepper,
        eval: &dyn DataSource,
        state: &State,
        opts: &TrainOptions,
        ropts: &graphopt_exec::RunOptions,
    ) -> Result<(f64, usize)> {
        let n = eval.examples();
        match opts.metric {
            Metric::Loss => {
                // Full batches through the loss graph, no update.
                let rows = stepper.loss_rows(opts.batch);
                let batches = n / rows;
                if batches == 0 {
                    return Err(Error::new(format!(
                        "--metric loss: {} has fewer examples than a batch",
                        eval.label()
                    )));
                }
                let mut sum = 0.0;
                for b in 0..batches {
                    let idx: Vec<usize> = (b * rows..(b + 1) * rows).collect();
                    let batch = to_feed(eval.gather(&idx)?, model, opts);
                    sum += stepper.loss_only(&batch, state, ropts)?;
                }
                Ok((sum / batches as f64, batches * rows))
            }
            Metric::Accuracy => {
                let (mut right, mut total) = (0usize, 0usize);
                let mut at = 0;
                while at < n {
                    let len = opts.batch.min(n - at);
                    let idx: Vec<usize> = (at..at + len).collect();
                    at += len;
                    let raw = eval.gather(&idx)?;
                    let target = raw
                        .iter()
                        .find(|(n, _)| *n == opts.target)
                        .map(|(_, t)| t.clone())
                        .ok_or_else(|| {
                            Error::new(format!("{}: no array '{}'", eval.label(), opts.target))
                        })?;
                    let batch = to_feed(raw, model, opts);
                    let k = match self.plans.iter().position(|p| p.0 == len) {
                        Some(k) => k,
                        None => {
                            self.plans
                                .push(Self::plan(model, &batch, &stepper.params, len)?);
                            self.plans.len() - 1
                        }
                    };
                    let (_, exe, out_names) = &mut self.plans[k];
                    let feed = exe
                        .input_infos()
                        .iter()
                        .map(|(name, _)| {
                            state.get(name).or_else(|| batch.get(name)).ok_or_else(|| {
                                Error::new(format!("{}: no array '{name}'", eval.label()))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let (outs, _) = exe
                        .run_borrowed(&feed, ropts)
                        .map_err(|e| Error::runtime(format!("eval: {e}")))?;
                    let out_at = match &opts.output {
                        Some(o) => out_names.iter().position(|x| x == o).unwrap_or(0),
                        None => 0,
                    };
                    let (r, t) = argmax_hits(&outs[out_at], &target, opts.class_axis)?;
                    right += r;
                    total += t;
                }
                Ok((right as f64 / total.max(1) as f64, n))
            }
        }
    }

    /// The inference model with the trainable parameters as graph inputs,
    /// planned for a batch of `len`.
    pub(super) fn plan(
        model: &Model,
        batch: &State,
        params: &[String],
        len: usize,
    ) -> Result<(usize, Executable, Vec<String>)> {
        let mut m = model.clone();
        let g = &mut m.graph;
        for p in params {
            if let Some(v) = g.value_by_name(p) {
                g.take_initializer(v);
                if !g.inputs.contains(&v) {
                    g.inputs.push(v);
                }
            }
        }
        let mut dims = batch_dims(batch, len);
        dims.shapes.retain(|(n, _)| n != "target");
        let planned = graphopt_plan::plan_model(&m, &dims, &PlanOptions::default())?;
        let exe = Executable::new(&planned.model, &planned.plan, &CpuBackend)
            .map_err(|e| Error::runtime(format!("eval: {e}")))?;
        let names = exe.output_names();
        Ok((len, exe, names))
    }
}

/// Positions whose arg-max over `axis` of `logits` equals `target` (the
/// logits' shape without that axis), and how many positions there are.
pub(super) fn argmax_hits(
    logits: &HostTensor,
    target: &HostTensor,
    axis: i64,
) -> Result<(usize, usize)> {
    let v = logits
        .to_f32()
        .ok_or_else(|| Error::new("--metric accuracy: the output is not float"))?;
    let r = logits.shape.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !(0..r).contains(&a) {
        return Err(Error::new(format!(
            "--class-axis {axis}: the output has rank {r}"
        )));
    }
    let a = a as usize;
    let classes = logits.shape[a];
    let inner: usize = logits.shape[a + 1..].iter().product();
    let outer: usize = logits.shape[..a].iter().product();
    let t: Vec<i64> = match target.dtype {
        DType::I64 => target
            .data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        DType::I32 => target
            .data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect(),
        d => {
            return Err(Error::new(format!(
                "--metric accuracy: the target is {}, expected int64 class indices",
                d.name()
            )))
        }
    };
    if t.len() != outer * inner {
        return Err(Error::new(format!(
            "--metric accuracy: the target has {} elements, the output {} positions",
            t.len(),
            outer * inner
        )));
    }
    let mut hits = 0;
    for o in 0..outer {
        for i in 0..inner {
            let mut best = (f32::NEG_INFINITY, 0usize);
            for c in 0..classes {
                let x = v[(o * classes + c) * inner + i];
                if x > best.0 {
                    best = (x, c);
                }
            }
            if t[o * inner + i] == best.1 as i64 {
                hits += 1;
            }
        }
    }
    Ok((hits, outer * inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn accuracy_over_a_middle_class_axis() {
        // [1, 3 classes, 2 positions]: arg-max 2 then 0.
        let l = HostTensor::from_f32(&[1, 3, 2], &[0.0, 5.0, 1.0, 0.0, 9.0, 1.0]);
        let t = HostTensor::from_i64(&[1, 2], &[2, 1]);
        assert_eq!(argmax_hits(&l, &t, 1).unwrap(), (1, 2));
    }
}
