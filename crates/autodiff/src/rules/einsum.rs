//! `Einsum`. For `Y = Einsum("A,B,...->C")(X_A, X_B, ...)` without
//! repeated indices inside a term (no diagonals), the gradient of an
//! operand is itself an einsum of the output gradient and the other
//! operands, contracted back to the operand's indices:
//!
//! ```text
//! y = Einsum <equation = "bhqd,bhkd->bhqk"> (q, k)
//! ==>  q_grad = Einsum <equation = "bhqk,bhkd->bhqd"> (y_grad, k)
//!      k_grad = Einsum <equation = "bhqk,bhqd->bhkd"> (y_grad, q)
//! ```
//!
//! - An implicit output (no `->`) is made explicit first, as numpy does:
//!   the ellipsis, then the indices used once, in alphabetical order.
//! - An index of the operand that appears nowhere else (summed over that
//!   operand alone) is put back by `Unsqueeze` and `Expand` to the
//!   operand's shape.
//! - An ellipsis broadcast between operands (`...ij,jk->...ik` with a
//!   lower-rank `...` in one operand) is summed back to the operand's
//!   shape as for the elementwise ops; then the operand's ellipsis must
//!   lead its term.
//!
//! It reads the other operands, as MatMul does.

use super::dy;
use crate::cx::Cx;
use crate::Result;
use graphopt_ir::{AttrValue, Attribute, Dim, ValueId};

type Grads = Result<Vec<Option<ValueId>>>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tok {
    L(char),
    Ell,
}

fn parse_term(s: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            out.push(Tok::Ell);
            rest = r;
        } else {
            let c = rest.chars().next()?;
            if !c.is_ascii_alphabetic() {
                return None;
            }
            out.push(Tok::L(c));
            rest = &rest[1..];
        }
    }
    (out.iter().filter(|t| **t == Tok::Ell).count() <= 1).then_some(out)
}

fn term_str(t: &[Tok]) -> String {
    t.iter()
        .map(|t| match t {
            Tok::L(c) => c.to_string(),
            Tok::Ell => "...".into(),
        })
        .collect()
}

fn letters(t: &[Tok]) -> Vec<char> {
    t.iter()
        .filter_map(|t| match t {
            Tok::L(c) => Some(*c),
            Tok::Ell => None,
        })
        .collect()
}

/// The operand terms and the (explicit) output term.
fn parse(eq: &str) -> Option<(Vec<Vec<Tok>>, Vec<Tok>)> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<Vec<Tok>> = lhs.split(',').map(parse_term).collect::<Option<_>>()?;
    let out = match rhs {
        Some(r) => parse_term(&r)?,
        None => {
            let mut out = Vec::new();
            if terms.iter().any(|t| t.contains(&Tok::Ell)) {
                out.push(Tok::Ell);
            }
            let all: Vec<char> = terms.iter().flat_map(|t| letters(t)).collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|d| *d == c).count() == 1)
                .collect();
            once.sort_unstable();
            out.extend(once.into_iter().map(Tok::L));
            out
        }
    };
    Some((terms, out))
}

pub fn einsum(cx: &mut Cx, dys: &[Option<ValueId>]) -> Grads {
    let d = dy(cx, dys)?;
    let eq =
        cx.g.node(cx.node)
            .attr_str("equation")
            .ok_or_else(|| cx.unsupported("the equation is missing"))?
            .to_string();
    let (terms, out) =
        parse(&eq).ok_or_else(|| cx.unsupported(format!("cannot read the equation '{eq}'")))?;
    let n = cx.g.node(cx.node).inputs().len();
    if terms.len() != n {
        return Err(cx.unsupported(format!(
            "the equation '{eq}' has {} operands, the node {n}",
            terms.len()
        )));
    }
    for t in terms.iter().chain(std::iter::once(&out)) {
        let l = letters(t);
        if (1..l.len()).any(|i| l[..i].contains(&l[i])) {
            return Err(cx.unsupported(format!(
                "repeated indices in a term (diagonals, traces) of '{eq}' have no rule yet"
            )));
        }
    }
    let y = cx.y(0)?;
    let yd = cx
        .dims(y)
        .ok_or_else(|| cx.unsupported("the output's rank is unknown"))?;
    let eo = yd.len() as i64 - letters(&out).len() as i64;
    // The output's ellipsis dims.
    let ell_dims: Vec<Dim> = match out.iter().position(|t| *t == Tok::Ell) {
        Some(p) if eo >= 0 => yd[p..p + eo as usize].to_vec(),
        _ => Vec::new(),
    };
    let mut grads = vec![None; n];
    for (i, term) in terms.iter().enumerate() {
        if !cx.need(i) {
            continue;
        }
        let x = cx.x(i)?;
        let xd = cx
            .dims(x)
            .ok_or_else(|| cx.unsupported(format!("the rank of operand {i} is unknown")))?;
        let has_ell = term.contains(&Tok::Ell);
        if has_ell && !out.contains(&Tok::Ell) {
            return Err(cx.unsupported(format!("an ellipsis summed away ('{eq}') has no rule yet")));
        }
        let ei = xd.len() as i64 - letters(term).len() as i64;
        let others: Vec<usize> = (0..n).filter(|&j| j != i).collect();
        let avail: Vec<char> = letters(&out)
            .into_iter()
            .chain(others.iter().flat_map(|&j| letters(&terms[j])))
            .collect();
        let missing: Vec<char> = letters(term)
            .into_iter()
            .filter(|c| !avail.contains(c))
            .collect();
        let reduced: Vec<Tok> = term
            .iter()
            .copied()
            .filter(|t| !matches!(t, Tok::L(c) if missing.contains(c)))
            .collect();
        let mut eqs = vec![term_str(&out)];
        eqs.extend(others.iter().map(|&j| term_str(&terms[j])));
        let geq = format!("{}->{}", eqs.join(","), term_str(&reduced));
        let mut ins = vec![d];
        for &j in &others {
            ins.push(cx.x(j)?);
        }
        let gr = if others.is_empty() && reduced == out {
            // `Einsum("C->C")` would be an identity.
            d
        } else {
            cx.op(
                "Einsum",
                &ins,
                vec![Attribute::new(
                    "equation",
                    AttrValue::String(geq.into_bytes()),
                )],
            )?
        };
        // Positions of the operand's axes, the ellipsis spanning `ei`.
        let mut pos = Vec::new();
        let mut k = 0i64;
        for t in term {
            match t {
                Tok::L(c) => {
                    pos.push((Some(*c), k));
                    k += 1;
                }
                Tok::Ell => k += ei,
            }
        }
        grads[i] = Some(if !missing.is_empty() {
            if has_ell {
                return Err(cx.unsupported(format!(
                    "an index summed over one operand next to an ellipsis ('{eq}') has no rule yet"
                )));
            }
            let axes: Vec<i64> = pos
                .iter()
                .filter(|(c, _)| c.is_some_and(|c| missing.contains(&c)))
                .map(|&(_, p)| p)
                .collect();
            let u = cx.unsqueeze(gr, &axes)?;
            let s = cx.shape_of(x)?;
            cx.op("Expand", &[u, s], vec![])?
        } else if has_ell {
            if ei < eo && term.first() != Some(&Tok::Ell) {
                return Err(cx.unsupported(format!(
                    "a broadcast ellipsis that does not lead its term ('{eq}') has no rule yet"
                )));
            }
            // The gradient's dims: the output's ellipsis, the operand's letters.
            let mut gdims = Vec::new();
            let mut p = 0usize;
            for t in term {
                match t {
                    Tok::L(_) => {
                        gdims.push(xd[p].clone());
                        p += 1;
                    }
                    Tok::Ell => {
                        gdims.extend(ell_dims.iter().cloned());
                        p += ei.max(0) as usize;
                    }
                }
            }
            cx.unbroadcast(gr, &gdims, x)?
        } else {
            gr
        });
    }
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implicit_output_is_made_explicit() {
        let (t, o) = parse("ij,jk").unwrap();
        assert_eq!(term_str(&t[0]), "ij");
        assert_eq!(term_str(&o), "ik");
        let (_, o) = parse("...ij, ...jk").unwrap();
        assert_eq!(term_str(&o), "...ik");
        assert!(parse("i..j").is_none());
    }
}
