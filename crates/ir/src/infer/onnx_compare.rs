//! Compares inference with Python's `onnx.shape_inference.infer_shapes`
//! (with data propagation) on small graphs, in the pinned Python environment
//! of `graphopt-testutil`; skips with a note when it cannot be had, and fails
//! then under `GRAPHOPT_REQUIRE_PYTHON=1` or `CI=true`.
//!
//! Each case is written in a tiny line-based language that both this test
//! and the generated Python script parse:
//!
//! ```text
//! opset 13
//! in x float batch,3,8,8          (graph input; `-` for unknown rank, empty for a scalar)
//! init w float 4,3,3,3            (zero-filled initializer)
//! initi shp 2 = 1,-1              (int64 initializer of dims `2` with values)
//! node Conv x,w -> y | strides:is=2,2 group:i=1 auto_pad:s=VALID alpha:f=0.5
//! ```

use super::tests::{dims_of, B};
use super::*;
use crate::{AttrValue, Attribute, DType, Tensor};
use std::process::Command;

const CASES: &[(&str, &str)] = &[
    (
        "resnet_block",
        "opset 13
in x float N,3,32,32
init w1 float 16,3,3,3
init w2 float 16,16,3,3
init fc float 10,16
node Conv x,w1 -> c1 | kernel_shape:is=3,3 pads:is=1,1,1,1 strides:is=2,2
node Relu c1 -> r1
node Conv r1,w2 -> c2 | pads:is=1,1,1,1
node Add c2,r1 -> a
node MaxPool a -> p | kernel_shape:is=3,3 strides:is=2,2 ceil_mode:i=1
node AveragePool p -> ap | kernel_shape:is=2,2 pads:is=0,0,1,1
node GlobalAveragePool ap -> g
node Flatten g -> f
node Gemm f,fc -> o | transB:i=1",
    ),
    (
        "gpt2_attention_shapes",
        "opset 13
in x float batch,seq,64
init wq float 64,64
initi z 1 = 0
initi o 1 = 1
initi os = 1
initi heads 2 = 4,16
initi perm_tgt 3 = 0,0,-1
node MatMul x,wq -> q
node Shape q -> sh
node Slice sh,z,o -> b
node Gather sh,os -> s | axis:i=0
node Unsqueeze s,z -> su
node Concat b,su,heads -> tgt | axis:i=0
node Reshape q,tgt -> qh
node Transpose qh -> qt | perm:is=0,2,1,3
node Transpose qh -> kt | perm:is=0,2,3,1
node MatMul qt,kt -> att
node Softmax att -> sm | axis:i=-1
node MatMul sm,qt -> ctx
node Transpose ctx -> ct | perm:is=0,2,1,3
node Reshape ct,perm_tgt -> merged",
    ),
    (
        "opset9_forms",
        "opset 9
in x float 2,3,16,16
initi axesc 1 = 0
node Slice x -> s | starts:is=0,1 ends:is=1,1000 axes:is=0,3
node Unsqueeze x -> u | axes:is=0
node Squeeze u -> sq | axes:is=0
node Pad x -> p | pads:is=0,0,1,1,0,0,1,1
node Upsample x,scl -> up | mode:s=nearest
init scl float 4
node Split x -> sp1,sp2 | axis:i=1 split:is=1,2
node ReduceMean x -> rm | axes:is=2,3
node Flatten x -> fl | axis:i=2
node Dropout x -> d
node Shape x -> shp
node ConstantOfShape shp -> cos",
    ),
    (
        "opset18_forms",
        "opset 18
in x float b,6,10
initi ax 1 = 1
initi ax2 2 = -1,1
initi st 1 = 2
initi en 1 = -1
initi pads 6 = 0,1,0,0,2,0
node Split x -> a,c,d | axis:i=1 num_outputs:i=3
node ReduceSum x,ax -> rs | keepdims:i=0
node ReduceMax x,ax2 -> rmx
node ReduceL2 x -> rl2 | keepdims:i=0
node Slice x,st,en,ax -> sl
node Squeeze rmx,ax -> sq
node Unsqueeze x,ax -> us
node Pad x,pads -> pd
node LayerNormalization x,w,bb -> ln | axis:i=-1
init w float 10
init bb float 10
node GroupNormalization x,w2,b2 -> gn | num_groups:i=2
init w2 float 6
init b2 float 6
node Shape x -> sh2 | start:i=1
node TopK x,k -> tv,ti | axis:i=-1
initi k 1 = 3
node ArgMax x -> am | axis:i=2 keepdims:i=0",
    ),
    (
        "misc_ops",
        "opset 17
in x float 2,3,4
in idx int64 5
in b bool 3,1
initi rep 3 = 1,2,3
initi tgt 4 = 7,1,1,4
initi r0 0 =
node Gather x,idx -> g | axis:i=1
node Tile x,rep -> t
node Expand x,tgt -> e
node Where b,x,x -> w
node Einsum x,x -> es | equation:s=ijk,ijl->jkl
node Cast x -> c | to:i=7
node Equal c,c -> eq
node Transpose x -> tr
node ReduceProd x -> rp | axes:is=0 keepdims:i=0
node CumSum x,zero -> cs
init zero int64
node Range st,lim,dl -> rg
initi st = 1
initi lim = 10
initi dl = 3
node NonZero x -> nz
node OneHot idx,depth,vals -> oh | axis:i=0
initi depth = 5
init vals float 2
node Resize x,r0,scl2 -> rz
init scl2 float 3",
    ),
    (
        "convs_and_quant",
        "opset 13
in x float 1,8,9,9
init wt float 8,4,3,3
init dw float 8,1,3,3
in q uint8 1,8,9,9
in wq uint8 4,8,1,1
in s float
in zp uint8
node ConvTranspose x,wt -> ct | strides:is=2,2 pads:is=1,1,1,1 output_padding:is=1,1
node Conv x,dw -> dc | group:i=8 auto_pad:s=SAME_UPPER strides:is=2,2
node Conv x,dw -> dd | group:i=8 dilations:is=2,2
node QuantizeLinear x,s,zp -> ql
node DequantizeLinear ql,s,zp -> dql
node ConvInteger q,wq -> ci
node QLinearConv q,s,zp,wq,s,zp,s,zp -> qc
node DynamicQuantizeLinear x -> dy,dys,dyz
node MatMulInteger q,q -> mi
node BatchNormalization x,bs,bs,bs,bs -> bn
init bs float 8
node InstanceNormalization x,bs,bs -> inn
node DepthToSpace x -> d2s | blocksize:i=2
node SpaceToDepth ct -> s2d | blocksize:i=2
node LeakyRelu x -> lr | alpha:f=0.1
node HardSwish x -> hs
node PRelu x,slope -> pr
init slope float 8,1,1",
    ),
    (
        "t5_whisper_masks",
        "opset 14
in ids int64 batch,seq
in mask int64 batch,seq
in h float batch,seq,32
initi z = 0
initi one = 1
initi ax1 1 = 1
initi ax2 1 = 2
initi m1 = -1
node Shape ids -> sh
node Gather sh,one -> s
node Range z,s,one -> pos
node Unsqueeze pos,ax1 -> posu
node Unsqueeze pos,z1 -> posr
initi z1 1 = 0
node Sub posu,posr -> rel
node Abs rel -> relabs
node Unsqueeze mask,ax1 -> m1u
node Unsqueeze m1u,ax2 -> m2u
node Cast m2u -> mf | to:i=1
node Sub onef,mf -> inv
init onef float
node Mul inv,negbig -> add_mask
init negbig float
node Pow h,two -> sq
init two float
node ReduceMean sq -> var | axes:is=-1
node Add var,eps -> ve
init eps float
node Sqrt ve -> sd
node Div h,sd -> normed
node Mul normed,gamma -> scaled
init gamma float 32
node Less rel,z -> neg
node Where neg,rel,relabs -> pick
node Concat sh,ax1 -> sh3 | axis:i=0
node Reshape h,sh3 -> hr
node Concat sh,sh -> sh4 | axis:i=0
node Expand add_mask,sh4 -> em",
    ),
    (
        "opset11_resize_squeeze",
        "opset 11
in x float n,3,20,30
initi z 1 = 0
initi two 1 = 2
node Shape x -> sh
node Slice sh,z,two -> nc
node Concat nc,hw -> sizes | axis:i=0
initi hw 2 = 40,60
init e float 0
node Resize x,e,e,sizes -> rz
node Unsqueeze x -> ux | axes:is=-1
node Squeeze ux -> sx | axes:is=-1
node Clip x,lo,hi -> cl
init lo float
init hi float
node Gather sh,z -> g0
node Concat g0,m1 -> tgt | axis:i=0
initi m1 1 = -1
node Reshape x,tgt -> flat
node ReduceSum x -> rs | axes:is=1 keepdims:i=1
node Softmax x -> sm | axis:i=1
node LogSoftmax flat -> lsm",
    ),
];

/// Builds the graph of a case; returns it and its opset.
fn build(src: &str) -> (B, i64) {
    let mut b = B::new();
    let mut opset = 13;
    // Initializers may be listed after their first use: create them first.
    for line in src.lines().map(str::trim) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("opset") => opset = w[1].parse().unwrap(),
            Some("in") => {
                let spec = w.get(3).copied().unwrap_or("");
                let e = DType::from_name(w[2]).unwrap();
                b.input(w[1], e, if spec == "-" { None } else { Some(spec) });
            }
            Some("init") => {
                let dims: Vec<i64> = dims_of(w.get(3).copied().unwrap_or(""))
                    .iter()
                    .map(|d| d.known().unwrap())
                    .collect();
                let n: i64 = dims.iter().product();
                match DType::from_name(w[2]).unwrap() {
                    DType::F32 => {
                        b.init_f32(w[1], &dims, &vec![1.0; n as usize]);
                    }
                    _ => {
                        b.init_i64(w[1], &dims, &vec![0; n as usize]);
                    }
                }
            }
            Some("initi") => {
                let (lhs, rhs) = line.split_once('=').unwrap();
                let lw: Vec<&str> = lhs.split_whitespace().collect();
                let dims: Vec<i64> = lw
                    .get(2)
                    .map(|d| vec![d.parse().unwrap()])
                    .unwrap_or_default();
                let vals: Vec<i64> = rhs
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| s.trim().parse().unwrap())
                    .collect();
                let dims = if vals.len() == 1 && dims.is_empty() {
                    vec![]
                } else {
                    dims
                };
                b.init_i64(lw[1], &dims, &vals);
            }
            _ => {}
        }
    }
    for line in src.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("node ") else {
            continue;
        };
        let (main, attrs) = rest.split_once('|').unwrap_or((rest, ""));
        let (lhs, outs) = main.split_once("->").unwrap();
        let mut lw = lhs.split_whitespace();
        let op = lw.next().unwrap();
        let ins: Vec<&str> = lw
            .next()
            .map(|s| s.split(',').collect())
            .unwrap_or_default();
        let outs: Vec<&str> = outs.trim().split(',').collect();
        let attrs = attrs
            .split_whitespace()
            .map(|a| {
                let (k, v) = a.split_once('=').unwrap();
                let (name, kind) = k.split_once(':').unwrap();
                let ints = || {
                    v.split(',')
                        .map(|x| x.parse::<i64>().unwrap())
                        .collect::<Vec<_>>()
                };
                let value = match kind {
                    "i" => AttrValue::Int(v.parse().unwrap()),
                    "is" => AttrValue::Ints(ints()),
                    "f" => AttrValue::Float(v.parse().unwrap()),
                    "s" => AttrValue::String(v.as_bytes().to_vec()),
                    "t" => AttrValue::Tensor(
                        Tensor::from_i64(vec![ints().len() as i64], &ints()).unwrap(),
                    ),
                    _ => panic!("attr kind {kind}"),
                };
                Attribute::new(name, value)
            })
            .collect();
        b.node(op, &ins, &outs, attrs);
    }
    (b, opset)
}

const SCRIPT: &str = r#"
import sys
import numpy as np
import onnx
from onnx import helper, TensorProto, shape_inference
src = sys.stdin.read()
opset = 13
inputs, inits, nodes = [], [], []
dt = lambda n: helper.np_dtype_to_tensor_dtype(np.dtype({'float': 'float32', 'bool': 'bool'}.get(n, n)))
for line in src.splitlines():
    line = line.strip()
    w = line.split()
    if not w:
        continue
    if w[0] == 'opset':
        opset = int(w[1])
    elif w[0] == 'in':
        spec = w[3] if len(w) > 3 else ''
        if spec == '-':
            shape = None
        else:
            shape = [int(d) if d.lstrip('-').isdigit() else (None if d == '?' else d) for d in spec.split(',') if d]
        inputs.append(helper.make_tensor_value_info(w[1], dt(w[2]), shape))
    elif w[0] == 'init':
        dims = [int(d) for d in (w[3] if len(w) > 3 else '').split(',') if d]
        n = int(np.prod(dims)) if dims else 1
        if w[2] == 'float':
            inits.append(helper.make_tensor(w[1], TensorProto.FLOAT, dims, [1.0] * n))
        else:
            inits.append(helper.make_tensor(w[1], TensorProto.INT64, dims, [0] * n))
    elif w[0] == 'initi':
        lhs, rhs = line.split('=', 1)
        lw = lhs.split()
        vals = [int(v) for v in rhs.split(',') if v.strip()]
        dims = [int(lw[2])] if len(lw) > 2 else []
        if len(vals) == 1 and not dims:
            dims = []
        inits.append(helper.make_tensor(lw[1], TensorProto.INT64, dims, vals))
    elif w[0] == 'node':
        rest = line[5:]
        main, _, attrs = rest.partition('|')
        lhs, outs = main.split('->')
        lw = lhs.split()
        ins = lw[1].split(',') if len(lw) > 1 else []
        kw = {}
        for a in attrs.split():
            k, v = a.split('=', 1)
            name, kind = k.split(':')
            if kind == 'i': kw[name] = int(v)
            elif kind == 'is': kw[name] = [int(x) for x in v.split(',')]
            elif kind == 'f': kw[name] = float(v)
            elif kind == 's': kw[name] = v
            elif kind == 't': kw[name] = helper.make_tensor('t', TensorProto.INT64, [len(v.split(','))], [int(x) for x in v.split(',')])
        nodes.append(helper.make_node(lw[0], ins, outs.strip().split(','), **kw))
g = helper.make_graph(nodes, 'g', inputs, [], initializer=inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid('', opset)])
m = shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
for vi in m.graph.value_info:
    t = vi.type.tensor_type
    if not vi.type.HasField('tensor_type'):
        continue
    if t.HasField('shape'):
        dims = ','.join(str(d.dim_value) if d.HasField('dim_value') else (d.dim_param if d.HasField('dim_param') else '?') for d in t.shape.dim)
        print(f'{vi.name}|{t.elem_type}|[{dims}]')
    else:
        print(f'{vi.name}|{t.elem_type}|-')
"#;

fn run_onnx(python: &std::path::Path, src: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(src.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compares one value; returns a description of a disagreement.
fn compare(name: &str, ours: Option<&Type>, elem: i32, shape: &str) -> Option<String> {
    let Some(t) = ours.and_then(|t| t.as_tensor()) else {
        return Some(format!(
            "{name}: onnx infers {elem} {shape}, we infer nothing"
        ));
    };
    if t.elem.to_onnx() != elem {
        return Some(format!("{name}: elem {} vs onnx {elem}", t.elem));
    }
    if shape == "-" {
        return None;
    }
    let theirs: Vec<&str> = shape
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    let Some(s) = &t.shape else {
        return Some(format!(
            "{name}: onnx infers shape {shape}, we infer unknown rank"
        ));
    };
    if s.rank() != theirs.len() {
        return Some(format!("{name}: shape {s} vs onnx {shape}"));
    }
    for (ours, theirs) in s.dims.iter().zip(theirs) {
        let ok = match theirs.parse::<i64>() {
            Ok(v) => *ours == Dim::Known(v),
            Err(_) if theirs == "?" || theirs.starts_with("unk__") => true,
            Err(_) => matches!(ours, Dim::Known(_)) || *ours == Dim::Sym(theirs.to_string()),
        };
        if !ok {
            return Some(format!("{name}: shape {s} vs onnx {shape}"));
        }
    }
    None
}

#[test]
fn agrees_with_onnx_shape_inference() {
    let Some(python) = graphopt_testutil::python_or_skip("agrees_with_onnx_shape_inference") else {
        return;
    };
    let mut failures = Vec::new();
    let mut compared = 0;
    for (name, src) in CASES {
        let (mut b, opset) = build(src);
        let r = b.run(opset);
        assert!(r.unknown_ops.is_empty(), "{name}: {:?}", r.unknown_ops);
        assert!(r.warnings.is_empty(), "{name}: {:?}", r.warnings);
        let out = match run_onnx(&python, src) {
            Ok(o) => o,
            Err(e) => panic!("{name}: onnx failed on the case:\n{e}"),
        };
        for line in out.lines() {
            let p: Vec<&str> = line.split('|').collect();
            let [vname, elem, shape] = p[..] else {
                continue;
            };
            let Some(v) = b.g.value_by_name(vname) else {
                continue;
            };
            compared += 1;
            if let Some(f) = compare(vname, b.g.ty(v), elem.parse().unwrap(), shape) {
                failures.push(format!("{name}: {f}"));
            }
        }
    }
    eprintln!("compared {compared} values with onnx");
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
    assert!(compared > 60, "only {compared} values compared");
}
