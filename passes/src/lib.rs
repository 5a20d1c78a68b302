//! graphopt's optimization passes.
//!
//! One pass per file. Each file opens with a `//!` comment saying what the
//! pass does, why, what must hold before it runs, and a before→after example
//! in ONNX text. Every pass is listed once in [`registry`] (through the
//! `passes!` macro below), which the CLI's `--passes`, `graphopt passes` and
//! the unknown-name error all read. Adding a pass means: its file, one line
//! in `passes!`, optionally one line in [`default_pipeline`], and its
//! fixtures under `testdata/passes/<name>/`.
//!
//! Passes run through the [`manager`], which verifies the IR after each pass
//! and can dump it, time it, and stop early to bisect.

pub mod manager;
mod util;

use graphopt_ir::Model;
use std::collections::BTreeMap;
use std::fmt;

/// What a pass reports about one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Did the pass change the model?
    pub changed: bool,
    /// Named counters (`nodes_removed`, `initializers_removed`,
    /// `bytes_saved`, ...), in name order.
    pub counters: BTreeMap<&'static str, u64>,
}

impl PassStats {
    /// Adds `n` to counter `name` (and marks the model changed if `n > 0`).
    pub fn add(&mut self, name: &'static str, n: u64) {
        if n > 0 {
            self.changed = true;
            *self.counters.entry(name).or_default() += n;
        }
    }

    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    pub fn merge(&mut self, other: &PassStats) {
        self.changed |= other.changed;
        for (k, v) in &other.counters {
            *self.counters.entry(k).or_default() += v;
        }
    }
}

/// A pass failed: one line saying why and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassError(pub String);

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for PassError {}

impl From<graphopt_ir::IrError> for PassError {
    fn from(e: graphopt_ir::IrError) -> Self {
        PassError(e.0)
    }
}

/// A transformation of the model.
pub trait Pass {
    /// The registry name (snake_case, same as the file name).
    fn name(&self) -> &'static str;
    /// Runs the pass once.
    fn run(&self, model: &mut Model) -> Result<PassStats, PassError>;
}

/// One registry entry.
pub struct PassInfo {
    pub name: &'static str,
    pub doc: &'static str,
    pub make: fn() -> Box<dyn Pass>,
}

/// Declares the pass modules and the registry in one list.
macro_rules! passes {
    ($($module:ident :: $ty:ident => $doc:literal,)*) => {
        $(pub mod $module;)*
        /// Every pass, in name order, with its one-line doc.
        pub fn registry() -> &'static [PassInfo] {
            static REGISTRY: &[PassInfo] = &[
                $(PassInfo {
                    name: stringify!($module),
                    doc: $doc,
                    make: || Box::new($module::$ty),
                },)*
            ];
            REGISTRY
        }
    };
}

passes! {
    dce::Dce => "dead-code elimination: unused nodes, initializers, value_info and captures",
    eliminate_identity::EliminateIdentity => "removes Identity nodes, keeping graph output names",
}

/// Looks up a pass by name (`-` and `_` are the same). The error lists the
/// valid names.
pub fn lookup(name: &str) -> Result<Box<dyn Pass>, PassError> {
    let norm = name.trim().replace('-', "_");
    registry()
        .iter()
        .find(|p| p.name == norm)
        .map(|p| (p.make)())
        .ok_or_else(|| {
            let names: Vec<&str> = registry().iter().map(|p| p.name).collect();
            PassError(format!(
                "unknown pass '{name}'; valid passes: {}",
                names.join(", ")
            ))
        })
}

/// Parses a comma-separated pass list. `none` (or an empty list) is no pass.
pub fn parse_pipeline(list: &str) -> Result<Vec<Box<dyn Pass>>, PassError> {
    if list.trim() == "none" || list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',').map(lookup).collect()
}

/// The pipeline `graphopt optimize` runs by default, to a fixed point.
pub fn default_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        // First, because it only rewires uses: every later pass sees
        // producers directly, and the nodes it removes are gone for good.
        Box::new(eliminate_identity::EliminateIdentity),
        // Last, to sweep what the passes before it left unused.
        Box::new(dce::Dce),
    ]
}
