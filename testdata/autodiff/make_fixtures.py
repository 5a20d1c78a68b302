# Writes the gradient-rule fixtures under testdata/autodiff/<family>/ (seeded, so reruns give the same files).
# Run from testdata/autodiff: python3 make_fixtures.py
import random, os
random.seed(7)
def vals(n, lo=-1.0, hi=1.0):
    return ", ".join(f"{random.uniform(lo,hi):.3f}" for _ in range(n))
def init(name, dims, lo=-1.0, hi=1.0):
    n = 1
    for d in dims: n *= d
    ds = ",".join(map(str, dims))
    return f'float[{ds}] {name} = {{{vals(n, lo, hi)}}}'
F = {}
F["elementwise/add_broadcast"] = (17, "float[2,3] x", "float[2,3] y", [init("b",[1,3]), init("c",[3])], """
  s = Add (x, b)
  t = Add (s, c)
  y = Mul (t, t)""")
F["elementwise/sub_mul_div"] = (17, "float[2,3] x", "float[2,3] y", [init("a",[2,3]), init("m",[3]), init("d",[2,1],1.0,2.0)], """
  s = Sub (x, a)
  p = Mul (s, m)
  q = Div (p, d)
  r = Neg (q)
  y = Mul (r, s)""")
F["elementwise/pow_sqrt_exp_log"] = (17, "float[2,3] x", "float[2,3] y", [init("w",[2,3]), "float two = {2.0}", "float three = {3.0}", "float one = {1.0}"], """
  h = Mul (x, w)
  p = Pow (h, two)
  c = Pow (h, three)
  q = Add (p, one)
  r = Sqrt (q)
  l = Log (q)
  e = Exp (h)
  v = Reciprocal (q)
  s0 = Add (r, l)
  s = Add (s0, v)
  t = Add (s, e)
  y = Add (t, c)""")
F["elementwise/where_cast_identity"] = (17, "float[2,3] x", "float[2,3] y", [init("w",[2,3]), init("v",[3]), "bool[2,3] mask = {1, 0, 1, 0, 0, 1}"], """
  h = Mul (x, w)
  i = Identity (h)
  n = Neg (x)
  c = Cast <to = 1> (n)
  s = Where (mask, i, v)
  t = Where (mask, v, c)
  u = Mul (s, t)
  y = Mul (u, h)""")
F["activations/relu_sigmoid_tanh"] = (17, "float[2,3] x", "float[2,4] y", [init("w",[3,4])], """
  h = MatMul (x, w)
  r = Relu (h)
  s = Sigmoid (h)
  t = Tanh (h)
  a = Add (r, s)
  b = Mul (a, t)
  y = Mul (b, h)""")
F["activations/erf"] = (17, "float[2,3] x", "float[2,3] y", [init("w",[2,3])], """
  h = Mul (x, w)
  e = Erf (h)
  y = Mul (e, h)""")
F["activations/gelu"] = (20, "float[2,3] x", "float[2,3] y", [init("w",[2,3])], """
  h = Mul (x, w)
  e = Gelu (h)
  y = Mul (e, h)""")
F["activations/softmax"] = (17, "float[2,3] x", "float[2,4] y", [init("w",[3,4]), init("k",[2,4])], """
  h = MatMul (x, w)
  s = Softmax <axis = -1> (h)
  y = Mul (s, k)""")
F["activations/log_softmax"] = (17, "float[2,3] x", "float[4,2] y", [init("w",[3,3]), init("k",[4,3])], """
  h = MatMul (x, w)
  t = Transpose <perm = [1, 0]> (h)
  s = LogSoftmax <axis = 1> (t)
  u = MatMul (k, s)
  y = Mul (u, u)""")
F["matmul/matmul_batched"] = (17, "float[2,3,4] x", "float[2,3,2] y", [init("w",[4,5]), init("a",[3,3]), init("v",[2,5,2])], """
  h = MatMul (x, w)
  g = MatMul (a, h)
  k = MatMul (g, v)
  y = Mul (k, k)""")
F["matmul/gemm_trans"] = (17, "float[3,4] x", "float[3,2] y", [init("w",[5,4]), init("c",[5]), init("u",[5,2]), init("d",[1,2])], """
  h = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (x, w, c)
  t = Transpose <perm = [1, 0]> (h)
  k = Gemm <transA = 1> (t, u, d)
  y = Mul (k, k)""")
F["reduce/reduce_sum_mean"] = (17, "float[2,3,4] x", "float[2,3] y", [init("w",[2,3,4]), "int64[1] ax = {2}"], """
  h = Mul (x, w)
  s = ReduceSum <keepdims = 0> (h, ax)
  m = ReduceMean <axes = [1], keepdims = 1> (h)
  q = Mul (m, m)
  r = ReduceSum <keepdims = 0> (q, ax)
  p = Mul (s, s)
  y = Add (p, r)""")
F["shape/reshape_transpose"] = (17, "float[2,3,4] x", "float[4,6] y", [init("w",[2,3,4]), "int64[2] shp = {6, 4}", "int64[1] ax0 = {0}"], """
  h = Mul (x, w)
  r = Reshape (h, shp)
  t = Transpose (r)
  u = Unsqueeze (t, ax0)
  s = Squeeze (u, ax0)
  f = Flatten <axis = 1> (s)
  y = Mul (f, f)""")
F["shape/concat_slice_expand"] = (17, "float[2,3] x", "float[2,3] y", [init("w",[2,2]), init("e",[2,1]), "int64[1] st = {1}", "int64[1] en = {4}", "int64[1] ax = {1}", "int64[2] es = {2, 3}"], """
  c = Concat <axis = 1> (x, w)
  s = Slice (c, st, en, ax)
  b = Expand (e, es)
  p = Mul (s, b)
  c3 = Slice (c, st, en, ax)
  y = Mul (p, c3)""")
F["shape/gather_embedding"] = (17, "float[2,3] x", "float[2,3,4] y", [init("emb",[5,4]), init("w",[4,3]), "int64[2,3] ids = {1, 3, 1, 0, 4, 1}", "int64 zero = {0}"], """
  two = Constant <value = int64[1] {2}> ()
  e = Gather (emb, ids)
  g = MatMul (e, w)
  f = Gather <axis = 2> (g, zero)
  h = Mul (f, x)
  hu = Unsqueeze (h, two)
  y = Mul (e, hu)""")
F["nn/layer_norm"] = (17, "float[2,3,4] x", "float[2,3,4] y", [init("scale",[4]), init("bias",[4]), init("k",[2,3,4])], """
  n = LayerNormalization <epsilon = 1e-5> (x, scale, bias)
  y = Mul (n, k)""")
F["reduce/global_average_pool"] = (17, "float[1,2,3,3] x", "float[1,2,1,1] y", [init("w",[1,2,3,3]), init("k",[1,2,1,1])], """
  h = Mul (x, w)
  p = GlobalAveragePool (h)
  q = Mul (p, k)
  y = Mul (q, p)""")
F["shape/split"] = (17, "float[2,4] x", "float[2,3] y", [init("w",[2,4]), "int64[2] parts = {1, 3}"], """
  h = Mul (x, w)
  a, b = Split <axis = 1> (h, parts)
  y = Mul (b, b)""")
F["nn/conv_strided"] = (17, "float[2,2,5,5] x", "float[2,3,3,3] y", [init("w",[3,2,3,3]), init("b",[3]), init("k",[2,3,3,3])], """
  c = Conv <strides = [2, 2], pads = [1, 1, 1, 1]> (x, w, b)
  p = Mul (c, k)
  y = Mul (p, c)""")
F["nn/conv_dilated"] = (17, "float[1,2,6,5] x", "float[1,2,4,3] y", [init("w",[2,2,2,2]), init("k",[1,2,4,3])], """
  c = Conv <dilations = [2, 1], strides = [1, 2], pads = [0, 1, 0, 0]> (x, w)
  p = Mul (c, k)
  y = Mul (p, c)""")
F["nn/max_pool"] = (17, "float[1,2,4,4] x", "float[1,2,2,2] y", [init("w",[1,2,4,4]), init("k",[1,2,2,2])], """
  h = Mul (x, w)
  p = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (h)
  q = Mul (p, k)
  y = Mul (q, p)""")
F["nn/conv_depthwise"] = (17, "float[2,4,5,5] x", "float[2,4,3,3] y", [init("w",[4,1,3,3]), init("k",[2,4,3,3])], """
  c = Conv <group = 4, strides = [2, 2], pads = [1, 1, 1, 1]> (x, w)
  p = Mul (c, k)
  y = Mul (p, c)""")
F["nn/conv_grouped"] = (17, "float[1,4,4,4] x", "float[1,6,4,4] y", [init("w",[6,2,3,3]), init("b",[6]), init("k",[1,6,4,4])], """
  c = Conv <group = 2, pads = [1, 1, 1, 1]> (x, w, b)
  p = Mul (c, k)
  y = Mul (p, c)""")
# Offsets keep h = x*w + o at least 0.05 from every kink (±2.5, ±3, 0):
# central differences across a kink are wrong, not the rule.
F["activations/hard_sigmoid_swish_leaky"] = (17, "float[2,6] x", "float[2,6] y", [init("w",[2,6], -0.2, 0.2), "float[2,6] o = {-4.0, -2.75, -1.5, -0.5, 0.5, 1.5, 2.75, 4.0, 5.0, -5.0, 1.0, -1.0}"], """
  m = Mul (x, w)
  h = Add (m, o)
  a = HardSigmoid <alpha = 0.2, beta = 0.5> (h)
  b = HardSwish (h)
  c = LeakyRelu <alpha = 0.1> (h)
  s = Add (a, b)
  t = Add (s, c)
  y = Mul (t, h)""")
F["nn/batch_norm"] = (17, "float[2,3,2,2] x", "float[2,3,2,2] y", [init("scale",[3]), init("bias",[3]), init("mean",[3]), init("var",[3], 0.5, 1.5), init("k",[2,3,2,2])], """
  n = BatchNormalization <epsilon = 1e-5> (x, scale, bias, mean, var)
  p = Mul (n, k)
  y = Mul (p, n)""")
F["activations/softplus_elu"] = (17, "float[2,3] x", "float[2,3] y", [init("w",[2,3], -2.0, 2.0)], """
  h = Mul (x, w)
  a = Softplus (h)
  b = Elu <alpha = 0.7> (h)
  s = Add (a, b)
  y = Mul (s, h)""")
F["reduce/reduce_max"] = (17, "float[2,3,4] x", "float[2,1,4] y", [init("w",[2,3,4])], """
  h = Mul (x, w)
  m = ReduceMax <axes = [1], keepdims = 1> (h)
  y = Mul (m, m)""")
# Offsets keep h = x*w + o at least 0.3 from PRelu's kink at 0.
F["activations/prelu"] = (17, "float[2,3,4] x", "float[2,3,4] y", [init("w",[2,3,4], -0.2, 0.2), init("o",[2,3,4], 0.5, 1.5), "float[4] sgn = {1.0, -1.0, 1.0, -1.0}", init("slope",[3,1], 0.1, 0.5)], """
  m = Mul (x, w)
  a = Add (m, o)
  h = Mul (a, sgn)
  p = PRelu (h, slope)
  y = Mul (p, h)""")
F["activations/gelu_tanh"] = (20, "float[2,3] x", "float[2,3] y", [init("w",[2,3], -2.0, 2.0)], """
  h = Mul (x, w)
  e = Gelu <approximate = "tanh"> (h)
  y = Mul (e, h)""")
F["reduce/reduce_min_cumsum"] = (17, "float[2,3,4] x", "float[2,4] y", [init("w",[2,3,4]), "int64[1] ax = {1}", "int64 cax = {2}", "int64 cax1 = {1}"], """
  h = Mul (x, w)
  m = ReduceMin <axes = [1], keepdims = 0> (h)
  c = CumSum (h, cax)
  e = CumSum <exclusive = 1, reverse = 1> (c, cax1)
  s = ReduceSum <keepdims = 0> (e, ax)
  p = Mul (s, m)
  y = Add (p, m)""")
F["nn/average_pool"] = (17, "float[1,2,5,5] x", "float[1,2,3,3] y", [init("w",[1,2,5,5]), init("k",[1,2,3,3]), init("k2",[1,2,3,3])], """
  h = Mul (x, w)
  p = AveragePool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (h)
  q = AveragePool <kernel_shape = [3, 2], strides = [2, 2], pads = [1, 0, 1, 1], count_include_pad = 1> (h)
  a = Mul (p, k)
  b = Mul (q, k2)
  c = Add (a, b)
  y = Mul (c, p)""")
F["nn/instance_norm"] = (17, "float[2,3,2,3] x", "float[2,3,2,3] y", [init("scale",[3]), init("bias",[3]), init("k",[2,3,2,3])], """
  n = InstanceNormalization <epsilon = 1e-5> (x, scale, bias)
  p = Mul (n, k)
  y = Mul (p, n)""")
F["nn/group_norm"] = (21, "float[2,4,2,3] x", "float[2,4,2,3] y", [init("scale",[4]), init("bias",[4]), init("k",[2,4,2,3])], """
  n = GroupNormalization <epsilon = 1e-5, num_groups = 2> (x, scale, bias)
  p = Mul (n, k)
  y = Mul (p, n)""")
F["nn/group_norm_18"] = (18, "float[2,4,3] x", "float[2,4,3] y", [init("scale",[2]), init("bias",[2]), init("k",[2,4,3])], """
  n = GroupNormalization <epsilon = 1e-5, num_groups = 2> (x, scale, bias)
  p = Mul (n, k)
  y = Mul (p, n)""")
F["matmul/einsum_attention"] = (17, "float[1,2,3,4] x", "float[1,2,3,4] y", [init("wq",[1,2,3,4]), init("kk",[1,2,3,4]), init("v",[1,2,3,4])], """
  q = Mul (x, wq)
  s = Einsum <equation = "bhqd,bhkd->bhqk"> (q, kk)
  a = Softmax <axis = -1> (s)
  o = Einsum <equation = "bhqk,bhkd->bhqd"> (a, v)
  y = Mul (o, q)""")
F["matmul/einsum_forms"] = (17, "float[2,3,4] x", "float[2,3,5] y", [init("w",[4,5]), init("u",[3,3]), init("c",[2,5]), "int64[1] one = {1}"], """
  h = Einsum <equation = "...ij,...jk->...ik"> (x, w)
  g = Einsum <equation = "ij,bjk"> (u, h)
  r = Einsum <equation = "bij->bj"> (g)
  t = Einsum <equation = "bj,bj->bj"> (r, c)
  tu = Unsqueeze (t, one)
  y = Mul (g, tu)""")
# Slice bounds computed at run time (from Shape), as the TorchScript
# exporter writes torch.chunk: a negative start and an end past the dim.
F["shape/slice_dynamic"] = (17, "float[2,6] x", "float[2,3] y", [init("w",[2,6]), "int64[1] i1 = {1}", "int64[1] two = {2}", "int64[1] big = {100}", "int64[1] ax = {1}", "int64[4] pp = {0, 1, 0, 0}"], """
  h = Mul (x, w)
  sh = Shape (h)
  d = Gather (sh, i1)
  half = Div (d, two)
  a = Slice (h, i1, d, ax)
  b0 = Slice (a, half, big, ax)
  nh = Neg (half)
  c = Slice (h, nh, big, ax)
  p = Mul (c, c)
  q = Mul (b0, b0)
  qp = Pad <mode = "constant"> (q, pp)
  y = Add (p, qp)""")
# Dropout with --dropout-train: one with a ratio input and its mask output,
# one with neither (default ratio 0.5; the builder adds the mask).
F["nn/dropout"] = (17, "float[2,8] x", "float[2,4] y", [init("w",[8,4]), "float ratio = {0.5}", init("k",[2,4])], """
  h = MatMul (x, w)
  d, m = Dropout (h, ratio)
  t = Tanh (d)
  e = Dropout (t)
  y = Mul (e, k)""")
# ReLU6 (both bounds), a lower bound only, and no bound; h stays at least
# 0.05 from the kinks 0 and 6.
F["activations/clip"] = (17, "float[2,6] x", "float[2,6] y", [init("w",[2,6], -0.2, 0.2), "float[2,6] o = {-4.0, -2.75, -1.5, -0.5, 0.5, 1.5, 2.75, 4.0, 5.5, 6.5, 7.0, -1.0}", "float lo = {0.0}", "float hi = {6.0}"], """
  m = Mul (x, w)
  h = Add (m, o)
  a = Clip (h, lo, hi)
  b = Clip (h, lo)
  c = Clip (h)
  s = Add (a, b)
  t = Add (s, c)
  y = Mul (t, h)""")

for name, (opset, ins, outs, inits, body) in F.items():
    fam, case = name.split("/")
    os.makedirs(fam, exist_ok=True)
    # Keep the body in topological order (the parser may require it).
    lines = [l for l in body.strip("\n").split("\n")]
    txt = f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({ins}) => ({outs})\n  <{", ".join(inits)}> {{\n' + "\n".join(lines) + "\n}\n"
    open(f"{fam}/{case}.onnxtxt", "w").write(txt)
