//! One error type: a single line saying what was wrong and where (file,
//! node), as the CLI prints it, with a [`ErrorKind`] a program can match
//! on and the lower-level error it came from kept as its
//! [`source`](std::error::Error::source).
//!
//! ```
//! use graphopt::{Error, ErrorKind};
//! let e = graphopt::load("no/such/model.onnx").unwrap_err();
//! assert_eq!(e.kind(), ErrorKind::Io);
//! // The CLI prints exactly this line after `error: `.
//! assert!(e.to_string().starts_with("no/such/model.onnx: cannot open"));
//! // The cause is kept, not flattened.
//! assert!(std::error::Error::source(&e).is_some());
//! ```

use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// What went wrong, for programs that react differently to each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A file could not be read or written.
    Io,
    /// A file's contents are not what they claim to be (ONNX protobuf,
    /// npz, CSV, ONNX text).
    Parse,
    /// Bad input: an option out of range, an unknown name, a model that
    /// breaks ONNX's rules, non-finite data.
    Invalid,
    /// Valid, but beyond what graphopt does: an op without a kernel or a
    /// rule, no GPU for `Device::Cuda`.
    Unsupported,
    /// A numerical check failed: validation or quantization error over its
    /// tolerance.
    Tolerance,
    /// A memory budget cannot be met.
    Budget,
    /// An independent checker rejected graphopt's own result (IR verifier
    /// after a pass, plan checker, poison run): a graphopt bug.
    Verify,
    /// Running a model failed (tract or graphopt's runtime).
    Runtime,
}

impl ErrorKind {
    /// The kind's name as Python's `GraphoptError.kind` and JSON give it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Io => "io",
            ErrorKind::Parse => "parse",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Tolerance => "tolerance",
            ErrorKind::Budget => "budget",
            ErrorKind::Verify => "verify",
            ErrorKind::Runtime => "runtime",
        }
    }
}

type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// A graphopt error: one line naming the file and the node or tensor, a
/// kind, and the error it came from.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Source>,
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`ErrorKind::Invalid`] error (bad input or options).
    pub fn new(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Invalid, msg)
    }

    /// An error of `kind`; newlines become spaces (one line).
    pub fn with_kind(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            message: msg.into().replace('\n', " "),
            source: None,
        }
    }

    /// An error of `kind` caused by `source`, which [`std::error::Error::source`] returns.
    pub fn caused_by(
        kind: ErrorKind,
        msg: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error {
            source: Some(Arc::new(source)),
            ..Error::with_kind(kind, msg)
        }
    }

    pub fn unsupported(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Unsupported, msg)
    }

    pub fn tolerance(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Tolerance, msg)
    }

    pub fn budget(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Budget, msg)
    }

    pub fn verify(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Verify, msg)
    }

    pub fn runtime(msg: impl Into<String>) -> Error {
        Error::with_kind(ErrorKind::Runtime, msg)
    }

    /// An I/O error on `path`: `path: what: cause`.
    pub fn io(path: &std::path::Path, what: &str, e: std::io::Error) -> Error {
        Error::caused_by(ErrorKind::Io, format!("{}: {what}: {e}", path.display()), e)
    }

    /// The same error, prefixed with where it happened (`file: ...`),
    /// unless the message already names it. Kind and source are kept.
    pub fn within(self, place: &str) -> Error {
        if place.is_empty() || self.message.starts_with(place) {
            self
        } else {
            Error {
                message: format!("{place}: {}", self.message),
                ..self
            }
        }
    }

    /// The same error with another kind (a lower crate's error whose kind
    /// the facade knows better, e.g. a planner error that is a budget).
    pub fn of_kind(self, kind: ErrorKind) -> Error {
        Error { kind, ..self }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The one-line message, as the CLI prints it after `error: `.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", &s.to_string());
        }
        d.finish()
    }
}

/// Errors are equal when kind and message are (the source is context).
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}
impl Eq for Error {}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::caused_by(ErrorKind::Io, e.to_string(), e)
    }
}

impl From<graphopt_onnx::OnnxError> for Error {
    fn from(e: graphopt_onnx::OnnxError) -> Error {
        let kind = match e.kind() {
            graphopt_onnx::OnnxErrorKind::Io => ErrorKind::Io,
            graphopt_onnx::OnnxErrorKind::Parse => ErrorKind::Parse,
            graphopt_onnx::OnnxErrorKind::Unsupported => ErrorKind::Unsupported,
        };
        Error::caused_by(kind, e.to_string(), e)
    }
}

impl From<graphopt_passes::PassError> for Error {
    fn from(e: graphopt_passes::PassError) -> Error {
        Error::caused_by(ErrorKind::Invalid, e.to_string(), e)
    }
}

impl From<graphopt_ir::IrError> for Error {
    fn from(e: graphopt_ir::IrError) -> Error {
        Error::caused_by(ErrorKind::Invalid, e.to_string(), e)
    }
}

impl From<graphopt_plan::PlanError> for Error {
    fn from(e: graphopt_plan::PlanError) -> Error {
        Error::caused_by(ErrorKind::Invalid, e.to_string(), e)
    }
}

impl From<graphopt_plan::ModelPlanError> for Error {
    fn from(e: graphopt_plan::ModelPlanError) -> Error {
        let kind = match e {
            graphopt_plan::ModelPlanError::BudgetTooSmall { .. } => ErrorKind::Budget,
            _ => ErrorKind::Invalid,
        };
        Error::caused_by(kind, e.to_string(), e)
    }
}

/// tract's errors (the reference executor, npz reading): the chain is
/// printed on the line (`a: b: c`) and kept as the source.
impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        let message = format!("{e:#}");
        let source: Box<dyn std::error::Error + Send + Sync + 'static> = e.into();
        Error {
            source: Some(Arc::from(source)),
            ..Error::with_kind(ErrorKind::Runtime, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn within_keeps_kind_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = Error::caused_by(ErrorKind::Io, "cannot open: gone", io).within("m.onnx");
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.message(), "m.onnx: cannot open: gone");
        assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("gone"));
        // Not prefixed twice.
        assert_eq!(e.clone().within("m.onnx").message(), e.message());
    }

    #[test]
    fn one_line() {
        assert_eq!(Error::budget("a\nb").to_string(), "a b");
        assert_eq!(Error::budget("x").kind(), ErrorKind::Budget);
    }
}
