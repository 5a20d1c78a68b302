//! Dense linear algebra in f64 for `lowrank`: the eigendecomposition of a
//! symmetric matrix (Householder tridiagonalization, then the implicit QL
//! iteration: EISPACK's `tred2` and `tql2`, as JAMA writes them), Cholesky
//! with a ridge, and a triangular solve. Matrices are row-major `Vec<f64>`.
//!
//! Sizes here are a layer's smaller side (768 on BERT-base and GPT-2), so
//! O(n³) in plain loops is seconds, not minutes, in an optimized build.

// Index loops follow the published algorithms line by line.
#![allow(clippy::needless_range_loop)]

/// Eigenvalues (descending) and eigenvectors of the symmetric `n × n`
/// matrix `a`: `vecs[j * n + i]` is component `i` of the eigenvector of
/// `vals[j]` (one vector per row).
pub fn sym_eigen(a: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(a.len(), n * n, "sym_eigen: a is not n x n");
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let mut v = a.to_vec();
    let mut d = vec![0.0; n];
    let mut e = vec![0.0; n];
    tred2(&mut v, &mut d, &mut e, n);
    // tql2 rotates pairs of columns of V: hold V transposed, so that a
    // column is a contiguous row.
    let mut vt = transpose(&v, n, n);
    tql2(&mut vt, &mut d, &mut e, n);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| d[j].total_cmp(&d[i]).then(i.cmp(&j)));
    let vals = order.iter().map(|&i| d[i]).collect();
    let mut vecs = Vec::with_capacity(n * n);
    for &i in &order {
        vecs.extend_from_slice(&vt[i * n..(i + 1) * n]);
    }
    (vals, vecs)
}

/// `a` (`rows × cols`) transposed.
pub fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; a.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = a[i * cols + j];
        }
    }
    t
}

/// Householder reduction of the symmetric `v` to tridiagonal form
/// (diagonal `d`, subdiagonal `e[1..]`), accumulating the transformation
/// in `v`.
fn tred2(v: &mut [f64], d: &mut [f64], e: &mut [f64], n: usize) {
    let at = |i: usize, j: usize| i * n + j;
    for j in 0..n {
        d[j] = v[at(n - 1, j)];
    }
    for i in (1..n).rev() {
        let mut scale = 0.0;
        let mut h = 0.0;
        for k in 0..i {
            scale += d[k].abs();
        }
        if scale == 0.0 {
            e[i] = d[i - 1];
            for j in 0..i {
                d[j] = v[at(i - 1, j)];
                v[at(i, j)] = 0.0;
                v[at(j, i)] = 0.0;
            }
        } else {
            for k in 0..i {
                d[k] /= scale;
                h += d[k] * d[k];
            }
            let mut f = d[i - 1];
            let mut g = h.sqrt();
            if f > 0.0 {
                g = -g;
            }
            e[i] = scale * g;
            h -= f * g;
            d[i - 1] = f - g;
            for x in e.iter_mut().take(i) {
                *x = 0.0;
            }
            for j in 0..i {
                f = d[j];
                v[at(j, i)] = f;
                g = e[j] + v[at(j, j)] * f;
                for k in j + 1..i {
                    g += v[at(k, j)] * d[k];
                    e[k] += v[at(k, j)] * f;
                }
                e[j] = g;
            }
            f = 0.0;
            for j in 0..i {
                e[j] /= h;
                f += e[j] * d[j];
            }
            let hh = f / (h + h);
            for j in 0..i {
                e[j] -= hh * d[j];
            }
            for j in 0..i {
                f = d[j];
                g = e[j];
                for k in j..i {
                    v[at(k, j)] -= f * e[k] + g * d[k];
                }
                d[j] = v[at(i - 1, j)];
                v[at(i, j)] = 0.0;
            }
        }
        d[i] = h;
    }
    for i in 0..n - 1 {
        v[at(n - 1, i)] = v[at(i, i)];
        v[at(i, i)] = 1.0;
        let h = d[i + 1];
        if h != 0.0 {
            for k in 0..=i {
                d[k] = v[at(k, i + 1)] / h;
            }
            for j in 0..=i {
                let mut g = 0.0;
                for k in 0..=i {
                    g += v[at(k, i + 1)] * v[at(k, j)];
                }
                for k in 0..=i {
                    v[at(k, j)] -= g * d[k];
                }
            }
        }
        for k in 0..=i {
            v[at(k, i + 1)] = 0.0;
        }
    }
    for j in 0..n {
        d[j] = v[at(n - 1, j)];
        v[at(n - 1, j)] = 0.0;
    }
    v[at(n - 1, n - 1)] = 1.0;
    e[0] = 0.0;
}

/// The implicit QL iteration on the tridiagonal (`d`, `e`), applying the
/// rotations to `vt` (the transformation, transposed).
fn tql2(vt: &mut [f64], d: &mut [f64], e: &mut [f64], n: usize) {
    for i in 1..n {
        e[i - 1] = e[i];
    }
    e[n - 1] = 0.0;
    let mut f = 0.0;
    let mut tst1: f64 = 0.0;
    let eps = f64::EPSILON;
    for l in 0..n {
        tst1 = tst1.max(d[l].abs() + e[l].abs());
        let mut m = l;
        while m < n - 1 && e[m].abs() > eps * tst1 {
            m += 1;
        }
        if m > l {
            // At most 60 sweeps per eigenvalue (it converges in 2 or 3).
            for _ in 0..60 {
                let mut g = d[l];
                let mut p = (d[l + 1] - g) / (2.0 * e[l]);
                let mut r = p.hypot(1.0);
                if p < 0.0 {
                    r = -r;
                }
                d[l] = e[l] / (p + r);
                d[l + 1] = e[l] * (p + r);
                let dl1 = d[l + 1];
                let mut h = g - d[l];
                for x in d.iter_mut().take(n).skip(l + 2) {
                    *x -= h;
                }
                f += h;
                p = d[m];
                let mut c = 1.0;
                let mut c2 = c;
                let mut c3 = c;
                let el1 = e[l + 1];
                let mut s = 0.0;
                let mut s2 = 0.0;
                for i in (l..m).rev() {
                    c3 = c2;
                    c2 = c;
                    s2 = s;
                    g = c * e[i];
                    h = c * p;
                    r = p.hypot(e[i]);
                    e[i + 1] = s * r;
                    s = e[i] / r;
                    c = p / r;
                    p = c * d[i] - s * g;
                    d[i + 1] = h + s * (c * g + s * d[i]);
                    let (lo, hi) = vt.split_at_mut((i + 1) * n);
                    let ci = &mut lo[i * n..];
                    let ci1 = &mut hi[..n];
                    for (a, b) in ci.iter_mut().zip(ci1.iter_mut()) {
                        let hb = *b;
                        *b = s * *a + c * hb;
                        *a = c * *a - s * hb;
                    }
                }
                p = -s * s2 * c3 * el1 * e[l] / dl1;
                e[l] = s * p;
                d[l] = c * p;
                if e[l].abs() <= eps * tst1 {
                    break;
                }
            }
        }
        d[l] += f;
        e[l] = 0.0;
    }
}

/// The lower Cholesky factor `L` of the symmetric positive semi-definite
/// `a` (`L Lᵀ = a + λI`), with the least ridge `λ` (from 1e-6 of the
/// mean diagonal up, by tens) that makes it positive definite.
pub fn cholesky(a: &[f64], n: usize) -> Vec<f64> {
    let mean = (0..n).map(|i| a[i * n + i]).sum::<f64>() / n.max(1) as f64;
    let mut ridge = 1e-6 * mean.max(f64::MIN_POSITIVE);
    loop {
        if let Some(l) = try_cholesky(a, n, ridge) {
            return l;
        }
        ridge *= 10.0;
    }
}

fn try_cholesky(a: &[f64], n: usize, ridge: f64) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = a[i * n + j];
            if i == j {
                s += ridge;
            }
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// `X` with `Lᵀ X = B` for lower-triangular `l` (`n × n`) and `b`
/// (`n × cols`): back substitution, column block at a time.
pub fn solve_lt(l: &[f64], b: &[f64], n: usize, cols: usize) -> Vec<f64> {
    let mut x = b.to_vec();
    for i in (0..n).rev() {
        for k in i + 1..n {
            let lki = l[k * n + i];
            if lki != 0.0 {
                let (head, tail) = x.split_at_mut(k * cols);
                let xi = &mut head[i * cols..(i + 1) * cols];
                for (a, b) in xi.iter_mut().zip(&tail[..cols]) {
                    *a -= lki * b;
                }
            }
        }
        let d = l[i * n + i];
        for a in &mut x[i * cols..(i + 1) * cols] {
            *a /= d;
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for p in 0..k {
                let x = a[i * k + p];
                for j in 0..n {
                    c[i * n + j] += x * b[p * n + j];
                }
            }
        }
        c
    }

    fn random(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
            })
            .collect()
    }

    #[test]
    fn eigen_reconstructs_a_symmetric_matrix() {
        for n in [1, 2, 5, 17, 40] {
            let x = random(n * (n + 3), n as u64);
            // A = Xᵀ X: symmetric positive semi-definite.
            let xt = transpose(&x, n + 3, n);
            let a = matmul(&xt, &x, n, n + 3, n);
            let (vals, vecs) = sym_eigen(&a, n);
            assert!(vals.windows(2).all(|w| w[0] >= w[1]), "{vals:?}");
            // A v = λ v, and the vectors are orthonormal.
            for j in 0..n {
                let v = &vecs[j * n..(j + 1) * n];
                for i in 0..n {
                    let av: f64 = (0..n).map(|k| a[i * n + k] * v[k]).sum();
                    assert!((av - vals[j] * v[i]).abs() < 1e-9, "n {n} j {j}");
                }
                for k in 0..n {
                    let dot: f64 = (0..n).map(|i| v[i] * vecs[k * n + i]).sum();
                    let want = if k == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-9, "n {n} <v{j}, v{k}> = {dot}");
                }
            }
        }
    }

    #[test]
    fn eigen_of_a_diagonal_with_repeats() {
        let a = [3.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0];
        let (vals, _) = sym_eigen(&a, 3);
        assert_eq!(vals.len(), 3);
        for (v, w) in vals.iter().zip([3.0, 3.0, 1.0]) {
            assert!((v - w).abs() < 1e-12, "{vals:?}");
        }
    }

    #[test]
    fn cholesky_and_solve() {
        let n = 6;
        let x = random(n * 9, 3);
        let xt = transpose(&x, 9, n);
        let a = matmul(&xt, &x, n, 9, n);
        let l = cholesky(&a, n);
        let lt = transpose(&l, n, n);
        let back = matmul(&l, &lt, n, n, n);
        for (p, q) in back.iter().zip(&a) {
            assert!((p - q).abs() < 1e-6 * a[0].abs().max(1.0), "{p} {q}");
        }
        let b = random(n * 2, 9);
        let sol = solve_lt(&l, &b, n, 2);
        let check = matmul(&lt, &sol, n, n, 2);
        for (p, q) in check.iter().zip(&b) {
            assert!((p - q).abs() < 1e-9, "{p} {q}");
        }
        // A singular matrix gets a ridge instead of failing.
        let l0 = cholesky(&[1.0, 1.0, 1.0, 1.0], 2);
        assert!(l0.iter().all(|v| v.is_finite()));
    }
}
