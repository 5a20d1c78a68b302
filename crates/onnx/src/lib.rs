//! ONNX ⇄ graphopt IR, lossless.
//!
//! - [`load`] memory-maps a `.onnx` file and decodes it with prost; tensor
//!   `raw_data` and external data stay inside the maps (zero copy).
//! - [`save`] streams the model to a temporary file beside the output and
//!   renames it into place (atomic), writing external data when asked to,
//!   when the input used it, or when the model would not fit protobuf's
//!   2 GiB limit.
//!
//! Every field of `ModelProto` is kept: what the IR models is converted,
//! what it does not interpret (training info, device configurations) is
//! carried as encoded bytes.

mod export;
mod external;
mod import;
mod resident;
mod stream;

use export::model_to_proto;
pub use export::{ExternalData, SaveOptions, SaveReport};
pub use import::ImportInfo;
pub use resident::{map_read_only, release_resident, Access};

use bytes::Bytes;
use graphopt_ir::Model;
use graphopt_proto::{Message, ModelProto};
use std::fmt;
use std::path::{Path, PathBuf};

/// What kind of import or export error it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnnxErrorKind {
    /// Opening, mapping, reading or writing a file failed.
    Io,
    /// The bytes are not a valid ONNX model (protobuf, tensors, external
    /// data entries, graph structure).
    Parse,
    /// Valid ONNX that graphopt does not handle.
    Unsupported,
}

/// An import or export error: one line saying what was wrong and where,
/// its kind, and the I/O error behind it when there is one.
#[derive(Debug, Clone)]
pub struct OnnxError {
    kind: OnnxErrorKind,
    message: String,
    io: Option<std::sync::Arc<std::io::Error>>,
}

impl fmt::Display for OnnxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
impl std::error::Error for OnnxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.io
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
impl PartialEq for OnnxError {
    fn eq(&self, o: &OnnxError) -> bool {
        self.kind == o.kind && self.message == o.message
    }
}
impl Eq for OnnxError {}

impl OnnxError {
    /// A [`OnnxErrorKind::Parse`] error.
    pub fn new(msg: impl Into<String>) -> OnnxError {
        OnnxError {
            kind: OnnxErrorKind::Parse,
            message: msg.into(),
            io: None,
        }
    }
    /// An [`OnnxErrorKind::Io`] error caused by `e`.
    pub fn io(msg: impl Into<String>, e: std::io::Error) -> OnnxError {
        OnnxError {
            kind: OnnxErrorKind::Io,
            message: msg.into(),
            io: Some(std::sync::Arc::new(e)),
        }
    }
    /// An [`OnnxErrorKind::Unsupported`] error.
    pub fn unsupported(msg: impl Into<String>) -> OnnxError {
        OnnxError {
            kind: OnnxErrorKind::Unsupported,
            ..OnnxError::new(msg)
        }
    }
    pub fn kind(&self) -> OnnxErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Prefixes the message with where it happened.
    pub fn within(self, place: impl fmt::Display) -> OnnxError {
        OnnxError {
            message: format!("{place}: {}", self.message),
            ..self
        }
    }
}

/// A loaded model and what the loader saw.
#[derive(Debug)]
pub struct Loaded {
    pub model: Model,
    pub info: ImportInfo,
}

/// Loads a model from a file. External data is resolved relative to the
/// file's folder and may not leave it.
pub fn load(path: &Path) -> Result<Loaded, OnnxError> {
    let place = path.display();
    let file = std::fs::File::open(path)
        .map_err(|e| OnnxError::io(format!("{place}: cannot open: {e}"), e))?;
    let bytes = resident::map_read_only(&file, resident::Access::Sequential)
        .map_err(|e| OnnxError::io(format!("{place}: cannot map: {e}"), e))?;
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    decode(bytes, Some(&dir)).map_err(|e| e.within(place))
}

/// Decodes a model from bytes. `base_dir` is where external data lives;
/// `None` makes external data an error.
pub fn decode(bytes: Bytes, base_dir: Option<&Path>) -> Result<Loaded, OnnxError> {
    if bytes.is_empty() {
        return Err(OnnxError::new("the file is empty, not an ONNX model"));
    }
    let proto = ModelProto::decode(bytes).map_err(|e| {
        OnnxError::new(format!(
            "not a valid ONNX protobuf (truncated or corrupt file?): {e}"
        ))
    })?;
    let mut ext = external::ExternalReader::new(base_dir.map(Path::to_path_buf));
    import::model_from_proto(proto, &mut ext)
}

/// Encodes a model to protobuf bytes in memory, all tensor data inline.
/// Fails if the result would exceed protobuf's 2 GiB limit.
pub fn encode(model: &Model) -> Result<Vec<u8>, OnnxError> {
    let (proto, _) = model_to_proto(model, &ExternalData::Never, None)?;
    let len = proto.encoded_len();
    if len > i32::MAX as usize {
        return Err(OnnxError::new(
            "the model exceeds protobuf's 2 GiB limit; save it with external data",
        ));
    }
    Ok(proto.encode_to_vec())
}

/// Saves a model: see [`SaveOptions`]. The output appears atomically.
pub fn save(model: &Model, path: &Path, opts: &SaveOptions) -> Result<SaveReport, OnnxError> {
    export::save(model, path, opts)
}
