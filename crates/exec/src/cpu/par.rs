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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// How long an idle worker spins, watching for the next job, before it
/// parks: the gaps between one run's parallel kernels are microseconds,
/// and waking a parked thread costs tens of them (a futex wake, slower in a
/// VM), as much as a small kernel's whole work. onnxruntime's pool spins
/// the same way.
const SPIN: std::time::Duration = std::time::Duration::from_millis(2);

/// One job of a [`Pool`]: `parts` calls of `f`, claimed one at a time.
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    parts: usize,
}

/// A pool's shared state. The caller publishes a job (while holding
/// [`Pool::busy`]), bumps `epoch`, runs parts itself and returns only
/// once every worker has acknowledged the epoch: no worker can then
/// still hold the job's closure, which lives on the caller's stack.
struct Shared {
    job: std::cell::UnsafeCell<Job>,
    epoch: AtomicUsize,
    next: AtomicUsize,
    acks: AtomicUsize,
    /// The payload of the first part that panicked in the current job.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Per worker: parked (or about to park) waiting for an epoch.
    sleeping: Vec<AtomicBool>,
}

// SAFETY: `job` is written only by the caller holding `busy` while no
// worker reads it (every worker acknowledged the previous epoch and waits
// for the next), and read by workers only between the epoch bump and
// their acknowledgement; the closure it points at is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// `threads - 1` workers that spin between jobs, then park.
struct Pool {
    shared: &'static Shared,
    workers: Vec<std::thread::Thread>,
    busy: Mutex<()>,
}

thread_local! {
    /// Set while this thread runs a part of a pool job: a kernel called
    /// from inside one runs its own parts serially (the same bits).
    static IN_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Pool {
    fn new(workers: usize) -> Option<Pool> {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            job: std::cell::UnsafeCell::new(Job {
                f: &|_| {},
                parts: 0,
            }),
            epoch: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            acks: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
        }));
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let h = std::thread::Builder::new()
                .name(format!("graphopt-cpu-{i}"))
                .spawn(move || worker(shared, i))
                .ok()?;
            handles.push(h.thread().clone());
        }
        Some(Pool {
            shared,
            workers: handles,
            busy: Mutex::new(()),
        })
    }

    /// Runs `f(p)` for `p` in `0..parts` on the caller and the workers, or
    /// on the caller alone when the pool is busy (another thread's job).
    fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        let busy = match self.busy.try_lock() {
            Ok(g) => g,
            // A kernel panicked in an earlier job: the pool still works.
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                (0..parts).for_each(f);
                return;
            }
        };
        let sh = self.shared;
        // SAFETY: every worker acknowledged the previous epoch and reads
        // `job` again only after the bump below; the pointer outlives the
        // job, since this call returns only after every acknowledgement.
        unsafe {
            let f: *const (dyn Fn(usize) + Sync + '_) = f;
            *sh.job.get() = Job {
                f: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(f),
                parts,
            };
        }
        sh.next.store(0, Ordering::Relaxed);
        sh.acks.store(0, Ordering::Relaxed);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        for (w, sleeping) in self.workers.iter().zip(&sh.sleeping) {
            if sleeping.load(Ordering::SeqCst) {
                w.unpark();
            }
        }
        run_parts(sh);
        let mut spins = 0u32;
        while sh.acks.load(Ordering::Acquire) < self.workers.len() {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Some(payload) = sh.panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            drop(busy);
            std::panic::resume_unwind(payload);
        }
    }
}

/// Claims and runs the current job's parts until none is left.
fn run_parts(sh: &Shared) {
    // SAFETY: read between the epoch bump and this thread's
    // acknowledgement (see `Shared`).
    let job = unsafe { &*sh.job.get() };
    // SAFETY: the closure outlives the job (see `Pool::run`).
    let f = unsafe { &*job.f };
    IN_JOB.with(|j| j.set(true));
    loop {
        let p = sh.next.fetch_add(1, Ordering::Relaxed);
        if p >= job.parts {
            break;
        }
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(p))) {
            // The first part's panic is raised again on the caller.
            sh.panic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(payload);
        }
    }
    IN_JOB.with(|j| j.set(false));
}

/// A worker: waits for each epoch (spinning for [`SPIN`], then parked),
/// runs parts, acknowledges.
fn worker(sh: &'static Shared, i: usize) {
    let mut seen = 0;
    loop {
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            if sh.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            sh.sleeping[i].store(true, Ordering::SeqCst);
            while sh.epoch.load(Ordering::SeqCst) == seen {
                std::thread::park();
            }
            sh.sleeping[i].store(false, Ordering::SeqCst);
        }
        seen = sh.epoch.load(Ordering::Acquire);
        run_parts(sh);
        sh.acks.fetch_add(1, Ordering::Release);
    }
}

/// The pool of `threads - 1` workers, or `None` for one thread (or when
/// the system refuses to start threads: the work then runs serially).
fn pool(threads: usize) -> Option<&'static Pool> {
    if threads <= 1 {
        return None;
    }
    type Pools = Mutex<Vec<(usize, Option<&'static Pool>)>>;
    static POOLS: OnceLock<Pools> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(n, _)| *n == threads) {
        return *p;
    }
    let made = Pool::new(threads - 1).map(|p| &*Box::leak(Box::new(p)));
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

/// Runs `f(p)` for `p` in `0..parts` on the calling thread and the pool
/// of `threads`; returns when all are done. Which thread runs a part
/// does not matter: each part's work depends only on `p`.
pub fn for_parts<F>(threads: usize, parts: usize, f: F)
where
    F: Fn(usize) + Sync,
{
    match pool(threads) {
        Some(pool) if parts > 1 && !IN_JOB.with(|j| j.get()) => pool.run(parts, &f),
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

/// Runs `f(item)` for each item on the calling thread and the pool of
/// `threads` (callers make at most `threads` items).
pub fn for_each_owned<T, F>(threads: usize, items: Vec<T>, f: F)
where
    T: Send,
    F: Fn(T) + Sync,
{
    if items.len() <= 1 || pool(threads).is_none() {
        items.into_iter().for_each(f);
        return;
    }
    let slots: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    for_parts(threads, slots.len(), |p| {
        let item = slots[p].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(item) = item {
            f(item);
        }
    });
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

    /// A part's panic reaches the caller with its own message, and the
    /// pool still runs later jobs on its workers.
    #[test]
    fn a_panicking_part_is_raised_on_the_caller_and_the_pool_goes_on() {
        // A thread count no other test of this binary uses, so that no
        // concurrent test holds the pool (its job would then run serially).
        let threads = 6;
        let caught = std::panic::catch_unwind(|| {
            for_parts(threads, 8, |p| {
                if p == 5 {
                    panic!("part five failed");
                }
            })
        });
        let msg = caught.expect_err("the part's panic");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"part five failed"));
        let ids = Mutex::new(std::collections::HashSet::new());
        for_parts(threads, 16, |_| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            ids.lock().unwrap().insert(std::thread::current().id());
        });
        assert!(
            ids.lock().unwrap().len() > 1,
            "parts ran on several threads"
        );
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
