//! Value types: tensors with symbolic shapes, and ONNX's sequence, map,
//! optional, sparse and opaque types.

use crate::DType;
use std::fmt;

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A known size.
    Known(i64),
    /// A named symbolic size (`batch`, `seq`), equal wherever the name recurs.
    Sym(String),
    /// Nothing is known.
    Unknown,
}

impl Dim {
    pub fn known(&self) -> Option<i64> {
        match self {
            Dim::Known(v) => Some(*v),
            _ => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(v) => write!(f, "{v}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A tensor shape: a list of dims, with optional ONNX dim denotations kept
/// for round trips.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    pub dims: Vec<Dim>,
    /// `denotations[i]` is dim i's denotation; empty when no dim has one.
    pub denotations: Vec<Option<String>>,
}

impl Shape {
    pub fn new(dims: Vec<Dim>) -> Shape {
        Shape {
            dims,
            denotations: Vec::new(),
        }
    }

    pub fn known(dims: &[i64]) -> Shape {
        Shape::new(dims.iter().map(|&d| Dim::Known(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// All dims as integers, if every dim is known.
    pub fn as_known(&self) -> Option<Vec<i64>> {
        self.dims.iter().map(Dim::known).collect()
    }

    /// Number of elements, if every dim is known and the product fits.
    pub fn numel(&self) -> Option<u64> {
        let mut n: u64 = 1;
        for d in &self.dims {
            let v = u64::try_from(d.known()?).ok()?;
            n = n.checked_mul(v)?;
        }
        Some(n)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A tensor type: element type and, if known, the shape (`None` = unknown rank).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub elem: DType,
    pub shape: Option<Shape>,
}

impl TensorType {
    pub fn new(elem: DType, shape: Option<Shape>) -> TensorType {
        TensorType { elem, shape }
    }
}

/// The type of a value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TypeKind {
    Tensor(TensorType),
    SparseTensor(TensorType),
    /// Element type, if known.
    Sequence(Option<Box<Type>>),
    Map(DType, Box<Type>),
    Optional(Box<Type>),
    Opaque {
        domain: String,
        name: String,
    },
    /// A TypeProto with no value set.
    Unset,
}

/// A value type plus its ONNX type denotation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    pub kind: TypeKind,
    pub denotation: Option<String>,
}

impl Type {
    pub fn tensor(elem: DType, shape: Option<Shape>) -> Type {
        Type {
            kind: TypeKind::Tensor(TensorType::new(elem, shape)),
            denotation: None,
        }
    }

    pub fn known(elem: DType, dims: &[i64]) -> Type {
        Type::tensor(elem, Some(Shape::known(dims)))
    }

    pub fn as_tensor(&self) -> Option<&TensorType> {
        match &self.kind {
            TypeKind::Tensor(t) => Some(t),
            _ => None,
        }
    }

    pub fn as_tensor_mut(&mut self) -> Option<&mut TensorType> {
        match &mut self.kind {
            TypeKind::Tensor(t) => Some(t),
            _ => None,
        }
    }

    pub fn elem(&self) -> Option<DType> {
        self.as_tensor().map(|t| t.elem)
    }

    pub fn shape(&self) -> Option<&Shape> {
        self.as_tensor().and_then(|t| t.shape.as_ref())
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            TypeKind::Tensor(t) => {
                write!(f, "{}", t.elem)?;
                if let Some(s) = &t.shape {
                    write!(f, "{s}")?;
                }
                Ok(())
            }
            TypeKind::SparseTensor(t) => {
                write!(f, "sparse_tensor({}", t.elem)?;
                if let Some(s) = &t.shape {
                    write!(f, "{s}")?;
                }
                f.write_str(")")
            }
            TypeKind::Sequence(Some(e)) => write!(f, "seq({e})"),
            TypeKind::Sequence(None) => f.write_str("seq"),
            TypeKind::Map(k, v) => write!(f, "map({k}, {v})"),
            TypeKind::Optional(e) => write!(f, "optional({e})"),
            TypeKind::Opaque { domain, name } => write!(f, "opaque({domain}.{name})"),
            TypeKind::Unset => f.write_str("?"),
        }
    }
}
