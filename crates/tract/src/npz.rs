//! numpy `.npz` files (a zip of `.npy` arrays, stored uncompressed, as
//! `np.savez` writes them): read any such file without panicking, whatever
//! its bytes, and write one that numpy reads back.

use crate::TractTensor;
use anyhow::{bail, Context};
use graphopt_ir::Model;
use std::collections::BTreeMap;
use std::path::Path;
use tract_onnx::prelude::{f16, DatumType, Tensor};

/// The model's runtime inputs (graph inputs without an initializer), in
/// order, from the arrays of the same names in `path`.
pub fn read_inputs(path: &Path, model: &Model) -> anyhow::Result<Vec<TractTensor>> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut arrays = read(&bytes).with_context(|| format!("{}", path.display()))?;
    let g = &model.graph;
    let mut out = Vec::new();
    for &v in &g.inputs {
        if g.initializer(v).is_some() {
            continue;
        }
        let name = g.name(v);
        let t = arrays.remove(name).with_context(|| {
            let have: Vec<&str> = arrays.keys().map(String::as_str).collect();
            format!(
                "{}: no array named '{name}' (it has: {})",
                path.display(),
                have.join(", ")
            )
        })?;
        out.push(t);
    }
    Ok(out)
}

/// Every array of an npz, by name (without `.npy`).
pub fn read(b: &[u8]) -> anyhow::Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for m in members(b)? {
        let data = &b[m.start..m.start + m.len];
        let t = npy(data).with_context(|| format!("array '{}.npy'", m.name))?;
        out.insert(m.name, t);
    }
    Ok(out)
}

/// One array stored in an npz: its name (without `.npy`) and where its
/// `.npy` bytes lie in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub start: usize,
    pub len: usize,
}

/// The arrays of an npz and where each lies, in the zip's order. Only
/// stored (uncompressed) members are accepted, as `np.savez` writes them:
/// each is then a plain `.npy` inside the file, readable in place.
pub fn members(b: &[u8]) -> anyhow::Result<Vec<Member>> {
    let u16_at = |i: usize| -> anyhow::Result<usize> {
        let s = b
            .get(i..i.saturating_add(2))
            .context("truncated zip structure")?;
        Ok(u16::from_le_bytes([s[0], s[1]]) as usize)
    };
    let u32_at = |i: usize| -> anyhow::Result<usize> {
        let s = b
            .get(i..i.saturating_add(4))
            .context("truncated zip structure")?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
    };
    // End of central directory: signature 0x06054b50, 22 bytes + comment.
    let eocd = (0..b.len().saturating_sub(21))
        .rev()
        .find(|&i| b[i..i + 4] == [0x50, 0x4b, 0x05, 0x06])
        .context("not a zip file (no end of central directory)")?;
    let count = u16_at(eocd + 10)?;
    let mut p = u32_at(eocd + 16)?;
    let mut out = Vec::new();
    for _ in 0..count {
        if u32_at(p)? != 0x0201_4b50 {
            bail!("bad zip central directory");
        }
        let method = u16_at(p + 10)?;
        let csize = u32_at(p + 20)?;
        let (nlen, xlen, clen) = (u16_at(p + 28)?, u16_at(p + 30)?, u16_at(p + 32)?);
        let local = u32_at(p + 42)?;
        let name = b
            .get(p + 46..p + 46 + nlen)
            .context("truncated zip entry name")?;
        let name = String::from_utf8_lossy(name).to_string();
        p += 46 + nlen + xlen + clen;
        if method != 0 {
            bail!("'{name}' is compressed; save the arrays with np.savez, not np.savez_compressed");
        }
        if u32_at(local)? != 0x0403_4b50 {
            bail!("bad zip local header for '{name}'");
        }
        let start = local + 30 + u16_at(local + 26)? + u16_at(local + 28)?;
        if b.get(start..start.saturating_add(csize)).is_none() {
            bail!("truncated zip entry '{name}'");
        }
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        out.push(Member {
            name: key,
            start,
            len: csize,
        });
    }
    Ok(out)
}

/// Where an `.npy` array's values lie and what they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyLayout {
    /// numpy's `descr`, e.g. `<f4`.
    pub descr: String,
    pub shape: Vec<usize>,
    /// Offset of the first value from the start of the `.npy` bytes.
    pub data_offset: usize,
    /// Elements (the product of the shape).
    pub elements: usize,
}

/// The header of one `.npy` array (format 1.0 to 3.0, C order, little
/// endian): the values are not read, only checked to be all there for
/// the dtypes [`npy_width`] knows.
pub fn npy_layout(b: &[u8]) -> anyhow::Result<NpyLayout> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        bail!("not an .npy array");
    }
    let (hlen, off): (usize, usize) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 => {
            let s = b.get(8..12).context("truncated header")?;
            (u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize, 12)
        }
        v => bail!("unsupported .npy format version {v}"),
    };
    let header = b
        .get(off..off.saturating_add(hlen))
        .context("truncated header")?;
    let header = std::str::from_utf8(header).context("header is not text")?;
    let field = |k: &str| -> Option<String> {
        let i = header.find(&format!("'{k}'"))? + k.len() + 2;
        let rest = header
            .get(i..)?
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        Some(rest.to_string())
    };
    let descr = field("descr").context("no descr")?;
    let descr = descr
        .trim_start_matches('\'')
        .split('\'')
        .next()
        .unwrap_or("")
        .to_string();
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        bail!("Fortran-order arrays are not supported");
    }
    let shape_s = field("shape").context("no shape")?;
    let inner = shape_s
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("");
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>())
        .collect::<Result<_, _>>()
        .context("bad shape")?;
    let elements = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .context("shape too large")?;
    let data_offset = off + hlen;
    if let Some(w) = npy_width(&descr) {
        let end = elements
            .checked_mul(w)
            .and_then(|len| len.checked_add(data_offset));
        if end.is_none_or(|e| e > b.len()) {
            bail!("truncated data");
        }
    }
    Ok(NpyLayout {
        descr,
        shape,
        data_offset,
        elements,
    })
}

/// The element type of a numpy `descr` graphopt reads.
pub fn npy_dtype(descr: &str) -> Option<graphopt_ir::DType> {
    use graphopt_ir::DType::*;
    Some(match descr {
        "<f4" => F32,
        "<f8" => F64,
        "<f2" => F16,
        "<i8" => I64,
        "<i4" => I32,
        "<i2" => I16,
        "|i1" => I8,
        "|u1" => U8,
        "<u2" => U16,
        "<u4" => U32,
        "<u8" => U64,
        "|b1" => Bool,
        _ => return None,
    })
}

/// Bytes per element of the numpy dtypes graphopt reads.
pub fn npy_width(descr: &str) -> Option<usize> {
    npy_dtype(descr)?.bits().map(|b| b as usize / 8)
}

/// One `.npy` array (format 1.0 to 3.0, C order, little endian).
pub fn npy(b: &[u8]) -> anyhow::Result<Tensor> {
    let l = npy_layout(b)?;
    let (shape, n, descr) = (l.shape, l.elements, l.descr);
    let data = &b[l.data_offset..];
    let take = |w: usize| -> anyhow::Result<&[u8]> {
        n.checked_mul(w)
            .and_then(|len| data.get(..len))
            .context("truncated data")
    };
    macro_rules! arr {
        ($t:ty, $w:expr) => {{
            let v: Vec<$t> = take($w)?
                .chunks_exact($w)
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of the width")))
                .collect();
            Tensor::from_shape(&shape, &v)?
        }};
    }
    Ok(match descr.as_str() {
        "<f4" => arr!(f32, 4),
        "<f8" => arr!(f64, 8),
        "<i8" => arr!(i64, 8),
        "<i4" => arr!(i32, 4),
        "<i2" => arr!(i16, 2),
        "|i1" => arr!(i8, 1),
        "|u1" => arr!(u8, 1),
        "<u2" => arr!(u16, 2),
        "<u4" => arr!(u32, 4),
        "<u8" => arr!(u64, 8),
        "|b1" => {
            let v: Vec<bool> = take(1)?.iter().map(|&x| x != 0).collect();
            Tensor::from_shape(&shape, &v)?
        }
        "<f2" => {
            let v: Vec<f16> = take(2)?
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            Tensor::from_shape(&shape, &v)?
        }
        d => bail!("unsupported dtype '{d}'"),
    })
}

/// The numpy `descr` of a tract datum type, if numpy has one.
fn descr(dt: DatumType) -> Option<&'static str> {
    Some(match dt {
        DatumType::F32 => "<f4",
        DatumType::F64 => "<f8",
        DatumType::F16 => "<f2",
        DatumType::I64 => "<i8",
        DatumType::I32 => "<i4",
        DatumType::I16 => "<i2",
        DatumType::I8 => "|i1",
        DatumType::U8 => "|u1",
        DatumType::U16 => "<u2",
        DatumType::U32 => "<u4",
        DatumType::U64 => "<u8",
        DatumType::Bool => "|b1",
        _ => return None,
    })
}

/// One `.npy` array (format 1.0).
pub fn write_npy(t: &Tensor) -> anyhow::Result<Vec<u8>> {
    let d = descr(t.datum_type())
        .with_context(|| format!("numpy has no dtype for {:?}", t.datum_type()))?;
    let shape = match t.shape() {
        [] => "()".to_string(),
        [x] => format!("({x},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that the data starts at a multiple of 64 bytes, ending in '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    if t.datum_type() == DatumType::Bool {
        let v = t.to_plain_array_view::<bool>()?;
        out.extend(v.iter().map(|&b| b as u8));
    } else {
        // `descr` accepted only plain numeric types, whose tract storage is
        // the little-endian bytes numpy expects (x86-64 and aarch64 hosts).
        out.extend_from_slice(t.as_bytes());
    }
    Ok(out)
}

/// An uncompressed zip of `.npy` arrays, by name, in the given order (what
/// `np.load` reads).
pub fn write(arrays: &[(String, Tensor)]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, t) in arrays {
        let data = write_npy(t).with_context(|| format!("array '{name}'"))?;
        let fname = format!("{name}.npy");
        let crc = crc32(&data);
        let offset = out.len() as u32;
        let size = u32::try_from(data.len()).context("array over 4 GiB")?;
        let local = |sig: u32, out: &mut Vec<u8>| {
            out.extend_from_slice(&sig.to_le_bytes());
        };
        local(0x0403_4b50, &mut out);
        // version, flags, method (stored), time, date
        out.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(fname.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(fname.as_bytes());
        out.extend_from_slice(&data);

        local(0x0201_4b50, &mut central);
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&(fname.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]); // extra, comment, disk, attrs
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(fname.as_bytes());
    }
    let cd_offset = out.len() as u32;
    let n = arrays.len() as u16;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    Ok(out)
}

/// CRC-32 (IEEE), as zip needs it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_onnx::prelude::tract_ndarray;

    #[test]
    fn writes_what_it_reads() {
        let a: Tensor = tract_ndarray::arr2(&[[1f32, -2.5], [3.0, 0.0]]).into();
        let b: Tensor = tract_ndarray::arr1(&[7i64, 8, 9]).into();
        let c: Tensor = tract_ndarray::arr0(true).into();
        let bytes = write(&[
            ("a".into(), a.clone()),
            ("b".into(), b.clone()),
            ("c".into(), c.clone()),
        ])
        .unwrap();
        let back = read(&bytes).unwrap();
        assert_eq!(back["a"], a);
        assert_eq!(back["b"], b);
        assert_eq!(back["c"], c);
    }

    #[test]
    fn crc_of_a_known_string() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let a: Tensor = tract_ndarray::arr2(&[[1f32, 2.0], [3.0, 4.0]]).into();
        let good = write(&[("x".into(), a)]).unwrap();
        // Every truncation, and every single-byte change, of a valid file.
        for n in 0..good.len() {
            let _ = read(&good[..n]);
        }
        for i in 0..good.len() {
            for v in [0u8, 0xff, 0x7f, 0x10] {
                let mut b = good.clone();
                b[i] = v;
                let _ = read(&b);
            }
        }
        // The short .npy headers that used to index past the end.
        for h in [
            &b"\x93NUMPY\x02\x00\x00\x00"[..],
            b"\x93NUMPY\x01\x00\xff\xff",
        ] {
            assert!(npy(h).is_err());
        }
    }
}
