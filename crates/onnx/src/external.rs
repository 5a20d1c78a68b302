//! External tensor data: reading, confined to the model's folder.

use crate::OnnxError;
use bytes::Bytes;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// Resolves `external_data` entries to bytes inside memory maps, one map per
/// data file.
pub(crate) struct ExternalReader {
    base: Option<PathBuf>,
    maps: HashMap<PathBuf, Bytes>,
    pub(crate) used: bool,
}

impl ExternalReader {
    pub(crate) fn new(base: Option<PathBuf>) -> ExternalReader {
        ExternalReader {
            base,
            maps: HashMap::new(),
            used: false,
        }
    }

    /// The bytes of `location` at `offset..offset+length` (to the end when
    /// `length` is absent).
    pub(crate) fn read(
        &mut self,
        location: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<Bytes, OnnxError> {
        let base = self.base.clone().ok_or_else(|| {
            OnnxError::new(format!(
                "external data '{location}' but no model folder is known"
            ))
        })?;
        let path = confined(&base, location)?;
        self.used = true;
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            return Err(OnnxError::new(format!(
                "external data '{location}' is not a regular file"
            )));
        }
        let data = match self.maps.get(&path) {
            Some(b) => b.clone(),
            None => {
                let f = std::fs::File::open(&path).map_err(|e| {
                    OnnxError::io(format!("external data file '{location}': {e}"), e)
                })?;
                let b = crate::resident::map_read_only(&f, crate::resident::Access::Sequential)
                    .map_err(|e| {
                        OnnxError::io(format!("external data file '{location}': {e}"), e)
                    })?;
                self.maps.insert(path.clone(), b.clone());
                b
            }
        };
        let total = data.len() as u64;
        let end = match length {
            Some(l) => offset.checked_add(l),
            None => Some(total),
        };
        match end {
            Some(end) if offset <= end && end <= total => Ok(data.slice(offset as usize..end as usize)),
            _ => Err(OnnxError::new(format!(
                "external data '{location}': offset {offset} length {} is past the end of the file ({total} bytes)",
                length.map(|l| l.to_string()).unwrap_or_else(|| "-".into())
            ))),
        }
    }
}

/// `base/location`, refusing absolute paths and paths that leave `base`
/// (through `..` or a symbolic link).
pub(crate) fn confined(base: &Path, location: &str) -> Result<PathBuf, OnnxError> {
    let rel = Path::new(location);
    let bad = || {
        OnnxError::new(format!(
            "external data path '{location}' leaves the model's folder"
        ))
    };
    if location.is_empty() {
        return Err(OnnxError::new("external data entry has an empty location"));
    }
    if rel.is_absolute()
        || rel.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::RootDir | Component::Prefix(_)
            )
        })
    {
        return Err(bad());
    }
    let joined = base.join(rel);
    let canon_base = base
        .canonicalize()
        .map_err(|e| OnnxError::new(format!("model folder: {e}")))?;
    let canon = joined
        .canonicalize()
        .map_err(|e| OnnxError::io(format!("external data file '{location}': {e}"), e))?;
    if !canon.starts_with(&canon_base) {
        return Err(bad());
    }
    Ok(canon)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_escapes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("w.bin"), [1u8, 2, 3, 4]).unwrap();
        assert!(confined(d.path(), "w.bin").is_ok());
        for bad in ["../w.bin", "/etc/passwd", "a/../../w.bin"] {
            let e = confined(d.path(), bad).unwrap_err().to_string();
            assert!(e.contains("leaves the model's folder"), "{bad}: {e}");
        }
        let mut r = ExternalReader::new(Some(d.path().to_path_buf()));
        assert_eq!(&r.read("w.bin", 1, Some(2)).unwrap()[..], &[2, 3]);
        assert!(r.read("w.bin", 3, Some(2)).is_err());
        assert!(r.read("w.bin", u64::MAX, Some(2)).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn refuses_symlink_escape() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), [0u8; 4]).unwrap();
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("link")).unwrap();
        assert!(confined(d.path(), "link").is_err());
    }
}
