//! Addition of zero, either sign.
//!
//! `Add(x, 0)`, `Add(0, x)` and `Sub(x, 0)` with a constant all-zero
//! operand that broadcasts nothing (the rules of `eliminate_noops`'
//! neutral operands: the constant's shape fits inside `x`'s and the output
//! has `x`'s shape) ==> `x`, whatever the sign of the float zeros.
//!
//! `eliminate_noops` removes only the bit-exact forms (`x + (-0)`,
//! `x - (+0)`), because `-0 + (+0)` is `+0`: here `x + (+0)` is removed
//! too, so an element of `x` that is `-0` stays `-0` where the original
//! gave `+0`. The two compare equal, and only a later division by that
//! element or a sign test could tell them apart, so the pass is not
//! [`Pass::exact`] (held to relative L2 instead of identical bits). The
//! zero biases of freshly initialised or pruned Linear layers and
//! LayerNorms (`Add(MatMul(x, W), b)` with `b = 0`) are the usual source;
//! onnxsim and onnxslim drop them too. Works in subgraphs.
//!
//! ```text
//! before:                                   after:
//! g (float[2,3] x) => (float[2,3] y)        g (float[2,3] x) => (float[2,3] y) {
//!   <float[3] b = {0.0, 0.0, 0.0}> {          y = Relu (x)
//!   a = Add (x, b)                          }
//!   y = Relu (a)
//! }
//! ```

use crate::eliminate_noops::neutral::neutral_operand;
use crate::pattern::{is_op, walk_typed, TypedGraph};
use crate::{Pass, PassContext, PassError, PassStats};
use graphopt_ir::Model;

pub struct EliminateZeroAdd;

impl Pass for EliminateZeroAdd {
    fn name(&self) -> &'static str {
        "eliminate_zero_add"
    }

    fn exact(&self) -> bool {
        false
    }

    fn run(&self, model: &mut Model) -> Result<PassStats, PassError> {
        self.run_in(model, &mut PassContext::new())
    }

    fn run_in(&self, model: &mut Model, cx: &mut PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let typed = cx.types(model);
        walk_typed(&mut model.graph, typed, &mut |g, tg| {
            let t = TypedGraph { tg };
            for n in g.nodes().collect::<Vec<_>>() {
                if g.is_live_node(n) && (is_op(g.node(n), "Add") || is_op(g.node(n), "Sub")) {
                    neutral_operand(g, &t, n, &mut stats, true)?;
                }
            }
            Ok(())
        })?;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::testing::{assert_pass, assert_unchanged};

    #[test]
    fn positive_zero_bias_goes() {
        assert_pass(
            &EliminateZeroAdd,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,3] x) => (float[2,3] y) <float[3] b = {0.0, 0.0, 0.0}> {
              a = Add (b, x)
              y = Relu (a)
            }"#,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,3] x) => (float[2,3] y) {
              y = Relu (x)
            }"#,
        );
    }

    #[test]
    fn broadcasting_or_nonzero_stays() {
        assert_unchanged(
            &EliminateZeroAdd,
            r#"<ir_version: 8, opset_import: ["" : 17]>
            g (float[3] x) => (float[2,3] y, float[3] z) <float[2,3] b = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0}, float[3] c = {0.0, 1.0, 0.0}> {
              y = Add (x, b)
              z = Add (x, c)
            }"#,
        );
    }
}
