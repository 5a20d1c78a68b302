//! The printer. Layout follows `onnx.printer` (three-space indents, `Op <attrs>
//! (inputs)`, subgraph attributes after the inputs) so that its output reads
//! like what ONNX users already know; output depends only on the IR, never on
//! hash order, so it is byte-identical run to run.

use crate::util::*;
use crate::PrintOptions;
use graphopt_ir::{
    AttrKind, AttrValue, Attribute, DType, Dim, Function, Graph, Model, NodeData, OpsetImport,
    Shape, SparseTensor, Tensor, TensorData, Type, TypeKind, ValueId,
};
use std::fmt::Write;

/// Prints a whole model: header, main graph, functions.
pub fn print_model(m: &Model, opts: &PrintOptions) -> String {
    let mut p = Printer {
        out: String::new(),
        opts,
    };
    p.model(m);
    p.out
}

/// Prints one graph (`name (inputs) => (outputs) <...> {...}`).
pub fn print_graph(g: &Graph, opts: &PrintOptions) -> String {
    let mut p = Printer {
        out: String::new(),
        opts,
    };
    p.graph(g, 0, false);
    p.out.push('\n');
    p.out
}

struct Printer<'a> {
    out: String,
    opts: &'a PrintOptions,
}

const IND: usize = 3;

impl Printer<'_> {
    fn indent(&mut self, n: usize) {
        self.out.extend(std::iter::repeat_n(' ', n));
    }

    fn model(&mut self, m: &Model) {
        self.out.push_str("<\n");
        let mut fields: Vec<String> = Vec::new();
        fields.push(format!("ir_version: {}", m.ir_version));
        fields.push(format!("opset_import: {}", opsets(&m.opset_imports)));
        let mut strf = |k: &str, v: &str| {
            if !v.is_empty() {
                let mut s = format!("{k}: ");
                push_quoted(&mut s, v);
                fields.push(s);
            }
        };
        strf("producer_name", &m.producer_name);
        strf("producer_version", &m.producer_version);
        strf("domain", &m.domain);
        if m.model_version != 0 {
            fields.push(format!("model_version: {}", m.model_version));
        }
        let mut strf = |k: &str, v: &str| {
            if !v.is_empty() {
                let mut s = format!("{k}: ");
                push_quoted(&mut s, v);
                fields.push(s);
            }
        };
        strf("doc_string", &m.doc_string);
        if !m.metadata_props.is_empty() {
            let mut s = String::from("metadata_props: [");
            for (i, (k, v)) in m.metadata_props.iter().enumerate() {
                if i > 0 {
                    s.push_str(", ");
                }
                push_quoted(&mut s, k);
                s.push_str(": ");
                push_quoted(&mut s, v);
            }
            s.push(']');
            fields.push(s);
        }
        self.header_fields(&fields);
        self.graph(&m.graph, 0, false);
        self.out.push('\n');
        for f in &m.functions {
            self.out.push('\n');
            self.function(f);
        }
    }

    fn header_fields(&mut self, fields: &[String]) {
        for (i, f) in fields.iter().enumerate() {
            self.indent(IND);
            self.out.push_str(f);
            self.out
                .push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
        }
        self.out.push_str(">\n");
    }

    fn function(&mut self, f: &Function) {
        self.out.push_str("<\n");
        let mut fields = Vec::new();
        let mut s = String::from("domain: ");
        push_quoted(&mut s, &f.domain);
        fields.push(s);
        if !f.overload.is_empty() {
            let mut s = String::from("overload: ");
            push_quoted(&mut s, &f.overload);
            fields.push(s);
        }
        fields.push(format!("opset_import: {}", opsets(&f.opset_imports)));
        if !f.doc_string.is_empty() {
            let mut s = String::from("doc_string: ");
            push_quoted(&mut s, &f.doc_string);
            fields.push(s);
        }
        self.header_fields(&fields);
        push_id(&mut self.out, &f.name);
        self.out.push(' ');
        if !f.attributes.is_empty() || !f.attribute_defaults.is_empty() {
            self.out.push('<');
            let mut first = true;
            for a in &f.attributes {
                if !first {
                    self.out.push_str(", ");
                }
                first = false;
                push_id(&mut self.out, a);
            }
            for a in &f.attribute_defaults {
                if !first {
                    self.out.push_str(", ");
                }
                first = false;
                self.attr(a, 0);
            }
            self.out.push_str("> ");
        }
        let g = &f.body;
        // Function signatures have no syntax for default values: a body's
        // input initializers (graphopt extension) go to the `<>` block.
        self.value_list(g, &g.inputs, false);
        self.out.push_str(" => ");
        self.value_list(g, &g.outputs, false);
        self.graph_rest(g, 0, false);
        self.out.push('\n');
    }

    /// `name (inputs) => (outputs) <...> {...}`; `in_attr` quotes names that
    /// `onnx.parser` would not read as a graph in attribute position.
    fn graph(&mut self, g: &Graph, ind: usize, in_attr: bool) {
        if in_attr
            && (!is_ident(&g.name) || is_type_word(&g.name) || looks_like_float_word(&g.name))
        {
            push_quoted(&mut self.out, &g.name);
        } else {
            push_id(&mut self.out, &g.name);
        }
        self.out.push(' ');
        self.value_list(g, &g.inputs, true);
        self.out.push_str(" => ");
        self.value_list(g, &g.outputs, false);
        self.graph_rest(g, ind, true);
    }

    /// The `<initializers, value_info>` block and the node list.
    fn graph_rest(&mut self, g: &Graph, ind: usize, inputs_inline: bool) {
        let mut extras: Vec<String> = Vec::new();
        for &v in g.initializers() {
            if inputs_inline && g.is_input(v) {
                continue;
            }
            let t = g.initializer(v).expect("listed initializers have data");
            let mut s = String::new();
            self.tensor_decl(&mut s, t, Some(g.name(v)), true);
            extras.push(s);
        }
        for &v in g.sparse_initializers() {
            let t = g
                .sparse_initializer(v)
                .expect("listed sparse initializers have data");
            let mut s = String::new();
            self.sparse_decl(&mut s, t, Some(g.name(v)));
            extras.push(s);
        }
        for &v in &g.value_info {
            let mut s = String::new();
            value_info(&mut s, g, v);
            extras.push(s);
        }
        if extras.is_empty() {
            self.out.push_str(" {\n");
        } else {
            self.out.push('\n');
            self.indent(ind + IND);
            self.out.push('<');
            for (i, e) in extras.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(",\n");
                    self.indent(ind + IND + 1);
                }
                self.out.push_str(e);
            }
            self.out.push_str(">\n");
            self.indent(ind);
            self.out.push_str("{\n");
        }
        for n in g.nodes() {
            self.node(g, g.node(n), ind + IND);
        }
        self.indent(ind);
        self.out.push('}');
    }

    /// `(type name, ...)`; inputs print their default initializer.
    fn value_list(&mut self, g: &Graph, vs: &[ValueId], inputs: bool) {
        self.out.push('(');
        for (i, &v) in vs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let mut s = String::new();
            value_info(&mut s, g, v);
            if inputs {
                if let Some(t) = g.initializer(v) {
                    s.push_str(" = ");
                    self.tensor_data(&mut s, t);
                }
            }
            self.out.push_str(&s);
        }
        self.out.push(')');
    }

    fn node(&mut self, g: &Graph, n: &NodeData, ind: usize) {
        self.indent(ind);
        if !n.name.is_empty() {
            self.out.push('[');
            push_id(&mut self.out, &n.name);
            self.out.push_str("] ");
        }
        let name_of = |v: &Option<ValueId>| v.map(|v| g.name(v)).unwrap_or("");
        for (i, o) in n.outputs().iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            push_id(&mut self.out, name_of(o));
        }
        if !n.outputs().is_empty() {
            self.out.push(' ');
        }
        self.out.push_str("= ");
        let plain_domain = n.domain.is_empty() || n.domain.split('.').all(is_ident);
        if plain_domain && is_ident(&n.op_type) {
            if !n.domain.is_empty() {
                self.out.push_str(&n.domain);
                self.out.push('.');
            }
            self.out.push_str(&n.op_type);
        } else {
            // graphopt extension: quoted domain and op type.
            if !n.domain.is_empty() {
                push_quoted(&mut self.out, &n.domain);
                self.out.push('.');
            }
            push_quoted(&mut self.out, &n.op_type);
        }
        if !n.overload.is_empty() {
            self.out.push(':');
            if is_ident(&n.overload) {
                self.out.push_str(&n.overload);
            } else {
                push_quoted(&mut self.out, &n.overload);
            }
        }
        let sub = n.has_subgraphs();
        if !sub && !n.attributes.is_empty() {
            self.attr_list(&n.attributes, ind);
        }
        self.out.push_str(" (");
        for (i, v) in n.inputs().iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            push_id(&mut self.out, name_of(v));
        }
        self.out.push(')');
        if sub {
            self.attr_list(&n.attributes, ind);
        }
        self.out.push('\n');
    }

    fn attr_list(&mut self, attrs: &[Attribute], ind: usize) {
        self.out.push_str(" <");
        for (i, a) in attrs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.attr(a, ind);
        }
        self.out.push('>');
    }

    fn attr(&mut self, a: &Attribute, ind: usize) {
        if is_ident(&a.name) {
            self.out.push_str(&a.name);
        } else {
            push_quoted(&mut self.out, &a.name);
        }
        // The type annotation is needed where the value alone does not say
        // it: empty lists and references.
        let kind = a.value.kind();
        let empty_list = match &a.value {
            AttrValue::Floats(v) => v.is_empty(),
            AttrValue::Ints(v) => v.is_empty(),
            AttrValue::Strings(v) => v.is_empty(),
            AttrValue::Tensors(v) => v.is_empty(),
            AttrValue::Graphs(v) => v.is_empty(),
            AttrValue::SparseTensors(v) => v.is_empty(),
            AttrValue::Types(v) => v.is_empty(),
            _ => false,
        };
        let is_ref = matches!(a.value, AttrValue::Ref { .. });
        if (empty_list || is_ref) && kind != AttrKind::Undefined {
            self.out.push_str(": ");
            self.out.push_str(kind.name());
        }
        self.out.push_str(" = ");
        let list = |p: &mut Printer, n: usize, f: &mut dyn FnMut(&mut Printer, usize)| {
            p.out.push('[');
            for i in 0..n {
                if i > 0 {
                    p.out.push_str(", ");
                }
                f(p, i);
            }
            p.out.push(']');
        };
        match &a.value {
            AttrValue::Float(v) => self.out.push_str(&fmt_f32(*v)),
            AttrValue::Int(v) => {
                let _ = write!(self.out, "{v}");
            }
            AttrValue::String(s) => push_quoted_bytes(&mut self.out, s),
            AttrValue::Tensor(t) => {
                let mut s = String::new();
                self.tensor_decl(&mut s, t, None, false);
                self.out.push_str(&s);
            }
            AttrValue::Graph(g) => self.graph(g, ind, true),
            AttrValue::SparseTensor(t) => {
                let mut s = String::new();
                self.sparse_decl(&mut s, t, None);
                self.out.push_str(&s);
            }
            AttrValue::Type(t) => print_type(&mut self.out, t),
            AttrValue::Floats(v) => list(self, v.len(), &mut |p, i| p.out.push_str(&fmt_f32(v[i]))),
            AttrValue::Ints(v) => list(self, v.len(), &mut |p, i| {
                let _ = write!(p.out, "{}", v[i]);
            }),
            AttrValue::Strings(v) => list(self, v.len(), &mut |p, i| {
                push_quoted_bytes(&mut p.out, &v[i])
            }),
            AttrValue::Tensors(v) => list(self, v.len(), &mut |p, i| {
                let mut s = String::new();
                p.tensor_decl(&mut s, &v[i], None, false);
                p.out.push_str(&s);
            }),
            AttrValue::Graphs(v) => list(self, v.len(), &mut |p, i| p.graph(&v[i], ind, true)),
            AttrValue::SparseTensors(v) => list(self, v.len(), &mut |p, i| {
                let mut s = String::new();
                p.sparse_decl(&mut s, &v[i], None);
                p.out.push_str(&s);
            }),
            AttrValue::Types(v) => list(self, v.len(), &mut |p, i| print_type(&mut p.out, &v[i])),
            AttrValue::Ref { attr, .. } => {
                self.out.push('@');
                push_id(&mut self.out, attr);
            }
        }
    }

    /// `float[2,3] name = {...}` (initializer: `var` is the value's name) or
    /// `float[2,3] name {...}` (attribute: the tensor's own name, if any).
    fn tensor_decl(&self, s: &mut String, t: &Tensor, var: Option<&str>, initializer: bool) {
        print_tensor_type(s, t.dtype, &t.dims);
        let name = var.unwrap_or(&t.name);
        if !name.is_empty() {
            s.push(' ');
            push_id(s, name);
        }
        if initializer || self.elided(t) {
            // The elided form needs `=` in attribute position for
            // `onnx.parser` to read it as a tensor.
            s.push_str(" = ");
        } else {
            s.push(' ');
        }
        self.tensor_data(s, t);
    }

    fn sparse_decl(&self, s: &mut String, t: &SparseTensor, var: Option<&str>) {
        s.push_str("sparse_tensor(");
        print_tensor_type(s, t.values.dtype, &t.dims);
        s.push(')');
        if let Some(v) = var {
            s.push(' ');
            push_id(s, v);
            s.push_str(" =");
        }
        s.push_str(" (");
        self.tensor_decl(s, &t.values, None, false);
        s.push_str(", ");
        self.tensor_decl(s, &t.indices, None, false);
        s.push(')');
    }

    fn elided(&self, t: &Tensor) -> bool {
        let n = match &t.data {
            TensorData::Strings(v) => v.len() as u64,
            TensorData::Raw(_) => t.numel().unwrap_or(u64::MAX),
        };
        self.opts.elide_above.is_some_and(|max| n > max as u64)
    }

    /// `{v, ...}` or the elided marker.
    fn tensor_data(&self, s: &mut String, t: &Tensor) {
        if self.elided(t) {
            let (n, hash) = match &t.data {
                TensorData::Raw(b) => (t.numel().unwrap_or(0), fnv1a64(&[b])),
                TensorData::Strings(v) => {
                    let parts: Vec<&[u8]> = v.iter().map(|b| b.as_ref()).collect();
                    (v.len() as u64, fnv1a64(&parts))
                }
            };
            let _ = write!(s, "[\"elided\": \"{n} elements, fnv1a64 {hash:016x}\"]");
            return;
        }
        s.push('{');
        match &t.data {
            TensorData::Strings(v) => {
                for (i, b) in v.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    push_quoted_bytes(s, b);
                }
            }
            TensorData::Raw(raw) => {
                let (form, per) = elem_form(t.dtype);
                let count = match t.dtype.bits() {
                    Some(_) => t.numel().unwrap_or(0).saturating_mul(per),
                    None => raw.len() as u64,
                };
                let mut sep = "";
                for i in 0..count as usize {
                    s.push_str(sep);
                    sep = ", ";
                    match form {
                        ElemForm::F32 => {
                            let b = raw.get(i * 4..i * 4 + 4).unwrap_or(&[0; 4]);
                            s.push_str(&fmt_f32(f32::from_le_bytes(
                                b.try_into().unwrap_or([0; 4]),
                            )));
                        }
                        ElemForm::F64 => {
                            let b = raw.get(i * 8..i * 8 + 8).unwrap_or(&[0; 8]);
                            s.push_str(&fmt_f64(f64::from_le_bytes(
                                b.try_into().unwrap_or([0; 8]),
                            )));
                        }
                        ElemForm::Half { .. } => {
                            let _ = write!(s, "{}", read_int(raw, 16, false, i));
                        }
                        ElemForm::Int { bits, signed } => {
                            let _ = write!(s, "{}", read_int(raw, bits, signed, i));
                        }
                        ElemForm::Str => {}
                    }
                }
            }
        }
        s.push('}');
    }
}

fn opsets(os: &[OpsetImport]) -> String {
    let mut s = String::from("[");
    for (i, o) in os.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        push_quoted(&mut s, &o.domain);
        let _ = write!(s, " : {}", o.version);
    }
    s.push(']');
    s
}

/// `type name`, or just `name` for a value without a type.
fn value_info(s: &mut String, g: &Graph, v: ValueId) {
    if let Some(t) = g.ty(v) {
        if t.kind != TypeKind::Unset {
            print_type(s, t);
            s.push(' ');
        }
    }
    push_id(s, g.name(v));
}

fn print_tensor_type(s: &mut String, d: DType, dims: &[i64]) {
    s.push_str(d.name());
    if !dims.is_empty() {
        s.push('[');
        for (i, d) in dims.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let _ = write!(s, "{d}");
        }
        s.push(']');
    }
}

fn print_shape(s: &mut String, shape: &Option<Shape>) {
    match shape {
        None => s.push_str("[]"),
        Some(sh) if sh.dims.is_empty() => {}
        Some(sh) => {
            s.push('[');
            for (i, d) in sh.dims.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                match d {
                    Dim::Known(v) => {
                        let _ = write!(s, "{v}");
                    }
                    Dim::Sym(n) => push_id(s, n),
                    Dim::Unknown => s.push('?'),
                }
            }
            s.push(']');
        }
    }
}

/// A value type. `Unset` has no syntax and prints as `undefined[]`.
pub(crate) fn print_type(s: &mut String, t: &Type) {
    match &t.kind {
        TypeKind::Tensor(tt) => {
            s.push_str(tt.elem.name());
            print_shape(s, &tt.shape);
        }
        TypeKind::SparseTensor(tt) => {
            s.push_str("sparse_tensor(");
            s.push_str(tt.elem.name());
            print_shape(s, &tt.shape);
            s.push(')');
        }
        TypeKind::Sequence(e) => {
            s.push_str("seq(");
            if let Some(e) = e {
                print_type(s, e);
            }
            s.push(')');
        }
        TypeKind::Map(k, v) => {
            s.push_str("map(");
            s.push_str(k.name());
            s.push_str(", ");
            print_type(s, v);
            s.push(')');
        }
        TypeKind::Optional(e) => {
            s.push_str("optional(");
            print_type(s, e);
            s.push(')');
        }
        TypeKind::Opaque { domain, name } => {
            s.push_str("opaque(");
            if !domain.is_empty() {
                s.push_str(domain);
                s.push(',');
            }
            s.push_str(name);
            s.push(')');
        }
        TypeKind::Unset => s.push_str("undefined[]"),
    }
}
