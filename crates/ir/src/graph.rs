//! The graph: values and nodes in arenas with typed ids, program order kept
//! apart from storage, and use lists kept by every mutation.
//!
//! Invariants the mutation API maintains (the verifier checks them too):
//! 1. A value has at most one definition: a node output, a graph input, an
//!    initializer, or (in a subgraph) a capture of an enclosing graph's value.
//!    A graph input may also carry an initializer (its default value).
//! 2. `uses(v)` lists exactly the node input slots and captures that name `v`.
//! 3. Names are unique among live values; removing a node never renumbers ids.

use crate::{Attribute, IrError, SparseTensor, Tensor, Type};
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::fmt;

mod layout;
mod patch;
use layout::Layout;
pub use patch::{Patch, Place};

/// A value (tensor, sequence, ...) in one graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(u32);

/// A node in one graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%v{}", self.0)
    }
}
impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#n{}", self.0)
    }
}

/// Where a value is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Use {
    /// Input slot `slot` of `node`.
    Input { node: NodeId, slot: u32 },
    /// Read by a subgraph of `node` (If/Loop/Scan bodies capture outer values).
    Capture { node: NodeId },
}

impl Use {
    pub fn node(self) -> NodeId {
        match self {
            Use::Input { node, .. } | Use::Capture { node } => node,
        }
    }
}

/// A value's data.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    pub name: String,
    /// Declared or inferred type.
    pub ty: Option<Type>,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    producer: Option<(NodeId, u32)>,
    initializer: Option<Tensor>,
    sparse_initializer: Option<SparseTensor>,
    outer: bool,
    uses: Vec<Use>,
    live: bool,
}

impl ValueData {
    fn new(name: String, ty: Option<Type>) -> ValueData {
        ValueData {
            name,
            ty,
            doc_string: String::new(),
            metadata_props: Vec::new(),
            producer: None,
            initializer: None,
            sparse_initializer: None,
            outer: false,
            uses: Vec::new(),
            live: true,
        }
    }
}

/// A node's data. Inputs and outputs are read through accessors so that use
/// lists stay correct; change them with [`Graph::set_input`] and friends.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeData {
    pub name: String,
    pub op_type: String,
    /// `""` is the default ONNX domain (`ai.onnx`).
    pub domain: String,
    pub overload: String,
    pub attributes: Vec<Attribute>,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    /// Fields the IR does not interpret, carried verbatim for export
    /// (encoded `NodeDeviceConfigurationProto`s).
    pub preserved: Vec<Bytes>,
    inputs: Vec<Option<ValueId>>,
    outputs: Vec<Option<ValueId>>,
    captures: Vec<ValueId>,
    live: bool,
}

impl NodeData {
    pub fn inputs(&self) -> &[Option<ValueId>] {
        &self.inputs
    }
    pub fn outputs(&self) -> &[Option<ValueId>] {
        &self.outputs
    }
    /// Input `i` if present.
    pub fn input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }
    /// Output `i` if present.
    pub fn output(&self, i: usize) -> Option<ValueId> {
        self.outputs.get(i).copied().flatten()
    }
    /// Outer values read by this node's subgraphs.
    pub fn captures(&self) -> &[ValueId] {
        &self.captures
    }
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.attributes.iter().find(|a| a.name == name)
    }
    pub fn attr_int(&self, name: &str) -> Option<i64> {
        match self.attr(name)?.value {
            crate::AttrValue::Int(v) => Some(v),
            _ => None,
        }
    }
    pub fn attr_float(&self, name: &str) -> Option<f32> {
        match self.attr(name)?.value {
            crate::AttrValue::Float(v) => Some(v),
            _ => None,
        }
    }
    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        match &self.attr(name)?.value {
            crate::AttrValue::Ints(v) => Some(v),
            _ => None,
        }
    }
    pub fn attr_str(&self, name: &str) -> Option<&str> {
        match &self.attr(name)?.value {
            crate::AttrValue::String(v) => std::str::from_utf8(v).ok(),
            _ => None,
        }
    }
    pub fn attr_tensor(&self, name: &str) -> Option<&Tensor> {
        match &self.attr(name)?.value {
            crate::AttrValue::Tensor(t) => Some(t),
            _ => None,
        }
    }
    /// True when any attribute holds a subgraph.
    pub fn has_subgraphs(&self) -> bool {
        self.attributes.iter().any(|a| a.graphs().next().is_some())
    }
    /// `op_type` qualified by domain when the domain is not the default one.
    pub fn qualified_op(&self) -> String {
        if self.domain.is_empty() || self.domain == "ai.onnx" {
            self.op_type.clone()
        } else {
            format!("{}::{}", self.domain, self.op_type)
        }
    }
}

/// A node to add: what [`Graph::add_node`] takes.
#[derive(Clone, Debug, Default)]
pub struct NewNode {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub overload: String,
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<Option<ValueId>>,
    pub attributes: Vec<Attribute>,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    pub preserved: Vec<Bytes>,
}

impl NewNode {
    pub fn new(op_type: impl Into<String>) -> NewNode {
        NewNode {
            op_type: op_type.into(),
            ..NewNode::default()
        }
    }
    pub fn name(mut self, name: impl Into<String>) -> NewNode {
        self.name = name.into();
        self
    }
    pub fn domain(mut self, domain: impl Into<String>) -> NewNode {
        self.domain = domain.into();
        self
    }
    pub fn inputs(mut self, inputs: &[ValueId]) -> NewNode {
        self.inputs = inputs.iter().map(|&v| Some(v)).collect();
        self
    }
    pub fn outputs(mut self, outputs: &[ValueId]) -> NewNode {
        self.outputs = outputs.iter().map(|&v| Some(v)).collect();
        self
    }
    pub fn attr(mut self, a: Attribute) -> NewNode {
        self.attributes.push(a);
        self
    }
}

/// An ONNX graph (the main graph, a subgraph, or a function body).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    pub doc_string: String,
    pub metadata_props: Vec<(String, String)>,
    /// Graph inputs, in order. An input may also carry an initializer.
    pub inputs: Vec<ValueId>,
    /// Graph outputs, in order.
    pub outputs: Vec<ValueId>,
    /// Values with an explicit `value_info` entry, in order.
    pub value_info: Vec<ValueId>,
    /// `quantization_annotation`: tensor name and its (key, tensor name) pairs.
    pub quantization_annotation: Vec<(String, Vec<(String, String)>)>,
    values: Vec<ValueData>,
    nodes: Vec<NodeData>,
    /// Program order: a linked list, so that edits cost O(1).
    order: Layout,
    initializers: Vec<ValueId>,
    sparse_initializers: Vec<ValueId>,
    names: HashMap<String, ValueId>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    // ---- values -------------------------------------------------------

    /// Adds a value with an exact name; fails if the name is taken.
    pub fn add_value(
        &mut self,
        name: impl Into<String>,
        ty: Option<Type>,
    ) -> Result<ValueId, IrError> {
        let name = name.into();
        if self.names.contains_key(&name) {
            return Err(IrError::new(format!(
                "value '{name}' is defined more than once"
            )));
        }
        Ok(self.insert_value(name, ty))
    }

    fn insert_value(&mut self, name: String, ty: Option<Type>) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.names.insert(name.clone(), id);
        self.values.push(ValueData::new(name, ty));
        id
    }

    /// Adds a value named `hint`, or `hint_1`, `hint_2`... if taken.
    pub fn fresh_value(&mut self, hint: &str, ty: Option<Type>) -> ValueId {
        let name = self.fresh_name(hint);
        self.insert_value(name, ty)
    }

    /// A value name not yet used in this graph.
    ///
    /// The name is also unused in every nested subgraph: ONNX wants names
    /// unique across scopes. (A subgraph cannot see its enclosing graphs;
    /// passes that add values inside subgraphs check the enclosing scopes,
    /// and the verifier rejects a shadowing name.)
    pub fn fresh_name(&self, hint: &str) -> String {
        let taken = |n: &str| self.defines_name_deep(n);
        if !hint.is_empty() && !taken(hint) {
            return hint.to_string();
        }
        let base = if hint.is_empty() { "v" } else { hint };
        (1..)
            .map(|i| format!("{base}_{i}"))
            .find(|n| !taken(n))
            .expect("some suffix is free")
    }

    /// True when this graph or any nested subgraph has a value named `name`.
    pub fn defines_name_deep(&self, name: &str) -> bool {
        self.names.contains_key(name) || self.subgraphs().any(|(_, g)| g.defines_name_deep(name))
    }

    /// The value named `name`, or a new capture of an enclosing graph's value.
    pub fn value_or_outer(&mut self, name: &str) -> ValueId {
        if let Some(&v) = self.names.get(name) {
            return v;
        }
        let v = self.insert_value(name.to_string(), None);
        self.values[v.index()].outer = true;
        v
    }

    pub fn value_by_name(&self, name: &str) -> Option<ValueId> {
        self.names.get(name).copied()
    }

    pub fn value(&self, v: ValueId) -> &ValueData {
        &self.values[v.index()]
    }

    pub fn value_mut(&mut self, v: ValueId) -> &mut ValueData {
        &mut self.values[v.index()]
    }

    pub fn name(&self, v: ValueId) -> &str {
        &self.values[v.index()].name
    }

    pub fn ty(&self, v: ValueId) -> Option<&Type> {
        self.values[v.index()].ty.as_ref()
    }

    /// Live values in creation order.
    pub fn values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.values
            .iter()
            .enumerate()
            .filter(|(_, d)| d.live)
            .map(|(i, _)| ValueId(i as u32))
    }

    pub fn uses(&self, v: ValueId) -> &[Use] {
        &self.values[v.index()].uses
    }

    pub fn producer(&self, v: ValueId) -> Option<(NodeId, u32)> {
        self.values[v.index()].producer
    }

    pub fn producer_node(&self, v: ValueId) -> Option<&NodeData> {
        self.producer(v).map(|(n, _)| self.node(n))
    }

    /// The cone of `roots`: every node they depend on, through inputs and
    /// subgraph captures (for a training graph and its loss, the forward
    /// pass).
    pub fn cone(&self, roots: impl IntoIterator<Item = ValueId>) -> HashSet<NodeId> {
        let mut cone = HashSet::new();
        let mut stack: Vec<ValueId> = roots.into_iter().collect();
        let mut seen = HashSet::new();
        while let Some(v) = stack.pop() {
            if !seen.insert(v) {
                continue;
            }
            if let Some((n, _)) = self.producer(v) {
                if cone.insert(n) {
                    stack.extend(self.node(n).inputs().iter().flatten().copied());
                    stack.extend(self.node(n).captures().iter().copied());
                }
            }
        }
        cone
    }

    /// True for a capture of an enclosing graph's value.
    pub fn is_outer(&self, v: ValueId) -> bool {
        self.values[v.index()].outer
    }

    /// The graph inputs a caller feeds: those without an initializer (an
    /// input with one is an overridable default), in order.
    pub fn runtime_inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs
            .iter()
            .copied()
            .filter(|&v| self.initializer(v).is_none())
    }

    pub fn is_input(&self, v: ValueId) -> bool {
        self.inputs.contains(&v)
    }

    pub fn is_output(&self, v: ValueId) -> bool {
        self.outputs.contains(&v)
    }

    /// Renames a value. Subgraphs that capture it are updated too.
    pub fn rename_value(&mut self, v: ValueId, new_name: &str) -> Result<(), IrError> {
        let old = self.values[v.index()].name.clone();
        if old == new_name {
            return Ok(());
        }
        if self.defines_name_deep(new_name) {
            return Err(IrError::new(format!(
                "cannot rename '{old}': '{new_name}' exists"
            )));
        }
        self.names.remove(&old);
        self.names.insert(new_name.to_string(), v);
        self.values[v.index()].name = new_name.to_string();
        let capturers: Vec<NodeId> = self.values[v.index()]
            .uses
            .iter()
            .filter_map(|u| match u {
                Use::Capture { node } => Some(*node),
                _ => None,
            })
            .collect();
        for n in capturers {
            for a in &mut self.nodes[n.index()].attributes {
                for g in a.graphs_mut() {
                    g.rename_capture(&old, new_name)?;
                }
            }
        }
        Ok(())
    }

    fn rename_capture(&mut self, old: &str, new: &str) -> Result<(), IrError> {
        if let Some(v) = self.value_by_name(old) {
            if self.is_outer(v) {
                return self.rename_value(v, new);
            }
        }
        Ok(())
    }

    /// Removes a value that nothing defines or uses any more.
    pub fn remove_value(&mut self, v: ValueId) {
        let d = &mut self.values[v.index()];
        if !d.live {
            return;
        }
        debug_assert!(d.uses.is_empty(), "removing used value {}", d.name);
        // In release builds, a removed value that is still read leaves the
        // readers without an input rather than with a dangling id.
        for u in std::mem::take(&mut d.uses) {
            if let Use::Input { node, slot } = u {
                self.nodes[node.index()].inputs[slot as usize] = None;
            }
        }
        let d = &mut self.values[v.index()];
        d.live = false;
        d.initializer = None;
        d.sparse_initializer = None;
        let name = std::mem::take(&mut d.name);
        self.names.remove(&name);
        // Keep the name readable in debug output without letting it be found.
        self.values[v.index()].name = format!("<removed {name}>");
        self.inputs.retain(|&x| x != v);
        self.outputs.retain(|&x| x != v);
        self.value_info.retain(|&x| x != v);
        self.initializers.retain(|&x| x != v);
        self.sparse_initializers.retain(|&x| x != v);
    }

    pub fn is_live_value(&self, v: ValueId) -> bool {
        self.values.get(v.index()).is_some_and(|d| d.live)
    }

    // ---- initializers -------------------------------------------------

    /// Sets (or replaces) `v`'s initializer.
    pub fn set_initializer(&mut self, v: ValueId, t: Tensor) {
        if self.values[v.index()].initializer.is_none() {
            self.initializers.push(v);
        }
        self.values[v.index()].initializer = Some(t);
    }

    pub fn take_initializer(&mut self, v: ValueId) -> Option<Tensor> {
        self.initializers.retain(|&x| x != v);
        self.values[v.index()].initializer.take()
    }

    pub fn initializer(&self, v: ValueId) -> Option<&Tensor> {
        self.values[v.index()].initializer.as_ref()
    }

    /// Values with an initializer, in order.
    pub fn initializers(&self) -> &[ValueId] {
        &self.initializers
    }

    /// Adds a new initializer value named after `hint`.
    pub fn add_initializer(&mut self, hint: &str, t: Tensor) -> ValueId {
        let shape = crate::Shape::known(&t.dims);
        let v = self.fresh_value(hint, Some(Type::tensor(t.dtype, Some(shape))));
        self.set_initializer(v, t);
        v
    }

    pub fn set_sparse_initializer(&mut self, v: ValueId, t: SparseTensor) {
        if self.values[v.index()].sparse_initializer.is_none() {
            self.sparse_initializers.push(v);
        }
        self.values[v.index()].sparse_initializer = Some(t);
    }

    pub fn sparse_initializer(&self, v: ValueId) -> Option<&SparseTensor> {
        self.values[v.index()].sparse_initializer.as_ref()
    }

    pub fn sparse_initializers(&self) -> &[ValueId] {
        &self.sparse_initializers
    }

    /// Makes every sparse initializer of this graph (not its subgraphs) a
    /// dense one, for executors that read dense weights only; returns how
    /// many. A sparse initializer that cannot be decoded stays as it is.
    pub fn densify_sparse_initializers(&mut self) -> usize {
        let mut n = 0;
        for v in self.sparse_initializers.clone() {
            let Some(Ok(t)) = self.sparse_initializer(v).map(|s| s.to_dense()) else {
                continue;
            };
            self.take_sparse_initializer(v);
            self.set_initializer(v, t);
            n += 1;
        }
        n
    }

    pub fn take_sparse_initializer(&mut self, v: ValueId) -> Option<SparseTensor> {
        self.sparse_initializers.retain(|&x| x != v);
        self.values[v.index()].sparse_initializer.take()
    }

    /// True when `v` is a constant: it has an initializer and is not an
    /// overridable graph input.
    pub fn is_constant(&self, v: ValueId) -> bool {
        self.initializer(v).is_some() && !self.is_input(v)
    }

    /// The constant value of `v`, if it is one (see [`Graph::is_constant`]).
    pub fn constant(&self, v: ValueId) -> Option<&Tensor> {
        if self.is_input(v) {
            None
        } else {
            self.initializer(v)
        }
    }

    // ---- nodes --------------------------------------------------------

    pub fn node(&self, n: NodeId) -> &NodeData {
        &self.nodes[n.index()]
    }

    /// Mutable access to a node's plain fields. Changing subgraph attributes
    /// through this must be followed by [`Graph::refresh_captures`].
    pub fn node_mut(&mut self, n: NodeId) -> &mut NodeData {
        &mut self.nodes[n.index()]
    }

    /// Nodes in program order.
    pub fn nodes(&self) -> impl DoubleEndedIterator<Item = NodeId> + ExactSizeIterator + '_ {
        self.order.iter()
    }

    /// Program order as a slice. It is materialized on the first call after
    /// an edit (O(n)), then shared until the next edit; walk [`Graph::nodes`]
    /// where an iterator will do.
    pub fn order(&self) -> &[NodeId] {
        self.order.as_slice()
    }

    /// The position of live node `n` in program order (`None` for a removed
    /// node). Positions are computed on the first call after an edit (O(n))
    /// and reused until the next one.
    pub fn position(&self, n: NodeId) -> Option<usize> {
        self.order.position(n)
    }

    pub fn node_count(&self) -> usize {
        self.order.len()
    }

    /// True when live node `a` comes before live node `b` in program order
    /// (O(1), whatever was edited before).
    pub fn precedes(&self, a: NodeId, b: NodeId) -> bool {
        self.order.precedes(a, b)
    }

    /// The first of `nodes` (live ones) in program order, in O(len).
    pub fn first_in_order(&self, nodes: impl IntoIterator<Item = NodeId>) -> Option<NodeId> {
        nodes
            .into_iter()
            .reduce(|a, b| if self.precedes(b, a) { b } else { a })
    }

    /// The node before live node `n` in program order (O(1)).
    pub fn prev_node(&self, n: NodeId) -> Option<NodeId> {
        self.order.prev(n)
    }

    /// The node after live node `n` in program order (O(1)).
    pub fn next_node(&self, n: NodeId) -> Option<NodeId> {
        self.order.next(n)
    }

    pub fn is_live_node(&self, n: NodeId) -> bool {
        self.nodes.get(n.index()).is_some_and(|d| d.live)
    }

    /// Appends a node at the end of program order.
    pub fn add_node(&mut self, new: NewNode) -> Result<NodeId, IrError> {
        let id = self.create_node(new)?;
        self.order.push_back(id);
        self.refresh_captures(id);
        Ok(id)
    }

    /// Inserts a node at position `pos` of program order (the end if `pos`
    /// is past it).
    ///
    /// Finding position `pos` walks the order after an edit; rewrites that
    /// insert next to a node they know use [`Graph::insert_node_before`] or
    /// [`Graph::insert_node_after`], which cost O(1).
    pub fn insert_node(&mut self, pos: usize, new: NewNode) -> Result<NodeId, IrError> {
        let id = self.create_node(new)?;
        self.order.insert_at(id, pos);
        self.refresh_captures(id);
        Ok(id)
    }

    /// Inserts a node at `place` (anchors must be live nodes).
    pub fn insert_node_at(&mut self, place: Place, new: NewNode) -> Result<NodeId, IrError> {
        match place {
            Place::Start => self.insert_node(0, new),
            Place::Before(a) => self.insert_node_before(a, new),
            Place::After(a) => self.insert_node_after(a, new),
            Place::End => self.add_node(new),
        }
    }

    /// Inserts a node right before live node `anchor` in program order.
    pub fn insert_node_before(&mut self, anchor: NodeId, new: NewNode) -> Result<NodeId, IrError> {
        self.check_anchor(anchor, &new)?;
        let id = self.create_node(new)?;
        self.order.insert_before(id, anchor);
        self.refresh_captures(id);
        Ok(id)
    }

    /// Inserts a node right after live node `anchor` in program order.
    pub fn insert_node_after(&mut self, anchor: NodeId, new: NewNode) -> Result<NodeId, IrError> {
        self.check_anchor(anchor, &new)?;
        let id = self.create_node(new)?;
        self.order.insert_after(id, anchor);
        self.refresh_captures(id);
        Ok(id)
    }

    fn check_anchor(&self, anchor: NodeId, new: &NewNode) -> Result<(), IrError> {
        if self.order.contains(anchor) {
            Ok(())
        } else {
            Err(IrError::new(format!(
                "node '{}' ({}) is placed next to {anchor}, which is not in the graph",
                new.name, new.op_type
            )))
        }
    }

    /// Adds a node to the arena, outside program order (the callers above
    /// place it, then resolve its captures).
    ///
    /// Outputs must not already have a producer. Subgraph captures are
    /// resolved by name in this graph (creating captures of the enclosing
    /// graph where this graph does not define the name).
    fn create_node(&mut self, new: NewNode) -> Result<NodeId, IrError> {
        let id = NodeId(self.nodes.len() as u32);
        // Check everything before changing anything.
        for (i, o) in new.outputs.iter().enumerate() {
            if let Some(o) = o {
                let d = &self.values[o.index()];
                if d.producer.is_some()
                    || d.initializer.is_some()
                    || d.outer
                    || self.inputs.contains(o)
                    || new.outputs[..i].contains(&Some(*o))
                {
                    return Err(IrError::new(format!(
                        "node '{}' ({}) redefines value '{}'",
                        new.name, new.op_type, d.name
                    )));
                }
            }
        }
        for (i, o) in new.outputs.iter().enumerate() {
            if let Some(o) = o {
                self.values[o.index()].producer = Some((id, i as u32));
            }
        }
        for (slot, i) in new.inputs.iter().enumerate() {
            if let Some(i) = i {
                self.values[i.index()].uses.push(Use::Input {
                    node: id,
                    slot: slot as u32,
                });
            }
        }
        self.nodes.push(NodeData {
            name: new.name,
            op_type: new.op_type,
            domain: new.domain,
            overload: new.overload,
            attributes: new.attributes,
            doc_string: new.doc_string,
            metadata_props: new.metadata_props,
            preserved: new.preserved,
            inputs: new.inputs,
            outputs: new.outputs,
            captures: Vec::new(),
            live: true,
        });
        Ok(id)
    }

    /// Recomputes the outer values that node `n`'s subgraphs read.
    pub fn refresh_captures(&mut self, n: NodeId) {
        for c in std::mem::take(&mut self.nodes[n.index()].captures) {
            self.values[c.index()]
                .uses
                .retain(|u| *u != Use::Capture { node: n });
        }
        let mut names: Vec<String> = Vec::new();
        for a in &self.nodes[n.index()].attributes {
            for g in a.graphs() {
                for v in g.values() {
                    if g.is_outer(v) && !names.iter().any(|x| x == g.name(v)) {
                        names.push(g.name(v).to_string());
                    }
                }
            }
        }
        let mut caps = Vec::new();
        for name in names {
            let v = self.value_or_outer(&name);
            self.values[v.index()].uses.push(Use::Capture { node: n });
            caps.push(v);
        }
        self.nodes[n.index()].captures = caps;
    }

    /// Removes a node. Its outputs lose their producer (remove or redefine
    /// them); its inputs lose these uses.
    pub fn remove_node(&mut self, n: NodeId) {
        self.detach_node(n);
        self.order.remove(n);
    }

    /// Removes many nodes.
    pub fn remove_nodes(&mut self, ns: &[NodeId]) {
        for &n in ns {
            self.remove_node(n);
        }
    }

    fn detach_node(&mut self, n: NodeId) {
        if !self.nodes[n.index()].live {
            return;
        }
        let inputs = std::mem::take(&mut self.nodes[n.index()].inputs);
        for (slot, i) in inputs.iter().enumerate() {
            if let Some(i) = i {
                let u = Use::Input {
                    node: n,
                    slot: slot as u32,
                };
                self.values[i.index()].uses.retain(|x| *x != u);
            }
        }
        for c in std::mem::take(&mut self.nodes[n.index()].captures) {
            self.values[c.index()]
                .uses
                .retain(|u| *u != Use::Capture { node: n });
        }
        for o in self.nodes[n.index()].outputs.clone().into_iter().flatten() {
            if self.values[o.index()].producer.map(|p| p.0) == Some(n) {
                self.values[o.index()].producer = None;
            }
        }
        self.nodes[n.index()].inputs = inputs;
        self.nodes[n.index()].live = false;
    }

    /// Sets input `slot` of node `n` (growing the input list if needed).
    pub fn set_input(&mut self, n: NodeId, slot: usize, v: Option<ValueId>) {
        if let Some(Some(old)) = self.nodes[n.index()].inputs.get(slot).copied() {
            let u = Use::Input {
                node: n,
                slot: slot as u32,
            };
            self.values[old.index()].uses.retain(|x| *x != u);
        }
        let ins = &mut self.nodes[n.index()].inputs;
        if ins.len() <= slot {
            ins.resize(slot + 1, None);
        }
        ins[slot] = v;
        if let Some(v) = v {
            self.values[v.index()].uses.push(Use::Input {
                node: n,
                slot: slot as u32,
            });
        }
    }

    /// Drops trailing absent inputs of node `n`.
    pub fn trim_inputs(&mut self, n: NodeId) {
        let ins = &mut self.nodes[n.index()].inputs;
        while ins.last() == Some(&None) {
            ins.pop();
        }
    }

    /// Replaces output `slot` of node `n` with `v` (which must have no producer).
    pub fn set_output(&mut self, n: NodeId, slot: usize, v: Option<ValueId>) {
        if let Some(Some(old)) = self.nodes[n.index()].outputs.get(slot).copied() {
            self.values[old.index()].producer = None;
        }
        let outs = &mut self.nodes[n.index()].outputs;
        if outs.len() <= slot {
            outs.resize(slot + 1, None);
        }
        outs[slot] = v;
        if let Some(v) = v {
            self.values[v.index()].producer = Some((n, slot as u32));
        }
    }

    /// Every read of `old` (node inputs, subgraph captures, graph outputs)
    /// now reads `new`.
    ///
    /// A graph output changes identity with this; passes that must keep the
    /// model's output names check [`Graph::is_output`] first.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) -> Result<(), IrError> {
        if old == new {
            return Ok(());
        }
        let uses = std::mem::take(&mut self.values[old.index()].uses);
        let mut capturers = Vec::new();
        for u in uses {
            match u {
                Use::Input { node, slot } => {
                    self.nodes[node.index()].inputs[slot as usize] = Some(new);
                    self.values[new.index()].uses.push(u);
                }
                Use::Capture { node } => capturers.push(node),
            }
        }
        for o in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
        if !capturers.is_empty() {
            let (old_name, new_name) = (self.name(old).to_string(), self.name(new).to_string());
            for n in capturers {
                for a in &mut self.nodes[n.index()].attributes {
                    for g in a.graphs_mut() {
                        g.replace_capture(&old_name, &new_name)?;
                    }
                }
                self.refresh_captures(n);
            }
        }
        Ok(())
    }

    /// In a subgraph: reads of the captured outer value `old` read `new` instead.
    fn replace_capture(&mut self, old: &str, new: &str) -> Result<(), IrError> {
        let Some(v) = self.value_by_name(old).filter(|&v| self.is_outer(v)) else {
            return Ok(());
        };
        match self.value_by_name(new) {
            // The subgraph already reads `new` (or defines a value of that
            // name, which would shadow: refuse rather than miscompile).
            Some(w) if self.is_outer(w) => {
                self.replace_all_uses(v, w)?;
                for n in self.nodes().collect::<Vec<_>>() {
                    self.refresh_captures(n);
                }
                self.remove_value(v);
                Ok(())
            }
            Some(_) => Err(IrError::new(format!(
                "subgraph '{}' defines '{new}', which shadows the outer value it must now read",
                self.name
            ))),
            None => self.rename_value(v, new),
        }
    }

    /// Replaces program order (a schedule). It must list every live node
    /// once, each after the producers of the values it reads (inputs and
    /// subgraph captures).
    pub fn set_order(&mut self, order: Vec<NodeId>) -> Result<(), IrError> {
        let mut seen = vec![false; self.nodes.len()];
        for &n in &order {
            if !self.is_live_node(n) || std::mem::replace(&mut seen[n.index()], true) {
                return Err(IrError::new(format!(
                    "schedule lists node {n} twice or dead"
                )));
            }
        }
        if order.len() != self.order.len() {
            return Err(IrError::new("schedule does not list every node"));
        }
        let mut placed = vec![false; self.nodes.len()];
        for &n in &order {
            let d = self.node(n);
            for &v in d.inputs().iter().flatten().chain(d.captures()) {
                if let Some((p, _)) = self.producer(v) {
                    if !placed[p.index()] {
                        return Err(IrError::new(format!(
                            "schedule puts node '{}' before the producer of its input '{}'",
                            d.name,
                            self.name(v)
                        )));
                    }
                }
            }
            placed[n.index()] = true;
        }
        self.order.set(&order);
        Ok(())
    }

    /// Puts nodes in topological order, keeping the current order wherever
    /// it is already valid. Fails with the name of a node on a cycle.
    pub fn topo_sort(&mut self) -> Result<(), IrError> {
        let order = crate::algo::stable_topo_order(self)?;
        self.order.set(&order);
        Ok(())
    }

    /// Every subgraph held in a node's attributes (If branches, Loop and
    /// Scan bodies), with its node, in program order. Not recursive: the
    /// subgraphs' own subgraphs are not included.
    pub fn subgraphs(&self) -> impl Iterator<Item = (NodeId, &Graph)> + '_ {
        self.order.iter().flat_map(move |n| {
            self.nodes[n.index()]
                .attributes
                .iter()
                .flat_map(move |a| a.graphs().map(move |g| (n, g)))
        })
    }

    /// Bytes of initializer data in this graph and its subgraphs.
    pub fn initializer_bytes_deep(&self) -> u64 {
        let own = self
            .initializers
            .iter()
            .filter_map(|&v| self.initializer(v))
            .fold(0u64, |a, t| a.saturating_add(t.nbytes()));
        self.subgraphs().fold(own, |a, (_, s)| {
            a.saturating_add(s.initializer_bytes_deep())
        })
    }

    /// Total node count including nested subgraphs.
    pub fn node_count_deep(&self) -> usize {
        self.node_count()
            + self
                .subgraphs()
                .map(|(_, g)| g.node_count_deep())
                .sum::<usize>()
    }
}
