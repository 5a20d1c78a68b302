//! Tensor constants: initializers and tensor attributes.
//!
//! Data is held as ONNX's little-endian packed `raw_data` layout in a
//! [`Bytes`], so a tensor read from a memory-mapped file points into the
//! file (zero copy) and cloning a tensor never copies its data. Strings are
//! the one exception: they are a list of byte strings.

use crate::{DType, IrError};
use bytes::Bytes;

/// The payload of a tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// Packed little-endian elements, as in `TensorProto.raw_data`.
    Raw(Bytes),
    /// One byte string per element (dtype `string`).
    Strings(Vec<Bytes>),
}

/// A constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub dims: Vec<i64>,
    pub data: TensorData,
    /// The tensor's own name: used for tensors inside attributes; an
    /// initializer's name is its value's name.
    pub name: String,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
}

impl Tensor {
    /// A tensor from packed raw bytes. Checks that the byte length matches.
    pub fn from_raw(dtype: DType, dims: Vec<i64>, raw: Bytes) -> Result<Tensor, IrError> {
        let t = Tensor {
            dtype,
            dims,
            data: TensorData::Raw(raw),
            name: String::new(),
            doc_string: String::new(),
            metadata_props: Vec::new(),
        };
        t.check()?;
        Ok(t)
    }

    pub fn from_strings(dims: Vec<i64>, strings: Vec<Bytes>) -> Result<Tensor, IrError> {
        let t = Tensor {
            dtype: DType::String,
            dims,
            data: TensorData::Strings(strings),
            name: String::new(),
            doc_string: String::new(),
            metadata_props: Vec::new(),
        };
        t.check()?;
        Ok(t)
    }

    pub fn from_f32(dims: Vec<i64>, values: &[f32]) -> Result<Tensor, IrError> {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_raw(DType::F32, dims, Bytes::from(raw))
    }

    pub fn from_i64(dims: Vec<i64>, values: &[i64]) -> Result<Tensor, IrError> {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_raw(DType::I64, dims, Bytes::from(raw))
    }

    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor::from_f32(vec![], &[v]).expect("scalar is well formed")
    }

    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor::from_i64(vec![], &[v]).expect("scalar is well formed")
    }

    /// Number of elements, or an error if a dim is negative or the product overflows.
    pub fn numel(&self) -> Result<u64, IrError> {
        numel(&self.dims)
    }

    /// Bytes of payload (for strings, the summed string lengths).
    pub fn nbytes(&self) -> u64 {
        match &self.data {
            TensorData::Raw(b) => b.len() as u64,
            TensorData::Strings(s) => s.iter().map(|b| b.len() as u64).sum(),
        }
    }

    pub fn raw(&self) -> Option<&Bytes> {
        match &self.data {
            TensorData::Raw(b) => Some(b),
            TensorData::Strings(_) => None,
        }
    }

    /// Checks that dims are valid and the payload has the size they imply.
    pub fn check(&self) -> Result<(), IrError> {
        let n = self.numel()?;
        match &self.data {
            TensorData::Strings(s) => {
                if self.dtype != DType::String {
                    return Err(IrError::new(format!(
                        "tensor '{}' holds strings but its dtype is {}",
                        self.name, self.dtype
                    )));
                }
                if s.len() as u64 != n {
                    return Err(IrError::new(format!(
                        "tensor '{}' has {} strings but its dims {:?} need {n}",
                        self.name,
                        s.len(),
                        self.dims
                    )));
                }
            }
            TensorData::Raw(b) => {
                if self.dtype.bits().is_some() && self.dtype.storage_bytes(n).is_none() {
                    return Err(IrError::new(format!(
                        "tensor '{}' dims {:?} overflow the byte count",
                        self.name, self.dims
                    )));
                }
                if let Some(want) = self.dtype.storage_bytes(n) {
                    if b.len() as u64 != want {
                        return Err(IrError::new(format!(
                            "tensor '{}' ({} {:?}) has {} bytes of data, expected {want}",
                            self.name,
                            self.dtype,
                            self.dims,
                            b.len()
                        )));
                    }
                } else if self.dtype == DType::String {
                    return Err(IrError::new(format!(
                        "string tensor '{}' has raw data",
                        self.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Values as i64, for integer tensors (used by shape inference and folding).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        let raw = self.raw()?;
        Some(match self.dtype {
            DType::I64 => raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::I32 => raw
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            DType::U32 => raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            DType::I16 => raw
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            DType::U16 => raw
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            DType::I8 => raw.iter().map(|&b| b as i8 as i64).collect(),
            DType::U8 | DType::Bool => raw.iter().map(|&b| b as i64).collect(),
            DType::U64 => raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            _ => return None,
        })
    }

    /// Values as f64, for float and integer tensors of 8 bits or more.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        let raw = self.raw()?;
        Some(match self.dtype {
            DType::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::F64 => raw
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::F16 => raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
            DType::BF16 => raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
                .collect(),
            _ => self.to_i64_vec()?.into_iter().map(|v| v as f64).collect(),
        })
    }
}

/// Product of dims, with an error for negative dims or overflow.
pub fn numel(dims: &[i64]) -> Result<u64, IrError> {
    let mut n: u64 = 1;
    for &d in dims {
        let d =
            u64::try_from(d).map_err(|_| IrError::new(format!("negative dim {d} in {dims:?}")))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| IrError::new(format!("dims {dims:?} overflow the element count")))?;
    }
    Ok(n)
}

/// A sparse tensor in COO form (`SparseTensorProto`).
#[derive(Clone, Debug, PartialEq)]
pub struct SparseTensor {
    pub values: Tensor,
    pub indices: Tensor,
    pub dims: Vec<i64>,
}

impl SparseTensor {
    /// The dense tensor: zeros but at `indices` (`[NNZ]` linear positions,
    /// or `[NNZ, rank]` coordinates), which hold `values`.
    pub fn to_dense(&self) -> Result<Tensor, IrError> {
        let dtype = self.values.dtype;
        let es = dtype.bits().filter(|b| b % 8 == 0).ok_or_else(|| {
            IrError::new(format!(
                "sparse {} values are not whole bytes",
                dtype.name()
            ))
        })? as usize
            / 8;
        let n = usize::try_from(numel(&self.dims)?)
            .map_err(|_| IrError::new("sparse tensor too large"))?;
        let vals = self
            .values
            .raw()
            .ok_or_else(|| IrError::new("sparse values are not numeric"))?;
        let nnz = vals.len() / es.max(1);
        let idx = self
            .indices
            .to_i64_vec()
            .ok_or_else(|| IrError::new("sparse indices are not integers"))?;
        let rank = self.dims.len();
        let linear: Vec<i64> = if idx.len() == nnz {
            idx
        } else if rank > 0 && idx.len() == nnz * rank {
            idx.chunks(rank)
                .map(|c| {
                    c.iter()
                        .zip(&self.dims)
                        .fold(0i64, |acc, (&i, &d)| acc * d + i)
                })
                .collect()
        } else {
            return Err(IrError::new(format!(
                "sparse tensor: {} indices for {nnz} values of rank {rank}",
                idx.len()
            )));
        };
        let mut out = vec![0u8; n * es];
        for (k, &p) in linear.iter().enumerate() {
            let p = usize::try_from(p)
                .ok()
                .filter(|&p| p < n)
                .ok_or_else(|| IrError::new(format!("sparse index {p} outside {:?}", self.dims)))?;
            out[p * es..(p + 1) * es].copy_from_slice(&vals[k * es..(k + 1) * es]);
        }
        Tensor::from_raw(dtype, self.dims.clone(), out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_is_checked() {
        assert!(Tensor::from_raw(DType::F32, vec![2], Bytes::from_static(&[0; 8])).is_ok());
        assert!(Tensor::from_raw(DType::F32, vec![3], Bytes::from_static(&[0; 8])).is_err());
        assert!(Tensor::from_raw(DType::I4, vec![3], Bytes::from_static(&[0; 2])).is_ok());
        assert!(Tensor::from_raw(DType::F32, vec![-1], Bytes::new()).is_err());
        assert!(numel(&[i64::MAX, i64::MAX]).is_err());
    }

    #[test]
    fn int_values() {
        let t = Tensor::from_i64(vec![3], &[1, -2, 3]).unwrap();
        assert_eq!(t.to_i64_vec(), Some(vec![1, -2, 3]));
        assert_eq!(t.to_f64_vec(), Some(vec![1.0, -2.0, 3.0]));
    }
}
