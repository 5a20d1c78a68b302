//! Spelling rules shared by the printer and the parser: identifiers, quoting,
//! number formats, and the element encoding of tensor literals.

use graphopt_ir::DType;

/// `[A-Za-z_][A-Za-z0-9_]*`, the identifiers of `onnx.parser`.
pub fn is_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Words that start a type where a value name may also stand
/// (`(float)` would read as a type).
pub const TYPE_KEYWORDS: &[&str] = &["seq", "map", "optional", "sparse_tensor", "opaque"];

pub fn is_type_word(s: &str) -> bool {
    DType::from_name(s).is_some() || TYPE_KEYWORDS.contains(&s)
}

/// True when `onnx.parser` would read an identifier starting here as the
/// float `nan`/`inf`/`infinity` (its `NextIsValidFloatString`: the leading
/// letters, at most 9, not followed by a digit).
pub fn looks_like_float_word(s: &str) -> bool {
    let b = s.as_bytes();
    let n = b
        .iter()
        .take(9)
        .take_while(|c| c.is_ascii_alphabetic())
        .count();
    if b.get(n).is_some_and(|c| c.is_ascii_digit()) {
        return false;
    }
    let w = s[..n].to_ascii_lowercase();
    w == "nan" || w == "inf" || w == "infinity"
}

/// Appends `s` quoted: `"` and `\` are escaped with `\`.
pub fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Appends a byte string quoted; bytes that are not UTF-8 print as `\xNN`
/// (a graphopt extension: `onnx.parser` would read `\x41` as `x41`).
pub fn push_quoted_bytes(out: &mut String, b: &[u8]) {
    out.push('"');
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        for x in chunk.invalid() {
            out.push_str(&format!("\\x{x:02x}"));
        }
    }
    out.push('"');
}

/// A name in a position where `onnx.parser` takes a quotable identifier.
pub fn push_id(out: &mut String, s: &str) {
    if is_ident(s) && !is_type_word(s) && s != "undefined" {
        out.push_str(s);
    } else {
        push_quoted(out, s);
    }
}

/// Shortest text that parses back to the same `f32` (`nan`, `-nan`, `inf`,
/// `-inf` for the special values, as `onnx.printer` writes them). Finite
/// values always contain `.` or `e`, so they never read as integers.
pub fn fmt_f32(v: f32) -> String {
    if v.is_nan() {
        if v.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{v:?}")
    }
}

pub fn fmt_f64(v: f64) -> String {
    if v.is_nan() {
        if v.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{v:?}")
    }
}

/// How the elements of a dtype are written in a tensor literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemForm {
    /// Floats (`float`, `double`, and complex as pairs).
    F32,
    F64,
    /// Integers with a byte width, signedness; sub-byte widths in `bits`.
    Int {
        bits: u32,
        signed: bool,
    },
    /// `float16`/`bfloat16`: 16-bit patterns (floats also accepted).
    Half {
        bf16: bool,
    },
    Str,
}

/// The literal form of `d` and how many values one element takes.
pub fn elem_form(d: DType) -> (ElemForm, u64) {
    use DType::*;
    let int = |bits, signed| (ElemForm::Int { bits, signed }, 1);
    match d {
        F32 => (ElemForm::F32, 1),
        F64 => (ElemForm::F64, 1),
        Complex64 => (ElemForm::F32, 2),
        Complex128 => (ElemForm::F64, 2),
        F16 => (ElemForm::Half { bf16: false }, 1),
        BF16 => (ElemForm::Half { bf16: true }, 1),
        String => (ElemForm::Str, 1),
        I8 => int(8, true),
        U8 | Bool | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F6E2M3 | F6E3M2 => {
            int(8, false)
        }
        I16 => int(16, true),
        U16 => int(16, false),
        I32 => int(32, true),
        U32 => int(32, false),
        I64 => int(64, true),
        U64 => int(64, false),
        I4 => int(4, true),
        U4 | F4E2M1 => int(4, false),
        I2 => int(2, true),
        U2 => int(2, false),
        // Unknown element types: the raw bytes.
        Undefined | Other(_) => int(8, false),
    }
}

/// Reads integer element `i` of packed little-endian `raw`.
pub fn read_int(raw: &[u8], bits: u32, signed: bool, i: usize) -> i128 {
    if bits < 8 {
        let per = (8 / bits) as usize;
        let byte = raw.get(i / per).copied().unwrap_or(0);
        let shift = (i % per) as u32 * bits;
        let v = (byte >> shift) & ((1u8 << bits) - 1);
        let v = v as i128;
        if signed && v >= (1 << (bits - 1)) {
            v - (1 << bits)
        } else {
            v
        }
    } else {
        let w = (bits / 8) as usize;
        let mut buf = [0u8; 16];
        if let Some(s) = raw.get(i * w..(i + 1) * w) {
            buf[..w].copy_from_slice(s);
        }
        let u = u128::from_le_bytes(buf);
        if signed && bits < 128 && (u >> (bits - 1)) & 1 == 1 {
            (u as i128) - (1i128 << bits)
        } else {
            u as i128
        }
    }
}

/// Range of integer elements of `bits` width.
pub fn int_range(bits: u32, signed: bool) -> (i128, i128) {
    if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// Appends integer elements (already range-checked) packed little-endian.
pub fn pack_ints(vals: &[i128], bits: u32) -> Vec<u8> {
    if bits < 8 {
        let per = (8 / bits) as usize;
        let mut out = vec![0u8; vals.len().div_ceil(per)];
        let mask = (1u16 << bits) as i128 - 1;
        for (i, v) in vals.iter().enumerate() {
            out[i / per] |= ((v & mask) as u8) << ((i % per) as u32 * bits);
        }
        out
    } else {
        let w = (bits / 8) as usize;
        let mut out = Vec::with_capacity(vals.len() * w);
        for v in vals {
            out.extend_from_slice(&v.to_le_bytes()[..w]);
        }
        out
    }
}

/// FNV-1a, 64-bit: a stable digest of elided data.
pub fn fnv1a64(chunks: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for c in chunks {
        for &b in *c {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips() {
        let v = vec![-8, 7, -1, 0, 3];
        let raw = pack_ints(&v, 4);
        assert_eq!(raw.len(), 3);
        let back: Vec<i128> = (0..5).map(|i| read_int(&raw, 4, true, i)).collect();
        assert_eq!(back, v);
        let v2 = vec![-2, 1, 0, -1, 1];
        let raw = pack_ints(&v2, 2);
        assert_eq!(raw.len(), 2);
        let back: Vec<i128> = (0..5).map(|i| read_int(&raw, 2, true, i)).collect();
        assert_eq!(back, v2);
        let raw = pack_ints(&[-5, u64::MAX as i128], 64);
        assert_eq!(read_int(&raw, 64, true, 0), -5);
        assert_eq!(read_int(&raw, 64, false, 1), u64::MAX as i128);
    }

    #[test]
    fn float_words() {
        assert!(looks_like_float_word("nan"));
        assert!(looks_like_float_word("NaN_x"));
        assert!(looks_like_float_word("Infinity"));
        assert!(!looks_like_float_word("info"));
        assert!(!looks_like_float_word("inf1"));
        assert!(!looks_like_float_word("body"));
    }

    #[test]
    fn floats_keep_their_bits() {
        for v in [1.0f32, 0.1, 1e20, -0.0, f32::MIN_POSITIVE, 1e-45, f32::MAX] {
            let s = fmt_f32(v);
            assert!(s.contains('.') || s.contains('e'), "{s}");
            assert_eq!(s.parse::<f32>().unwrap().to_bits(), v.to_bits());
        }
        assert_eq!(fmt_f32(f32::NEG_INFINITY), "-inf");
        assert_eq!(fmt_f64(-f64::NAN), "-nan");
    }
}
