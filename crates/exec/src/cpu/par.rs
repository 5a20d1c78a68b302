//! The one thread pool every CPU kernel runs on, and the static splits
//! kernels use to share work across it.
//!
//! A run with `threads = N` uses the calling thread plus a pool of `N - 1`
//! workers (one pool per `N`, made on first use and kept for the process),
//! so exactly `N` threads compute. Work is split into contiguous parts
//! decided only by the sizes and `N` (never by which thread is free first),
//! and each output element is computed by one part in a fixed order: for a
//! given `N`, repeated runs give the same bits.

use std::ops::Range;
use std::sync::{Mutex, OnceLock};

/// Threads this process may run at once (the CPUs its affinity and cgroup
/// allow).
pub fn max_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The default thread count: one per physical core (hyperthreads share a
/// core's vector units, which GEMMs saturate), read from Linux's CPU
/// topology; elsewhere, or when it cannot be read, [`max_threads`].
pub fn default_threads() -> usize {
    let all = max_threads();
    let siblings =
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
            .ok()
            .map(|s| {
                // "0-1", "0,4" or "0": the logical CPUs of cpu0's core.
                s.trim()
                    .split(',')
                    .map(|r| match r.split_once('-') {
                        Some((a, b)) => (b.parse::<usize>().unwrap_or(0) + 1)
                            .saturating_sub(a.parse::<usize>().unwrap_or(0)),
                        None => 1,
                    })
                    .sum::<usize>()
                    .max(1)
            })
            .unwrap_or(1);
    (all / siblings).max(1)
}

/// The pool of `threads - 1` workers, or `None` for one thread (or when
/// the system refuses to start threads: the work then runs serially).
fn pool(threads: usize) -> Option<&'static rayon::ThreadPool> {
    if threads <= 1 {
        return None;
    }
    type Pools = Mutex<Vec<(usize, Option<&'static rayon::ThreadPool>)>>;
    static POOLS: OnceLock<Pools> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(n, _)| *n == threads) {
        return *p;
    }
    let made = rayon::ThreadPoolBuilder::new()
        .num_threads(threads - 1)
        .thread_name(|i| format!("graphopt-cpu-{i}"))
        .build()
        .ok()
        .map(|p| &*Box::leak(Box::new(p)));
    pools.push((threads, made));
    made
}

/// How many parts `n` items split into on `threads` threads when a part
/// should hold at least `min_items` items.
pub fn parts(n: usize, threads: usize, min_items: usize) -> usize {
    threads.min(n / min_items.max(1)).max(1)
}

/// The `p`-th of `parts` contiguous ranges of `0..n` (sizes differ by at
/// most one).
pub fn range(n: usize, parts: usize, p: usize) -> Range<usize> {
    let (q, r) = (n / parts, n % parts);
    let start = p * q + p.min(r);
    start..start + q + usize::from(p < r)
}

/// Runs `f(p)` for `p` in `0..parts`, part 0 on the calling thread and the
/// others on the pool of `threads`; returns when all are done.
pub fn for_parts<F>(threads: usize, parts: usize, f: F)
where
    F: Fn(usize) + Sync,
{
    match pool(threads) {
        Some(pool) if parts > 1 => pool.in_place_scope(|s| {
            let f = &f;
            for p in 1..parts {
                s.spawn(move |_| f(p));
            }
            f(0);
        }),
        _ => (0..parts).for_each(f),
    }
}

/// Splits `data` into contiguous parts of whole `unit`-element blocks
/// (at least `min_units` per part) and runs `f(first_unit, part)` on each
/// in parallel. `data.len()` must be a multiple of `unit`.
pub fn for_chunks_mut<T, F>(threads: usize, data: &mut [T], unit: usize, min_units: usize, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync,
{
    let unit = unit.max(1);
    let units = data.len() / unit;
    let k = parts(units, threads, min_units);
    if k == 1 {
        f(0, data);
        return;
    }
    let mut pieces: Vec<(usize, &mut [T])> = Vec::with_capacity(k);
    let mut rest = data;
    for p in 0..k {
        let r = range(units, k, p);
        let take = if p + 1 == k {
            rest.len()
        } else {
            r.len() * unit
        };
        let (mine, tail) = rest.split_at_mut(take);
        pieces.push((r.start, mine));
        rest = tail;
    }
    for_each_owned(threads, pieces, |(i, part)| f(i, part));
}

/// Runs `f(item)` for each item, the first on the calling thread and each
/// other on the pool of `threads` (callers make at most `threads` items).
pub fn for_each_owned<T, F>(threads: usize, items: Vec<T>, f: F)
where
    T: Send,
    F: Fn(T) + Sync,
{
    match pool(threads) {
        Some(pool) if items.len() > 1 => pool.in_place_scope(|s| {
            let f = &f;
            let mut it = items.into_iter();
            let first = it.next();
            for item in it {
                s.spawn(move |_| f(item));
            }
            if let Some(item) = first {
                f(item);
            }
        }),
        _ => items.into_iter().for_each(f),
    }
}

/// Elements per part below which elementwise work stays on one thread
/// (waking a worker costs about as much as this many simple operations).
pub const MIN_ELEMS: usize = 1 << 15;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn ranges_cover_each_item_once() {
        for n in [0, 1, 7, 100] {
            for parts in 1..6 {
                let mut seen = vec![0; n];
                for p in 0..parts {
                    for i in range(n, parts, p) {
                        seen[i] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n {n} parts {parts}");
            }
        }
    }

    #[test]
    fn chunks_write_every_element_once_on_several_threads() {
        for threads in [1, 2, 3, 5] {
            let mut v = vec![0u32; 10 * 7];
            let calls = AtomicUsize::new(0);
            for_chunks_mut(threads, &mut v, 7, 1, |first, part| {
                calls.fetch_add(1, Ordering::Relaxed);
                for (i, row) in part.chunks_mut(7).enumerate() {
                    row.iter_mut().for_each(|x| *x += (first + i) as u32 + 1);
                }
            });
            let want: Vec<u32> = (0..70).map(|i| i / 7 + 1).collect();
            assert_eq!(v, want, "threads {threads}");
            assert_eq!(calls.load(Ordering::Relaxed), threads.min(10));
        }
    }
}
