//! Identity elimination.
//!
//! `y = Identity(x)` ==> readers of `y` read `x`.
//!
//! When `y` is a graph output its name is part of the model's interface, so
//! the pass renames `x` to `y` instead, which is possible when `x` is not a
//! graph input, not already a graph output and not a value captured from an
//! enclosing graph; otherwise the Identity stays. Works in subgraphs too.
//!
//! ```text
//! before:                                  after:
//! g (float[2] x) => (float[2] y) {         g (float[2] x) => (float[2] y) {
//!   a = Relu (x)                             y = Relu (x)
//!   b = Identity (a)                       }
//!   y = Identity (b)
//! }
//! ```

use crate::util::{bypass, for_each_subgraph};
use crate::{Pass, PassError, PassStats};
use graphopt_ir::{Graph, Model};

pub struct EliminateIdentity;

impl Pass for EliminateIdentity {
    fn name(&self) -> &'static str {
        "eliminate_identity"
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for_each_subgraph(&mut model.graph, &mut |g| eliminate(g, &mut stats))?;
        eliminate(&mut model.graph, &mut stats)?;
        Ok(stats)
    }
}

fn eliminate(g: &mut Graph, stats: &mut PassStats) -> Result<(), PassError> {
    let identities: Vec<_> = g
        .nodes()
        .filter(|&n| {
            let d = g.node(n);
            d.op_type == "Identity" && (d.domain.is_empty() || d.domain == "ai.onnx")
        })
        .collect();
    for n in identities {
        let d = g.node(n);
        let (Some(x), Some(_)) = (d.input(0), d.output(0)) else {
            continue;
        };
        if d.inputs().len() != 1 || d.outputs().len() != 1 {
            continue;
        }
        bypass(g, n, x, stats)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn chain_into_output() {
        assert_pass(
            &EliminateIdentity,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  a = Relu (x)
  b = Identity (a)
  y = Identity (b)
}
"#,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  y = Relu (x)
}
"#,
        );
    }

    #[test]
    fn keeps_input_passthrough() {
        assert_unchanged(
            &EliminateIdentity,
            r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  y = Identity (x)
}
"#,
        );
    }
}
