//! The ONNX textual syntax (onnx `docs/Syntax.md`, the format read by
//! `onnx.parser` and written by `onnx.printer`), printed from and parsed into
//! graphopt IR.
//!
//! ```text
//! <
//!    ir_version: 8,
//!    opset_import: ["" : 17, "com.microsoft" : 1]
//! >
//! agraph (float[N,128] X, float[128,10] W) => (float[N,10] C)
//!    <float[10] B = {0.0, 1.0, ...}, float[N,10] T>
//! {
//!    T = MatMul (X, W)
//!    C = com.microsoft.FusedAdd <alpha = 1.0> (T, B)
//! }
//! ```
//!
//! # What survives a round trip
//!
//! Everything the syntax can express survives print → parse: names, types
//! (symbolic `N`, unknown `?`, scalar `float`, unknown rank `float[]`,
//! `seq`/`map`/`optional`/`sparse_tensor`/`opaque`), initializers (bit-exact:
//! floats print in Rust's shortest round-trip form, half and 8-bit floats
//! print their bit patterns as `onnx.printer` does), value_info, node
//! labels, domains, overloads, missing optional inputs and outputs (`""`),
//! all attribute kinds, attribute references (`alpha: float = @beta`), the
//! model header and model-local functions. Doc strings other than the
//! model's and functions', metadata other than the model's, type and dim
//! denotations, and `quantization_annotation` have no syntax and are dropped.
//! NaN payloads other than the default quiet NaN print as `nan`/`-nan`.
//!
//! # Conventions the syntax leaves open, and graphopt's extensions
//!
//! 1. `float` is a scalar (rank 0) and `float[]` a tensor of unknown rank,
//!    as `onnx.parser` reads them.
//! 2. Sub-byte types (`int4`, `uint4`, `int2`, `uint2`, `float4e2m1`) print
//!    one value per element (not packed); `float16`, `bfloat16`, the 8-bit
//!    and 6-bit floats print their bit patterns as integers (`onnx.printer`'s
//!    form). For `float16`/`bfloat16` the parser also accepts float literals.
//!    `complex64`/`complex128` print `2 * numel` floats (real, imaginary).
//! 3. Elided tensors (more elements than [`PrintOptions::elide_above`]) print
//!    in ONNX's external-data form, which `onnx.parser` accepts:
//!    `float[64,64] W = ["elided": "4096 elements, fnv1a64 0123..."]`. The
//!    hash makes data changes visible in snapshots. [`parse_model`] reads an
//!    elided tensor back as zeros (empty strings for `string`); any other
//!    external data is an error.
//! 4. Extensions `onnx.parser` rejects, used only where the standard syntax
//!    cannot express the IR: quoted attribute names, quoted op types and
//!    domains (`"my-domain"."My-Op"`), quoted overloads, a quoted name for a
//!    graph attribute (`body = "my graph" (...) => (...) {...}`), `seq()` for
//!    a sequence of unknown element type, the `undefined` element type,
//!    `\xNN` escapes for bytes that are not UTF-8, sparse tensors
//!    (`sparse_tensor(float[3,4]) S = (float[2] {1.0, 2.0}, int64[2] {0, 7})`:
//!    values then indices, dims from the type), and initializers inside a
//!    function's value_info block.

mod parse;
mod print;
mod util;

pub use parse::{parse_graph, parse_model};
pub use print::{print_graph, print_model};

/// How to print.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintOptions {
    /// Elide the data of tensors with more elements than this (see the
    /// crate docs for the elided form); `None` prints everything.
    pub elide_above: Option<usize>,
}

impl Default for PrintOptions {
    fn default() -> PrintOptions {
        PrintOptions {
            elide_above: Some(16),
        }
    }
}

impl PrintOptions {
    /// Print every tensor in full (text that parses back bit-exactly).
    pub fn full() -> PrintOptions {
        PrintOptions { elide_above: None }
    }
}

/// A parse error: one line with `line:column` (1-based, columns count
/// characters) and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[cfg(test)]
mod tests;
