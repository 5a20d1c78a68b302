//! Relu and Clip fused into the Conv that produces their input
//! (`executor/fuse.rs`): on every Conv path (im2col tiles, tiles split
//! across threads, 1x1, depthwise, folded batch), with Relu, Clip with
//! constant bound inputs and Clip with opset-6 attributes, the fused
//! output has the bits of the unfused one; an activation whose input is
//! also read elsewhere, or whose bounds are computed, stays a step.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use graphopt_testutil::uniform as data;

fn t(shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_f32(shape, &data(shape.iter().product(), seed))
}

/// Outputs (bytes) at 1 and 3 threads, which must agree, and the fused count.
fn run(text: &str, inputs: &[HostTensor]) -> (Vec<Vec<u8>>, usize) {
    let m = graphopt_text::parse_model(text).expect("fixture parses");
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let mut all = Vec::new();
    for threads in [1, 3] {
        let opts = RunOptions {
            threads,
            poison: true,
        };
        let (out, _) = exe.run(inputs, &opts).unwrap();
        all.push(out.into_iter().map(|t| t.data.to_vec()).collect::<Vec<_>>());
    }
    assert_eq!(all[0], all[1], "thread counts disagree");
    (all.swap_remove(0), exe.fused_activations())
}

/// The convolutions (with their activations) of both graphs below.
const BODY: &str = r#"
          a = Conv <pads = [1,1,1,1]> (x, w3, b16)
          ra = Relu (a)
          p = Conv (x, w1, b16)
          cp = Clip (p, lo, hi)
          d = Conv <pads = [1,1,1,1], group = 8> (x, wd, b8)
          rd = Relu (d)
          s = Conv <pads = [1,1,1,1], strides = [2,2]> (x, w3, b16)
          cs = Clip (s, lo, hi)
          f = Conv (xf, wf, bf)
          rf = Relu (f)
"#;

#[test]
fn fused_activations_have_the_bits_of_their_steps() {
    // 8 channels at 130x130: 3x3 im2col in several tiles; 1x1; depthwise;
    // stride 2; a batch of small outputs with a large weight (folded).
    let inputs = [
        t(&[2, 8, 130, 130], 1),
        t(&[16, 8, 3, 3], 2),
        t(&[16, 8, 1, 1], 3),
        t(&[8, 1, 3, 3], 4),
        t(&[16], 5),
        t(&[8], 6),
        t(&[4, 64, 9, 9], 7),
        t(&[128, 64, 3, 3], 8),
        t(&[128], 9),
    ];
    let sig = "(float[2,8,130,130] x, float[16,8,3,3] w3, float[16,8,1,1] w1, float[8,1,3,3] wd, \
               float[16] b16, float[8] b8, float[4,64,9,9] xf, float[128,64,3,3] wf, float[128] bf)";
    let consts = "<float lo = {-0.1}, float hi = {0.2}>";
    let outs = "float[2,16,130,130] ra, float[2,16,130,130] cp, float[2,8,130,130] rd, \
                float[2,16,65,65] cs, float[4,128,7,7] rf";
    let fused = format!(
        "<ir_version: 8, opset_import: [\"\" : 17]>\ng {sig} => ({outs}) {consts} {{{BODY}}}"
    );
    // The Conv outputs are graph outputs too: no activation is in place
    // over them, so none is fused.
    let plain = format!(
        "<ir_version: 8, opset_import: [\"\" : 17]>\ng {sig} => ({outs}, float[2,16,130,130] a, \
         float[2,16,130,130] p, float[2,8,130,130] d, float[2,16,65,65] s, float[4,128,7,7] f) \
         {consts} {{{BODY}}}"
    );
    let (got, n) = run(&fused, &inputs);
    let (want, n_plain) = run(&plain, &inputs);
    assert_eq!((n, n_plain), (5, 0));
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "output {k}: fused bits differ");
    }
    // The activations did something: Clip's bounds hold, Relu zeroes.
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let cp = f(&got[1]);
    assert!(cp.iter().all(|v| (-0.1..=0.2).contains(v)) && cp.contains(&0.2));
    assert!(f(&got[0]).contains(&0.0));
}

#[test]
fn opset6_clip_attributes_fuse_and_shared_or_computed_inputs_do_not() {
    let x = t(&[1, 4, 20, 20], 11);
    let w = t(&[6, 4, 3, 3], 12);
    let (outs, n) = run(
        r#"<ir_version: 3, opset_import: ["" : 6]>
        g (float[1,4,20,20] x, float[6,4,3,3] w) => (float[1,6,18,18] c) {
          y = Conv (x, w)
          c = Clip <min = -0.05, max = 0.05> (y)
        }"#,
        &[x.clone(), w.clone()],
    );
    assert_eq!(n, 1);
    let c: Vec<f32> = outs[0]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(c.iter().all(|v| v.abs() <= 0.05) && c.contains(&0.05) && c.contains(&-0.05));
    // `y` read by the Add after the Relu (so the Relu cannot be in place
    // over it), and a Clip bound computed at run time: neither fuses.
    let (_, n) = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,20,20] x, float[6,4,3,3] w, float lo0) => (float[1,6,18,18] s, float[1,6,18,18] c) {
          y = Conv (x, w)
          r = Relu (y)
          s = Add (r, y)
          z = Conv (x, w)
          lo = Neg (lo0)
          c = Clip (z, lo)
        }"#,
        &[x.clone(), w.clone(), HostTensor::from_f32(&[], &[0.1])],
    );
    assert_eq!(n, 0);
    // `y` read by an Add scheduled between the Conv and the Relu, which
    // the plan may still put in place over `y` (its last reader): the Add
    // must see `y` before the Relu, so no fusion, and the sum is Conv + x'.
    let q = t(&[1, 6, 18, 18], 13);
    let (outs, n) = run(
        r#"<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,20,20] x, float[6,4,3,3] w, float[1,6,18,18] q) => (float[1,6,18,18] s, float[1,6,18,18] r) {
          y = Conv (x, w)
          s = Add (y, q)
          r = Relu (y)
        }"#,
        &[x.clone(), w.clone(), q.clone()],
    );
    assert_eq!(n, 0);
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let (s, r, qv) = (f(&outs[0]), f(&outs[1]), q.to_f32().unwrap());
    // Where the Conv is negative, Relu gives 0 and the Add must still
    // see the negative value: s - q < 0 there.
    let negative = s
        .iter()
        .zip(&qv)
        .zip(&r)
        .filter(|((s, q), r)| **r == 0.0 && *s - *q < -1e-6)
        .count();
    assert!(negative > 0, "the Add saw the activated Conv");
}
