//! ModelProto → IR.

use crate::external::ExternalReader;
use crate::OnnxError;
use bytes::Bytes;
use graphopt_ir::{
    AttrKind, AttrValue, Attribute, DType, Dim, Function, Graph, Model, NewNode, OpsetImport,
    Shape, SparseTensor, Tensor, TensorType, Type, TypeKind, ValueId,
};
use graphopt_proto as pb;
use graphopt_proto::Message;

/// What the importer noticed about the file.
#[derive(Debug, Default, Clone)]
pub struct ImportInfo {
    /// Some tensor data came from external files.
    pub used_external_data: bool,
    /// Nodes were not in topological order and were sorted.
    pub reordered: bool,
}

/// Converts a decoded model. `ext` resolves external data.
pub(crate) fn model_from_proto(
    p: pb::ModelProto,
    ext: &mut ExternalReader,
) -> Result<crate::Loaded, OnnxError> {
    let mut info = ImportInfo::default();
    let gp = p
        .graph
        .ok_or_else(|| OnnxError::new("the model has no graph (not an ONNX model?)"))?;
    let mut cx = Cx {
        ext,
        info: &mut info,
    };
    let graph = cx.graph(gp, true)?;
    let mut functions = Vec::new();
    for f in p.functions {
        let name = f.name.clone().unwrap_or_default();
        functions.push(
            cx.function(f)
                .map_err(|e| e.within(format!("function '{name}'")))?,
        );
    }
    let model = Model {
        ir_version: p.ir_version.unwrap_or(0),
        opset_imports: p.opset_import.into_iter().map(opset).collect(),
        producer_name: p.producer_name.unwrap_or_default(),
        producer_version: p.producer_version.unwrap_or_default(),
        domain: p.domain.unwrap_or_default(),
        model_version: p.model_version.unwrap_or(0),
        doc_string: p.doc_string.unwrap_or_default(),
        metadata_props: props(p.metadata_props),
        graph,
        functions,
        training_info: p
            .training_info
            .iter()
            .map(|t| Bytes::from(t.encode_to_vec()))
            .collect(),
        configuration: p
            .configuration
            .iter()
            .map(|t| Bytes::from(t.encode_to_vec()))
            .collect(),
    };
    info.used_external_data = ext.used;
    graphopt_ir::verify::verify_model(&model).map_err(|e| OnnxError::new(e.to_string()))?;
    Ok(crate::Loaded { model, info })
}

fn opset(o: pb::OperatorSetIdProto) -> OpsetImport {
    OpsetImport {
        domain: o.domain.unwrap_or_default(),
        version: o.version.unwrap_or(0),
    }
}

fn props(p: Vec<pb::StringStringEntryProto>) -> Vec<(String, String)> {
    p.into_iter()
        .map(|e| (e.key.unwrap_or_default(), e.value.unwrap_or_default()))
        .collect()
}

struct Cx<'a> {
    ext: &'a mut ExternalReader,
    info: &'a mut ImportInfo,
}

impl Cx<'_> {
    fn function(&mut self, f: pb::FunctionProto) -> Result<Function, OnnxError> {
        let mut body = Graph::new(f.name.clone().unwrap_or_default());
        for i in &f.input {
            let v = body.add_value(i.clone(), None).map_err(ir)?;
            body.inputs.push(v);
        }
        self.nodes(&mut body, f.node, true)?;
        for vi in f.value_info {
            self.value_info(&mut body, vi)?;
        }
        for o in &f.output {
            let v = body
                .value_by_name(o)
                .ok_or_else(|| OnnxError::new(format!("output '{o}' is never defined")))?;
            body.outputs.push(v);
        }
        let mut defaults = Vec::new();
        for a in f.attribute_proto {
            defaults.push(self.attribute(a)?);
        }
        Ok(Function {
            name: f.name.unwrap_or_default(),
            domain: f.domain.unwrap_or_default(),
            overload: f.overload.unwrap_or_default(),
            attributes: f.attribute,
            attribute_defaults: defaults,
            opset_imports: f.opset_import.into_iter().map(opset).collect(),
            doc_string: f.doc_string.unwrap_or_default(),
            metadata_props: props(f.metadata_props),
            body,
        })
    }

    /// Imports a graph. `top` is true for the main graph and function
    /// bodies, where reading an undefined name is an error at once; in a
    /// subgraph such a name is a capture of an enclosing graph's value.
    fn graph(&mut self, p: pb::GraphProto, top: bool) -> Result<Graph, OnnxError> {
        let gname = p.name.clone().unwrap_or_default();
        let mut g = Graph::new(gname.clone());
        g.doc_string = p.doc_string.unwrap_or_default();
        g.metadata_props = props(p.metadata_props);
        g.quantization_annotation = p
            .quantization_annotation
            .into_iter()
            .map(|a| {
                (
                    a.tensor_name.unwrap_or_default(),
                    props(a.quant_parameter_tensor_names),
                )
            })
            .collect();
        let where_ = |what: &str| {
            if top {
                what.to_string()
            } else {
                format!("subgraph '{gname}': {what}")
            }
        };

        for vi in p.input {
            let name = vi.name.clone().unwrap_or_default();
            let ty = vi
                .r#type
                .as_ref()
                .map(ty)
                .transpose()
                .map_err(|e| e.within(where_(&format!("input '{name}'"))))?;
            let v = g
                .add_value(name.clone(), ty)
                .map_err(|e| ir(e).within(where_("inputs")))?;
            self.value_meta(&mut g, v, vi.doc_string, vi.metadata_props);
            g.inputs.push(v);
        }
        for t in p.initializer {
            let name = t.name.clone().unwrap_or_default();
            let tensor = self
                .tensor(t)
                .map_err(|e| e.within(where_(&format!("initializer '{name}'"))))?;
            let v = match g.value_by_name(&name) {
                Some(v) if g.is_input(v) && g.initializer(v).is_none() => v,
                Some(_) => {
                    return Err(OnnxError::new(where_(&format!(
                        "initializer '{name}' is defined twice"
                    ))))
                }
                None => {
                    let t = Type::tensor(tensor.dtype, Some(Shape::known(&tensor.dims)));
                    g.add_value(name.clone(), Some(t)).map_err(ir)?
                }
            };
            g.set_initializer(v, tensor);
        }
        for s in p.sparse_initializer {
            let st = self
                .sparse(s)
                .map_err(|e| e.within(where_("sparse initializer")))?;
            let name = st.values.name.clone();
            let v = match g.value_by_name(&name) {
                Some(v)
                    if g.is_input(v)
                        && g.sparse_initializer(v).is_none()
                        && g.initializer(v).is_none() =>
                {
                    v
                }
                Some(_) => {
                    return Err(OnnxError::new(where_(&format!(
                        "sparse initializer '{name}' is defined twice"
                    ))))
                }
                None => {
                    let t = Type::tensor(st.values.dtype, Some(Shape::known(&st.dims)));
                    g.add_value(name.clone(), Some(t)).map_err(ir)?
                }
            };
            g.set_sparse_initializer(v, st);
        }
        self.nodes(&mut g, p.node, top).map_err(|e| {
            if top {
                e
            } else {
                e.within(format!("subgraph '{gname}'"))
            }
        })?;
        for vi in p.value_info {
            self.value_info(&mut g, vi)
                .map_err(|e| e.within(where_("value_info")))?;
        }
        for vi in p.output {
            let name = vi.name.clone().unwrap_or_default();
            let t = vi
                .r#type
                .as_ref()
                .map(ty)
                .transpose()
                .map_err(|e| e.within(where_(&format!("output '{name}'"))))?;
            let v = match g.value_by_name(&name) {
                Some(v) => v,
                None if !top => g.value_or_outer(&name),
                None => {
                    return Err(OnnxError::new(where_(&format!(
                        "graph output '{name}' is not produced by any node, input or initializer"
                    ))))
                }
            };
            // A pass-through output keeps the input's declaration.
            if !g.is_input(v) {
                if t.is_some() {
                    g.value_mut(v).ty = t;
                }
                self.value_meta(&mut g, v, vi.doc_string, vi.metadata_props);
            }
            g.outputs.push(v);
        }
        Ok(g)
    }

    fn value_meta(
        &self,
        g: &mut Graph,
        v: ValueId,
        doc: Option<String>,
        meta: Vec<pb::StringStringEntryProto>,
    ) {
        let d = g.value_mut(v);
        if let Some(doc) = doc {
            d.doc_string = doc;
        }
        if !meta.is_empty() {
            d.metadata_props = props(meta);
        }
    }

    fn value_info(&mut self, g: &mut Graph, vi: pb::ValueInfoProto) -> Result<(), OnnxError> {
        let name = vi.name.clone().unwrap_or_default();
        let t = vi
            .r#type
            .as_ref()
            .map(ty)
            .transpose()
            .map_err(|e| e.within(format!("'{name}'")))?;
        let v = match g.value_by_name(&name) {
            Some(v) => v,
            None => g.add_value(name, None).map_err(ir)?,
        };
        // A graph input's or output's own declaration wins over value_info.
        let declared_elsewhere = g.is_input(v) || g.is_output(v);
        if t.is_some() && !declared_elsewhere {
            g.value_mut(v).ty = t;
        }
        if !declared_elsewhere {
            self.value_meta(g, v, vi.doc_string, vi.metadata_props);
        }
        if !g.value_info.contains(&v) {
            g.value_info.push(v);
        }
        Ok(())
    }

    fn nodes(
        &mut self,
        g: &mut Graph,
        nodes: Vec<pb::NodeProto>,
        top: bool,
    ) -> Result<(), OnnxError> {
        // Outputs first, so that nodes listed out of order still resolve.
        let mut outs: Vec<Vec<Option<ValueId>>> = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let mut o = Vec::with_capacity(n.output.len());
            for name in &n.output {
                if name.is_empty() {
                    o.push(None);
                    continue;
                }
                let v = match g.value_by_name(name) {
                    None => g.add_value(name.clone(), None).map_err(ir)?,
                    Some(_) => {
                        return Err(OnnxError::new(format!(
                            "{}: output '{name}' is already defined",
                            node_place(n, i)
                        )))
                    }
                };
                o.push(Some(v));
            }
            outs.push(o);
        }
        for (i, (n, outputs)) in nodes.into_iter().zip(outs).enumerate() {
            let place = node_place(&n, i);
            let mut inputs = Vec::with_capacity(n.input.len());
            for name in &n.input {
                if name.is_empty() {
                    inputs.push(None);
                    continue;
                }
                let v = match g.value_by_name(name) {
                    Some(v) => v,
                    None if top => {
                        return Err(OnnxError::new(format!(
                            "{place}: input '{name}' is not a graph input, an initializer or any node's output"
                        )))
                    }
                    None => g.value_or_outer(name),
                };
                inputs.push(Some(v));
            }
            let mut attributes = Vec::with_capacity(n.attribute.len());
            for a in n.attribute {
                let an = a.name.clone().unwrap_or_default();
                attributes.push(
                    self.attribute(a)
                        .map_err(|e| e.within(format!("{place}: attribute '{an}'")))?,
                );
            }
            let new = NewNode {
                name: n.name.unwrap_or_default(),
                op_type: n.op_type.unwrap_or_default(),
                domain: n.domain.unwrap_or_default(),
                overload: n.overload.unwrap_or_default(),
                inputs,
                outputs,
                attributes,
                doc_string: n.doc_string.unwrap_or_default(),
                metadata_props: props(n.metadata_props),
                preserved: n
                    .device_configurations
                    .iter()
                    .map(|d| Bytes::from(d.encode_to_vec()))
                    .collect(),
            };
            g.add_node(new).map_err(|e| ir(e).within(&place))?;
        }
        let before = g.order().to_vec();
        g.topo_sort().map_err(ir)?;
        if g.order() != before {
            self.info.reordered = true;
        }
        Ok(())
    }

    fn attribute(&mut self, a: pb::AttributeProto) -> Result<Attribute, OnnxError> {
        let name = a.name.clone().unwrap_or_default();
        let declared = a.r#type.and_then(AttrKind::from_onnx);
        let value = if let Some(r) = a.ref_attr_name.clone().filter(|r| !r.is_empty()) {
            AttrValue::Ref {
                attr: r,
                kind: declared.unwrap_or(AttrKind::Undefined),
            }
        } else {
            let kind = declared.unwrap_or_else(|| infer_attr_kind(&a));
            match kind {
                AttrKind::Float => AttrValue::Float(a.f.unwrap_or(0.0)),
                AttrKind::Int => AttrValue::Int(a.i.unwrap_or(0)),
                AttrKind::String => AttrValue::String(a.s.map(|s| s.to_vec()).unwrap_or_default()),
                AttrKind::Tensor => AttrValue::Tensor(self.tensor(
                    a.t.ok_or_else(|| OnnxError::new("tensor attribute without a tensor"))?,
                )?),
                AttrKind::Graph => AttrValue::Graph(Box::new(self.graph(
                    a.g.ok_or_else(|| OnnxError::new("graph attribute without a graph"))?,
                    false,
                )?)),
                AttrKind::SparseTensor => {
                    AttrValue::SparseTensor(self.sparse(a.sparse_tensor.ok_or_else(|| {
                        OnnxError::new("sparse tensor attribute without a value")
                    })?)?)
                }
                AttrKind::TypeProto => AttrValue::Type(ty(a
                    .tp
                    .as_ref()
                    .ok_or_else(|| OnnxError::new("type attribute without a type"))?)?),
                AttrKind::Floats => AttrValue::Floats(a.floats),
                AttrKind::Ints => AttrValue::Ints(a.ints),
                AttrKind::Strings => {
                    AttrValue::Strings(a.strings.into_iter().map(|s| s.to_vec()).collect())
                }
                AttrKind::Tensors => AttrValue::Tensors(
                    a.tensors
                        .into_iter()
                        .map(|t| self.tensor(t))
                        .collect::<Result<_, _>>()?,
                ),
                AttrKind::Graphs => AttrValue::Graphs(
                    a.graphs
                        .into_iter()
                        .map(|g| self.graph(g, false))
                        .collect::<Result<_, _>>()?,
                ),
                AttrKind::SparseTensors => AttrValue::SparseTensors(
                    a.sparse_tensors
                        .into_iter()
                        .map(|s| self.sparse(s))
                        .collect::<Result<_, _>>()?,
                ),
                AttrKind::TypeProtos => {
                    AttrValue::Types(a.type_protos.iter().map(ty).collect::<Result<_, _>>()?)
                }
                AttrKind::Undefined => {
                    return Err(OnnxError::new("attribute has no value and no type"))
                }
            }
        };
        Ok(Attribute {
            name,
            value,
            doc_string: a.doc_string.unwrap_or_default(),
        })
    }

    fn sparse(&mut self, s: pb::SparseTensorProto) -> Result<SparseTensor, OnnxError> {
        let values = self.tensor(
            s.values
                .ok_or_else(|| OnnxError::new("sparse tensor without values"))?,
        )?;
        let indices = self.tensor(
            s.indices
                .ok_or_else(|| OnnxError::new("sparse tensor without indices"))?,
        )?;
        graphopt_ir::numel(&s.dims).map_err(ir)?;
        Ok(SparseTensor {
            values,
            indices,
            dims: s.dims,
        })
    }

    fn tensor(&mut self, t: pb::TensorProto) -> Result<Tensor, OnnxError> {
        let dtype = DType::from_onnx(t.data_type.unwrap_or(0));
        let name = t.name.clone().unwrap_or_default();
        if t.segment.is_some() {
            return Err(OnnxError::new(
                "segmented tensors (TensorProto.segment) are not supported",
            ));
        }
        let n = graphopt_ir::numel(&t.dims).map_err(ir)?;
        let data = if t.data_location == Some(1) {
            let mut location = None;
            let (mut offset, mut length) = (0u64, None);
            for e in &t.external_data {
                let v = e.value.clone().unwrap_or_default();
                match e.key.as_deref() {
                    Some("location") => location = Some(v),
                    Some("offset") => {
                        offset = v.parse().map_err(|_| {
                            OnnxError::new(format!("bad external data offset '{v}'"))
                        })?
                    }
                    Some("length") => {
                        length = Some(v.parse().map_err(|_| {
                            OnnxError::new(format!("bad external data length '{v}'"))
                        })?)
                    }
                    _ => {}
                }
            }
            let location =
                location.ok_or_else(|| OnnxError::new("external data without a location"))?;
            graphopt_ir::TensorData::Raw(self.ext.read(&location, offset, length)?)
        } else if dtype == DType::String {
            graphopt_ir::TensorData::Strings(t.string_data)
        } else if let Some(raw) = t.raw_data {
            graphopt_ir::TensorData::Raw(raw)
        } else {
            graphopt_ir::TensorData::Raw(typed_to_raw(dtype, n, &t)?)
        };
        let tensor = Tensor {
            dtype,
            dims: t.dims,
            data,
            name,
            doc_string: t.doc_string.unwrap_or_default(),
            metadata_props: props(t.metadata_props),
        };
        tensor.check().map_err(ir)?;
        Ok(tensor)
    }
}

fn node_place(n: &pb::NodeProto, i: usize) -> String {
    let name = n.name.as_deref().unwrap_or("");
    let op = n.op_type.as_deref().unwrap_or("?");
    if name.is_empty() {
        format!("node #{i} ({op})")
    } else {
        format!("node '{name}' ({op})")
    }
}

fn ir(e: graphopt_ir::IrError) -> OnnxError {
    OnnxError::new(e.0)
}

/// For attributes written without `type` (very old exporters): the kind
/// implied by which field is set.
fn infer_attr_kind(a: &pb::AttributeProto) -> AttrKind {
    if a.f.is_some() {
        AttrKind::Float
    } else if a.i.is_some() {
        AttrKind::Int
    } else if a.s.is_some() {
        AttrKind::String
    } else if a.t.is_some() {
        AttrKind::Tensor
    } else if a.g.is_some() {
        AttrKind::Graph
    } else if a.sparse_tensor.is_some() {
        AttrKind::SparseTensor
    } else if a.tp.is_some() {
        AttrKind::TypeProto
    } else if !a.floats.is_empty() {
        AttrKind::Floats
    } else if !a.ints.is_empty() {
        AttrKind::Ints
    } else if !a.strings.is_empty() {
        AttrKind::Strings
    } else if !a.tensors.is_empty() {
        AttrKind::Tensors
    } else if !a.graphs.is_empty() {
        AttrKind::Graphs
    } else if !a.sparse_tensors.is_empty() {
        AttrKind::SparseTensors
    } else if !a.type_protos.is_empty() {
        AttrKind::TypeProtos
    } else {
        AttrKind::Undefined
    }
}

/// Converts the typed data fields to ONNX's packed little-endian raw layout.
fn typed_to_raw(dtype: DType, n: u64, t: &pb::TensorProto) -> Result<Bytes, OnnxError> {
    use DType::*;
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    let i32s = &t.int32_data;
    let pairs = |n: u64| {
        n.checked_mul(2).ok_or_else(|| {
            OnnxError::new(format!(
                "tensor dims {:?} overflow the element count",
                t.dims
            ))
        })
    };
    // (values present, values expected, packed bytes)
    let (have, want, out) = match dtype {
        F32 => (t.float_data.len(), n, le(&t.float_data, f32::to_le_bytes)),
        Complex64 => (
            t.float_data.len(),
            pairs(n)?,
            le(&t.float_data, f32::to_le_bytes),
        ),
        F64 => (t.double_data.len(), n, le(&t.double_data, f64::to_le_bytes)),
        Complex128 => (
            t.double_data.len(),
            pairs(n)?,
            le(&t.double_data, f64::to_le_bytes),
        ),
        I64 => (t.int64_data.len(), n, le(&t.int64_data, i64::to_le_bytes)),
        U64 => (t.uint64_data.len(), n, le(&t.uint64_data, u64::to_le_bytes)),
        U32 => (
            t.uint64_data.len(),
            n,
            le(&t.uint64_data, |v| (v as u32).to_le_bytes()),
        ),
        I32 => (i32s.len(), n, le(i32s, i32::to_le_bytes)),
        I16 | U16 | F16 | BF16 => (i32s.len(), n, le(i32s, |v| (v as u16).to_le_bytes())),
        I8 | U8 | Bool | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F6E2M3 | F6E3M2 => {
            (i32s.len(), n, le(i32s, |v| [v as u8]))
        }
        // Each int32 holds one byte of packed elements: two 4-bit or four 2-bit ones.
        U4 | I4 | F4E2M1 => (i32s.len(), n.div_ceil(2), le(i32s, |v| [v as u8])),
        U2 | I2 => (i32s.len(), n.div_ceil(4), le(i32s, |v| [v as u8])),
        String | Undefined | Other(_) if n == 0 => return Ok(Bytes::new()),
        String | Undefined | Other(_) => {
            return Err(OnnxError::new(format!(
                "tensor '{}' has data type {dtype}, which has no numeric storage",
                t.name.as_deref().unwrap_or("")
            )))
        }
    };
    if have as u64 != want {
        return Err(OnnxError::new(format!(
            "tensor '{}' ({dtype} {:?}) has {have} stored values, expected {want}",
            t.name.as_deref().unwrap_or(""),
            t.dims
        )));
    }
    Ok(Bytes::from(out))
}

/// TypeProto → Type.
pub(crate) fn ty(t: &pb::TypeProto) -> Result<Type, OnnxError> {
    use pb::type_proto::Value;
    let kind = match &t.value {
        None => TypeKind::Unset,
        Some(Value::TensorType(tt)) => {
            TypeKind::Tensor(tensor_type(tt.elem_type, tt.shape.as_ref()))
        }
        Some(Value::SparseTensorType(tt)) => {
            TypeKind::SparseTensor(tensor_type(tt.elem_type, tt.shape.as_ref()))
        }
        Some(Value::SequenceType(s)) => TypeKind::Sequence(match &s.elem_type {
            Some(e) => Some(Box::new(ty(e)?)),
            None => None,
        }),
        Some(Value::MapType(m)) => TypeKind::Map(
            DType::from_onnx(m.key_type.unwrap_or(0)),
            Box::new(match &m.value_type {
                Some(v) => ty(v)?,
                None => Type {
                    kind: TypeKind::Unset,
                    denotation: None,
                },
            }),
        ),
        Some(Value::OptionalType(o)) => TypeKind::Optional(Box::new(match &o.elem_type {
            Some(e) => ty(e)?,
            None => Type {
                kind: TypeKind::Unset,
                denotation: None,
            },
        })),
        Some(Value::OpaqueType(o)) => TypeKind::Opaque {
            domain: o.domain.clone().unwrap_or_default(),
            name: o.name.clone().unwrap_or_default(),
        },
    };
    Ok(Type {
        kind,
        denotation: t.denotation.clone(),
    })
}

fn tensor_type(elem: Option<i32>, shape: Option<&pb::TensorShapeProto>) -> TensorType {
    use pb::tensor_shape_proto::dimension::Value;
    TensorType {
        elem: DType::from_onnx(elem.unwrap_or(0)),
        shape: shape.map(|s| {
            let dims = s
                .dim
                .iter()
                .map(|d| match &d.value {
                    Some(Value::DimValue(v)) => Dim::Known(*v),
                    Some(Value::DimParam(p)) => Dim::Sym(p.clone()),
                    None => Dim::Unknown,
                })
                .collect();
            let denotations: Vec<Option<String>> =
                s.dim.iter().map(|d| d.denotation.clone()).collect();
            Shape {
                dims,
                denotations: if denotations.iter().any(Option::is_some) {
                    denotations
                } else {
                    Vec::new()
                },
            }
        }),
    }
}
