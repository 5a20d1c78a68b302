//! Collectives between processes (issue 24): the operations data-parallel
//! and pipelined training need, over engines that already exist. graphopt
//! does not build its own communication layer.
//!
//! - [`Collective`]: all-reduce, reduce-scatter, all-gather, broadcast,
//!   send/recv and a barrier on host buffers, in rank order.
//! - [`Solo`]: one rank (every operation is a copy), for a process that
//!   was not launched by MPI and for tests.
//! - [`mpi::Mpi`] (cargo feature `mpi`): OpenMPI or MPICH through the
//!   `mpi` crate, the world communicator of an `mpirun` launch.
//! - [`nccl::Nccl`] (cargo feature `cuda`): NCCL between GPUs through
//!   cudarc, its unique id broadcast over a host [`Collective`].
//!
//! Every blocking call runs under a [`Watchdog`]: a call that waits longer
//! than its timeout (a rank died, or ranks disagree on what to call) ends
//! the process with one line, and `mpirun` then ends the others.
//!
//! Reductions are sums of `f32` (gradients); the result is the same bits
//! on every rank.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;

/// What a collective call refused or failed at.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CommError(pub String);

pub type CommResult<T> = Result<T, CommError>;

/// How long a blocking call waits for the other ranks by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Collective operations over the ranks of one communicator. Every rank
/// must make the same calls in the same order with the same lengths.
pub trait Collective {
    /// This process's rank, `0..ranks()`.
    fn rank(&self) -> usize;
    /// How many ranks there are.
    fn ranks(&self) -> usize;
    /// The engine, for reports: "mpi", "solo", ...
    fn engine(&self) -> &'static str;
    /// `buf` becomes the element-wise sum of every rank's `buf`.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()>;
    /// Starts summing `buf` over the ranks; [`Pending::wait`] gives the
    /// sum. Calls stay in order: a call made after this one runs after it
    /// on every rank. By default the sum is made at once (blocking); MPI
    /// queues it on its thread, so that the caller computes meanwhile.
    fn all_reduce_sum_start(&self, mut buf: Vec<f32>) -> Box<dyn Pending> {
        let r = self.all_reduce_sum(&mut buf).map(|_| buf);
        Box::new(Ready(r))
    }
    /// Starts summing `buf` over the ranks into rank `root` (ZeRO-2's
    /// reduction of a gradient bucket to the rank that owns it): on
    /// `root`, [`Pending::wait`] gives the sum; elsewhere, whatever is
    /// left in `buf`. In order with the other calls, as
    /// [`Collective::all_reduce_sum_start`]. By default an all-reduce
    /// (every rank gets the sum; twice the traffic); MPI queues
    /// `MPI_Reduce` on its thread.
    fn reduce_sum_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        let _ = root;
        self.all_reduce_sum_start(buf)
    }
    /// `recv` (`send.len() / ranks()` elements) becomes this rank's block
    /// of the element-wise sum of every rank's `send`.
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()>;
    /// `recv` (`send.len() * ranks()` elements) becomes every rank's
    /// `send`, in rank order.
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()>;
    /// [`Collective::all_gather`] of bytes.
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> CommResult<()>;
    /// `buf` becomes `root`'s `buf` on every rank.
    fn broadcast(&self, buf: &mut [u8], root: usize) -> CommResult<()>;
    /// Sends `buf` to rank `to` (blocking until it may be reused).
    fn send(&self, buf: &[u8], to: usize) -> CommResult<()>;
    /// Receives exactly `buf.len()` bytes from rank `from`.
    fn recv(&self, buf: &mut [u8], from: usize) -> CommResult<()>;
    /// Sends one message that [`Collective::recv_message`] receives.
    fn send_message(&self, buf: &[u8], to: usize) -> CommResult<()> {
        self.send(buf, to)
    }
    /// Receives the next message from rank `from`, whatever its length.
    fn recv_message(&self, from: usize) -> CommResult<Vec<u8>>;
    /// Sends `send` to rank `to` and receives the next message from rank
    /// `from`, the send not waiting for the receive: two neighbours that
    /// each send to the other at once do not wait on each other (a
    /// pipeline's steady state).
    fn send_recv_message(&self, send: &[u8], to: usize, from: usize) -> CommResult<Vec<u8>>;
    /// Waits until every rank has called it.
    fn barrier(&self) -> CommResult<()>;
}

/// A reduction started by [`Collective::all_reduce_sum_start`] or
/// [`Collective::reduce_sum_start`].
pub trait Pending: Send {
    /// Waits for the sum.
    fn wait(self: Box<Self>) -> CommResult<Vec<f32>>;
}

/// A reduction already made.
pub struct Ready(pub CommResult<Vec<f32>>);

impl Pending for Ready {
    fn wait(self: Box<Self>) -> CommResult<Vec<f32>> {
        self.0
    }
}

/// Checks the lengths of a reduce-scatter.
pub fn check_scatter(ranks: usize, send: usize, recv: usize) -> CommResult<()> {
    if send != recv * ranks {
        return Err(CommError(format!(
            "reduce-scatter: {send} elements do not split into {ranks} blocks of {recv}"
        )));
    }
    Ok(())
}

/// Checks the lengths of an all-gather.
pub fn check_gather(ranks: usize, send: usize, recv: usize) -> CommResult<()> {
    if recv != send * ranks {
        return Err(CommError(format!(
            "all-gather: {ranks} blocks of {send} elements do not fill {recv}"
        )));
    }
    Ok(())
}

/// Checks a peer rank.
pub fn check_peer(ranks: usize, me: usize, peer: usize, what: &str) -> CommResult<()> {
    if peer >= ranks || peer == me {
        return Err(CommError(format!(
            "{what} rank {peer}: expected another rank of 0..{ranks} than {me}"
        )));
    }
    Ok(())
}

/// One process alone: rank 0 of 1.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
    fn engine(&self) -> &'static str {
        "solo"
    }
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> CommResult<()> {
        Ok(())
    }
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_scatter(1, send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_gather(1, send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> CommResult<()> {
        check_gather(1, send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn broadcast(&self, _buf: &mut [u8], root: usize) -> CommResult<()> {
        if root != 0 {
            return Err(CommError(format!(
                "broadcast from rank {root}: there is one rank"
            )));
        }
        Ok(())
    }
    fn send(&self, _buf: &[u8], to: usize) -> CommResult<()> {
        check_peer(1, 0, to, "send to")
    }
    fn recv(&self, _buf: &mut [u8], from: usize) -> CommResult<()> {
        check_peer(1, 0, from, "receive from")
    }
    fn recv_message(&self, from: usize) -> CommResult<Vec<u8>> {
        check_peer(1, 0, from, "receive from").map(|_| Vec::new())
    }
    fn send_recv_message(&self, _send: &[u8], to: usize, from: usize) -> CommResult<Vec<u8>> {
        check_peer(1, 0, to, "send to")?;
        self.recv_message(from)
    }
    fn barrier(&self) -> CommResult<()> {
        Ok(())
    }
}

/// Ends the process when a blocking call waits past its timeout: a rank
/// that died or called something else would otherwise hang every other
/// rank. `mpirun` ends the rest of the job when one process exits.
pub struct Watchdog {
    inner: Arc<WatchState>,
}

struct WatchState {
    /// Milliseconds since `epoch` at which the call in progress expires
    /// (0: no call in progress).
    deadline_ms: AtomicU64,
    epoch: Instant,
    what: Mutex<&'static str>,
    timeout: Duration,
    rank: usize,
    /// What to do on expiry (tests replace the exit).
    on_expiry: Box<dyn Fn(String) + Send + Sync>,
}

/// A call in progress; the deadline is cleared when it drops.
pub struct Watched<'a>(&'a Watchdog);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.0.inner.deadline_ms.store(0, Ordering::SeqCst);
    }
}

impl Watchdog {
    /// A watchdog for `rank` that prints the expiry line to stderr and
    /// exits with status 1.
    pub fn new(rank: usize, timeout: Duration) -> Watchdog {
        Watchdog::with_expiry(
            rank,
            timeout,
            Box::new(|line| {
                eprintln!("error: {line}");
                std::process::exit(1);
            }),
        )
    }

    /// A watchdog that calls `on_expiry` with the line instead.
    pub fn with_expiry(
        rank: usize,
        timeout: Duration,
        on_expiry: Box<dyn Fn(String) + Send + Sync>,
    ) -> Watchdog {
        let inner = Arc::new(WatchState {
            deadline_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            what: Mutex::new(""),
            timeout,
            rank,
            on_expiry,
        });
        let weak = Arc::downgrade(&inner);
        let tick = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new()
            .name("graphopt-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(tick);
                let Some(s) = weak.upgrade() else { return };
                let d = s.deadline_ms.load(Ordering::SeqCst);
                let now = s.epoch.elapsed().as_millis() as u64;
                if d != 0 && now > d {
                    s.deadline_ms.store(0, Ordering::SeqCst);
                    let what = *s.what.lock().unwrap_or_else(|e| e.into_inner());
                    (s.on_expiry)(format!(
                        "rank {}: {what} waited more than {} s for the other ranks \
                         (a rank died, hangs, or called something else)",
                        s.rank,
                        s.timeout.as_secs_f64()
                    ));
                }
            })
            .expect("the watchdog thread starts");
        Watchdog { inner }
    }

    /// Marks a blocking call as started; it must end within the timeout.
    pub fn watch(&self, what: &'static str) -> Watched<'_> {
        *self.inner.what.lock().unwrap_or_else(|e| e.into_inner()) = what;
        let due = self.inner.epoch.elapsed() + self.inner.timeout;
        self.inner
            .deadline_ms
            .store((due.as_millis() as u64).max(1), Ordering::SeqCst);
        Watched(self)
    }

    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`,
/// `mpiexec`, `srun` with PMI): the variables OpenMPI, MPICH/Hydra and
/// PMIx set in each process they start.
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "PMI_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The blocks of `total` elements over `ranks` ranks, padded: every rank
/// owns `shard` elements, `shard * ranks >= total`, the last ones padding.
pub fn shard_len(total: usize, ranks: usize) -> usize {
    total.div_ceil(ranks.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn solo_copies_and_checks_lengths() {
        let s = Solo;
        let mut b = vec![1.0, 2.0];
        s.all_reduce_sum(&mut b).unwrap();
        assert_eq!(b, [1.0, 2.0]);
        let mut r = vec![0.0; 2];
        s.reduce_scatter_sum(&[3.0, 4.0], &mut r).unwrap();
        assert_eq!(r, [3.0, 4.0]);
        let e = s.all_gather(&[1.0], &mut [0.0; 2]).unwrap_err();
        assert_eq!(e.0, "all-gather: 1 blocks of 1 elements do not fill 2");
        let e = s.send(&[1], 1).unwrap_err();
        assert_eq!(e.0, "send to rank 1: expected another rank of 0..1 than 0");
    }

    #[test]
    fn shards_cover_the_elements() {
        assert_eq!(shard_len(10, 4), 3);
        assert_eq!(shard_len(8, 4), 2);
        assert_eq!(shard_len(0, 3), 0);
        assert_eq!(shard_len(5, 1), 5);
    }

    #[test]
    fn the_watchdog_fires_on_a_call_past_its_timeout_only() {
        let (tx, rx) = channel();
        let tx = Mutex::new(tx);
        let w = Watchdog::with_expiry(
            3,
            Duration::from_millis(100),
            Box::new(move |line| {
                let _ = tx.lock().unwrap().send(line);
            }),
        );
        {
            let _quick = w.watch("all-reduce");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(250));
        assert!(rx.try_recv().is_err(), "a call that ended in time fired");
        let _slow = w.watch("all-gather");
        let line = rx.recv_timeout(Duration::from_secs(5)).expect("it fires");
        assert_eq!(
            line,
            "rank 3: all-gather waited more than 0.1 s for the other ranks \
             (a rank died, hangs, or called something else)"
        );
    }
}
