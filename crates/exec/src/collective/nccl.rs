//! NCCL between GPUs (cargo feature `cuda`), through cudarc's `nccl`
//! module with the library loaded at run time: building needs neither
//! CUDA nor NCCL.
//!
//! [`Nccl::init`] makes one communicator rank per process: rank 0 draws
//! NCCL's unique id and broadcasts its 128 bytes over a host
//! [`Collective`] (MPI), as onnxruntime-training and torch.distributed do.
//! The device operations work on `CudaSlice`s on the communicator's
//! stream; the [`Collective`] methods stage host buffers through the
//! device (for code that holds its tensors on the host).
//!
//! Status: compiled and unit-tested without a GPU (the id's bytes, the
//! refusal where no GPU or no libnccl is found); the one-GPU self-test
//! (`tests/nccl.rs`) runs in `benches/device/cuda_check.sh`.

use super::{check_gather, check_peer, check_scatter, Collective, CommError, CommResult};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use std::sync::Arc;

/// Why NCCL cannot start here, or `None` when the CUDA driver and libnccl
/// load and a device is visible.
pub fn unavailable() -> Option<String> {
    // SAFETY: these only try to dlopen the libraries.
    let (cuda, nccl) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nccl::sys::is_culib_present(),
        )
    };
    if !cuda {
        return Some(
            "NCCL: no CUDA driver found (libcuda could not be loaded): NCCL needs NVIDIA GPUs"
                .into(),
        );
    }
    if !nccl {
        return Some("NCCL: libnccl.so could not be loaded (install NCCL 2.x, or put a directory with libnccl.so on LD_LIBRARY_PATH)".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => None,
        Ok(_) => Some("NCCL: the CUDA driver sees no GPU".into()),
        Err(e) => Some(format!("NCCL: the CUDA driver failed to start: {e}")),
    }
}

/// NCCL's unique id as the bytes a host collective carries.
pub fn id_bytes(id: &Id) -> [u8; 128] {
    id.internal().map(|c| c as u8)
}

/// The id from its bytes (no call into NCCL).
pub fn id_from_bytes(b: &[u8; 128]) -> Id {
    Id::uninit(b.map(|x| x as std::ffi::c_char))
}

/// One rank of an NCCL communicator, on one GPU.
pub struct Nccl {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    ranks: usize,
}

fn nccl_err(what: &str, e: impl std::fmt::Debug) -> CommError {
    CommError(format!("NCCL {what}: {e:?}"))
}

impl Nccl {
    /// Joins the NCCL communicator of `host`'s ranks on GPU `ordinal`
    /// (each rank its own device, or shared). Every rank of `host` must
    /// call it. Refuses in one line where there is no GPU or no NCCL.
    pub fn init(host: &dyn Collective, ordinal: usize) -> CommResult<Nccl> {
        // Every rank learns whether any rank cannot start, so that none is
        // left waiting in the id's broadcast.
        let why = unavailable();
        let mut flags = vec![0u8; host.ranks()];
        host.all_gather_bytes(&[why.is_some() as u8], &mut flags)?;
        if let Some(w) = why {
            return Err(CommError(w));
        }
        if let Some(r) = flags.iter().position(|&f| f != 0) {
            return Err(CommError(format!("NCCL: rank {r} cannot start NCCL")));
        }
        let mut bytes = [0u8; 128];
        if host.rank() == 0 {
            bytes = id_bytes(&Id::new().map_err(|e| nccl_err("unique id", e))?);
        }
        host.broadcast(&mut bytes, 0)?;
        let ctx = CudaContext::new(ordinal).map_err(|e| nccl_err("device", e))?;
        let stream = ctx.default_stream();
        let comm = Comm::from_rank(
            stream.clone(),
            host.rank(),
            host.ranks(),
            id_from_bytes(&bytes),
        )
        .map_err(|e| nccl_err("communicator", e))?;
        Ok(Nccl {
            comm,
            stream,
            rank: host.rank(),
            ranks: host.ranks(),
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Sums `buf` over the ranks, in place on the device.
    pub fn all_reduce_sum_device(&self, buf: &mut CudaSlice<f32>) -> CommResult<()> {
        self.comm
            .all_reduce_in_place(buf, &ReduceOp::Sum)
            .map_err(|e| nccl_err("all-reduce", e))?;
        Ok(())
    }

    /// `recv` becomes this rank's block of the sum of every rank's `send`.
    pub fn reduce_scatter_sum_device(
        &self,
        send: &CudaSlice<f32>,
        recv: &mut CudaSlice<f32>,
    ) -> CommResult<()> {
        check_scatter(self.ranks, send.len(), recv.len())?;
        self.comm
            .reduce_scatter(send, recv, &ReduceOp::Sum)
            .map_err(|e| nccl_err("reduce-scatter", e))?;
        Ok(())
    }

    /// `recv` becomes every rank's `send`, in rank order.
    pub fn all_gather_device(
        &self,
        send: &CudaSlice<f32>,
        recv: &mut CudaSlice<f32>,
    ) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        self.comm
            .all_gather(send, recv)
            .map_err(|e| nccl_err("all-gather", e))?;
        Ok(())
    }

    fn to_device<T: cudarc::driver::DeviceRepr>(&self, h: &[T]) -> CommResult<CudaSlice<T>> {
        self.stream
            .clone_htod(h)
            .map_err(|e| nccl_err("host to device", e))
    }

    fn to_host<T: cudarc::driver::DeviceRepr>(
        &self,
        d: &CudaSlice<T>,
        h: &mut [T],
    ) -> CommResult<()> {
        self.stream
            .memcpy_dtoh(d, h)
            .map_err(|e| nccl_err("device to host", e))?;
        self.stream
            .synchronize()
            .map_err(|e| nccl_err("synchronize", e))
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }
    fn ranks(&self) -> usize {
        self.ranks
    }
    fn engine(&self) -> &'static str {
        "nccl"
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> CommResult<()> {
        let mut d = self.to_device(buf)?;
        self.all_reduce_sum_device(&mut d)?;
        self.to_host(&d, buf)
    }
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_scatter(self.ranks, send.len(), recv.len())?;
        let s = self.to_device(send)?;
        let mut r = self.to_device(recv)?;
        self.reduce_scatter_sum_device(&s, &mut r)?;
        self.to_host(&r, recv)
    }
    fn all_gather(&self, send: &[f32], recv: &mut [f32]) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        let s = self.to_device(send)?;
        let mut r = self.to_device(recv)?;
        self.all_gather_device(&s, &mut r)?;
        self.to_host(&r, recv)
    }
    fn all_gather_bytes(&self, send: &[u8], recv: &mut [u8]) -> CommResult<()> {
        check_gather(self.ranks, send.len(), recv.len())?;
        let s = self.to_device(send)?;
        let mut r = self.to_device(recv)?;
        self.comm
            .all_gather(&s, &mut r)
            .map_err(|e| nccl_err("all-gather", e))?;
        self.to_host(&r, recv)
    }
    fn broadcast(&self, buf: &mut [u8], root: usize) -> CommResult<()> {
        if root >= self.ranks {
            return Err(CommError(format!(
                "broadcast from rank {root}: there are {} ranks",
                self.ranks
            )));
        }
        let mut d = self.to_device(buf)?;
        self.comm
            .broadcast_in_place(&mut d, root as i32)
            .map_err(|e| nccl_err("broadcast", e))?;
        self.to_host(&d, buf)
    }
    fn send(&self, buf: &[u8], to: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        let d = self.to_device(buf)?;
        self.comm
            .send(&d, to as i32)
            .map_err(|e| nccl_err("send", e))?;
        self.stream
            .synchronize()
            .map_err(|e| nccl_err("synchronize", e))
    }
    fn recv(&self, buf: &mut [u8], from: usize) -> CommResult<()> {
        check_peer(self.ranks, self.rank, from, "receive from")?;
        let mut d = self.to_device(buf)?;
        self.comm
            .recv(&mut d, from as i32)
            .map_err(|e| nccl_err("receive", e))?;
        self.to_host(&d, buf)
    }
    /// NCCL has no probe: a message is its 8-byte length, then its bytes.
    fn send_message(&self, buf: &[u8], to: usize) -> CommResult<()> {
        self.send(&(buf.len() as u64).to_le_bytes(), to)?;
        self.send(buf, to)
    }

    fn recv_message(&self, from: usize) -> CommResult<Vec<u8>> {
        let mut len = [0u8; 8];
        self.recv(&mut len, from)?;
        let mut v = vec![0u8; u64::from_le_bytes(len) as usize];
        self.recv(&mut v, from)?;
        Ok(v)
    }

    fn send_recv_message(&self, send: &[u8], to: usize, from: usize) -> CommResult<Vec<u8>> {
        check_peer(self.ranks, self.rank, to, "send to")?;
        check_peer(self.ranks, self.rank, from, "receive from")?;
        // Each phase in one group, so that both directions progress.
        let exchange = |out: &[u8], back: usize| -> CommResult<Vec<u8>> {
            let s = self.to_device(out)?;
            let mut r = self.to_device(&vec![0u8; back])?;
            {
                let _g = self.comm.group();
                self.comm
                    .send(&s, to as i32)
                    .map_err(|e| nccl_err("send", e))?;
                self.comm
                    .recv(&mut r, from as i32)
                    .map_err(|e| nccl_err("receive", e))?;
            }
            let mut h = vec![0u8; back];
            self.to_host(&r, &mut h)?;
            Ok(h)
        };
        let len = exchange(&(send.len() as u64).to_le_bytes(), 8)?;
        let back = u64::from_le_bytes(len.as_slice().try_into().expect("8 bytes")) as usize;
        exchange(send, back)
    }

    fn barrier(&self) -> CommResult<()> {
        // An all-reduce of one element: every rank must reach it.
        let mut one = [0f32];
        self.all_reduce_sum(&mut one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Solo;

    #[test]
    fn the_unique_id_travels_as_bytes() {
        let mut b = [0u8; 128];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7 + 200) as u8;
        }
        assert_eq!(id_bytes(&id_from_bytes(&b)), b);
    }

    #[test]
    fn without_a_gpu_init_refuses_in_one_line() {
        // With a GPU and NCCL, tests/nccl.rs runs the one-rank self-test.
        let Some(why) = unavailable() else { return };
        let e = Nccl::init(&Solo, 0).err().expect("refused");
        assert_eq!(e.0, why);
        assert!(!e.0.contains('\n') && e.0.starts_with("NCCL: "), "{}", e.0);
    }
}
