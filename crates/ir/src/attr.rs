//! Node attributes.

use crate::{Graph, SparseTensor, Tensor, Type};

/// The kind of an attribute, as in `AttributeProto.AttributeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttrKind {
    Undefined,
    Float,
    Int,
    String,
    Tensor,
    Graph,
    SparseTensor,
    TypeProto,
    Floats,
    Ints,
    Strings,
    Tensors,
    Graphs,
    SparseTensors,
    TypeProtos,
}

const KINDS: &[(AttrKind, i32, &str)] = &[
    (AttrKind::Undefined, 0, "undefined"),
    (AttrKind::Float, 1, "float"),
    (AttrKind::Int, 2, "int"),
    (AttrKind::String, 3, "string"),
    (AttrKind::Tensor, 4, "tensor"),
    (AttrKind::Graph, 5, "graph"),
    (AttrKind::Floats, 6, "floats"),
    (AttrKind::Ints, 7, "ints"),
    (AttrKind::Strings, 8, "strings"),
    (AttrKind::Tensors, 9, "tensors"),
    (AttrKind::Graphs, 10, "graphs"),
    (AttrKind::SparseTensor, 11, "sparse_tensor"),
    (AttrKind::SparseTensors, 12, "sparse_tensors"),
    (AttrKind::TypeProto, 13, "type_proto"),
    (AttrKind::TypeProtos, 14, "type_protos"),
];

impl AttrKind {
    pub fn from_onnx(code: i32) -> Option<AttrKind> {
        KINDS.iter().find(|k| k.1 == code).map(|k| k.0)
    }
    pub fn to_onnx(self) -> i32 {
        KINDS.iter().find(|k| k.0 == self).map(|k| k.1).unwrap_or(0)
    }
    /// The spelling used by the textual syntax for attribute types.
    pub fn name(self) -> &'static str {
        KINDS
            .iter()
            .find(|k| k.0 == self)
            .map(|k| k.2)
            .unwrap_or("undefined")
    }
    pub fn from_name(name: &str) -> Option<AttrKind> {
        KINDS.iter().find(|k| k.2 == name).map(|k| k.0)
    }
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    /// Byte string (ONNX strings are bytes; usually UTF-8).
    String(Vec<u8>),
    Tensor(Tensor),
    Graph(Box<Graph>),
    SparseTensor(SparseTensor),
    Type(Type),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<Tensor>),
    Graphs(Vec<Graph>),
    SparseTensors(Vec<SparseTensor>),
    Types(Vec<Type>),
    /// Inside a function body: takes the value of the function's attribute
    /// `attr` (`AttributeProto.ref_attr_name`).
    Ref {
        attr: String,
        kind: AttrKind,
    },
}

impl AttrValue {
    pub fn kind(&self) -> AttrKind {
        match self {
            AttrValue::Float(_) => AttrKind::Float,
            AttrValue::Int(_) => AttrKind::Int,
            AttrValue::String(_) => AttrKind::String,
            AttrValue::Tensor(_) => AttrKind::Tensor,
            AttrValue::Graph(_) => AttrKind::Graph,
            AttrValue::SparseTensor(_) => AttrKind::SparseTensor,
            AttrValue::Type(_) => AttrKind::TypeProto,
            AttrValue::Floats(_) => AttrKind::Floats,
            AttrValue::Ints(_) => AttrKind::Ints,
            AttrValue::Strings(_) => AttrKind::Strings,
            AttrValue::Tensors(_) => AttrKind::Tensors,
            AttrValue::Graphs(_) => AttrKind::Graphs,
            AttrValue::SparseTensors(_) => AttrKind::SparseTensors,
            AttrValue::Types(_) => AttrKind::TypeProtos,
            AttrValue::Ref { kind, .. } => *kind,
        }
    }
}

/// A named attribute.
#[derive(Clone, Debug, PartialEq)]
pub struct Attribute {
    pub name: String,
    pub value: AttrValue,
    pub doc_string: String,
}

impl Attribute {
    pub fn new(name: impl Into<String>, value: AttrValue) -> Attribute {
        Attribute {
            name: name.into(),
            value,
            doc_string: String::new(),
        }
    }

    /// The subgraphs held by this attribute.
    pub fn graphs(&self) -> impl Iterator<Item = &Graph> {
        let s: &[Graph] = match &self.value {
            AttrValue::Graph(g) => std::slice::from_ref(g.as_ref()),
            AttrValue::Graphs(gs) => gs,
            _ => &[],
        };
        s.iter()
    }

    pub fn graphs_mut(&mut self) -> impl Iterator<Item = &mut Graph> {
        let s: &mut [Graph] = match &mut self.value {
            AttrValue::Graph(g) => std::slice::from_mut(g.as_mut()),
            AttrValue::Graphs(gs) => gs,
            _ => &mut [],
        };
        s.iter_mut()
    }
}
