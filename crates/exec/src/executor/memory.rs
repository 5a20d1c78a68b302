//! Where the bytes of a run live: the 64-byte aligned buffers (arena,
//! workspace, misaligned weights copied), the location of each value
//! ([`Loc`]: arena offset, weight, or a slot of the dynamic store), when
//! each value of data-dependent size is freed, and which arena regions are
//! poisoned after each step.

use super::bind::Step;
use crate::backend::TensorInfo;
use crate::control::OutSlot;
use bytes::Bytes;
use graphopt_ir::{DType, Graph};
use graphopt_plan::Plan;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// A 64-byte aligned, zeroed byte buffer.
///
/// It is allocated zeroed at the allocator's own alignment and offset to
/// 64 bytes: a large `calloc` maps fresh zero pages without touching them,
/// so an arena costs resident memory only as its bytes are written. (Asked
/// for 64-byte alignment directly, the allocator zeroes every byte up
/// front: a 1 GB arena was resident before its first use.)
pub(crate) struct Aligned {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    /// Bytes from the allocation's start to `ptr`.
    offset: usize,
}

// SAFETY: plain owned memory.
unsafe impl Send for Aligned {}
unsafe impl Sync for Aligned {}

pub(crate) const ALIGN: usize = 64;

/// The alignment asked of the allocator: one it zeroes lazily.
const BASE_ALIGN: usize = 16;

impl Aligned {
    pub(super) fn new(len: usize) -> Aligned {
        if len == 0 {
            // A dangling, aligned pointer is valid for zero-length slices.
            return Aligned {
                ptr: NonNull::new(ALIGN as *mut u8).expect("non-null"),
                len,
                offset: 0,
            };
        }
        let layout = Aligned::layout(len);
        // SAFETY: non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let Some(base) = NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        let offset = base.as_ptr().align_offset(ALIGN);
        assert!(offset < ALIGN, "an allocation aligns to 64 within 64 bytes");
        Aligned {
            // SAFETY: offset + len <= the allocation's len + ALIGN bytes.
            ptr: unsafe { base.add(offset) },
            len,
            offset,
        }
    }

    fn layout(len: usize) -> Layout {
        let size = len.checked_add(ALIGN).expect("arena size fits a layout");
        Layout::from_size_align(size, BASE_ALIGN).expect("arena size fits a layout")
    }

    /// Zeroes `range` and hands back the whole pages inside it (Linux:
    /// `MADV_DONTNEED`, after which they read as zeros and cost nothing
    /// until written).
    pub(super) fn discard(&mut self, range: std::ops::Range<usize>) {
        let b = &mut self.bytes_mut()[range];
        if let Some((start, end)) = whole_pages(b) {
            // SAFETY: [start, end) lies inside `b`, private anonymous
            // memory borrowed mutably here, so nothing else reads it;
            // afterwards its pages read as zeros.
            #[cfg(target_os = "linux")]
            let handed_back = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) == 0
            };
            #[cfg(not(target_os = "linux"))]
            let handed_back = false;
            // The partial pages at either end are zeroed by hand (and the
            // middle too, where the kernel refused).
            let p = b.as_ptr() as usize;
            let (head, tail) = (start - p, end - p);
            if !handed_back {
                b[head..tail].fill(0);
            }
            b[..head].fill(0);
            b[tail..].fill(0);
            return;
        }
        b.fill(0);
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this layout, `offset` bytes
            // before `ptr`.
            unsafe {
                dealloc(
                    self.ptr.as_ptr().sub(self.offset),
                    Aligned::layout(self.len),
                )
            }
        }
    }
}

/// Tells the kernel that the whole pages inside `b` (a weight just copied
/// into aligned memory) will not be read again soon: `MADV_PAGEOUT`
/// reclaims them, so a memory-mapped model file does not stay resident
/// twice (file and copy). Only a hint: the bytes stay valid (file pages
/// are read back on access; anonymous memory is left alone without swap).
pub(super) fn release_pages(b: &[u8]) {
    if let Some((start, end)) = whole_pages(b) {
        // SAFETY: [start, end) lies inside `b`, which is borrowed (so
        // mapped) for the call; MADV_PAGEOUT never changes contents.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
        }
    }
}

/// The addresses `[start, end)` of the whole pages inside `b`, if any
/// (Linux only: elsewhere nothing is handed back).
fn whole_pages(b: &[u8]) -> Option<(usize, usize)> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = if page > 0 { page as usize } else { 4096 };
        let p = b.as_ptr() as usize;
        let start = p.div_ceil(page) * page;
        let end = (p + b.len()) / page * page;
        (end > start).then_some((start, end))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = b;
        None
    }
}

/// A weight: in place in the model's bytes, or copied when misaligned.
pub(crate) enum Weight {
    Shared(Bytes),
    Copied(Aligned),
}

impl Weight {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Weight::Shared(b) => b,
            Weight::Copied(a) => a.bytes(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Arena {
        offset: usize,
        len: usize,
    },
    Weight(usize),
    /// A value of data-dependent size: slot of the dynamic store (host
    /// executables only; device backends refuse such plans).
    Dynamic(usize),
}

pub(crate) struct Region {
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) float: bool,
}

/// Which dynamic values (store slots) to free after each of `steps`:
/// after their last reader, or never for graph outputs.
pub(super) fn dyn_free_after<K>(
    steps: &[Step<K>],
    outputs: &[(String, Loc, TensorInfo)],
    n_dynamic: usize,
) -> Vec<Vec<usize>> {
    // Dynamic values are freed after their last reader (graph outputs
    // live to the end).
    let mut dyn_last: Vec<Option<usize>> = vec![None; n_dynamic];
    for (si, s) in steps.iter().enumerate() {
        for (l, _) in s.inputs.iter().flatten() {
            if let Loc::Dynamic(k) = *l {
                dyn_last[k] = Some(si);
            }
        }
        if let Some(sp) = &s.special {
            for o in sp.outputs.iter().flatten() {
                if let OutSlot::Dynamic { index } = o {
                    dyn_last[*index] = Some(dyn_last[*index].map_or(si, |x| x.max(si)));
                }
            }
        }
    }
    for (_, l, _) in outputs {
        if let Loc::Dynamic(k) = *l {
            dyn_last[k] = None;
        }
    }
    let mut dyn_free_after: Vec<Vec<usize>> = (0..steps.len()).map(|_| Vec::new()).collect();
    for (k, l) in dyn_last.iter().enumerate() {
        if let Some(si) = l {
            dyn_free_after[*si].push(k);
        }
    }
    dyn_free_after
}

/// The arena regions to poison after each of the plan's steps: each alias
/// group (a tensor with the tensors aliased to it) after its last step,
/// NaN-poisoned (`float`) when every member is f32.
pub(super) fn poison_regions(g: &Graph, plan: &Plan) -> Vec<Vec<Region>> {
    // Poison regions: alias groups end together.
    let mut parent: Vec<usize> = (0..plan.tensors.len()).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while p[x] != x {
            p[x] = p[p[x]];
            x = p[x];
        }
        x
    }
    for a in &plan.aliases {
        let (x, y) = (find(&mut parent, a.input), find(&mut parent, a.output));
        parent[x] = y;
    }
    let steps_n = plan.schedule.len();
    let mut groups: Vec<Option<(usize, usize, usize, bool)>> = vec![None; plan.tensors.len()];
    for (i, t) in plan.tensors.iter().enumerate() {
        let r = find(&mut parent, i);
        let float = g.ty(t.value).and_then(|t| t.elem()) == Some(DType::F32);
        let e = groups[r].get_or_insert((t.offset as usize, 0, 0, float));
        e.1 = e.1.max(t.size as usize);
        e.2 = e.2.max(t.last);
        e.3 &= float;
    }
    let mut poison_after: Vec<Vec<Region>> = (0..steps_n).map(|_| Vec::new()).collect();
    for (offset, len, last, float) in groups.into_iter().flatten() {
        if len > 0 && last + 1 < steps_n {
            poison_after[last].push(Region { offset, len, float });
        }
    }
    poison_after
}

#[cfg(test)]
mod aligned_tests {
    use super::*;

    fn rss_kb() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
        l.split_whitespace().nth(1)?.parse().ok()
    }

    #[test]
    fn buffers_are_aligned_zeroed_and_resident_only_once_written() {
        for len in [1, 63, 64, 4097, 1 << 20] {
            let a = Aligned::new(len);
            assert_eq!(a.ptr.as_ptr() as usize % ALIGN, 0);
            assert!(a.bytes().iter().all(|&b| b == 0));
        }
        // 512 MiB: mapped fresh, not zeroed by hand (measured on Linux;
        // the margin leaves room for tests running beside this one).
        if !cfg!(target_os = "linux") {
            return;
        }
        let before = rss_kb().expect("VmRSS in /proc/self/status");
        let mut a = Aligned::new(512 << 20);
        let after = rss_kb().unwrap();
        assert!(after < before + 128 * 1024, "{before} -> {after} kB");
        a.bytes_mut()[..64 << 20].fill(1);
        let written = rss_kb().unwrap();
        assert!(written > before + 48 * 1024, "{before} -> {written} kB");
    }

    #[test]
    fn discard_zeroes_exactly_its_range() {
        let len = 5 * 4096 + 100;
        let mut a = Aligned::new(len);
        a.bytes_mut().fill(7);
        a.discard(1000..3 * 4096 + 50);
        let b = a.bytes();
        assert!(b[..1000].iter().all(|&x| x == 7));
        assert!(b[1000..3 * 4096 + 50].iter().all(|&x| x == 0));
        assert!(b[3 * 4096 + 50..].iter().all(|&x| x == 7));
        a.discard(10..20);
        assert!(a.bytes()[10..20].iter().all(|&x| x == 0) && a.bytes()[20] == 7);
    }
}
