//! The model: a main graph plus the model-level fields of ONNX's ModelProto.

use crate::{Attribute, Graph};
use bytes::Bytes;

/// An opset import: `(domain, version)`; domain `""` is `ai.onnx`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpsetImport {
    pub domain: String,
    pub version: i64,
}

/// A model-local function (`FunctionProto`). Its body's inputs and outputs
/// are the function's formal parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub domain: String,
    pub overload: String,
    /// Attribute names without defaults.
    pub attributes: Vec<String>,
    /// Attributes with default values.
    pub attribute_defaults: Vec<Attribute>,
    pub opset_imports: Vec<OpsetImport>,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    pub body: Graph,
}

/// A whole model.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Model {
    pub ir_version: i64,
    pub opset_imports: Vec<OpsetImport>,
    pub producer_name: String,
    pub producer_version: String,
    pub domain: String,
    pub model_version: i64,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    pub graph: Graph,
    pub functions: Vec<Function>,
    /// Encoded `TrainingInfoProto`s, carried verbatim.
    pub training_info: Vec<Bytes>,
    /// Encoded `DeviceConfigurationProto`s, carried verbatim.
    pub configuration: Vec<Bytes>,
}

impl Model {
    pub fn new(graph: Graph, opset: i64) -> Model {
        Model {
            ir_version: 8,
            opset_imports: vec![OpsetImport {
                domain: String::new(),
                version: opset,
            }],
            graph,
            ..Model::default()
        }
    }

    /// The imported version of `domain` (`""` and `"ai.onnx"` are the same).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let norm = |d: &str| if d == "ai.onnx" { "" } else { d }.to_string();
        let want = norm(domain);
        self.opset_imports
            .iter()
            .find(|o| norm(&o.domain) == want)
            .map(|o| o.version)
    }

    /// The default-domain opset, if imported.
    pub fn onnx_opset(&self) -> Option<i64> {
        self.opset("")
    }

    pub fn function(&self, domain: &str, name: &str) -> Option<&Function> {
        self.functions
            .iter()
            .find(|f| f.domain == domain && f.name == name)
    }
}
