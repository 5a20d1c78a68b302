//! `graphopt.distributed`'s native half: this process's communicator
//! ([`graphopt::distributed::World`]) under `mpirun`, shared by
//! `Session.train(distributed=..., pipeline=...)` and the collectives on
//! numpy arrays. MPI is initialized once per process (the first `init`,
//! or the first distributed `train`) and finalized by `finalize()`, which
//! the Python module registers with `atexit`.

use crate::convert::{array_to_tensor, tensor_to_array};
use crate::{gerr, gmsg};
use graphopt::distributed::{CommError, World, HAS_MPI};
use graphopt::ir::DType;
use graphopt::HostTensor;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// The process's world: `None` before `init`, `Some(None)` once finalized
/// (MPI cannot start twice in one process).
static WORLD: Mutex<Option<Option<Arc<World>>>> = Mutex::new(None);

/// The world, joined now if this process has not yet (`what` names the
/// call in errors). The lock is taken with the GIL released, so that a
/// thread joining (which waits for the other ranks) does not hold up
/// another thread waiting for the GIL.
pub(crate) fn joined(py: Python<'_>, what: &str, timeout: Option<f64>) -> PyResult<Arc<World>> {
    let timeout = graphopt::distributed::comm_timeout(timeout, "comm_timeout").map_err(gerr)?;
    py.detach(|| {
        let mut w = WORLD.lock().unwrap_or_else(|p| p.into_inner());
        match &*w {
            Some(Some(world)) => return Ok(world.clone()),
            Some(None) => {
                return Err(graphopt::Error::new(format!(
                    "{what}: graphopt.distributed.finalize() already ended MPI in this process"
                )))
            }
            None => {}
        }
        if !HAS_MPI {
            return Err(graphopt::Error::unsupported(format!(
                "{what}: this graphopt package was built without MPI: pip install ./crates/python --config-settings=build-args=\"--features mpi --auditwheel skip\" (README, \"Multiple devices\")"
            )));
        }
        graphopt::distributed::require_launch(what)?;
        let world = Arc::new(World::init(timeout)?);
        *w = Some(Some(world.clone()));
        Ok(world)
    })
    .map_err(gerr)
}

/// This process's place among the processes `mpirun` started, with
/// collectives on numpy arrays. Every rank must make the same calls in
/// the same order (MPI's rule); a call that waits longer than the timeout
/// given to `init` ends the process with a line naming it (and `mpirun`
/// the others). It holds no reference to MPI: after `finalize()` its
/// collectives raise.
#[pyclass(name = "World", module = "graphopt.distributed", frozen)]
pub(crate) struct PyWorld {
    rank: usize,
    size: usize,
    engine: &'static str,
}

impl PyWorld {
    /// The world for one call (while it runs, `finalize` waits for it).
    fn world(&self, what: &str) -> PyResult<Arc<World>> {
        match &*WORLD.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Some(w)) => Ok(w.clone()),
            _ => Err(gmsg(format!(
                "{what}: graphopt.distributed.finalize() already ended MPI in this process"
            ))),
        }
    }

    fn f32s(&self, what: &str, a: &Bound<'_, PyAny>) -> PyResult<HostTensor> {
        let t = array_to_tensor(what, a)?;
        if t.dtype != DType::F32 {
            return Err(gmsg(format!(
                "{what}: expected a float32 array, not {:?}",
                t.dtype
            )));
        }
        Ok(t)
    }
}

fn floats(t: &HostTensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn host(shape: Vec<usize>, v: &[f32]) -> HostTensor {
    HostTensor {
        dtype: DType::F32,
        shape,
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

fn comm_err(e: CommError) -> PyErr {
    gerr(graphopt::Error::new(e.0))
}

#[pymethods]
impl PyWorld {
    /// This process's rank (0-based).
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// How many processes `mpirun` started.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The communication engine ("mpi").
    #[getter]
    fn engine(&self) -> &'static str {
        self.engine
    }

    fn __repr__(&self) -> String {
        format!(
            "graphopt.distributed.World(rank={}, size={}, engine={:?})",
            self.rank(),
            self.size(),
            self.engine()
        )
    }

    /// Waits for every rank.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let w = self.world("barrier")?;
        py.detach(move || w.comm().barrier()).map_err(comm_err)
    }

    /// The sum over the ranks of a float32 array (each rank gives one of
    /// the same shape): a new array.
    fn all_reduce<'py>(
        &self,
        py: Python<'py>,
        array: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.f32s("all_reduce", array)?;
        let w = self.world("all_reduce")?;
        let shape = t.shape.clone();
        let sum = py
            .detach(move || {
                let mut v = floats(&t);
                w.comm().all_reduce_sum(&mut v).map(|_| v)
            })
            .map_err(comm_err)?;
        tensor_to_array(py, host(shape, &sum))
    }

    /// Every rank's float32 array (the same shape on each), stacked along
    /// a new first axis in rank order.
    fn all_gather<'py>(
        &self,
        py: Python<'py>,
        array: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = self.f32s("all_gather", array)?;
        let w = self.world("all_gather")?;
        let mut shape = vec![w.ranks()];
        shape.extend(&t.shape);
        let all = py
            .detach(move || {
                let send = floats(&t);
                let mut recv = vec![0f32; send.len() * w.ranks()];
                w.comm().all_gather(&send, &mut recv).map(|_| recv)
            })
            .map_err(comm_err)?;
        tensor_to_array(py, host(shape, &all))
    }

    /// Rank `root`'s array, on every rank: each gives an array of the
    /// same dtype and shape (its values are replaced), any dtype.
    #[pyo3(signature = (array, root=0))]
    fn broadcast<'py>(
        &self,
        py: Python<'py>,
        array: &Bound<'py, PyAny>,
        root: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        if root >= self.size {
            return Err(gmsg(format!(
                "broadcast: root {root}, but there are {} ranks",
                self.size
            )));
        }
        let mut t = array_to_tensor("broadcast", array)?;
        let w = self.world("broadcast")?;
        let t = py
            .detach(move || {
                // The root's size first: a rank whose array differs still
                // takes part (into a buffer of the root's size, so that
                // every rank makes the same calls), then says so.
                let mut len = (t.data.len() as u64).to_le_bytes();
                w.comm().broadcast(&mut len, root)?;
                let want = u64::from_le_bytes(len);
                if want != t.data.len() as u64 {
                    let mut scratch = vec![0u8; want as usize];
                    w.comm().broadcast(&mut scratch, root)?;
                    return Err(CommError(format!(
                        "broadcast: rank {root} sent {want} bytes, this rank's array has {}",
                        t.data.len()
                    )));
                }
                w.comm().broadcast(&mut t.data, root).map(|_| t)
            })
            .map_err(comm_err)?;
        tensor_to_array(py, t)
    }
}

/// Joins the processes `mpirun` started (MPI starts here, once per
/// process; later calls return the same world, and their `comm_timeout`
/// is not used). `comm_timeout`: seconds any collective may wait (default
/// 300) before it ends the process.
#[pyfunction(name = "distributed_init")]
#[pyo3(signature = (comm_timeout=None))]
pub(crate) fn init(py: Python<'_>, comm_timeout: Option<f64>) -> PyResult<PyWorld> {
    let w = joined(py, "graphopt.distributed.init", comm_timeout)?;
    Ok(PyWorld {
        rank: w.rank(),
        size: w.ranks(),
        engine: w.comm().engine(),
    })
}

/// Ends MPI in this process (every rank must call it; `atexit` does, after
/// a clean exit). A no-op before `init` or after a first `finalize`.
#[pyfunction(name = "distributed_finalize")]
pub(crate) fn finalize(py: Python<'_>) {
    let world = {
        let mut w = WORLD.lock().unwrap_or_else(|p| p.into_inner());
        match w.take() {
            Some(Some(world)) => {
                *w = Some(None);
                Some(world)
            }
            other => {
                *w = other;
                None
            }
        }
    };
    // MPI is finalized when the last reference drops (a call in flight on
    // another thread keeps it until that call returns).
    py.detach(move || drop(world));
}

/// Whether this process was started by an MPI launcher.
#[pyfunction(name = "distributed_launched")]
pub(crate) fn launched() -> bool {
    graphopt::distributed::launched_by_mpi()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("HAS_MPI", HAS_MPI)?;
    m.add_class::<PyWorld>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(launched, m)?)?;
    Ok(())
}
