//! Where training examples come from: the [`DataSource`] trait, arrays in
//! memory, the order of each epoch, and the batch checks.

use super::{State, TrainOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::grad::Loss;
use crate::run::to_host;
use graphopt_exec::HostTensor;
use graphopt_ir::{DType, Model};
use graphopt_plan::DimValues;
use std::path::{Path, PathBuf};

/// Examples to train on: arrays with a leading example axis.
pub trait DataSource: Sync {
    /// Examples in the source.
    fn examples(&self) -> usize;
    /// The arrays' names.
    fn names(&self) -> Vec<String>;
    /// The examples at `indices`, each array stacked along a new leading
    /// axis, by name.
    fn gather(&self, indices: &[usize]) -> Result<Vec<(String, HostTensor)>>;
    /// Where the data came from, for messages.
    fn label(&self) -> String;
}

/// Arrays in memory (an npz, a folder of npz shards, or the caller's).
#[derive(Clone, Debug)]
pub struct ArrayData {
    arrays: Vec<(String, HostTensor)>,
    examples: usize,
    label: String,
}

impl ArrayData {
    /// Arrays that share their leading dim (the examples). Refuses no
    /// arrays, scalars, arrays of different lengths, and floats holding
    /// NaN or Inf (naming the array and the first bad example).
    pub fn new(arrays: Vec<(String, HostTensor)>, label: &str) -> Result<ArrayData> {
        let Some((first, t)) = arrays.first() else {
            return Err(Error::new(format!("{label}: no arrays")));
        };
        let Some(&examples) = t.shape.first() else {
            return Err(Error::new(format!(
                "{label}: array '{first}' is a scalar; every array needs a leading example axis"
            )));
        };
        for (name, t) in &arrays {
            if t.shape.first() != Some(&examples) {
                return Err(Error::new(format!(
                    "{label}: array '{name}' has {} examples, '{first}' has {examples}",
                    t.shape.first().map_or("no".to_string(), |n| n.to_string()),
                )));
            }
            if let Some(i) = first_non_finite(t) {
                let per = t.shape[1..].iter().product::<usize>().max(1);
                return Err(Error::new(format!(
                    "{label}: array '{name}' holds NaN or Inf (example {})",
                    i / per
                )));
            }
        }
        Ok(ArrayData {
            arrays,
            examples,
            label: label.to_string(),
        })
    }

    /// Shards (each a label and its arrays) concatenated along the example
    /// axis: every shard must have the same arrays, in the same order, of
    /// the same element type and per-example shape.
    pub fn concat(
        shards: Vec<(String, Vec<(String, HostTensor)>)>,
        label: &str,
    ) -> Result<ArrayData> {
        let mut all: Vec<(String, HostTensor)> = Vec::new();
        for (where_, shard) in shards {
            if all.is_empty() {
                all = shard;
                continue;
            }
            let names = |a: &[(String, HostTensor)]| -> Vec<String> {
                a.iter().map(|(n, _)| n.clone()).collect()
            };
            if names(&shard) != names(&all) {
                return Err(Error::new(format!(
                    "{where_}: arrays {:?} differ from the first shard's {:?}",
                    names(&shard),
                    names(&all)
                )));
            }
            for ((name, a), (_, b)) in all.iter_mut().zip(shard) {
                if a.dtype != b.dtype || a.shape.is_empty() || a.shape.get(1..) != b.shape.get(1..)
                {
                    return Err(Error::new(format!(
                        "{where_}: array '{name}' is {}{:?}, the first shard's is {}{:?}",
                        b.dtype.name(),
                        b.shape,
                        a.dtype.name(),
                        a.shape
                    )));
                }
                a.shape[0] += b.shape[0];
                a.data.extend_from_slice(&b.data);
            }
        }
        ArrayData::new(all, label)
    }

    /// One npz (`np.savez`), or a folder of npz shards concatenated in name
    /// order (each with the same arrays).
    pub fn load(path: &Path) -> Result<ArrayData> {
        let label = path.display().to_string();
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, "read", e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "npz"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::new(format!("{label}: no .npz shards")));
            }
            let shards = files
                .iter()
                .map(|f| Ok((f.display().to_string(), read_npz(f)?)))
                .collect::<Result<Vec<_>>>()?;
            return ArrayData::concat(shards, &label);
        }
        ArrayData::new(read_npz(path)?, &label)
    }
}

pub(crate) fn read_npz(path: &Path) -> Result<Vec<(String, HostTensor)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, "read", e))?;
    let arrays = graphopt_tract::npz::read(&bytes)
        .map_err(|e| Error::with_kind(ErrorKind::Parse, format!("{}: {e:#}", path.display())))?;
    arrays
        .iter()
        .map(|(n, t)| {
            to_host(t)
                .map(|h| (n.clone(), h))
                .map_err(|e| Error::new(format!("{}: array '{n}': {e}", path.display())))
        })
        .collect()
}

pub(super) fn first_non_finite(t: &HostTensor) -> Option<usize> {
    match t.dtype {
        DType::F32 => t
            .data
            .chunks_exact(4)
            .position(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        DType::F64 => t
            .data
            .chunks_exact(8)
            .position(|c| !f64::from_le_bytes(c.try_into().expect("8 bytes")).is_finite()),
        DType::F16 => t.data.chunks_exact(2).position(|c| {
            // Exponent all ones: Inf or NaN.
            u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00
        }),
        _ => None,
    }
}

impl DataSource for ArrayData {
    fn examples(&self) -> usize {
        self.examples
    }

    fn names(&self) -> Vec<String> {
        self.arrays.iter().map(|(n, _)| n.clone()).collect()
    }

    fn gather(&self, indices: &[usize]) -> Result<Vec<(String, HostTensor)>> {
        let mut out = Vec::with_capacity(self.arrays.len());
        for (name, t) in &self.arrays {
            let per = t.data.len() / self.examples.max(1);
            let mut data = Vec::with_capacity(per * indices.len());
            for &i in indices {
                if i >= self.examples {
                    return Err(Error::new(format!(
                        "{}: example {i} of {}",
                        self.label, self.examples
                    )));
                }
                data.extend_from_slice(&t.data[i * per..(i + 1) * per]);
            }
            let mut shape = t.shape.clone();
            shape[0] = indices.len();
            out.push((
                name.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape,
                    data,
                },
            ));
        }
        Ok(out)
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

/// A deterministic permutation of `0..n` for `(seed, epoch)`: Fisher-Yates
/// driven by SplitMix64, so any front end can reproduce it.
pub fn epoch_permutation(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut state = seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        p.swap(i, j);
    }
    p
}

/// The batch's arrays against the model's runtime inputs: each present,
/// of its element type and rank, its fixed dims equal.
pub(super) fn check_arrays(
    g: &graphopt_ir::Graph,
    batch: &[(String, HostTensor)],
    data: &dyn DataSource,
    opts: &TrainOptions,
) -> Result<()> {
    use graphopt_ir::Dim;
    for v in g.runtime_inputs() {
        let name = g.name(v);
        let Some((_, t)) = batch.iter().find(|(n, _)| n == name) else {
            return Err(Error::new(format!(
                "{}: no array '{name}' (a model input); it has {}",
                data.label(),
                data.names().join(", ")
            )));
        };
        let Some(tt) = g.ty(v).and_then(|t| t.as_tensor()) else {
            continue;
        };
        let want = match &tt.shape {
            Some(s) => format!(
                "{}[{}]",
                tt.elem.name(),
                s.dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match d {
                        Dim::Known(k) => k.to_string(),
                        Dim::Sym(n) => n.clone(),
                        Dim::Unknown => format!("?{i}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => tt.elem.name().to_string(),
        };
        let fits = t.dtype == tt.elem
            && tt.shape.as_ref().is_none_or(|s| {
                s.dims.len() == t.shape.len()
                    && s.dims.iter().zip(&t.shape).all(|(d, &n)| match d {
                        Dim::Known(k) => *k == n as i64,
                        _ => true,
                    })
            });
        if !fits {
            return Err(Error::new(format!(
                "{}: array '{name}' is {}{:?} per batch of {}, the model's input '{name}' is {want}",
                data.label(),
                t.dtype.name(),
                t.shape,
                opts.batch
            )));
        }
    }
    Ok(())
}

/// A batch by the names the step's graphs read: the target array becomes
/// `target`; arrays that are neither a model input nor the target go.
pub(super) fn to_feed(
    batch: Vec<(String, HostTensor)>,
    model: &Model,
    opts: &TrainOptions,
) -> State {
    let g = &model.graph;
    batch
        .into_iter()
        .filter_map(|(n, t)| {
            if n == opts.target {
                Some(("target".to_string(), t))
            } else if g.value_by_name(&n).is_some_and(|v| g.is_input(v)) {
                Some((n, t))
            } else {
                None
            }
        })
        .collect()
}

/// The loss's target is there when the loss needs one.
pub(super) fn check_feed(batch: &State, data: &dyn DataSource, opts: &TrainOptions) -> Result<()> {
    let needs_target = matches!(opts.loss, Loss::Mse | Loss::L1 | Loss::CrossEntropy);
    if needs_target && !batch.contains_key("target") {
        return Err(Error::new(format!(
            "{}: no array '{}' (the loss's target; name another array with --target); it has {}",
            data.label(),
            opts.target,
            data.names().join(", ")
        )));
    }
    Ok(())
}

/// The dims of a batch of `rows` examples.
pub(super) fn batch_dims(batch: &State, rows: usize) -> DimValues {
    DimValues {
        bound: Vec::new(),
        shapes: batch
            .iter()
            .map(|(n, t)| {
                let mut s: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                s[0] = rows as i64;
                (n.clone(), s)
            })
            .collect(),
        default: None,
    }
}

/// Examples `k * rows .. (k + 1) * rows` of every array.
pub(super) fn slice_rows(batch: &State, k: usize, rows: usize) -> State {
    batch
        .iter()
        .map(|(n, t)| {
            let per = t.data.len() / t.shape[0].max(1);
            let mut shape = t.shape.clone();
            shape[0] = rows;
            (
                n.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape,
                    data: t.data[k * rows * per..(k + 1) * rows * per].to_vec(),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_seeded_and_complete() {
        let a = epoch_permutation(100, 7, 0);
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_eq!(a, epoch_permutation(100, 7, 0));
        assert_ne!(a, epoch_permutation(100, 7, 1));
        assert_ne!(a, epoch_permutation(100, 8, 0));
    }

    #[test]
    fn arrays_must_agree_and_be_finite() {
        let x = HostTensor::from_f32(&[3, 2], &[0.0, 1.0, 2.0, 3.0, f32::NAN, 5.0]);
        let y = HostTensor::from_i64(&[3], &[0, 1, 2]);
        let e = ArrayData::new(vec![("x".into(), x), ("y".into(), y.clone())], "d.npz")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "d.npz: array 'x' holds NaN or Inf (example 2)");
        let x = HostTensor::from_f32(&[2, 2], &[0.0; 4]);
        let e = ArrayData::new(vec![("x".into(), x), ("y".into(), y)], "d.npz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'y' has 3 examples, 'x' has 2"), "{e}");
    }

    #[test]
    fn gather_stacks_examples() {
        let x = HostTensor::from_f32(&[3, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let d = ArrayData::new(vec![("x".into(), x)], "d").unwrap();
        let b = d.gather(&[2, 0]).unwrap();
        assert_eq!(b[0].1.shape, vec![2, 2]);
        assert_eq!(b[0].1.to_f32().unwrap(), vec![4.0, 5.0, 0.0, 1.0]);
    }
}
