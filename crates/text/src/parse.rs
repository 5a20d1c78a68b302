//! The parser: recursive descent over bytes, following `onnx/defs/parser.cc`
//! token for token (so text `onnx.parser` reads means the same here), plus
//! the extensions listed in the crate docs.
//!
//! A graph is read in two steps: its syntax into a [`PGraph`] (subgraphs in
//! attributes are already built by then), then [`build`] creates the IR. Two
//! steps because a name's meaning depends on the whole graph: a name that no
//! input, initializer or node output of this graph defines is, in a
//! subgraph, a capture of an enclosing graph's value.
//!
//! The parser never panics: every failure is a [`ParseError`], nesting is
//! bounded by [`MAX_DEPTH`], and elided tensors are only filled with zeros up
//! to [`MAX_ELIDED_BYTES`].

use crate::util::*;
use crate::ParseError;
use bytes::Bytes;
use graphopt_ir::{
    AttrKind, AttrValue, Attribute, DType, Dim, Function, Graph, Model, NewNode, OpsetImport,
    Shape, SparseTensor, Tensor, TensorType, Type, TypeKind,
};
use std::collections::HashSet;

/// Deepest nesting of types and graphs accepted (keeps the stack bounded).
pub const MAX_DEPTH: usize = 64;
/// Largest elided tensor the parser fills with zeros.
pub const MAX_ELIDED_BYTES: u64 = 1 << 28;

type PResult<T> = Result<T, ParseError>;

/// Parses a model: optional `<header>`, the main graph, then functions.
pub fn parse_model(src: &str) -> Result<Model, ParseError> {
    let mut p = Parser::new(src);
    p.model()
}

/// Parses one graph, `name (inputs) => (outputs) <...> {...}`.
pub fn parse_graph(src: &str) -> Result<Graph, ParseError> {
    let mut p = Parser::new(src);
    let name = p.quotable("a graph name")?;
    let g = p.graph(name, false)?;
    p.expect_end()?;
    Ok(g)
}

/// A value in a signature, value_info list or initializer list.
struct PValue {
    name: String,
    ty: Option<Type>,
    init: Option<Init>,
    pos: usize,
}

enum Init {
    Dense(Tensor),
    Sparse(SparseTensor),
}

struct PNode {
    pos: usize,
    label: String,
    outputs: Vec<String>,
    domain: String,
    op: String,
    overload: String,
    attrs: Vec<Attribute>,
    inputs: Vec<String>,
}

/// A graph's syntax; subgraphs in attributes are already built.
struct PGraph {
    name: String,
    inputs: Vec<PValue>,
    outputs: Vec<PValue>,
    extras: Vec<PValue>,
    nodes: Vec<PNode>,
}

enum Lit {
    Int(String),
    Float(String),
    Str(Vec<u8>),
}

struct Parser<'a> {
    text: &'a str,
    src: &'a [u8],
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            text,
            src: text.as_bytes(),
            pos: 0,
            depth: 0,
        }
    }

    // ---- errors -------------------------------------------------------

    fn error_at(&self, pos: usize, message: impl Into<String>) -> ParseError {
        let pos = pos.min(self.src.len());
        let before = &self.src[..pos];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        // Columns count characters: skip UTF-8 continuation bytes.
        let column = 1 + before[line_start..]
            .iter()
            .filter(|&&b| b & 0xC0 != 0x80)
            .count();
        let message: String = message.into();
        ParseError {
            line,
            column,
            message: message.replace('\n', " "),
        }
    }

    /// "expected X, found Y" at the next token.
    fn expected(&mut self, what: &str) -> ParseError {
        self.skip_ws();
        let found = self.describe_here();
        self.error_at(self.pos, format!("expected {what}, found {found}"))
    }

    fn describe_here(&self) -> String {
        let Some(&c) = self.src.get(self.pos) else {
            return "end of input".to_string();
        };
        if c.is_ascii_alphabetic() || c == b'_' {
            let end = self.src[self.pos..]
                .iter()
                .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                .map_or(self.src.len(), |i| self.pos + i);
            return format!("'{}'", &self.text[self.pos..end]);
        }
        match self.text.get(self.pos..).and_then(|s| s.chars().next()) {
            Some(ch) => format!("'{}'", ch.escape_debug()),
            None => "a stray byte".to_string(),
        }
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error_at(self.pos, format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    // ---- tokens -------------------------------------------------------

    /// Skips whitespace and `#` comments (to the end of the line).
    fn skip_ws(&mut self) {
        loop {
            while self
                .src
                .get(self.pos)
                .is_some_and(|c| c.is_ascii_whitespace() || *c == 0x0b)
            {
                self.pos += 1;
            }
            if self.src.get(self.pos) != Some(&b'#') {
                return;
            }
            while self.src.get(self.pos).is_some_and(|c| *c != b'\n') {
                self.pos += 1;
            }
        }
    }

    fn here(&mut self) -> usize {
        self.skip_ws();
        self.pos
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.src.get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> PResult<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.expected(&format!("'{}'", c as char)))
        }
    }

    fn expect_end(&mut self) -> PResult<()> {
        if self.peek().is_some() {
            return Err(self.expected("end of input"));
        }
        Ok(())
    }

    fn peek_is_ident_start(&mut self) -> bool {
        self.peek()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
    }

    fn peek_ident(&mut self) -> Option<&'a str> {
        if !self.peek_is_ident_start() {
            return None;
        }
        let end = self.src[self.pos..]
            .iter()
            .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
            .map_or(self.src.len(), |i| self.pos + i);
        let text: &'a str = self.text;
        Some(&text[self.pos..end])
    }

    fn ident_opt(&mut self) -> Option<String> {
        let id = self.peek_ident()?;
        self.pos += id.len();
        Some(id.to_string())
    }

    fn ident(&mut self, what: &str) -> PResult<String> {
        match self.ident_opt() {
            Some(id) => Ok(id),
            None => Err(self.expected(what)),
        }
    }

    /// A `"..."` literal. `\c` stands for `c`; `\xNN` (graphopt extension)
    /// for the byte NN.
    fn string(&mut self) -> PResult<Vec<u8>> {
        let start = self.here();
        if self.src.get(self.pos) != Some(&b'"') {
            return Err(self.expected("a string"));
        }
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            match self.src.get(self.pos) {
                None => return Err(self.error_at(start, "unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let hex = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16));
                    match self.src.get(self.pos + 1) {
                        None => return Err(self.error_at(start, "unterminated string")),
                        Some(b'x') => match (
                            hex(self.src.get(self.pos + 2)),
                            hex(self.src.get(self.pos + 3)),
                        ) {
                            (Some(h), Some(l)) => {
                                out.push((h * 16 + l) as u8);
                                self.pos += 4;
                            }
                            _ => {
                                out.push(b'x');
                                self.pos += 2;
                            }
                        },
                        Some(&c) => {
                            out.push(c);
                            self.pos += 2;
                        }
                    }
                }
                Some(&c) => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn string_utf8(&mut self) -> PResult<String> {
        let start = self.here();
        let b = self.string()?;
        String::from_utf8(b).map_err(|_| self.error_at(start, "a name must be valid UTF-8"))
    }

    /// An identifier or a quoted string.
    fn quotable(&mut self, what: &str) -> PResult<String> {
        if self.peek() == Some(b'"') {
            self.string_utf8()
        } else {
            self.ident(what)
        }
    }

    /// A number, `nan`/`inf`/`infinity` (optionally negative), or a string.
    fn literal(&mut self, what: &str) -> PResult<Lit> {
        let start = self.here();
        match self.src.get(self.pos) {
            Some(b'"') => return Ok(Lit::Str(self.string()?)),
            Some(b'-') => self.pos += 1,
            _ => {}
        }
        let Some(&c) = self.src.get(self.pos) else {
            return Err(self.expected(what));
        };
        if c.is_ascii_alphabetic() {
            let word = self.peek_ident().unwrap_or("");
            let lower = word.to_ascii_lowercase();
            if lower == "nan" || lower == "inf" || lower == "infinity" {
                self.pos += word.len();
                return Ok(Lit::Float(self.text[start..self.pos].to_string()));
            }
            self.pos = start;
            return Err(self.expected(what));
        }
        if !c.is_ascii_digit() {
            self.pos = start;
            return Err(self.expected(what));
        }
        let mut float = false;
        while let Some(&c) = self.src.get(self.pos) {
            if c.is_ascii_digit() {
                self.pos += 1;
            } else if c == b'.' && !float {
                float = true;
                self.pos += 1;
            } else {
                break;
            }
        }
        if matches!(self.src.get(self.pos), Some(b'e' | b'E')) {
            float = true;
            self.pos += 1;
            if matches!(self.src.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            while self.src.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        let s = self.text[start..self.pos].to_string();
        Ok(if float { Lit::Float(s) } else { Lit::Int(s) })
    }

    fn int_lit(&mut self, what: &str) -> PResult<i64> {
        let start = self.here();
        match self.literal(what)? {
            Lit::Int(s) => s
                .parse::<i64>()
                .map_err(|_| self.error_at(start, format!("integer {s} does not fit in 64 bits"))),
            _ => Err(self.error_at(start, format!("expected {what}"))),
        }
    }

    fn str_lit(&mut self, what: &str) -> PResult<String> {
        if self.peek() != Some(b'"') {
            return Err(self.expected(what));
        }
        self.string_utf8()
    }

    fn parse_f32(&self, s: &str, pos: usize) -> PResult<f32> {
        s.parse::<f32>()
            .map_err(|_| self.error_at(pos, format!("'{s}' is not a valid float")))
    }

    // ---- model and functions -------------------------------------------

    fn model(&mut self) -> PResult<Model> {
        let mut m = Model::default();
        if self.eat(b'<') && !self.eat(b'>') {
            loop {
                let kpos = self.here();
                let key = self.ident("a model field name")?;
                self.expect(b':')?;
                match key.as_str() {
                    "ir_version" => m.ir_version = self.int_lit("an integer")?,
                    "opset_import" => m.opset_imports = self.opsets()?,
                    "producer_name" => m.producer_name = self.str_lit("a string")?,
                    "producer_version" => m.producer_version = self.str_lit("a string")?,
                    "domain" => m.domain = self.str_lit("a string")?,
                    "model_version" => m.model_version = self.int_lit("an integer")?,
                    "doc_string" => m.doc_string = self.str_lit("a string")?,
                    "metadata_props" => m.metadata_props = self.string_pairs()?,
                    _ => {
                        return Err(self.error_at(
                            kpos,
                            format!(
                                "unknown model field '{key}' (expected ir_version, opset_import, producer_name, \
                                 producer_version, domain, model_version, doc_string or metadata_props)"
                            ),
                        ))
                    }
                }
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b'>')?;
        }
        let name = self.quotable("a graph name")?;
        m.graph = self.graph(name, false)?;
        while self.peek().is_some() {
            m.functions.push(self.function()?);
        }
        Ok(m)
    }

    /// `["" : 17, "com.microsoft" : 1]`
    fn opsets(&mut self) -> PResult<Vec<OpsetImport>> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        if self.eat(b']') {
            return Ok(out);
        }
        loop {
            let domain = self.str_lit("a quoted opset domain")?;
            self.expect(b':')?;
            let version = self.int_lit("an opset version")?;
            out.push(OpsetImport { domain, version });
            if !self.eat(b',') {
                break;
            }
        }
        self.expect(b']')?;
        Ok(out)
    }

    /// `["key": "value", ...]`
    fn string_pairs(&mut self) -> PResult<Vec<(String, String)>> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        if self.eat(b']') {
            return Ok(out);
        }
        loop {
            let k = self.str_lit("a quoted key")?;
            self.expect(b':')?;
            let v = self.str_lit("a quoted value")?;
            out.push((k, v));
            if !self.eat(b',') {
                break;
            }
        }
        self.expect(b']')?;
        Ok(out)
    }

    fn function(&mut self) -> PResult<Function> {
        let mut f = Function {
            name: String::new(),
            domain: String::new(),
            overload: String::new(),
            attributes: Vec::new(),
            attribute_defaults: Vec::new(),
            opset_imports: Vec::new(),
            doc_string: String::new(),
            metadata_props: Vec::new(),
            body: Graph::default(),
        };
        if self.eat(b'<') && !self.eat(b'>') {
            loop {
                let kpos = self.here();
                let key = self.ident("a function field name")?;
                self.expect(b':')?;
                match key.as_str() {
                    "opset_import" => f.opset_imports = self.opsets()?,
                    "doc_string" => f.doc_string = self.str_lit("a string")?,
                    "domain" => f.domain = self.str_lit("a string")?,
                    "overload" => f.overload = self.str_lit("a string")?,
                    _ => {
                        return Err(self.error_at(
                            kpos,
                            format!(
                                "unknown function field '{key}' (expected domain, overload, opset_import or doc_string)"
                            ),
                        ))
                    }
                }
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b'>')?;
        }
        f.name = self.quotable("a function name")?;
        if self.eat(b'<') && !self.eat(b'>') {
            loop {
                let name = self.quotable("an attribute name")?;
                if matches!(self.peek(), Some(b':' | b'=')) {
                    f.attribute_defaults.push(self.attr_after_name(name)?);
                } else {
                    f.attributes.push(name);
                }
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b'>')?;
        }
        let inputs = self.value_list(b'(', b')', false)?;
        self.arrow()?;
        let outputs = self.value_list(b'(', b')', false)?;
        let extras = if self.peek() == Some(b'<') {
            self.value_list(b'<', b'>', true)?
        } else {
            Vec::new()
        };
        let nodes = self.node_list()?;
        let pg = PGraph {
            name: f.name.clone(),
            inputs,
            outputs,
            extras,
            nodes,
        };
        f.body = self.build(pg, false)?;
        Ok(f)
    }

    // ---- graphs -------------------------------------------------------

    fn arrow(&mut self) -> PResult<()> {
        if self.peek() == Some(b'=') && self.src.get(self.pos + 1) == Some(&b'>') {
            self.pos += 2;
            Ok(())
        } else {
            Err(self.expected("'=>'"))
        }
    }

    /// The rest of a graph after its name. `sub`: a subgraph, whose unknown
    /// names are captures of enclosing values.
    fn graph(&mut self, name: String, sub: bool) -> PResult<Graph> {
        self.enter()?;
        let inputs = self.value_list(b'(', b')', true)?;
        self.arrow()?;
        let outputs = self.value_list(b'(', b')', false)?;
        let extras = if self.peek() == Some(b'<') {
            self.value_list(b'<', b'>', true)?
        } else {
            Vec::new()
        };
        let nodes = self.node_list()?;
        let pg = PGraph {
            name,
            inputs,
            outputs,
            extras,
            nodes,
        };
        let g = self.build(pg, sub)?;
        self.leave();
        Ok(g)
    }

    /// `open (type? name (= data)?)* close`
    fn value_list(&mut self, open: u8, close: u8, allow_init: bool) -> PResult<Vec<PValue>> {
        self.expect(open)?;
        let mut out = Vec::new();
        if self.eat(close) {
            return Ok(out);
        }
        loop {
            out.push(self.value_entry(allow_init)?);
            if !self.eat(b',') {
                break;
            }
        }
        self.expect(close)?;
        Ok(out)
    }

    fn value_entry(&mut self, allow_init: bool) -> PResult<PValue> {
        let pos = self.here();
        let ty = match self.peek_ident() {
            Some(w) if is_type_word(w) => Some(self.ty()?),
            _ => None,
        };
        let name = self.quotable("a value name")?;
        if ty.is_none()
            && (self.peek() == Some(b'[')
                || self.peek_is_ident_start()
                || self.peek() == Some(b'"'))
        {
            return Err(self.error_at(
                pos,
                format!("'{name}' is not a type (expected float, int64, seq(...), ...)"),
            ));
        }
        let mut init = None;
        if allow_init && self.peek() == Some(b'=') && self.src.get(self.pos + 1) != Some(&b'>') {
            self.pos += 1;
            init = Some(match &ty {
                Some(Type {
                    kind: TypeKind::SparseTensor(tt),
                    ..
                }) => {
                    let dims = self.tensor_dims(tt, pos)?;
                    Init::Sparse(self.sparse_body(tt.elem, dims)?)
                }
                Some(t) => {
                    let (d, dims) = self.tensor_type_of(t, pos)?;
                    Init::Dense(self.tensor_body(d, dims)?)
                }
                None => {
                    return Err(
                        self.error_at(pos, format!("initializer '{name}' needs a tensor type"))
                    )
                }
            });
        }
        Ok(PValue {
            name,
            ty,
            init,
            pos,
        })
    }

    fn node_list(&mut self) -> PResult<Vec<PNode>> {
        self.expect(b'{')?;
        let mut out = Vec::new();
        while !self.eat(b'}') {
            if self.peek().is_none() {
                return Err(self.expected("a node or '}'"));
            }
            out.push(self.node()?);
        }
        Ok(out)
    }

    /// onnx's id list: names may be empty (`""`, or nothing before a comma);
    /// a trailing comma after a name is ignored.
    fn id_list(&mut self) -> PResult<Vec<String>> {
        let mut out = Vec::new();
        loop {
            let (id, found) = if self.peek() == Some(b'"') {
                (self.string_utf8()?, true)
            } else {
                let id = self.ident_opt().unwrap_or_default();
                let found = !id.is_empty() || self.peek() == Some(b',');
                (id, found)
            };
            if !found {
                break;
            }
            out.push(id);
            if !self.eat(b',') {
                break;
            }
        }
        Ok(out)
    }

    fn node(&mut self) -> PResult<PNode> {
        let pos = self.here();
        let mut label = String::new();
        if self.eat(b'[') {
            if self.peek() == Some(b'"') {
                label = self.string_utf8()?;
            } else {
                label = self.ident_opt().unwrap_or_default();
            }
            self.expect(b']')?;
        }
        let outputs = self.id_list()?;
        self.expect(b'=')?;
        let (mut domain, op);
        if self.peek() == Some(b'"') {
            let first = self.string_utf8()?;
            if self.eat(b'.') {
                domain = first;
                op = self.string_utf8()?;
            } else {
                domain = String::new();
                op = first;
            }
        } else {
            domain = String::new();
            let mut id = self.ident("an operator name")?;
            while self.eat(b'.') {
                if !domain.is_empty() {
                    domain.push('.');
                }
                domain.push_str(&id);
                id = self.ident("an operator name")?;
            }
            op = id;
        }
        let mut overload = String::new();
        if self.eat(b':') {
            overload = self.quotable("an overload name")?;
        }
        let mut attrs = if self.peek() == Some(b'<') {
            self.attr_list()?
        } else {
            Vec::new()
        };
        self.expect(b'(')?;
        let inputs = self.id_list()?;
        self.expect(b')')?;
        if attrs.is_empty() && self.peek() == Some(b'<') {
            attrs = self.attr_list()?;
        }
        Ok(PNode {
            pos,
            label,
            outputs,
            domain,
            op,
            overload,
            attrs,
            inputs,
        })
    }

    // ---- attributes -----------------------------------------------------

    fn attr_list(&mut self) -> PResult<Vec<Attribute>> {
        self.expect(b'<')?;
        let mut out = Vec::new();
        if self.eat(b'>') {
            return Ok(out);
        }
        loop {
            let name = self.quotable("an attribute name")?;
            out.push(self.attr_after_name(name)?);
            if !self.eat(b',') {
                break;
            }
        }
        self.expect(b'>')?;
        Ok(out)
    }

    /// `(: kind)? = value`
    fn attr_after_name(&mut self, name: String) -> PResult<Attribute> {
        let mut kind = None;
        if self.eat(b':') {
            let kpos = self.here();
            let k = self.ident("an attribute type")?;
            match AttrKind::from_name(&k) {
                Some(AttrKind::Undefined) | None => {
                    return Err(self.error_at(
                        kpos,
                        format!("unknown attribute type '{k}' (expected int, float, string, tensor, graph, ints, ...)"),
                    ))
                }
                Some(k) => kind = Some(k),
            }
        }
        self.expect(b'=')?;
        let vpos = self.here();
        let value = self.attr_value(kind)?;
        if let Some(k) = kind {
            if value.kind() != k {
                return Err(self.error_at(
                    vpos,
                    format!(
                        "attribute '{name}' is declared {} but its value is {}",
                        k.name(),
                        value.kind().name()
                    ),
                ));
            }
        }
        Ok(Attribute::new(name, value))
    }

    fn attr_value(&mut self, kind: Option<AttrKind>) -> PResult<AttrValue> {
        if self.eat(b'@') {
            let attr = self.quotable("an attribute name")?;
            return Ok(AttrValue::Ref {
                attr,
                kind: kind.unwrap_or(AttrKind::Undefined),
            });
        }
        if self.peek() != Some(b'[') {
            return self.single_value(kind);
        }
        let lpos = self.here();
        self.pos += 1;
        let elem_kind = kind.map(singleton);
        let mut items = Vec::new();
        if !self.eat(b']') {
            loop {
                items.push(self.single_value(elem_kind)?);
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b']')?;
        }
        if items.is_empty() {
            return match kind {
                None => Err(self.error_at(
                    lpos,
                    "an empty list needs a type annotation, as in `axes: ints = []`",
                )),
                Some(k) => empty_list(k).ok_or_else(|| {
                    self.error_at(
                        lpos,
                        format!("a list given for single-valued type {}", k.name()),
                    )
                }),
            };
        }
        combine_list(items).map_err(|m| self.error_at(lpos, m))
    }

    /// One attribute value (not a list).
    fn single_value(&mut self, expected: Option<AttrKind>) -> PResult<AttrValue> {
        let start = self.here();
        match self.src.get(self.pos) {
            Some(b'"') => {
                let s = self.string()?;
                if self.peek() == Some(b'(') {
                    // graphopt extension: a graph with a quoted name.
                    let name = String::from_utf8(s)
                        .map_err(|_| self.error_at(start, "a name must be valid UTF-8"))?;
                    return Ok(AttrValue::Graph(Box::new(self.graph(name, true)?)));
                }
                Ok(AttrValue::String(s))
            }
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
                let word = self.peek_ident().unwrap_or("");
                if is_type_word(word) {
                    let ty = self.ty()?;
                    return self.after_type(ty, start);
                }
                let lower = word.to_ascii_lowercase();
                if lower == "nan" || lower == "inf" || lower == "infinity" {
                    let lit = self.literal("a float")?;
                    let Lit::Float(s) = lit else {
                        return Err(self.error_at(start, "expected a float"));
                    };
                    return Ok(AttrValue::Float(self.parse_f32(&s, start)?));
                }
                let name = self.ident("a graph name")?;
                Ok(AttrValue::Graph(Box::new(self.graph(name, true)?)))
            }
            _ => match self.literal("an attribute value")? {
                Lit::Int(s) if expected == Some(AttrKind::Float) => {
                    Ok(AttrValue::Float(self.parse_f32(&s, start)?))
                }
                Lit::Int(s) => s.parse::<i64>().map(AttrValue::Int).map_err(|_| {
                    self.error_at(start, format!("integer {s} does not fit in 64 bits"))
                }),
                Lit::Float(s) => Ok(AttrValue::Float(self.parse_f32(&s, start)?)),
                Lit::Str(s) => Ok(AttrValue::String(s)),
            },
        }
    }

    /// After a type in attribute position: a tensor literal, a sparse tensor
    /// literal, or the type itself.
    fn after_type(&mut self, ty: Type, start: usize) -> PResult<AttrValue> {
        if let TypeKind::SparseTensor(tt) = &ty.kind {
            if self.peek() == Some(b'(') {
                let dims = self.tensor_dims(tt, start)?;
                return Ok(AttrValue::SparseTensor(self.sparse_body(tt.elem, dims)?));
            }
        }
        let is_tensor =
            matches!(self.peek(), Some(b'{' | b'=' | b'"')) || self.peek_is_ident_start();
        if !is_tensor {
            return Ok(AttrValue::Type(ty));
        }
        Ok(AttrValue::Tensor(self.tensor_after_type(&ty, start)?))
    }

    /// `name? =? data`, after the tensor's type.
    fn tensor_after_type(&mut self, ty: &Type, start: usize) -> PResult<Tensor> {
        let (d, dims) = self.tensor_type_of(ty, start)?;
        let name = match self.peek() {
            Some(b'"') => self.string_utf8()?,
            _ => self.ident_opt().unwrap_or_default(),
        };
        self.eat(b'=');
        let mut t = self.tensor_body(d, dims)?;
        t.name = name;
        Ok(t)
    }

    /// `type name? =? data`
    fn tensor_literal(&mut self) -> PResult<Tensor> {
        let start = self.here();
        let ty = self.ty()?;
        self.tensor_after_type(&ty, start)
    }

    /// `(values, indices)` of a sparse tensor.
    fn sparse_body(&mut self, elem: DType, dims: Vec<i64>) -> PResult<SparseTensor> {
        self.expect(b'(')?;
        let vpos = self.here();
        let values = self.tensor_literal()?;
        if values.dtype != elem {
            return Err(self.error_at(
                vpos,
                format!(
                    "sparse values are {} but the sparse type says {elem}",
                    values.dtype
                ),
            ));
        }
        self.expect(b',')?;
        let indices = self.tensor_literal()?;
        self.expect(b')')?;
        Ok(SparseTensor {
            values,
            indices,
            dims,
        })
    }

    // ---- types and tensors ----------------------------------------------

    fn ty(&mut self) -> PResult<Type> {
        self.enter()?;
        let pos = self.here();
        let word = self.ident("a type")?;
        let kind = if let Some(d) = DType::from_name(&word) {
            TypeKind::Tensor(TensorType::new(d, self.shape()?))
        } else {
            match word.as_str() {
                "seq" => {
                    self.expect(b'(')?;
                    if self.eat(b')') {
                        TypeKind::Sequence(None)
                    } else {
                        let e = self.ty()?;
                        self.expect(b')')?;
                        TypeKind::Sequence(Some(Box::new(e)))
                    }
                }
                "map" => {
                    self.expect(b'(')?;
                    let kpos = self.here();
                    let k = self.ident("a map key type")?;
                    let k = DType::from_name(&k).ok_or_else(|| {
                        self.error_at(kpos, format!("'{k}' is not an element type"))
                    })?;
                    self.expect(b',')?;
                    let v = self.ty()?;
                    self.expect(b')')?;
                    TypeKind::Map(k, Box::new(v))
                }
                "optional" => {
                    self.expect(b'(')?;
                    let e = self.ty()?;
                    self.expect(b')')?;
                    TypeKind::Optional(Box::new(e))
                }
                "sparse_tensor" => {
                    self.expect(b'(')?;
                    let epos = self.here();
                    let e = self.ident("an element type")?;
                    let d = DType::from_name(&e).ok_or_else(|| {
                        self.error_at(epos, format!("'{e}' is not an element type"))
                    })?;
                    let shape = self.shape()?;
                    self.expect(b')')?;
                    TypeKind::SparseTensor(TensorType::new(d, shape))
                }
                "opaque" => {
                    self.expect(b'(')?;
                    let (mut domain, mut name) = (String::new(), String::new());
                    if !self.eat(b')') {
                        let mut q = self.ident("an opaque type name")?;
                        while self.eat(b'.') {
                            q.push('.');
                            q.push_str(&self.ident("an identifier")?);
                        }
                        if self.eat(b',') {
                            domain = q;
                            name = self.ident("an opaque type name")?;
                        } else {
                            name = q;
                        }
                        self.expect(b')')?;
                    }
                    TypeKind::Opaque { domain, name }
                }
                _ => return Err(self.error_at(pos, format!("expected a type, found '{word}'"))),
            }
        };
        self.leave();
        Ok(Type {
            kind,
            denotation: None,
        })
    }

    /// `[dims]` (known rank), `[]` (unknown rank) or nothing (a scalar).
    fn shape(&mut self) -> PResult<Option<Shape>> {
        if !self.eat(b'[') {
            return Ok(Some(Shape::new(Vec::new())));
        }
        if self.eat(b']') {
            return Ok(None);
        }
        let mut dims = Vec::new();
        loop {
            if self.eat(b'?') {
                dims.push(Dim::Unknown);
            } else if self.peek() == Some(b'"') {
                dims.push(Dim::Sym(self.string_utf8()?));
            } else if let Some(id) = self.ident_opt() {
                dims.push(Dim::Sym(id));
            } else {
                dims.push(Dim::Known(self.int_lit("a dimension")?));
            }
            if !self.eat(b',') {
                break;
            }
        }
        self.expect(b']')?;
        Ok(Some(Shape::new(dims)))
    }

    fn tensor_dims(&self, tt: &TensorType, pos: usize) -> PResult<Vec<i64>> {
        let Some(shape) = &tt.shape else {
            return Err(self.error_at(pos, "a constant needs a known shape, not `[]`"));
        };
        shape
            .dims
            .iter()
            .map(|d| match d {
                Dim::Known(v) => Ok(*v),
                _ => Err(self.error_at(pos, "a constant's dimensions must be numbers")),
            })
            .collect()
    }

    fn tensor_type_of(&self, ty: &Type, pos: usize) -> PResult<(DType, Vec<i64>)> {
        match &ty.kind {
            TypeKind::Tensor(tt) => Ok((tt.elem, self.tensor_dims(tt, pos)?)),
            _ => Err(self.error_at(pos, "a constant needs a tensor type")),
        }
    }

    /// `{values}` or the external-data form `["key": "value", ...]`, of which
    /// only the elided marker is understood.
    fn tensor_body(&mut self, d: DType, dims: Vec<i64>) -> PResult<Tensor> {
        let pos = self.here();
        let numel = graphopt_ir::numel(&dims).map_err(|e| self.error_at(pos, e.0))?;
        if self.peek() == Some(b'[') {
            let pairs = self.string_pairs()?;
            if !pairs.iter().any(|(k, _)| k == "elided") {
                return Err(self.error_at(
                    pos,
                    "external tensor data is not supported (only the \"elided\" marker)",
                ));
            }
            return self.zeros(d, dims, numel, pos);
        }
        if self.peek() != Some(b'{') {
            return Err(self.expected("'{' and tensor values"));
        }
        self.pos += 1;
        let (form, per) = elem_form(d);
        let want = if d.bits().is_some() || d == DType::String {
            numel.checked_mul(per)
        } else {
            None
        };
        let mut strings: Vec<Bytes> = Vec::new();
        let mut raw: Vec<u8> = Vec::new();
        let mut ints: Vec<i128> = Vec::new();
        let mut count: u64 = 0;
        if !self.eat(b'}') {
            loop {
                let vpos = self.here();
                if want.is_some_and(|w| count >= w) {
                    return Err(self.error_at(
                        vpos,
                        format!("too many values: {d}{dims:?} holds {}", want.unwrap_or(0)),
                    ));
                }
                let lit = self.literal("a tensor value")?;
                count += 1;
                match (form, lit) {
                    (ElemForm::Str, Lit::Str(s)) => strings.push(Bytes::from(s)),
                    (ElemForm::F32, Lit::Int(s) | Lit::Float(s)) => {
                        raw.extend_from_slice(&self.parse_f32(&s, vpos)?.to_le_bytes())
                    }
                    (ElemForm::F64, Lit::Int(s) | Lit::Float(s)) => {
                        let v = s.parse::<f64>().map_err(|_| {
                            self.error_at(vpos, format!("'{s}' is not a valid double"))
                        })?;
                        raw.extend_from_slice(&v.to_le_bytes());
                    }
                    (ElemForm::Half { bf16 }, Lit::Float(s)) => {
                        let v = self.parse_f32(&s, vpos)?;
                        let bits = if bf16 {
                            half::bf16::from_f32(v).to_bits()
                        } else {
                            half::f16::from_f32(v).to_bits()
                        };
                        ints.push(bits as i128);
                    }
                    (ElemForm::Half { .. }, Lit::Int(s)) => {
                        ints.push(self.int_in(&s, 16, false, d, vpos)?)
                    }
                    (ElemForm::Int { bits, signed }, Lit::Int(s)) => {
                        ints.push(self.int_in(&s, bits, signed, d, vpos)?)
                    }
                    (_, _) => {
                        let what = match form {
                            ElemForm::Str => "a string",
                            ElemForm::F32 | ElemForm::F64 => "a number",
                            _ => "an integer",
                        };
                        return Err(
                            self.error_at(vpos, format!("expected {what} for a {d} tensor"))
                        );
                    }
                }
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b'}')?;
        }
        if let Some(w) = want {
            if count != w {
                return Err(self.error_at(
                    pos,
                    format!("a {d} tensor of dims {dims:?} needs {w} values, found {count}"),
                ));
            }
        }
        let t = match form {
            ElemForm::Str => Tensor::from_strings(dims, strings),
            ElemForm::F32 | ElemForm::F64 => Tensor::from_raw(d, dims, Bytes::from(raw)),
            ElemForm::Half { .. } => Tensor::from_raw(d, dims, Bytes::from(pack_ints(&ints, 16))),
            ElemForm::Int { bits, .. } => {
                Tensor::from_raw(d, dims, Bytes::from(pack_ints(&ints, bits)))
            }
        };
        t.map_err(|e| self.error_at(pos, e.0))
    }

    fn int_in(&self, s: &str, bits: u32, signed: bool, d: DType, pos: usize) -> PResult<i128> {
        let (lo, hi) = int_range(bits, signed);
        match s.parse::<i128>() {
            Ok(v) if v >= lo && v <= hi => Ok(v),
            _ => Err(self.error_at(
                pos,
                format!("{s} is out of range for {d} (expected {lo}..={hi})"),
            )),
        }
    }

    /// An elided tensor read back as zeros.
    fn zeros(&self, d: DType, dims: Vec<i64>, numel: u64, pos: usize) -> PResult<Tensor> {
        let too_big = || self.error_at(pos, "elided tensor is too large to fill with zeros");
        let t = if d == DType::String {
            if numel > MAX_ELIDED_BYTES / 16 {
                return Err(too_big());
            }
            Tensor::from_strings(dims, vec![Bytes::new(); numel as usize])
        } else {
            // Complex element sizes count both parts; unknown types hold no bytes.
            let bytes = d.storage_bytes(numel).unwrap_or(0);
            if bytes > MAX_ELIDED_BYTES {
                return Err(too_big());
            }
            Tensor::from_raw(d, dims, Bytes::from(vec![0u8; bytes as usize]))
        };
        t.map_err(|e| self.error_at(pos, e.0))
    }

    // ---- building the IR -------------------------------------------------

    /// Creates the IR graph. Values are created by name on first mention in
    /// text order; nodes are added in text order.
    fn build(&self, pg: PGraph, sub: bool) -> PResult<Graph> {
        let mut g = Graph::new(pg.name);
        let mut defined: HashSet<String> = HashSet::new();
        for v in &pg.inputs {
            defined.insert(v.name.clone());
        }
        for v in &pg.extras {
            if v.init.is_some() {
                defined.insert(v.name.clone());
            }
        }
        for n in &pg.nodes {
            for o in &n.outputs {
                if !o.is_empty() {
                    defined.insert(o.clone());
                }
            }
        }
        let resolve = |g: &mut Graph, name: &str, pos: usize| -> PResult<graphopt_ir::ValueId> {
            if let Some(v) = g.value_by_name(name) {
                return Ok(v);
            }
            if sub && !defined.contains(name) {
                return Ok(g.value_or_outer(name));
            }
            g.add_value(name, None).map_err(|e| self.error_at(pos, e.0))
        };
        for pv in pg.inputs {
            let v = g
                .add_value(pv.name, pv.ty)
                .map_err(|e| self.error_at(pv.pos, e.0))?;
            g.inputs.push(v);
            match pv.init {
                Some(Init::Dense(t)) => g.set_initializer(v, t),
                Some(Init::Sparse(t)) => g.set_sparse_initializer(v, t),
                None => {}
            }
        }
        for pv in pg.outputs {
            let v = resolve(&mut g, &pv.name, pv.pos)?;
            if pv.ty.is_some() {
                g.value_mut(v).ty = pv.ty;
            }
            g.outputs.push(v);
        }
        for pv in pg.extras {
            let v = resolve(&mut g, &pv.name, pv.pos)?;
            let twice = || {
                self.error_at(
                    pv.pos,
                    format!("initializer '{}' is defined twice", pv.name),
                )
            };
            match pv.init {
                Some(init) => {
                    if g.initializer(v).is_some() || g.sparse_initializer(v).is_some() {
                        return Err(twice());
                    }
                    if g.ty(v).is_none() {
                        g.value_mut(v).ty = pv.ty;
                    }
                    match init {
                        Init::Dense(t) => g.set_initializer(v, t),
                        Init::Sparse(t) => g.set_sparse_initializer(v, t),
                    }
                }
                None => {
                    if pv.ty.is_some() {
                        g.value_mut(v).ty = pv.ty;
                    }
                    if !g.value_info.contains(&v) {
                        g.value_info.push(v);
                    }
                }
            }
        }
        // Every name a node mentions exists before the first node is added,
        // so that a subgraph's capture of a value defined by a later node
        // resolves to that value.
        for n in &pg.nodes {
            for name in n.inputs.iter().chain(&n.outputs) {
                if !name.is_empty() {
                    resolve(&mut g, name, n.pos)?;
                }
            }
        }
        for n in pg.nodes {
            let mut ids = |names: &[String]| -> PResult<Vec<Option<graphopt_ir::ValueId>>> {
                names
                    .iter()
                    .map(|s| {
                        if s.is_empty() {
                            Ok(None)
                        } else {
                            resolve(&mut g, s, n.pos).map(Some)
                        }
                    })
                    .collect()
            };
            let inputs = ids(&n.inputs)?;
            let outputs = ids(&n.outputs)?;
            let new = NewNode {
                name: n.label,
                op_type: n.op,
                domain: n.domain,
                overload: n.overload,
                inputs,
                outputs,
                attributes: n.attrs,
                ..NewNode::default()
            };
            g.add_node(new).map_err(|e| self.error_at(n.pos, e.0))?;
        }
        Ok(g)
    }
}

fn singleton(k: AttrKind) -> AttrKind {
    match k {
        AttrKind::Floats => AttrKind::Float,
        AttrKind::Ints => AttrKind::Int,
        AttrKind::Strings => AttrKind::String,
        AttrKind::Tensors => AttrKind::Tensor,
        AttrKind::Graphs => AttrKind::Graph,
        AttrKind::SparseTensors => AttrKind::SparseTensor,
        AttrKind::TypeProtos => AttrKind::TypeProto,
        k => k,
    }
}

fn empty_list(k: AttrKind) -> Option<AttrValue> {
    Some(match k {
        AttrKind::Floats => AttrValue::Floats(Vec::new()),
        AttrKind::Ints => AttrValue::Ints(Vec::new()),
        AttrKind::Strings => AttrValue::Strings(Vec::new()),
        AttrKind::Tensors => AttrValue::Tensors(Vec::new()),
        AttrKind::Graphs => AttrValue::Graphs(Vec::new()),
        AttrKind::SparseTensors => AttrValue::SparseTensors(Vec::new()),
        AttrKind::TypeProtos => AttrValue::Types(Vec::new()),
        _ => return None,
    })
}

/// A list value from its items: all of one kind, except that integers mixed
/// with floats read as floats.
fn combine_list(items: Vec<AttrValue>) -> Result<AttrValue, String> {
    let kinds: HashSet<AttrKind> = items.iter().map(|v| v.kind()).collect();
    if kinds.len() > 1
        && !kinds
            .iter()
            .all(|k| matches!(k, AttrKind::Int | AttrKind::Float))
    {
        return Err("a list attribute mixes values of different kinds".to_string());
    }
    if kinds.contains(&AttrKind::Float) {
        return Ok(AttrValue::Floats(
            items
                .into_iter()
                .map(|v| match v {
                    AttrValue::Float(f) => f,
                    AttrValue::Int(i) => i as f32,
                    _ => 0.0,
                })
                .collect(),
        ));
    }
    macro_rules! collect {
        ($variant:ident, $list:ident) => {
            AttrValue::$list(
                items
                    .into_iter()
                    .filter_map(|v| match v {
                        AttrValue::$variant(x) => Some(x),
                        _ => None,
                    })
                    .collect(),
            )
        };
    }
    Ok(match items.first().map(|v| v.kind()) {
        Some(AttrKind::Int) => collect!(Int, Ints),
        Some(AttrKind::String) => collect!(String, Strings),
        Some(AttrKind::Tensor) => collect!(Tensor, Tensors),
        Some(AttrKind::Graph) => AttrValue::Graphs(
            items
                .into_iter()
                .filter_map(|v| match v {
                    AttrValue::Graph(g) => Some(*g),
                    _ => None,
                })
                .collect(),
        ),
        Some(AttrKind::SparseTensor) => collect!(SparseTensor, SparseTensors),
        Some(AttrKind::TypeProto) => collect!(Type, Types),
        _ => return Err("a list of attribute references is not allowed".to_string()),
    })
}
