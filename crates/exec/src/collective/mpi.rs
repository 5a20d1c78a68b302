//! [`Collective`] over MPI (OpenMPI, MPICH): the world communicator of the
//! processes `mpirun` started, through the `mpi` crate (cargo feature
//! `mpi`; building it needs the MPI headers and libclang, running it the
//! MPI library).
//!
//! MPI is initialized with `MPI_THREAD_FUNNELED`: only the thread that
//! made the [`Mpi`] calls MPI (the runtime's worker threads never do). It
//! is finalized when the [`Mpi`] drops. Each call runs under the
//! [`Watchdog`].

use super::{check_gather, check_peer, check_scatter, Collective, CommError, CommResult, Watchdog};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::time::Duration;

/// All-reduces go in pieces of this many elements, so that the copy of the
/// send buffer MPI needs stays small.
const PIECE: usize = 1 << 22;

/// The world communicator of an MPI launch.
pub struct Mpi {
    world: SimpleCommunicator,
    watchdog: Watchdog,
    rank: usize,
    ranks: usize,
    // Dropped last: finalizes MPI.
    _universe: Universe,
}

impl Mpi {
    /// Initializes MPI (once per process). Refuses, in one line, a process
    /// that no MPI launcher started, and a second initialization.
    pub fn init(timeout: Duration) -> CommResult<Mpi> {
        if !super::launched_by_mpi() {
            return Err(CommError(
                "this process was not started by an MPI launcher (run it as: mpirun -np N graphopt ...)"
                    .into(),
            ));
        }
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| CommError("MPI was already initialized in this process".into()))?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let ranks = world.size() as usize;
        Ok(Mpi {
            watchdog: Watchdog::new(rank, timeout),
            world,
            rank,
            ranks,
            _universe: universe,
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
        let _w = self.watchdog.watch("all-reduce");
        let mut send = Vec::with_capacity(PIECE.min(buf.len()));
        for piece in buf.chunks_mut(PIECE) {
            send.clear();
            send.extend_from_slice(piece);
            self.world
                .all_reduce_into(&send[..], piece, SystemOperation::sum());
        }
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_scatter(self.ranks, send.len(), recv.len())?;
        Mpi::count(recv.len())?;
        let _w = self.watchdog.watch("reduce-scatter");
        self.world
            .reduce_scatter_block_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        Mpi::count(send.len())?;
        let _w = self.watchdog.watch("all-gather");
        self.world.all_gather_into(send, recv);
        Ok(())
    }

    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        Mpi::count(send.len())?;
        let _w = self.watchdog.watch("all-gather");
        self.world.all_gather_into(send, recv);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [u8], root: usize) -> CommResult<()> {
        if root >= self.ranks {
            return Err(CommError(format!(
                "broadcast from rank {root}: there are {} ranks",
                self.ranks
            )));
        }
        Mpi::count(buf.len())?;
        let _w = self.watchdog.watch("broadcast");
        self.world.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn send(&self, buf: &[u8], to: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        Mpi::count(buf.len())?;
        let _w = self.watchdog.watch("send");
        self.world.process_at_rank(to as i32).send(buf);
        Ok(())
    }

    fn recv(&self, buf: &mut [u8], from: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, from, "receive from")?;
        Mpi::count(buf.len())?;
        let _w = self.watchdog.watch("receive");
        let status = self.world.process_at_rank(from as i32).receive_into(buf);
        let got = status.count(u8::equivalent_datatype()) as usize;
        if got != buf.len() {
            return Err(CommError(format!(
                "received {got} bytes from rank {from}, expected {}",
                buf.len()
            )));
        }
        Ok(())
    }

    fn recv_message(&self, from: usize) -> CommResult<Vec<u8>> {
        check_peer(self.ranks, self.rank, from, "receive from")?;
        let _w = self.watchdog.watch("receive");
        let (v, _) = self.world.process_at_rank(from as i32).receive_vec::<u8>();
        Ok(v)
    }

    fn send_recv_message(&self, send: &[u8], to: usize, from: usize) -> CommResult<Vec<u8>> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        check_peer(self.ranks, self.rank, from, "receive from")?;
        Mpi::count(send.len())?;
        let _w = self.watchdog.watch("send-receive");
        // The send is posted first and waited for last, so the receive
        // goes on while the peer is still receiving.
        Ok(mpi::request::scope(|scope| {
            let sent = self
                .world
                .process_at_rank(to as i32)
                .immediate_send(scope, send);
            let (v, _) = self.world.process_at_rank(from as i32).receive_vec::<u8>();
            sent.wait();
            v
        }))
    }

    fn barrier(&self) -> CommResult<()> {
        let _w = self.watchdog.watch("barrier");
        self.world.barrier();
        Ok(())
    }
}
