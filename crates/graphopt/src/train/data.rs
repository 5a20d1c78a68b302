//! Where training examples come from: the [`DataSource`] trait, arrays in
//! memory, the order of each epoch, and the batch checks.

use super::{State, TrainOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::grad::Loss;
use crate::run::to_host;
use bytes::Bytes;
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

/// Arrays in memory (the caller's: Python dicts, or shards concatenated).
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

/// Examples read in place from files, memory-mapped: one npz
/// (`np.savez`), or a folder of shards concatenated in name order, either
/// npz files with the same arrays or npy files holding one array each
/// (`NAME.npy`, all with the same number of examples), mapped by
/// [`graphopt_onnx::map_read_only`]. A batch copies only its own examples
/// out of the maps (and hands their pages back), and is
/// checked for NaN and Inf then: the data is never read whole, so a bad
/// value deep in a large set is found when its example is first drawn
/// (the error names the array and the example, and the run stops there).
pub struct MappedData {
    maps: Vec<Bytes>,
    /// Per array: name, element type, per-example shape, bytes per example.
    arrays: Vec<(String, DType, Vec<usize>, usize)>,
    shards: Vec<Shard>,
    examples: usize,
    label: String,
}

/// Where one shard's examples lie.
struct Shard {
    /// Its first example in the whole set.
    first: usize,
    /// Per array: the map, and the byte offset of its values there.
    at: Vec<(usize, usize)>,
}

/// One array of a shard as found in a file.
struct Found {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    /// Bytes per element.
    width: usize,
    map: usize,
    offset: usize,
}

impl MappedData {
    /// Maps `path`: an npz file, or a folder of npz or npy shards.
    pub fn open(path: &Path) -> Result<MappedData> {
        let label = path.display().to_string();
        let mut maps = Vec::new();
        let mut shards: Vec<(String, Vec<Found>)> = Vec::new();
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| Error::io(path, "read", e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "npz" || x == "npy"))
                .collect();
            files.sort();
            let npy = files
                .iter()
                .filter(|f| f.extension().is_some_and(|x| x == "npy"));
            let npy: Vec<PathBuf> = npy.cloned().collect();
            if files.is_empty() {
                return Err(Error::new(format!("{label}: no .npz or .npy shards")));
            }
            if !npy.is_empty() && npy.len() != files.len() {
                return Err(Error::new(format!(
                    "{label}: holds both .npz and .npy files; use one kind of shard"
                )));
            }
            if npy.is_empty() {
                for f in &files {
                    shards.push((f.display().to_string(), map_npz(f, &mut maps)?));
                }
            } else {
                let mut found = Vec::new();
                for f in &npy {
                    let name = f
                        .file_stem()
                        .map(|s| s.to_string_lossy().to_string())
                        .unwrap_or_default();
                    let i = maps.len();
                    maps.push(map_file(f)?);
                    found.push(layout_of(&maps[i], 0, i, name, f)?);
                }
                shards.push((label.clone(), found));
            }
        } else {
            shards.push((label.clone(), map_npz(path, &mut maps)?));
        }
        MappedData::from_shards(maps, shards, &label)
    }

    fn from_shards(
        maps: Vec<Bytes>,
        shards: Vec<(String, Vec<Found>)>,
        label: &str,
    ) -> Result<MappedData> {
        let mut arrays: Vec<(String, DType, Vec<usize>, usize)> = Vec::new();
        let mut out = Vec::new();
        let mut examples = 0usize;
        for (where_, found) in shards {
            let Some(first) = found.first() else {
                return Err(Error::new(format!("{where_}: no arrays")));
            };
            if let Some(f) = found.iter().find(|f| f.shape.is_empty()) {
                return Err(Error::new(format!(
                    "{where_}: array '{}' is a scalar; every array needs a leading example axis",
                    f.name
                )));
            }
            let n = first.shape[0];
            if arrays.is_empty() {
                for f in &found {
                    let row = f.shape[1..]
                        .iter()
                        .try_fold(f.width, |a, &d| a.checked_mul(d))
                        .ok_or_else(|| {
                            Error::with_kind(
                                ErrorKind::Parse,
                                format!("{where_}: array '{}': shape too large", f.name),
                            )
                        })?;
                    arrays.push((f.name.clone(), f.dtype, f.shape[1..].to_vec(), row));
                }
            }
            let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
            let want: Vec<&str> = arrays.iter().map(|a| a.0.as_str()).collect();
            if names != want {
                return Err(Error::new(format!(
                    "{where_}: arrays {names:?} differ from the first shard's {want:?}"
                )));
            }
            for (f, (name, dtype, per, _)) in found.iter().zip(&arrays) {
                if f.shape.first() != Some(&n) {
                    return Err(Error::new(format!(
                        "{where_}: array '{name}' has {} examples, '{}' has {n}",
                        f.shape.first().map_or("no".to_string(), |n| n.to_string()),
                        first.name
                    )));
                }
                if f.dtype != *dtype || f.shape[1..] != per[..] {
                    return Err(Error::new(format!(
                        "{where_}: array '{name}' is {}{:?} per example, the first shard's is {}{:?}",
                        f.dtype.name(),
                        &f.shape[1..],
                        dtype.name(),
                        per
                    )));
                }
            }
            out.push(Shard {
                first: examples,
                at: found.iter().map(|f| (f.map, f.offset)).collect(),
            });
            examples += n;
        }
        Ok(MappedData {
            maps,
            arrays,
            shards: out,
            examples,
            label: label.to_string(),
        })
    }
}

fn map_file(path: &Path) -> Result<Bytes> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let map = graphopt_onnx::map_read_only(&file, graphopt_onnx::Access::Random)
        .map_err(|e| Error::io(path, "map", e))?;
    if map.is_empty() {
        return Err(Error::new(format!("{}: empty file", path.display())));
    }
    Ok(map)
}

/// The arrays of the npz at `path`, mapped (the map joins `maps`).
fn map_npz(path: &Path, maps: &mut Vec<Bytes>) -> Result<Vec<Found>> {
    let i = maps.len();
    maps.push(map_file(path)?);
    let members = graphopt_tract::npz::members(&maps[i])
        .map_err(|e| Error::with_kind(ErrorKind::Parse, format!("{}: {e:#}", path.display())))?;
    members
        .into_iter()
        .map(|m| {
            let name = m.name.clone();
            layout_of(&maps[i][..m.start + m.len], m.start, i, name, path)
        })
        .collect()
}

/// The `.npy` array starting at `start` of `bytes` (map `map` of `path`).
fn layout_of(bytes: &[u8], start: usize, map: usize, name: String, path: &Path) -> Result<Found> {
    let bad = |e: String| {
        Error::with_kind(
            ErrorKind::Parse,
            format!("{}: array '{name}': {e}", path.display()),
        )
    };
    let l = graphopt_tract::npz::npy_layout(&bytes[start..]).map_err(|e| bad(format!("{e:#}")))?;
    let (Some(dtype), Some(width)) = (
        graphopt_tract::npz::npy_dtype(&l.descr),
        graphopt_tract::npz::npy_width(&l.descr),
    ) else {
        return Err(bad(format!("unsupported dtype '{}'", l.descr)));
    };
    Ok(Found {
        width,
        name,
        dtype,
        shape: l.shape,
        map,
        offset: start + l.data_offset,
    })
}

impl DataSource for MappedData {
    fn examples(&self) -> usize {
        self.examples
    }

    fn names(&self) -> Vec<String> {
        self.arrays.iter().map(|a| a.0.clone()).collect()
    }

    fn gather(&self, indices: &[usize]) -> Result<Vec<(String, HostTensor)>> {
        let mut out = Vec::with_capacity(self.arrays.len());
        for (a, (name, dtype, per, row)) in self.arrays.iter().enumerate() {
            let mut data = Vec::with_capacity(row * indices.len());
            for &i in indices {
                if i >= self.examples {
                    return Err(Error::new(format!(
                        "{}: example {i} of {}",
                        self.label, self.examples
                    )));
                }
                // The shard holding example i: the last one starting at or
                // before it.
                let s = &self.shards[self.shards.partition_point(|sh| sh.first <= i) - 1];
                let (map, offset) = s.at[a];
                let from = offset + (i - s.first) * row;
                let example = &self.maps[map][from..from + row];
                data.extend_from_slice(example);
                // Copied: its pages go back, so an epoch over a large set
                // does not stay resident (the page cache keeps what memory
                // allows, as for any read).
                graphopt_onnx::release_resident(example);
            }
            let mut shape = vec![indices.len()];
            shape.extend_from_slice(per);
            let t = HostTensor {
                dtype: *dtype,
                shape,
                data,
            };
            if let Some(k) = first_non_finite(&t) {
                let per_example = per.iter().product::<usize>().max(1);
                return Err(Error::new(format!(
                    "{}: array '{name}' holds NaN or Inf (example {})",
                    self.label,
                    indices[k / per_example]
                )));
            }
            out.push((name.clone(), t));
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

    fn npz(arrays: &[(&str, HostTensor)]) -> Vec<u8> {
        let a: Vec<(String, graphopt_tract::TractTensor)> = arrays
            .iter()
            .map(|(n, t)| (n.to_string(), crate::run::to_tract(t).unwrap()))
            .collect();
        graphopt_tract::npz::write(&a).unwrap()
    }

    #[test]
    fn mapped_data_checks_what_it_gathers() {
        let dir = tempfile::tempdir().unwrap();
        let x = HostTensor::from_f32(&[3, 2], &[0.0, 1.0, 2.0, 3.0, f32::NAN, 5.0]);
        let y = HostTensor::from_i64(&[3], &[0, 1, 2]);
        let p = dir.path().join("d.npz");
        std::fs::write(&p, npz(&[("x", x), ("y", y)])).unwrap();
        let d = MappedData::open(&p).unwrap();
        assert_eq!(d.examples(), 3);
        let b = d.gather(&[1, 0]).unwrap();
        assert_eq!(b[0].1.to_f32().unwrap(), vec![2.0, 3.0, 0.0, 1.0]);
        assert_eq!(b[1].1.shape, vec![2]);
        let e = d.gather(&[0, 2]).unwrap_err().to_string();
        assert!(
            e.ends_with("d.npz: array 'x' holds NaN or Inf (example 2)"),
            "{e}"
        );
        // Shards whose arrays disagree, and a scalar.
        let shards = dir.path().join("s");
        std::fs::create_dir_all(&shards).unwrap();
        let a = HostTensor::from_f32(&[2, 2], &[0.0; 4]);
        let b = HostTensor::from_f32(&[2, 3], &[0.0; 6]);
        std::fs::write(shards.join("0.npz"), npz(&[("x", a)])).unwrap();
        std::fs::write(shards.join("1.npz"), npz(&[("x", b)])).unwrap();
        let e = MappedData::open(&shards).err().unwrap().to_string();
        assert!(
            e.contains("1.npz: array 'x' is float[3] per example"),
            "{e}"
        );
        let s = HostTensor::from_f32(&[], &[1.0]);
        std::fs::write(shards.join("1.npz"), npz(&[("x", s)])).unwrap();
        let e = MappedData::open(&shards).err().unwrap().to_string();
        assert!(e.contains("array 'x' is a scalar"), "{e}");
    }

    #[test]
    fn mapped_data_never_panics_on_a_cut_or_corrupted_file() {
        let dir = tempfile::tempdir().unwrap();
        let x = HostTensor::from_f32(&[4, 3], &[0.5; 12]);
        let y = HostTensor::from_i64(&[4], &[0, 1, 2, 3]);
        let good = npz(&[("x", x), ("y", y)]);
        let p = dir.path().join("d.npz");
        let mut seed = 7u64;
        for cut in 0..good.len() {
            let mut bytes = good[..cut].to_vec();
            // And a flipped byte in the kept part.
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            if !bytes.is_empty() {
                let at = (seed >> 33) as usize % bytes.len();
                bytes[at] ^= (seed >> 13) as u8 | 1;
            }
            for b in [&good[..cut], &bytes[..]] {
                std::fs::write(&p, b).unwrap();
                if let Ok(d) = MappedData::open(&p) {
                    let _ = d.gather(&(0..d.examples()).collect::<Vec<_>>());
                }
            }
        }
    }
}
