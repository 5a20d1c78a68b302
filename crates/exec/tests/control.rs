//! If, Loop and Scan as nested programs, and values of data-dependent size as
//! dynamic allocations outside the arena: each small model runs through the
//! whole runtime (planned arena, poison on) against values computed here.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions, RunStats};
use graphopt_ir::DType;
use graphopt_plan::{plan_model, DimValues, PlanOptions};

fn exe(text: &str) -> Executable {
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap()
}

fn run(e: &mut Executable, inputs: &[HostTensor]) -> (Vec<HostTensor>, RunStats) {
    let clean = e
        .run(
            inputs,
            &RunOptions {
                threads: 2,
                poison: false,
            },
        )
        .unwrap();
    // Poison changes nothing (nested arenas are poisoned too).
    let poisoned = e
        .run(
            inputs,
            &RunOptions {
                threads: 2,
                poison: true,
            },
        )
        .unwrap();
    assert_eq!(clean.0, poisoned.0, "poison reached an output");
    assert!(poisoned.1.poisoned_regions >= clean.1.poisoned_regions);
    clean
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    t.to_f32().unwrap()
}

fn boolean(b: bool) -> HostTensor {
    HostTensor {
        dtype: DType::Bool,
        shape: vec![],
        data: vec![u8::from(b)],
    }
}

#[test]
fn if_runs_the_branch_its_condition_picks() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[3] x) => (float[3] y) <float two = {2.0}> {
          y = If (c) <then_branch = then_g () => (float[3] a) {
                a = Mul (x, two)
              }, else_branch = else_g () => (float[3] b) {
                b = Neg (x)
              }>
        }"#);
    let x = HostTensor::from_f32(&[3], &[1.0, -2.0, 3.5]);
    let (o, s) = run(&mut e, &[boolean(true), x.clone()]);
    assert_eq!(f32s(&o[0]), [2.0, -4.0, 7.0]);
    assert_eq!(s.subgraph_runs, 1);
    let (o, _) = run(&mut e, &[boolean(false), x]);
    assert_eq!(f32s(&o[0]), [-1.0, 2.0, -3.5]);
    // One nested arena per branch that ran (3 floats each, 256-aligned).
    assert!(e.subgraph_arena_bytes() > 0);
    assert!(e.dynamic_values().is_empty());
}

#[test]
fn loop_runs_its_trip_count_with_a_carried_value() {
    // y <- y * 2 + x, M times; the condition input is omitted.
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64 m, float[2] y0, float[2] x) => (float[2] y) <float two = {2.0}> {
          y = Loop (m, "", y0) <body = body (int64 i, bool c, float[2] yi) => (bool co, float[2] yo) {
                d = Mul (yi, two)
                yo = Add (d, x)
                co = Identity (c)
              }>
        }"#);
    let (o, s) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[4]),
            HostTensor::from_f32(&[2], &[1.0, 0.5]),
            HostTensor::from_f32(&[2], &[1.0, -1.0]),
        ],
    );
    let mut y = [1.0f32, 0.5];
    for _ in 0..4 {
        y = [y[0] * 2.0 + 1.0, y[1] * 2.0 - 1.0];
    }
    assert_eq!(f32s(&o[0]), y);
    assert_eq!(s.subgraph_runs, 4);
    // Zero trips: the initial value passes through.
    let (o, _) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[0]),
            HostTensor::from_f32(&[2], &[1.0, 0.5]),
            HostTensor::from_f32(&[2], &[1.0, -1.0]),
        ],
    );
    assert_eq!(f32s(&o[0]), [1.0, 0.5]);
}

/// The loop ends when the body's condition turns false, well before M; its
/// scan output (one value per iteration) is of data-dependent size: a
/// dynamic allocation outside the arena, listed and measured.
#[test]
fn loop_condition_ends_it_early_and_scan_outputs_stack() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float s0) => (float s, float[N] trace) <int64 m = {100}, bool t = {1}, float one = {1.0}, float limit = {3.0}> {
          s, trace = Loop (m, t, s0) <body = body (int64 i, bool c, float si) => (bool co, float so, float sc) {
                so = Add (si, one)
                co = Less (so, limit)
                sc = Identity (so)
              }>
        }"#);
    assert_eq!(e.dynamic_values(), ["trace"]);
    let (o, s) = run(&mut e, &[HostTensor::from_f32(&[], &[0.0])]);
    // 1 < 3, 2 < 3, 3 < 3 is false: three iterations.
    assert_eq!(f32s(&o[0]), [3.0]);
    assert_eq!(o[1].shape, [3]);
    assert_eq!(f32s(&o[1]), [1.0, 2.0, 3.0]);
    assert_eq!(s.subgraph_runs, 3);
    assert_eq!(s.dynamic_peak_bytes, 12);
    // Another start: another length, same executable.
    let (o, s) = run(&mut e, &[HostTensor::from_f32(&[], &[-3.5])]);
    assert_eq!(f32s(&o[1]), [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5]);
    assert_eq!(s.dynamic_peak_bytes, 28);
}

/// Values downstream of a dynamic one are dynamic too and run as nodes
/// alone at the shapes seen; a reduction back to a known size lands in the
/// arena again.
#[test]
fn values_after_a_scan_output_are_dynamic_allocations() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64 m, float[2] x) => (float[2] total, float[N,2] doubled) <float two = {2.0}, int64[1] ax = {0}> {
          last, rows = Loop (m, "", x) <body = body (int64 i, bool c, float[2] xi) => (bool co, float[2] xo, float[2] row) {
                fi = Cast <to = 1> (i)
                xo = Add (xi, fi)
                row = Identity (xo)
                co = Identity (c)
              }>
          doubled = Mul (rows, two)
          total = ReduceSum <keepdims = 0> (doubled, ax)
        }"#);
    let mut dv = e.dynamic_values().to_vec();
    dv.sort();
    assert_eq!(dv, ["doubled", "rows"]);
    let (o, s) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[3]),
            HostTensor::from_f32(&[2], &[1.0, 10.0]),
        ],
    );
    // rows: x+0, x+0+1, x+0+1+2 = [1,10], [2,11], [4,13].
    assert_eq!(o[1].shape, [3, 2]);
    assert_eq!(f32s(&o[1]), [2.0, 20.0, 4.0, 22.0, 8.0, 26.0]);
    assert_eq!(f32s(&o[0]), [14.0, 68.0]);
    // rows (24 B) and doubled (24 B) live at once.
    assert_eq!(s.dynamic_peak_bytes, 48);
}

/// A Reshape of a dynamic value to a shape computed at run time: the node
/// runs alone with the computed shape folded in, so its output is planned.
#[test]
fn a_node_after_a_dynamic_value_sees_computed_shapes() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64 m, float[2] x) => (float[2,N] flipped) <int64[1] st = {-1}, int64[1] en = {-3}, int64[1] ax = {0}, int64[1] stp = {-1}> {
          last, rows = Loop (m, "", x) <body = body (int64 i, bool c, float[2] xi) => (bool co, float[2] xo, float[2] row) {
                xo = Identity (xi)
                row = Identity (xi)
                co = Identity (c)
              }>
          sh = Shape (rows)
          rev = Slice (sh, st, en, ax, stp)
          flipped = Reshape (rows, rev)
        }"#);
    assert!(e.dynamic_values().contains(&"flipped".to_string()));
    let (o, _) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[3]),
            HostTensor::from_f32(&[2], &[1.0, 2.0]),
        ],
    );
    assert_eq!(o[0].shape, [2, 3]);
    assert_eq!(f32s(&o[0]), [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
}

/// A nested If inside a Loop body reads a value of the main graph (a
/// runtime input two scopes out) and a main-graph weight.
#[test]
fn a_nested_if_in_a_loop_body_reads_outer_values() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64 m, float[2] w, float[2] y0) => (float[2] y) <int64 one = {1}, float half = {0.5}> {
          y = Loop (m, "", y0) <body = body (int64 i, bool c, float[2] yi) => (bool co, float[2] yo) {
                big = Greater (i, one)
                yo = If (big) <then_branch = then_g () => (float[2] a) {
                       a = Add (yi, w)
                     }, else_branch = else_g () => (float[2] b) {
                       p = Mul (yi, half)
                       b = Sub (p, w)
                     }>
                co = Identity (c)
              }>
        }"#);
    let w = [1.0f32, -2.0];
    let (o, _) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[4]),
            HostTensor::from_f32(&[2], &w),
            HostTensor::from_f32(&[2], &[8.0, 4.0]),
        ],
    );
    let mut y = [8.0f32, 4.0];
    for i in 0..4 {
        for k in 0..2 {
            y[k] = if i > 1 {
                y[k] + w[k]
            } else {
                y[k] * 0.5 - w[k]
            };
        }
    }
    assert_eq!(f32s(&o[0]), y);
}

/// If branches of different shapes: the output's size is data-dependent.
#[test]
fn if_branches_of_different_shapes_give_a_dynamic_output() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[2] x) => (float[N] y, float s) {
          y = If (c) <then_branch = then_g () => (float[2] a) {
                a = Identity (x)
              }, else_branch = else_g () => (float[4] b) {
                b = Concat <axis = 0> (x, x)
              }>
          s = ReduceSum <keepdims = 0> (y)
        }"#);
    assert_eq!(e.dynamic_values(), ["y"]);
    let x = HostTensor::from_f32(&[2], &[1.0, 2.0]);
    let (o, _) = run(&mut e, &[boolean(true), x.clone()]);
    assert_eq!(f32s(&o[0]), [1.0, 2.0]);
    assert_eq!(f32s(&o[1]), [3.0]);
    let (o, _) = run(&mut e, &[boolean(false), x]);
    assert_eq!(f32s(&o[0]), [1.0, 2.0, 1.0, 2.0]);
    assert_eq!(f32s(&o[1]), [6.0]);
}

/// Body outputs that are a body input or an outer value as they are.
#[test]
fn body_outputs_may_be_inputs_or_outer_values() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64 m, float[2] x, float[2] z0) => (float[2] z, float[N,2] xs) {
          z, xs = Loop (m, "", z0) <body = body (int64 i, bool c, float[2] zi) => (bool c, float[2] zi, float[2] x) {
              }>
        }"#);
    let (o, _) = run(
        &mut e,
        &[
            HostTensor::from_i64(&[], &[2]),
            HostTensor::from_f32(&[2], &[1.0, 2.0]),
            HostTensor::from_f32(&[2], &[3.0, 4.0]),
        ],
    );
    assert_eq!(f32s(&o[0]), [3.0, 4.0]);
    assert_eq!(f32s(&o[1]), [1.0, 2.0, 1.0, 2.0]);
}

/// A Range whose bounds are floats computed at run time: run alone, its
/// scalar inputs are folded in as constants, so its size is known.
#[test]
fn a_range_of_computed_float_bounds_is_sized_at_run_time() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float a) => (float[N] r) <float zero = {0.0}, float one = {1.0}> {
          lim = Add (a, one)
          [range0] r = Range (zero, lim, one)
        }"#);
    assert_eq!(e.dynamic_values(), ["r"]);
    let (o, _) = run(&mut e, &[HostTensor::from_f32(&[], &[2.0])]);
    assert_eq!(o[0].shape, [3]);
    assert_eq!(f32s(&o[0]), [0.0, 1.0, 2.0]);
    let (o, _) = run(&mut e, &[HostTensor::from_f32(&[], &[4.5])]);
    assert_eq!(f32s(&o[0]), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

/// The same with float16 bounds (cast from the fed float), and Resizes
/// whose scales are computed: each folded in, so the sizes are known. One
/// Resize's image is a weight (its scales are then the node's first fed
/// input); the other's is fed and is not folded: new image values reuse
/// the program made for the same scales.
#[test]
fn float16_range_bounds_and_computed_resize_scales_are_folded() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float a, float[1,1,2,2] x) => (float16[N] r, float[1,1,H,W] y, float[1,1,H,W] yc) <float one = {1.0}, float[2] ones2 = {1.0, 1.0}, float[1,1,2,2] c = {1.0, 2.0, 3.0, 4.0}> {
          lim = Add (a, one)
          h = Cast <to = 10> (lim)
          z = Sub (h, h)
          o = Div (h, h)
          r = Range (z, h, o)
          s2 = Mul (ones2, lim)
          sc = Concat <axis = 0> (ones2, s2)
          y = Resize <mode = "nearest"> (x, "", sc)
          yc = Resize <mode = "nearest"> (c, "", sc)
        }"#);
    let x = |v: [f32; 4]| HostTensor::from_f32(&[1, 1, 2, 2], &v);
    // Each pixel three times along both axes.
    let up3 =
        |v: [f32; 4]| -> Vec<f32> { (0..36).map(|i| v[(i / 6 / 3) * 2 + (i % 6) / 3]).collect() };
    let (o, _) = run(
        &mut e,
        &[HostTensor::from_f32(&[], &[2.0]), x([1.0, 2.0, 3.0, 4.0])],
    );
    let f16s = |t: &HostTensor| -> Vec<f32> {
        assert_eq!(t.dtype, DType::F16);
        t.data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    };
    assert_eq!(f16s(&o[0]), [0.0, 1.0, 2.0]);
    assert_eq!(o[1].shape, [1, 1, 6, 6]);
    assert_eq!(f32s(&o[1]), up3([1.0, 2.0, 3.0, 4.0]));
    assert_eq!(f32s(&o[2]), up3([1.0, 2.0, 3.0, 4.0]));
    let made = e.subgraph_arena_bytes();
    let (o, _) = run(
        &mut e,
        &[HostTensor::from_f32(&[], &[2.0]), x([5.0, 6.0, 7.0, 8.0])],
    );
    assert_eq!(f32s(&o[1]), up3([5.0, 6.0, 7.0, 8.0]));
    assert_eq!(
        e.subgraph_arena_bytes(),
        made,
        "a new image made a new program"
    );
    let (o, _) = run(
        &mut e,
        &[HostTensor::from_f32(&[], &[1.0]), x([1.0, 2.0, 3.0, 4.0])],
    );
    assert_eq!(f16s(&o[0]), [0.0, 1.0]);
    assert_eq!(o[2].shape, [1, 1, 4, 4]);
}

#[test]
fn a_size_unknown_even_at_run_time_is_one_clear_error() {
    // A shape of 65 elements is not folded in (at most 64 are), so the
    // size of the node run alone stays unknown.
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (int64[65] s) => (float[] r) {
          [fill] r = ConstantOfShape (s)
        }"#);
    assert_eq!(e.dynamic_values(), ["r"]);
    let err = e
        .run(
            &[HostTensor::from_i64(&[65], &[1; 65])],
            &RunOptions::default(),
        )
        .expect_err("refused")
        .to_string();
    assert!(err.contains("node 'fill' (ConstantOfShape)"), "{err}");
    assert!(err.contains("the size of r is unknown"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

/// Ops whose output size depends on the values (NonZero, Compress, Unique,
/// NonMaxSuppression) are computed on the host; what reads them is planned
/// at the sizes they come out with, run after run.
#[test]
fn nonzero_and_friends_size_their_outputs_from_the_values() {
    let mut e = exe(r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[3,4] x) => (int64[N,2] pos, float[M] kept, float[U] uniq, int64[K,3] sel) <float half = {0.5}, int64[1] s0 = {0}, int64[1] s1 = {1}, int64[1] a0 = {0}, float[1,4,4] boxes = {0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.0, 5.0, 5.0, 6.0, 6.0, 10.0, 10.0, 11.0, 11.0}, int64 most = {2}, float iou = {0.5}> {
          big = Greater (x, half)
          nz = NonZero (big)
          pos = Transpose <perm = [1, 0]> (nz)
          row = Reshape (x, minus1)
          maskrow = Reshape (big, minus1)
          kept = Compress (row, maskrow)
          uniq, idx, inv, cnt = Unique (kept)
          first = Slice (x, s0, s1, a0)
          scores = Unsqueeze (first, a0)
          sel = NonMaxSuppression (boxes, scores, most, iou)
        }"#.replace("minus1)", "m1)").replace("<float half", "<int64[1] m1 = {-1}, float half").as_str());
    let x = [0.9, 0.1, 0.8, 0.3, 0.6, 0.9, 0.2, 0.7, 0.9, 0.4, 0.6, 0.0];
    let (o, stats) = run(&mut e, &[HostTensor::from_f32(&[3, 4], &x)]);
    let big: Vec<usize> = (0..12).filter(|&i| x[i] > 0.5).collect();
    assert_eq!(o[0].shape, [big.len(), 2]);
    let pos: Vec<i64> = o[0]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<i64> = big
        .iter()
        .flat_map(|&i| [(i / 4) as i64, (i % 4) as i64])
        .collect();
    assert_eq!(pos, want);
    let kept: Vec<f32> = big.iter().map(|&i| x[i]).collect();
    assert_eq!(f32s(&o[1]), kept);
    assert_eq!(f32s(&o[2]), [0.6, 0.7, 0.8, 0.9]);
    // Scores of the four boxes: the first row of x, [0.9, 0.1, 0.8, 0.3];
    // box 1 overlaps box 0 (IoU 0.9) and scores less; two boxes at most.
    assert_eq!(o[3].shape, [2, 3]);
    let sel: Vec<i64> = o[3]
        .data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(sel, [0, 0, 0, 0, 0, 2]);
    assert!(stats.kernels_run > 0);
    // Another mask, other sizes.
    let y = [0.0f32; 12];
    let (o, _) = run(&mut e, &[HostTensor::from_f32(&[3, 4], &y)]);
    assert_eq!(o[0].shape, [0, 2]);
    assert_eq!(o[1].shape, [0]);
    assert_eq!(o[2].shape, [0]);
}

/// Scan along axis 0: a running sum (state) and its trace (a scan output),
/// forward over the rows and backward.
#[test]
fn scan_carries_state_over_rows_both_directions() {
    let text = |dirs: &str| {
        format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[3,2] xs, float[2] s0) => (float[2] s, float[3,2] trace) {{
          s, trace = Scan <num_scan_inputs = 1, {dirs} body = body (float[2] si, float[2] x) => (float[2] so, float[2] t) {{
                so = Add (si, x)
                t = Identity (so)
              }}> (s0, xs)
        }}"#
        )
    };
    let xs = HostTensor::from_f32(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let s0 = HostTensor::from_f32(&[2], &[10.0, 20.0]);
    let mut e = exe(&text(""));
    let (o, s) = run(&mut e, &[xs.clone(), s0.clone()]);
    assert_eq!(f32s(&o[0]), [19.0, 32.0]);
    assert_eq!(f32s(&o[1]), [11.0, 22.0, 14.0, 26.0, 19.0, 32.0]);
    assert_eq!(s.subgraph_runs, 3);
    // Rows last to first; the trace written back to front.
    let mut e = exe(&text(
        "scan_input_directions = [1], scan_output_directions = [1],",
    ));
    let (o, _) = run(&mut e, &[xs, s0]);
    assert_eq!(f32s(&o[0]), [19.0, 32.0]);
    assert_eq!(f32s(&o[1]), [19.0, 32.0, 18.0, 30.0, 15.0, 26.0]);
}

/// Scan along axis 1 of a [2,3,2] input, rows last to first, the trace
/// stacked along axis 1 (forward and reversed) and along axis -1.
#[test]
fn scan_along_another_axis_and_backward() {
    let text = |attrs: &str, trace: &str| {
        format!(
            r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3,2] xs, float[2,2] s0) => (float[2,2] s, float[{trace}] trace) {{
          s, trace = Scan <num_scan_inputs = 1, scan_input_axes = [1], scan_input_directions = [1], {attrs} body = body (float[2,2] si, float[2,2] x) => (float[2,2] so, float[2,2] t) {{
                so = Add (si, x)
                t = Identity (so)
              }}> (s0, xs)
        }}"#
        )
    };
    let xs = HostTensor::from_f32(&[2, 3, 2], &(1..=12).map(|v| v as f32).collect::<Vec<_>>());
    let s0 = HostTensor::from_f32(&[2, 2], &[10.0, 20.0, 30.0, 40.0]);
    // Expected values from numpy: the state plus xs[:, 2 - step, :].
    let cases: [(&str, &str, [f32; 12]); 3] = [
        (
            "scan_output_axes = [1],",
            "2,3,2",
            [
                15.0, 26.0, 18.0, 30.0, 19.0, 32.0, 41.0, 52.0, 50.0, 62.0, 57.0, 70.0,
            ],
        ),
        (
            "scan_output_axes = [1], scan_output_directions = [1],",
            "2,3,2",
            [
                19.0, 32.0, 18.0, 30.0, 15.0, 26.0, 57.0, 70.0, 50.0, 62.0, 41.0, 52.0,
            ],
        ),
        (
            "scan_output_axes = [-1],",
            "2,2,3",
            [
                15.0, 18.0, 19.0, 26.0, 30.0, 32.0, 41.0, 50.0, 57.0, 52.0, 62.0, 70.0,
            ],
        ),
    ];
    for (attrs, trace, want) in cases {
        let mut e = exe(&text(attrs, trace));
        let (o, s) = run(&mut e, &[xs.clone(), s0.clone()]);
        assert_eq!(f32s(&o[0]), [19.0, 32.0, 57.0, 70.0], "{attrs}");
        let dims: Vec<usize> = trace.split(',').map(|d| d.parse().unwrap()).collect();
        assert_eq!(o[1].shape, dims, "{attrs}");
        assert_eq!(f32s(&o[1]), want, "{attrs}");
        assert_eq!(s.subgraph_runs, 3);
    }
}

/// The CUDA backend (bound without a GPU) refuses subgraphs and dynamic
/// values in one line naming the node, before anything runs.
#[test]
fn the_cuda_backend_refuses_control_flow_in_one_line() {
    let m = graphopt_text::parse_model(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (bool c, float[3] x) => (float[3] y) {
          [if0] y = If (c) <then_branch = then_g () => (float[3] a) {
                a = Neg (x)
              }, else_branch = else_g () => (float[3] b) {
                b = Identity (x)
              }>
        }"#,
    )
    .unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let e = graphopt_exec::cuda::plan_kernels(&mp.model, &mp.plan)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("no cuda kernel for If (node 'if0')"), "{e}");
    assert!(e.contains("not supported yet on this backend"), "{e}");
    assert!(!e.contains('\n'));
}
