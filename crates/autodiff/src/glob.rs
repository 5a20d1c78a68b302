//! Glob matching for `--trainable` and `--frozen`: `*` matches any run of
//! characters, `?` one character, everything else itself.

/// True when `name` matches `pattern`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Classic backtracking over the last `*`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs() {
        assert!(glob_match("*", "encoder.weight"));
        assert!(glob_match("encoder.*", "encoder.weight"));
        assert!(glob_match("*.bias", "fc1.bias"));
        assert!(!glob_match("*.bias", "fc1.weight"));
        assert!(glob_match("fc?.weight", "fc1.weight"));
        assert!(!glob_match("fc?.weight", "fc12.weight"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
    }
}
