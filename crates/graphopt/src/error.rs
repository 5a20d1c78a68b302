//! One error type: a single line saying what was wrong and where (file,
//! node), as the CLI prints it.

use std::fmt;

/// A graphopt error: one line, naming the file and the node or tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(String);

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into().replace('\n', " "))
    }

    /// The same error, prefixed with where it happened (`file: ...`),
    /// unless the message already names it.
    pub fn within(self, place: &str) -> Error {
        if place.is_empty() || self.0.starts_with(place) {
            self
        } else {
            Error(format!("{place}: {}", self.0))
        }
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::new(e.to_string())
            }
        }
    )*};
}

from_display!(
    graphopt_onnx::OnnxError,
    graphopt_passes::PassError,
    graphopt_plan::PlanError,
    graphopt_plan::ModelPlanError,
    graphopt_ir::IrError,
    std::io::Error
);

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        Error::new(format!("{e:#}"))
    }
}
