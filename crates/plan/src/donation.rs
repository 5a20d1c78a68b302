//! Donation: a graph output written over a graph input of the same type and
//! shape, so that what a training step reads and replaces is held once.
//!
//! A training step built with its optimizer reads each parameter `p` (and
//! AdamW's `p_m`, `p_v`, `step`) as a graph input and writes the updated
//! value as the output `p_new`. Without donation the arena holds both, and
//! a runtime looping the step copies one into the other. With donation
//! `p_new` takes `p`'s bytes: the input's storage lives to the end of the
//! step, and the output is placed there once the input is dead (or in place,
//! at the node that reads the input last, where that node is elementwise).
//! After a step the runtime finds the new value where the next step reads
//! the old one.
//!
//! The pairs are declared once, in the model's metadata under
//! [`DONATE_KEY`] (`in:out,in:out`, with `%`, `:` and `,` inside a name
//! written `%25`, `%3A`, `%2C`: torch names such as `onnx::Conv_117`);
//! `graphopt grad` writes them, so files carry them. The planner
//! ([`crate::liveness`]) honours a pair when:
//! 1. the input is a runtime graph input and the output a graph output;
//! 2. both are tensors of one element type and size;
//! 3. no node reads the input after the output's producer, and the
//!    producer reads it only if it may write in place over it
//!    ([`crate::inplace_rule`]: elementwise, or the input is the one an
//!    `Over` rule names, a Scatter's `data` or a Gemm's `C`).
//!
//! Pairs that fail are planned apart and listed with why in
//! [`crate::Plan::donations_refused`].
//!
//! ```text
//! inputs p, g; p_new = Sub(p, Mul(g, lr))     donate p:p_new
//! before: p [0, 2)  t [0, 1)  p_new [1, end]  (three buffers)
//! after:  p and p_new one buffer, p_new written in place over p at Sub
//! ```

use graphopt_ir::{Graph, Model, ValueId};

/// The metadata key of the donation table.
pub const DONATE_KEY: &str = "graphopt.donate";

/// The model's declared pairs (input name, output name), in order.
pub fn declared_donations(m: &Model) -> Vec<(String, String)> {
    m.metadata_props
        .iter()
        .filter(|(k, _)| k == DONATE_KEY)
        .flat_map(|(_, v)| parse_table(v))
        .collect()
}

/// `in:out,in:out` as pairs; malformed entries are skipped. An entry with
/// more than one `:` (written, unescaped, before names were escaped) is
/// read as `p:p_new` where one split gives that.
pub fn parse_table(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|e| {
            let e = e.trim();
            let (i, o) = match e.matches(':').count() {
                1 => e.split_once(':')?,
                _ => e
                    .match_indices(':')
                    .map(|(k, _)| (&e[..k], &e[k + 1..]))
                    .find(|(i, o)| o.strip_suffix("_new") == Some(*i))?,
            };
            let (i, o) = (unescape(i.trim()), unescape(o.trim()));
            (!i.is_empty() && !o.is_empty()).then_some((i, o))
        })
        .collect()
}

/// A name as the table writes it.
fn escape(name: &str) -> String {
    name.replace('%', "%25")
        .replace(':', "%3A")
        .replace(',', "%2C")
}

fn unescape(name: &str) -> String {
    name.replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
}

/// Sets the model's table to `pairs` (removing it when empty).
pub fn set_donations(m: &mut Model, pairs: &[(String, String)]) {
    m.metadata_props.retain(|(k, _)| k != DONATE_KEY);
    if !pairs.is_empty() {
        let table: Vec<String> = pairs
            .iter()
            .map(|(i, o)| format!("{}:{}", escape(i), escape(o)))
            .collect();
        m.metadata_props
            .push((DONATE_KEY.to_string(), table.join(",")));
    }
}

/// The declared pairs that name a runtime input and a graph output of
/// `g`, as value ids; the others with why.
pub fn resolve(g: &Graph, pairs: &[(String, String)]) -> (Vec<(ValueId, ValueId)>, Vec<String>) {
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    let runtime: Vec<ValueId> = g.runtime_inputs().collect();
    for (i, o) in pairs {
        let iv = g.value_by_name(i).filter(|v| runtime.contains(v));
        let ov = g.value_by_name(o).filter(|&v| g.is_output(v));
        match (iv, ov) {
            (Some(iv), Some(ov)) => {
                let ti = g.ty(iv).and_then(|t| t.as_tensor());
                let to = g.ty(ov).and_then(|t| t.as_tensor());
                let same = matches!((ti, to), (Some(a), Some(b)) if a.elem == b.elem
                    && a.shape.as_ref().and_then(|s| s.numel()) == b.shape.as_ref().and_then(|s| s.numel())
                    && a.shape.as_ref().and_then(|s| s.numel()).is_some());
                if same {
                    ok.push((iv, ov));
                } else {
                    refused.push(format!("{i}:{o}: not one element type and size"));
                }
            }
            (None, _) => refused.push(format!("{i}:{o}: '{i}' is not a runtime graph input")),
            (_, None) => refused.push(format!("{i}:{o}: '{o}' is not a graph output")),
        }
    }
    (ok, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_round_trips_through_metadata() {
        let mut m = Model::new(Graph::new("g"), 17);
        let pairs = vec![
            ("w".to_string(), "w_new".to_string()),
            ("step".to_string(), "step_new".to_string()),
        ];
        set_donations(&mut m, &pairs);
        assert_eq!(
            m.metadata_props,
            vec![(DONATE_KEY.to_string(), "w:w_new,step:step_new".to_string())]
        );
        assert_eq!(declared_donations(&m), pairs);
        set_donations(&mut m, &[]);
        assert!(m.metadata_props.is_empty());
        assert_eq!(
            parse_table(" a : b ,bad, :x"),
            vec![("a".into(), "b".into())]
        );
    }

    #[test]
    fn names_with_colons_commas_and_percents_round_trip() {
        let mut m = Model::new(Graph::new("g"), 17);
        let pairs: Vec<(String, String)> = ["onnx::Conv_117", "a,b", "50%:3A"]
            .iter()
            .map(|p| (p.to_string(), format!("{p}_new")))
            .collect();
        set_donations(&mut m, &pairs);
        assert_eq!(declared_donations(&m), pairs);
        // Tables written before names were escaped.
        assert_eq!(
            parse_table("onnx::Conv_117:onnx::Conv_117_new,w:w_new,x::y:z"),
            vec![
                ("onnx::Conv_117".into(), "onnx::Conv_117_new".into()),
                ("w".into(), "w_new".into()),
            ]
        );
    }
}
