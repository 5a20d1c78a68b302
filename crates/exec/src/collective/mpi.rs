//! [`Collective`] over MPI (OpenMPI, MPICH): the world communicator of the
//! processes `mpirun` started, through the `mpi` crate (cargo feature
//! `mpi`; building it needs the MPI headers and libclang, running it the
//! MPI library).
//!
//! One thread of its own makes every MPI call, in the order they are asked
//! for: MPI is initialized there with `MPI_THREAD_FUNNELED` and finalized
//! there when the [`Mpi`] drops. A blocking call waits for its turn and
//! its result; [`Collective::all_reduce_sum_start`] only queues its
//! reduction, so that the caller computes on while the MPI thread sums (a
//! training step reduces a bucket of gradients while the backward pass
//! goes on). Each call runs under the [`Watchdog`].

use super::{
    check_gather, check_peer, check_scatter, Collective, CommError, CommResult, Pending, Watchdog,
};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

/// All-reduces go in pieces of this many elements, so that the copy of the
/// send buffer MPI needs stays small.
const PIECE: usize = 1 << 22;

/// A call for the MPI thread.
struct Job {
    what: &'static str,
    run: Box<dyn FnOnce(&SimpleCommunicator) + Send>,
}

/// A caller's buffer handed to the MPI thread for one blocking call.
struct Raw<T>(*mut T, usize);

// SAFETY: a `Raw` only crosses to the MPI thread for a call its owner
// waits for (`Mpi::call`); the buffer outlives the call and nothing else
// touches it meanwhile.
unsafe impl<T> Send for Raw<T> {}

impl<T> Raw<T> {
    fn of(s: &[T]) -> Raw<T> {
        Raw(s.as_ptr() as *mut T, s.len())
    }
    fn of_mut(s: &mut [T]) -> Raw<T> {
        Raw(s.as_mut_ptr(), s.len())
    }
    /// # Safety
    /// Only inside the call its owner waits for (see [`Raw`]).
    unsafe fn get(&self) -> &'static mut [T] {
        std::slice::from_raw_parts_mut(self.0, self.1)
    }
}

/// The world communicator of an MPI launch.
pub struct Mpi {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
    ranks: usize,
}

impl Mpi {
    /// Initializes MPI (once per process) on its own thread. Refuses, in
    /// one line, a process that no MPI launcher started, and a second
    /// initialization.
    pub fn init(timeout: Duration) -> CommResult<Mpi> {
        if !super::launched_by_mpi() {
            return Err(CommError(
                "this process was not started by an MPI launcher (run it as: mpirun -np N graphopt ...)"
                    .into(),
            ));
        }
        let (jobs, queue) = channel::<Job>();
        let (ready, started) = sync_channel::<CommResult<(usize, usize)>>(1);
        let thread = std::thread::Builder::new()
            .name("graphopt-mpi".into())
            .spawn(move || serve(queue, ready, timeout))
            .map_err(|e| CommError(format!("the MPI thread did not start: {e}")))?;
        let (rank, ranks) = started
            .recv()
            .map_err(|_| CommError("the MPI thread ended while starting".into()))??;
        Ok(Mpi {
            jobs: Some(jobs),
            thread: Some(thread),
            rank,
            ranks,
        })
    }

    /// Runs `f` on the MPI thread after every call asked for before it,
    /// and returns its result.
    fn call<R: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&SimpleCommunicator) -> R + Send + 'static,
    ) -> CommResult<R> {
        let (tx, rx) = sync_channel(1);
        self.queue(what, move |w| {
            let _ = tx.send(f(w));
        })?;
        rx.recv()
            .map_err(|_| CommError(format!("{what}: the MPI thread ended")))
    }

    fn queue(
        &self,
        what: &'static str,
        f: impl FnOnce(&SimpleCommunicator) + Send + 'static,
    ) -> CommResult<()> {
        self.jobs
            .as_ref()
            .expect("open until dropped")
            .send(Job {
                what,
                run: Box::new(f),
            })
            .map_err(|_| CommError(format!("{what}: the MPI thread ended")))
    }

    /// All-gather of `f32` or bytes.
    fn gather<T: Equivalence + Send + 'static>(
        &self,
        send: &[T],
        recv: &mut [T],
    ) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        Mpi::count(send.len())?;
        let (s, r) = (Raw::of(send), Raw::of_mut(recv));
        self.call("all-gather", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            let (s, r) = unsafe { (s.get(), r.get()) };
            w.all_gather_into(&s[..], r);
        })
    }

    fn count(n: usize) -> CommResult<()> {
        if n > i32::MAX as usize {
            return Err(CommError(format!(
                "{n} elements in one MPI call: more than MPI's count allows"
            )));
        }
        Ok(())
    }
}

/// The MPI thread: initializes MPI, runs the calls in order, finalizes.
fn serve(
    queue: Receiver<Job>,
    ready: std::sync::mpsc::SyncSender<CommResult<(usize, usize)>>,
    timeout: Duration,
) {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        let _ = ready.send(Err(CommError(
            "MPI was already initialized in this process".into(),
        )));
        return;
    };
    let world = universe.world();
    let rank = world.rank() as usize;
    let watchdog = Watchdog::new(rank, timeout);
    let _ = ready.send(Ok((rank, world.size() as usize)));
    for job in queue {
        let _w = watchdog.watch(job.what);
        (job.run)(&world);
    }
    drop(world);
    // Finalizes MPI, on the thread that initialized it.
    drop(universe);
}

impl Drop for Mpi {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn all_reduce_in_pieces(w: &SimpleCommunicator, buf: &mut [f32]) {
    let mut send = Vec::with_capacity(PIECE.min(buf.len()));
    for piece in buf.chunks_mut(PIECE) {
        send.clear();
        send.extend_from_slice(piece);
        w.all_reduce_into(&send[..], piece, SystemOperation::sum());
    }
}

/// A reduction queued on the MPI thread.
struct Queued(Receiver<Vec<f32>>);

impl Pending for Queued {
    fn wait(self: Box<Self>) -> CommResult<Vec<f32>> {
        self.0
            .recv()
            .map_err(|_| CommError("reduction: the MPI thread ended".into()))
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn ranks(&self) -> usize {
        self.ranks
    }
    fn engine(&self) -> &'static str {
        "mpi"
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()> {
        let b = Raw::of_mut(buf);
        // SAFETY: `call` waits for the job (see `Raw`).
        self.call("all-reduce", move |w| {
            all_reduce_in_pieces(w, unsafe { b.get() })
        })
    }

    fn all_reduce_sum_start(&self, mut buf: Vec<f32>) -> Box<dyn Pending> {
        let (tx, rx) = sync_channel(1);
        let queued = self.queue("all-reduce", move |w| {
            all_reduce_in_pieces(w, &mut buf);
            let _ = tx.send(buf);
        });
        match queued {
            Ok(()) => Box::new(Queued(rx)),
            Err(e) => Box::new(super::Ready(Err(e))),
        }
    }

    fn reduce_sum_start(&self, buf: Vec<f32>, root: usize) -> Box<dyn Pending> {
        if root >= self.ranks {
            return Box::new(super::Ready(Err(CommError(format!(
                "reduce: root {root}, but there are {} ranks",
                self.ranks
            )))));
        }
        let (tx, rx) = sync_channel(1);
        let queued = self.queue("reduce", move |w| {
            let at = w.process_at_rank(root as i32);
            if w.rank() as usize == root {
                let mut sum = vec![0f32; buf.len()];
                for (s, r) in buf.chunks(PIECE).zip(sum.chunks_mut(PIECE)) {
                    at.reduce_into_root(s, r, SystemOperation::sum());
                }
                let _ = tx.send(sum);
            } else {
                for s in buf.chunks(PIECE) {
                    at.reduce_into(s, SystemOperation::sum());
                }
                let _ = tx.send(buf);
            }
        });
        match queued {
            Ok(()) => Box::new(Queued(rx)),
            Err(e) => Box::new(super::Ready(Err(e))),
        }
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_scatter(self.ranks, send.len(), recv.len())?;
        Mpi::count(recv.len())?;
        let (s, r) = (Raw::of(send), Raw::of_mut(recv));
        self.call("reduce-scatter", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            let (s, r) = unsafe { (s.get(), r.get()) };
            w.reduce_scatter_block_into(&s[..], r, SystemOperation::sum());
        })
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        self.gather(send, recv)
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> CommResult<()> {
        self.gather(send, recv)
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> CommResult<()> {
        if root >= self.ranks {
            return Err(CommError(format!(
                "broadcast from rank {root}: there are {} ranks",
                self.ranks
            )));
        }
        Mpi::count(buf.len())?;
        let b = Raw::of_mut(buf);
        self.call("broadcast", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            w.process_at_rank(root as i32)
                .broadcast_into(unsafe { b.get() });
        })
    }

    fn send(&self, buf: &[u8], to: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        Mpi::count(buf.len())?;
        let b = Raw::of(buf);
        self.call("send", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            w.process_at_rank(to as i32).send(&unsafe { b.get() }[..]);
        })
    }

    fn recv(&self, buf: &mut [u8], from: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, from, "receive from")?;
        Mpi::count(buf.len())?;
        let want = buf.len();
        let b = Raw::of_mut(buf);
        let got = self.call("receive", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            let status = w
                .process_at_rank(from as i32)
                .receive_into(unsafe { b.get() });
            status.count(u8::equivalent_datatype()) as usize
        })?;
        if got != want {
            return Err(CommError(format!(
                "received {got} bytes from rank {from}, expected {want}"
            )));
        }
        Ok(())
    }

    fn recv_message(&self, from: usize) -> CommResult<Vec<u8>> {
        check_peer(self.ranks, self.rank, from, "receive from")?;
        self.call("receive", move |w| {
            w.process_at_rank(from as i32).receive_vec::<u8>().0
        })
    }

    fn send_recv_message(&self, send: &[u8], to: usize, from: usize) -> CommResult<Vec<u8>> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        check_peer(self.ranks, self.rank, from, "receive from")?;
        Mpi::count(send.len())?;
        let s = Raw::of(send);
        self.call("send-receive", move |w| {
            // SAFETY: `call` waits for the job (see `Raw`).
            let s = &unsafe { s.get() }[..];
            // The send is posted first and waited for last, so the receive
            // goes on while the peer is still receiving.
            mpi::request::scope(|scope| {
                let sent = w.process_at_rank(to as i32).immediate_send(scope, s);
                let (v, _) = w.process_at_rank(from as i32).receive_vec::<u8>();
                sent.wait();
                v
            })
        })
    }

    fn barrier(&self) -> CommResult<()> {
        self.call("barrier", |w| w.barrier())
    }
}
