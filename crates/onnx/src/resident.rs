//! The files the loader maps, so that a caller done with some of their
//! bytes can hand the pages back.
//!
//! A mapped file's pages count in the process's resident set once read.
//! `graphopt train` reads every parameter once, to copy it into the
//! training step's arena, and does not read the file again until the end:
//! without [`release_resident`] the parameters would sit in the resident
//! set twice (the file's pages and the arena), a second copy of the model
//! on top of the plan.
//!
//! Only read-only maps of files made here are touched. Dropping their
//! pages (`MADV_DONTNEED`) loses nothing: a later read faults them back in
//! from the file (or the page cache).

use bytes::Bytes;
use memmap2::Mmap;
use std::sync::{Arc, Mutex, Weak};

/// A map shared between the bytes it backs and the registry.
struct Shared(Arc<Mmap>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Every live map the loader made.
static MAPS: Mutex<Vec<Weak<Mmap>>> = Mutex::new(Vec::new());

/// How a mapped file will be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Front to back (a model file).
    Sequential,
    /// Anywhere (training examples drawn in a shuffled order).
    Random,
}

/// `file` mapped read-only, as bytes, registered for [`release_resident`]
/// (an empty file gives empty bytes). The one place graphopt maps files.
pub fn map_read_only(file: &std::fs::File, access: Access) -> std::io::Result<Bytes> {
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only; graphopt never writes to its inputs.
    // Another process truncating the file while it is read is outside what
    // any loader can defend against.
    let map = unsafe { Mmap::map(file) }?;
    #[cfg(unix)]
    let _ = map.advise(match access {
        Access::Sequential => memmap2::Advice::Sequential,
        Access::Random => memmap2::Advice::Random,
    });
    #[cfg(not(unix))]
    let _ = access;
    Ok(register(map))
}

/// `map` as bytes, registered for [`release_resident`].
fn register(map: Mmap) -> Bytes {
    let map = Arc::new(map);
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    maps.retain(|w| w.strong_count() > 0);
    maps.push(Arc::downgrade(&map));
    Bytes::from_owner(Shared(map))
}

/// Hands back this process's resident pages inside `data` (the 4 KiB pages
/// wholly within it) where it lies in a file mapped by [`map_read_only`];
/// returns the bytes advised. Data anywhere else (the heap, a model built
/// in memory) is left alone and gives 0, and so does data smaller than a
/// page.
pub fn release_resident(data: &[u8]) -> u64 {
    const PAGE: usize = 4096;
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let (inner_start, inner_end) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
    if inner_end <= inner_start {
        return 0;
    }
    let map = MAPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .find(|m| {
            let base = m.as_ptr() as usize;
            start >= base && end <= base + m.len()
        });
    let Some(map) = map else { return 0 };
    #[cfg(unix)]
    {
        let base = map.as_ptr() as usize;
        // SAFETY: a read-only map of a file: MADV_DONTNEED drops the page
        // table entries only, and the next read of these bytes faults the
        // file's contents back in. No reference sees other bytes than
        // before.
        let r = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                inner_start - base,
                inner_end - inner_start,
            )
        };
        if r.is_ok() {
            (inner_end - inner_start) as u64
        } else {
            0
        }
    }
    #[cfg(not(unix))]
    {
        let _ = map;
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mapped_bytes_are_released_and_they_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.bin");
        let content: Vec<u8> = (0..3 * 65536u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &content).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let b = map_read_only(&f, Access::Random).unwrap();
        let part = &b[1000..70000];
        let before = part.to_vec();
        // The whole pages inside: 4096..69632 of the (page-aligned) map.
        assert_eq!(release_resident(part), 69632 - 4096);
        assert_eq!(release_resident(&b[10..4000]), 0);
        assert_eq!(part, &before[..]);
        assert_eq!(&b[..], &content[..]);
        // Heap bytes are not a map of ours.
        assert_eq!(release_resident(&content), 0);
        assert_eq!(release_resident(&[]), 0);
    }
}
