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

/// `map` as bytes, registered for [`release_resident`].
pub(crate) fn register(map: Mmap) -> Bytes {
    let map = Arc::new(map);
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    maps.retain(|w| w.strong_count() > 0);
    maps.push(Arc::downgrade(&map));
    Bytes::from_owner(Shared(map))
}

/// Hands back this process's resident pages under `data` where it lies in
/// a file the loader mapped (with the pages it shares at either end);
/// returns the bytes advised. Data anywhere else (the heap, a model built
/// in memory) is left alone and gives 0.
pub fn release_resident(data: &[u8]) -> u64 {
    if data.is_empty() {
        return 0;
    }
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let maps: Vec<Arc<Mmap>> = MAPS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for map in maps {
        let base = map.as_ptr() as usize;
        if start < base || end > base + map.len() {
            continue;
        }
        #[cfg(unix)]
        {
            // SAFETY: a read-only map of a file: MADV_DONTNEED drops the
            // page table entries only, and the next read of these bytes
            // faults the file's contents back in. No reference sees other
            // bytes than before.
            let r = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start - base,
                    data.len(),
                )
            };
            return if r.is_ok() { data.len() as u64 } else { 0 };
        }
        #[cfg(not(unix))]
        return 0;
    }
    0
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
        // SAFETY: a read-only map of a file this test wrote and keeps.
        let b = register(unsafe { Mmap::map(&f) }.unwrap());
        let part = &b[1000..70000];
        let before = part.to_vec();
        assert_eq!(release_resident(part), 69000);
        assert_eq!(part, &before[..]);
        assert_eq!(&b[..], &content[..]);
        // Heap bytes are not a map of ours.
        assert_eq!(release_resident(&content), 0);
        assert_eq!(release_resident(&[]), 0);
    }
}
