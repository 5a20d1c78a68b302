//! The backend interface: what the CPU backend here and a CUDA backend
//! later both implement.
//!
//! A [`Backend`] turns one node (with its input and output types, known
//! before anything runs) into a [`Kernel`], or says why it cannot; the
//! executor asks for every node first and refuses the model on the first
//! refusal, so no run starts that cannot finish. A kernel then gets typed
//! views into the arena ([`KernelIo`]): input slices, output slices, a
//! scratch workspace; it writes only into its outputs and the workspace.
//!
//! In place: when the plan puts output 0 in the storage of an input (the
//! elementwise and update rules of [`graphopt_plan::inplace_rule`]), that
//! input is passed as [`Data::Output0`]: its elements are the output's
//! current contents (for a Scatter, the output already holds `data`). A kernel that can read it there says so with
//! [`Kernel::in_place`]; for the others the executor first copies the input
//! into the workspace (staging, counted in the workspace bytes). View ops
//! whose output the plan aliases to the input are not run at all.

pub use crate::activation::Activation;
use graphopt_ir::{DType, NodeData};

/// An input or output's type, as the kernel sees it when it is made.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

/// Everything a backend may read to make a kernel.
pub struct NodeCtx<'a> {
    pub node: &'a NodeData,
    /// The default-domain opset of the model (semantics changed with it:
    /// Softmax's axis, Reduce* axes as an input, ...).
    pub opset: i64,
    /// `None` for an omitted optional input.
    pub inputs: Vec<Option<TensorInfo>>,
    /// Output types; an omitted optional output gets a placeholder (f32,
    /// shape `[0]`).
    pub outputs: Vec<TensorInfo>,
    /// Contents of constant inputs (initializers), by input slot, for
    /// kernels that read attributes-as-inputs (Reshape's shape, Slice's
    /// starts): `None` when the input is computed at run time.
    pub constants: Vec<Option<&'a [u8]>>,
}

impl NodeCtx<'_> {
    pub fn input(&self, i: usize) -> Result<&TensorInfo, String> {
        self.inputs
            .get(i)
            .and_then(|t| t.as_ref())
            .ok_or_else(|| format!("input {i} is missing"))
    }
}

/// Makes kernels for one device.
pub trait Backend: Send + Sync {
    /// `cpu`, `cuda`, ...
    fn name(&self) -> &str;
    /// Whether the backend has any kernel for this op (checked for every
    /// node before shapes are even looked at, so that a model with an
    /// unknown op is refused by naming it).
    fn has_op(&self, domain: &str, op_type: &str) -> bool;
    /// A kernel for the node, or one line saying why there is none.
    fn kernel(&self, ctx: &NodeCtx) -> Result<Box<dyn Kernel>, String>;
}

/// One node's computation, made once per plan.
pub trait Kernel: Send + Sync {
    /// Scratch bytes this kernel needs (aligned to 64 when given).
    fn workspace_bytes(&self) -> usize {
        0
    }
    /// True when the kernel reads a [`Data::Output0`] input correctly
    /// (element `i` read before element `i` of output 0 is written; a
    /// Scatter starts from output 0's contents instead of copying `data`).
    fn in_place(&self) -> bool {
        false
    }
    /// Computes the outputs.
    fn run(&self, io: &mut KernelIo) -> Result<(), String>;
    /// The activation this kernel is, if it is one the executor can fuse
    /// into its producer ([`Kernel::fuse_activation`]). A Clip whose
    /// bounds are inputs reports its attribute bounds, and the executor
    /// takes constant bound inputs in their place.
    fn activation(&self) -> Option<Activation> {
        None
    }
    /// Apply `act` to output 0 as part of computing it (while it is in
    /// cache); true when the kernel does. The executor then skips the
    /// activation's own step, which the plan had put in place over this
    /// output.
    fn fuse_activation(&mut self, _act: Activation) -> bool {
        false
    }
}

/// Where an input's elements are.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    Bytes(&'a [u8]),
    /// In output 0's storage (an in-place pair of the plan).
    Output0,
}

/// One input of a running kernel.
#[derive(Clone, Copy, Debug)]
pub struct In<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: Data<'a>,
}

impl<'a> In<'a> {
    /// The input's bytes; an error for an in-place input (which only
    /// kernels that declare [`Kernel::in_place`] ever see).
    pub fn bytes(&self) -> Result<&'a [u8], String> {
        match self.data {
            Data::Bytes(b) => Ok(b),
            Data::Output0 => Err("input lives in output 0 (in place)".into()),
        }
    }
    pub fn f32(&self) -> Result<&'a [f32], String> {
        self.expect(DType::F32)?;
        Ok(crate::tensor::cast(self.bytes()?))
    }
    pub fn expect(&self, d: DType) -> Result<(), String> {
        if self.dtype == d {
            Ok(())
        } else {
            Err(format!("expected {}, got {}", d.name(), self.dtype.name()))
        }
    }
    /// Integer contents widened to i64 (index and shape inputs).
    pub fn ints(&self) -> Result<Vec<i64>, String> {
        let b = self.bytes()?;
        Ok(match self.dtype {
            DType::I64 => crate::tensor::cast::<i64>(b).to_vec(),
            DType::I32 => crate::tensor::cast::<i32>(b)
                .iter()
                .map(|&x| x as i64)
                .collect(),
            d => return Err(format!("expected int64 or int32, got {}", d.name())),
        })
    }
    /// [`In::ints`] without a copy where the input is int64 already: index
    /// inputs as large as an activation (the MaxPool indices a backward
    /// graph scatters through, 25 MB in resnet18's step at batch 16) are
    /// read where they lie instead of being copied beside the arena.
    pub fn ints_ref(&self) -> Result<std::borrow::Cow<'a, [i64]>, String> {
        Ok(match self.dtype {
            DType::I64 => std::borrow::Cow::Borrowed(crate::tensor::cast::<i64>(self.bytes()?)),
            _ => std::borrow::Cow::Owned(self.ints()?),
        })
    }
    /// A float or double input's elements widened to f64.
    pub fn floats(&self) -> Result<Vec<f64>, String> {
        let b = self.bytes()?;
        Ok(match self.dtype {
            DType::F32 => crate::tensor::cast::<f32>(b)
                .iter()
                .map(|&v| v as f64)
                .collect(),
            DType::F64 => crate::tensor::cast::<f64>(b).to_vec(),
            d => return Err(format!("expected float or double, got {}", d.name())),
        })
    }
}

/// One output of a running kernel.
#[derive(Debug)]
pub struct Out<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a mut [u8],
}

impl Out<'_> {
    pub fn f32(&mut self) -> Result<&mut [f32], String> {
        if self.dtype != DType::F32 {
            return Err(format!("expected float output, got {}", self.dtype.name()));
        }
        Ok(crate::tensor::cast_mut(self.data))
    }
}

/// The views a kernel runs on.
pub struct KernelIo<'a> {
    /// `None` for an omitted optional input.
    pub inputs: Vec<Option<In<'a>>>,
    /// The outputs in order up to the last present one: trailing omitted
    /// outputs are left out, an omitted one before a present one is an
    /// empty placeholder (f32, shape `[0]`) on the CPU backend (the CUDA
    /// backend refuses those).
    pub outputs: Vec<Out<'a>>,
    /// At least [`Kernel::workspace_bytes`], 64-aligned.
    pub workspace: &'a mut [u8],
    /// Threads the kernel may use.
    pub threads: usize,
}

impl<'a> KernelIo<'a> {
    pub fn input(&self, i: usize) -> Result<In<'a>, String> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("input {i} is missing"))
    }
}
