//! graphopt's intermediate representation.
//!
//! An ONNX model becomes a [`Model`] holding a [`Graph`]: values and nodes
//! in arenas addressed by typed ids ([`ValueId`], [`NodeId`]), program order
//! kept apart from storage, use lists maintained by every mutation, and
//! tensor data in zero-copy [`bytes::Bytes`]. The IR knows nothing of files,
//! protobuf, passes or the CLI: `graphopt-onnx` converts to and from ONNX,
//! `graphopt-text` prints and parses the ONNX textual syntax.
//!
//! - [`infer`]: dtype and shape inference with symbolic dims;
//! - [`verify`]: the verifier run after every pass.

mod algo;
mod attr;
mod dtype;
mod graph;
pub mod infer;
mod model;
mod tensor;
mod types;
pub mod verify;

pub use algo::{dependency_graph, stable_topo_order};
pub use attr::{AttrKind, AttrValue, Attribute};
pub use dtype::DType;
pub use graph::{Graph, NewNode, NodeData, NodeId, Patch, Place, Use, ValueData, ValueId};
pub use model::{Function, Model, OpsetImport};
pub use tensor::{numel, SparseTensor, Tensor, TensorData};
pub use types::{Dim, Shape, TensorType, Type, TypeKind};

/// An error about the IR's content: one line saying what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IrError(pub String);

impl IrError {
    pub fn new(msg: impl Into<String>) -> IrError {
        IrError(msg.into())
    }
}
