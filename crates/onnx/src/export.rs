//! IR → ModelProto, and saving to disk.

use crate::stream::StreamBuf;
use crate::OnnxError;
use bytes::Bytes;
use graphopt_ir::{
    AttrValue, Attribute, Dim, Function, Graph, Model, OpsetImport, SparseTensor, Tensor,
    TensorData, TensorType, Type, TypeKind, ValueId,
};
use graphopt_proto as pb;
use graphopt_proto::Message;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// When initializer data goes to a separate file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExternalData {
    /// External when the input used it or the model would pass protobuf's
    /// 2 GiB limit; tensors of at least 1 KiB then go out.
    Auto { input_used_external: bool },
    /// Everything inline (fails past 2 GiB).
    Never,
    /// Initializers of at least `threshold` bytes go out.
    Always { threshold: u64 },
}

/// How to save.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveOptions {
    pub external: ExternalData,
    /// File name of the external data, beside the model. Default: the
    /// model's file name plus `.data`.
    pub location: Option<String>,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            external: ExternalData::Auto {
                input_used_external: false,
            },
            location: None,
        }
    }
}

/// What a save wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveReport {
    pub model_bytes: u64,
    pub external_bytes: u64,
    pub external_file: Option<PathBuf>,
}

/// Protobuf refuses messages of 2 GiB and more; stay clear of it.
const PROTO_LIMIT: u64 = (2 << 30) - (64 << 20);
const DEFAULT_THRESHOLD: u64 = 1024;

/// Sink for external tensor data.
pub(crate) struct ExtSink<'a> {
    out: &'a mut dyn Write,
    location: String,
    threshold: u64,
    offset: u64,
    error: Option<std::io::Error>,
}

impl ExtSink<'_> {
    /// Writes `data` and returns the `external_data` entries, aligning large
    /// tensors to 4 KiB so that runtimes can map them.
    fn put(&mut self, data: &[u8]) -> Vec<pb::StringStringEntryProto> {
        let align = if data.len() >= 1 << 20 { 4096 } else { 64 };
        let pad = (align - self.offset % align) % align;
        if self.error.is_none() {
            if let Err(e) = self
                .out
                .write_all(&vec![0u8; pad as usize])
                .and_then(|_| self.out.write_all(data))
            {
                self.error = Some(e);
            }
        }
        self.offset += pad;
        let entries = vec![
            kv("location", &self.location),
            kv("offset", &self.offset.to_string()),
            kv("length", &data.len().to_string()),
        ];
        self.offset += data.len() as u64;
        entries
    }
}

fn kv(k: &str, v: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: Some(k.to_string()),
        value: Some(v.to_string()),
    }
}

fn props(p: &[(String, String)]) -> Vec<pb::StringStringEntryProto> {
    p.iter().map(|(k, v)| kv(k, v)).collect()
}

fn opt(s: &str) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s.to_string())
    }
}

/// Builds the ModelProto. With `sink`, initializers at or above its
/// threshold are written there and referenced as external data.
pub(crate) fn model_to_proto(
    m: &Model,
    _mode: &ExternalData,
    sink: Option<&mut ExtSink<'_>>,
) -> Result<(pb::ModelProto, u64), OnnxError> {
    let mut cx = Ex {
        sink,
        // IR versions 1-3 require every initializer of the main graph to be
        // a graph input too (onnxruntime: "Graph ctor should have created
        // NodeArg for initializer"); initializers that passes added get one.
        initializers_are_inputs: (1..4).contains(&m.ir_version),
    };
    let graph = cx.graph(&m.graph)?;
    let functions = m
        .functions
        .iter()
        .map(|f| cx.function(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut training_info = Vec::new();
    for b in &m.training_info {
        training_info.push(
            pb::TrainingInfoProto::decode(b.clone())
                .map_err(|e| OnnxError::new(format!("training_info: {e}")))?,
        );
    }
    let mut configuration = Vec::new();
    for b in &m.configuration {
        configuration.push(
            pb::DeviceConfigurationProto::decode(b.clone())
                .map_err(|e| OnnxError::new(format!("configuration: {e}")))?,
        );
    }
    let written = cx.sink.as_ref().map(|s| s.offset).unwrap_or(0);
    if let Some(s) = cx.sink.as_mut() {
        if let Some(e) = s.error.take() {
            return Err(OnnxError::new(format!("writing external data: {e}")));
        }
    }
    Ok((
        pb::ModelProto {
            ir_version: if m.ir_version != 0 {
                Some(m.ir_version)
            } else {
                None
            },
            opset_import: m.opset_imports.iter().map(opset).collect(),
            producer_name: opt(&m.producer_name),
            producer_version: opt(&m.producer_version),
            domain: opt(&m.domain),
            model_version: if m.model_version != 0 {
                Some(m.model_version)
            } else {
                None
            },
            doc_string: opt(&m.doc_string),
            graph: Some(graph),
            metadata_props: props(&m.metadata_props),
            training_info,
            functions,
            configuration,
        },
        written,
    ))
}

fn opset(o: &OpsetImport) -> pb::OperatorSetIdProto {
    pb::OperatorSetIdProto {
        domain: Some(o.domain.clone()),
        version: Some(o.version),
    }
}

struct Ex<'s, 'a> {
    sink: Option<&'s mut ExtSink<'a>>,
    initializers_are_inputs: bool,
}

impl Ex<'_, '_> {
    fn function(&mut self, f: &Function) -> Result<pb::FunctionProto, OnnxError> {
        let g = &f.body;
        Ok(pb::FunctionProto {
            name: Some(f.name.clone()),
            input: g.inputs.iter().map(|&v| g.name(v).to_string()).collect(),
            output: g.outputs.iter().map(|&v| g.name(v).to_string()).collect(),
            attribute: f.attributes.clone(),
            attribute_proto: f
                .attribute_defaults
                .iter()
                .map(|a| self.attribute(a))
                .collect::<Result<_, _>>()?,
            node: self.nodes(g)?,
            doc_string: opt(&f.doc_string),
            opset_import: f.opset_imports.iter().map(opset).collect(),
            domain: Some(f.domain.clone()),
            overload: opt(&f.overload),
            value_info: g.value_info.iter().map(|&v| value_info(g, v)).collect(),
            metadata_props: props(&f.metadata_props),
        })
    }

    fn graph(&mut self, g: &Graph) -> Result<pb::GraphProto, OnnxError> {
        // Only the main graph: If/Loop/Scan bodies have fixed formal inputs.
        let initializers_are_inputs = std::mem::take(&mut self.initializers_are_inputs);
        let mut initializer = Vec::with_capacity(g.initializers().len());
        for &v in g.initializers() {
            let t = g.initializer(v).expect("listed initializers have data");
            let mut p = self.tensor(t, true)?;
            p.name = Some(g.name(v).to_string());
            initializer.push(p);
        }
        let mut sparse_initializer = Vec::new();
        for &v in g.sparse_initializers() {
            let s = g
                .sparse_initializer(v)
                .expect("listed sparse initializers have data");
            let mut p = self.sparse(s)?;
            if let Some(vals) = p.values.as_mut() {
                vals.name = Some(g.name(v).to_string());
            }
            sparse_initializer.push(p);
        }
        let mut input: Vec<pb::ValueInfoProto> =
            g.inputs.iter().map(|&v| value_info(g, v)).collect();
        if initializers_are_inputs {
            let declared: std::collections::HashSet<ValueId> = g.inputs.iter().copied().collect();
            for &v in g.initializers() {
                if declared.contains(&v) {
                    continue;
                }
                let t = g.initializer(v).expect("listed initializers have data");
                let mut vi = value_info(g, v);
                vi.r#type = Some(ty(&Type::known(t.dtype, &t.dims)));
                input.push(vi);
            }
        }
        Ok(pb::GraphProto {
            node: self.nodes(g)?,
            name: Some(g.name.clone()),
            initializer,
            sparse_initializer,
            doc_string: opt(&g.doc_string),
            input,
            output: g.outputs.iter().map(|&v| value_info(g, v)).collect(),
            value_info: g
                .value_info
                .iter()
                .filter(|&&v| g.is_live_value(v))
                .map(|&v| value_info(g, v))
                .collect(),
            quantization_annotation: g
                .quantization_annotation
                .iter()
                .map(|(n, p)| pb::TensorAnnotation {
                    tensor_name: Some(n.clone()),
                    quant_parameter_tensor_names: props(p),
                })
                .collect(),
            metadata_props: props(&g.metadata_props),
        })
    }

    fn nodes(&mut self, g: &Graph) -> Result<Vec<pb::NodeProto>, OnnxError> {
        let name_of = |v: &Option<ValueId>| v.map(|v| g.name(v).to_string()).unwrap_or_default();
        let mut out = Vec::with_capacity(g.node_count());
        for n in g.nodes() {
            let d = g.node(n);
            let mut device_configurations = Vec::new();
            for b in &d.preserved {
                device_configurations.push(
                    pb::NodeDeviceConfigurationProto::decode(b.clone()).map_err(|e| {
                        OnnxError::new(format!("node '{}': device configuration: {e}", d.name))
                    })?,
                );
            }
            out.push(pb::NodeProto {
                input: d.inputs().iter().map(name_of).collect(),
                output: d.outputs().iter().map(name_of).collect(),
                name: opt(&d.name),
                op_type: Some(d.op_type.clone()),
                domain: opt(&d.domain),
                overload: opt(&d.overload),
                attribute: d
                    .attributes
                    .iter()
                    .map(|a| self.attribute(a))
                    .collect::<Result<_, _>>()?,
                doc_string: opt(&d.doc_string),
                metadata_props: props(&d.metadata_props),
                device_configurations,
            });
        }
        Ok(out)
    }

    fn attribute(&mut self, a: &Attribute) -> Result<pb::AttributeProto, OnnxError> {
        let mut p = pb::AttributeProto {
            name: Some(a.name.clone()),
            doc_string: opt(&a.doc_string),
            r#type: Some(a.value.kind().to_onnx()),
            ..Default::default()
        };
        match &a.value {
            AttrValue::Float(f) => p.f = Some(*f),
            AttrValue::Int(i) => p.i = Some(*i),
            AttrValue::String(s) => p.s = Some(Bytes::from(s.clone())),
            AttrValue::Tensor(t) => p.t = Some(self.tensor(t, false)?),
            AttrValue::Graph(g) => p.g = Some(self.graph(g)?),
            AttrValue::SparseTensor(s) => p.sparse_tensor = Some(self.sparse(s)?),
            AttrValue::Type(t) => p.tp = Some(ty(t)),
            AttrValue::Floats(v) => p.floats = v.clone(),
            AttrValue::Ints(v) => p.ints = v.clone(),
            AttrValue::Strings(v) => p.strings = v.iter().map(|s| Bytes::from(s.clone())).collect(),
            AttrValue::Tensors(v) => {
                p.tensors = v
                    .iter()
                    .map(|t| self.tensor(t, false))
                    .collect::<Result<_, _>>()?
            }
            AttrValue::Graphs(v) => {
                p.graphs = v.iter().map(|g| self.graph(g)).collect::<Result<_, _>>()?
            }
            AttrValue::SparseTensors(v) => {
                p.sparse_tensors = v.iter().map(|s| self.sparse(s)).collect::<Result<_, _>>()?
            }
            AttrValue::Types(v) => p.type_protos = v.iter().map(ty).collect(),
            AttrValue::Ref { attr, .. } => p.ref_attr_name = Some(attr.clone()),
        }
        Ok(p)
    }

    fn sparse(&mut self, s: &SparseTensor) -> Result<pb::SparseTensorProto, OnnxError> {
        Ok(pb::SparseTensorProto {
            values: Some(self.tensor(&s.values, false)?),
            indices: Some(self.tensor(&s.indices, false)?),
            dims: s.dims.clone(),
        })
    }

    fn tensor(&mut self, t: &Tensor, may_externalize: bool) -> Result<pb::TensorProto, OnnxError> {
        let mut p = pb::TensorProto {
            dims: t.dims.clone(),
            data_type: Some(t.dtype.to_onnx()),
            name: opt(&t.name),
            doc_string: opt(&t.doc_string),
            metadata_props: props(&t.metadata_props),
            ..Default::default()
        };
        match &t.data {
            TensorData::Strings(s) => p.string_data = s.clone(),
            TensorData::Raw(b) => match self.sink.as_mut() {
                Some(sink) if may_externalize && b.len() as u64 >= sink.threshold => {
                    p.external_data = sink.put(b);
                    p.data_location = Some(1);
                }
                _ => p.raw_data = Some(b.clone()),
            },
        }
        Ok(p)
    }
}

fn value_info(g: &Graph, v: ValueId) -> pb::ValueInfoProto {
    let d = g.value(v);
    pb::ValueInfoProto {
        name: Some(d.name.clone()),
        r#type: d.ty.as_ref().map(ty),
        doc_string: opt(&d.doc_string),
        metadata_props: props(&d.metadata_props),
    }
}

/// Type → TypeProto.
pub(crate) fn ty(t: &Type) -> pb::TypeProto {
    use pb::type_proto as tp;
    let value = match &t.kind {
        TypeKind::Unset => None,
        TypeKind::Tensor(tt) => Some(tp::Value::TensorType(tp::Tensor {
            elem_type: Some(tt.elem.to_onnx()),
            shape: shape(tt),
        })),
        TypeKind::SparseTensor(tt) => Some(tp::Value::SparseTensorType(tp::SparseTensor {
            elem_type: Some(tt.elem.to_onnx()),
            shape: shape(tt),
        })),
        TypeKind::Sequence(e) => Some(tp::Value::SequenceType(Box::new(tp::Sequence {
            elem_type: e.as_ref().map(|e| Box::new(ty(e))),
        }))),
        TypeKind::Map(k, v) => Some(tp::Value::MapType(Box::new(tp::Map {
            key_type: Some(k.to_onnx()),
            value_type: Some(Box::new(ty(v))),
        }))),
        TypeKind::Optional(e) => Some(tp::Value::OptionalType(Box::new(tp::Optional {
            elem_type: Some(Box::new(ty(e))),
        }))),
        TypeKind::Opaque { domain, name } => Some(tp::Value::OpaqueType(tp::Opaque {
            domain: Some(domain.clone()),
            name: Some(name.clone()),
        })),
    };
    pb::TypeProto {
        value,
        denotation: t.denotation.clone(),
    }
}

fn shape(tt: &TensorType) -> Option<pb::TensorShapeProto> {
    use pb::tensor_shape_proto::{dimension::Value, Dimension};
    let s = tt.shape.as_ref()?;
    Some(pb::TensorShapeProto {
        dim: s
            .dims
            .iter()
            .enumerate()
            .map(|(i, d)| Dimension {
                denotation: s.denotations.get(i).cloned().flatten(),
                value: match d {
                    Dim::Known(v) => Some(Value::DimValue(*v)),
                    Dim::Sym(p) => Some(Value::DimParam(p.clone())),
                    Dim::Unknown => None,
                },
            })
            .collect(),
    })
}

/// Saves atomically: temporary files in the output's folder, then renames.
pub(crate) fn save(m: &Model, path: &Path, opts: &SaveOptions) -> Result<SaveReport, OnnxError> {
    let place = path.display().to_string();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| OnnxError::new(format!("{place}: not a file path")))?
        .to_string_lossy()
        .to_string();
    let threshold = match &opts.external {
        ExternalData::Never => None,
        ExternalData::Always { threshold } => Some(*threshold),
        ExternalData::Auto {
            input_used_external,
        } => {
            if *input_used_external || m.graph.initializer_bytes_deep() >= PROTO_LIMIT {
                Some(DEFAULT_THRESHOLD)
            } else {
                None
            }
        }
    };
    let io = |what: &str, e: std::io::Error| OnnxError::io(format!("{place}: {what}: {e}"), e);
    let mut report = SaveReport::default();
    let mut data_tmp = None;
    let location = opts
        .location
        .clone()
        .unwrap_or_else(|| format!("{file_name}.data"));
    let plain = !(location.contains('/')
        || location.contains('\\')
        || location == ".."
        || location.is_empty());
    if threshold.is_some() && !plain {
        return Err(OnnxError::new(format!(
            "{place}: external data name '{location}' must be a plain file name"
        )));
    }
    let proto = if let Some(threshold) = threshold {
        let tmp = tempfile::Builder::new()
            .prefix(".graphopt-data-")
            .tempfile_in(&dir)
            .map_err(|e| io("cannot create a temporary file", e))?;
        let mut w = BufWriter::with_capacity(
            1 << 20,
            tmp.as_file().try_clone().map_err(|e| io("temp file", e))?,
        );
        let mut sink = ExtSink {
            out: &mut w,
            location: location.clone(),
            threshold,
            offset: 0,
            error: None,
        };
        let (proto, written) = model_to_proto(m, &opts.external, Some(&mut sink))?;
        w.flush().map_err(|e| io("writing external data", e))?;
        report.external_bytes = written;
        data_tmp = Some(tmp);
        proto
    } else {
        model_to_proto(m, &opts.external, None)?.0
    };
    let len = proto.encoded_len() as u64;
    if len >= 2 << 30 {
        return Err(OnnxError::new(format!(
            "{place}: the model is {len} bytes, over protobuf's 2 GiB limit; use --external-data"
        )));
    }
    let tmp = tempfile::Builder::new()
        .prefix(".graphopt-")
        .tempfile_in(&dir)
        .map_err(|e| io("cannot create a temporary file", e))?;
    let mut sb = StreamBuf::new(BufWriter::with_capacity(
        1 << 20,
        tmp.as_file().try_clone().map_err(|e| io("temp file", e))?,
    ));
    proto
        .encode(&mut sb)
        .map_err(|e| OnnxError::new(format!("{place}: encoding: {e}")))?;
    report.model_bytes = sb.written_total();
    sb.finish().map_err(|e| io("writing", e))?;
    if let Some(d) = data_tmp {
        let target = dir.join(&location);
        set_mode(d.as_file());
        d.persist(&target)
            .map_err(|e| io("cannot move the external data into place", e.error))?;
        report.external_file = Some(target);
    }
    set_mode(tmp.as_file());
    tmp.persist(path)
        .map_err(|e| io("cannot move the output into place", e.error))?;
    Ok(report)
}

/// Temporary files are created 0600; give outputs the usual 0644.
fn set_mode(f: &std::fs::File) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
    }
    #[cfg(not(unix))]
    let _ = f;
}
