//! A Conv fused with the Add of a residual (`ConvAdd`, issue 20): once
//! lowered by [`graphopt_exec::lower::lower_coded`] (which calls
//! [`graphopt_exec::fuse_residual::fuse_residual`]), a ResNet block's
//! last convolution adds its shortcut image by image, over the shortcut's
//! storage, and its whole output is never planned.
//!
//! Each case runs through the whole runtime (planned arena, poison on) as
//! written and lowered, at 1-3 threads: the outputs must be bitwise
//! equal, the expected fusions must happen, and the arena must not grow.

mod common;

use common::{f32_tensor, list, run};
use graphopt_exec::lower::lower_coded;
use graphopt_exec::HostTensor;
use graphopt_ir::Model;
use graphopt_plan::{plan_model, DimValues, PlanOptions};
use graphopt_testutil::uniform as data;

/// `m` as written and lowered: `want` ConvAdds, the same bits at 1-3
/// threads, no more arena. Returns (plain, lowered) arena bytes.
fn check(name: &str, m: &Model, inputs: &[HostTensor], want: usize) -> (u64, u64) {
    let mut lowered = m.clone();
    let r = lower_coded(&mut lowered);
    graphopt_ir::verify::verify_model(&lowered).expect("the lowered model verifies");
    assert_eq!(r.residual_convs, want, "{name}: {r:?}");
    let count = lowered
        .graph
        .nodes()
        .filter(|&n| lowered.graph.node(n).op_type == graphopt_plan::CONV_ADD)
        .count();
    assert_eq!(count, want, "{name}");
    let mut arenas = (0, 0);
    for threads in 1..=3 {
        let (plain, pa, _) = run(m, inputs, threads);
        let (fused, fa, _) = run(&lowered, inputs, threads);
        for (p, f) in plain.iter().zip(&fused) {
            assert_eq!(p.shape, f.shape, "{name}");
            assert!(
                p.data == f.data,
                "{name} at {threads} threads: outputs differ"
            );
        }
        assert!(fa <= pa, "{name}: arena {fa} > {pa}");
        arenas = (pa, fa);
    }
    arenas
}

/// A bottleneck's end: 3x3 Conv, Relu, 1x1 Conv with a bias, Add of the
/// block's input, Relu; `batch` images of `hw x hw` (more than 256
/// positions: image by image; at most 256 at batch 2: the whole batch
/// at once). `swap` puts the Conv's output second in the Add; `bias` off
/// drops the 1x1's bias.
fn block(batch: usize, hw: usize, swap: bool, bias: bool) -> (Model, Vec<HostTensor>) {
    let c = 8;
    let w1 = data(c * c * 9, 1);
    let w2 = data(c * c, 2);
    let b2 = data(c, 3);
    let add = if swap {
        "s = Add (x, h2)"
    } else {
        "s = Add (h2, x)"
    };
    let (b2_decl, b2_in) = if bias {
        (format!(", float[{c}] b2 = {{{}}}", list(&b2)), ", b2")
    } else {
        (String::new(), "")
    };
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[{batch},{c},{hw},{hw}] x) => (float[{batch},{c},{hw},{hw}] y)\n\
         <float[{c},{c},3,3] w1 = {{{}}}, float[{c},{c},1,1] w2 = {{{}}}{b2_decl}>\n{{\n\
         h = Conv <kernel_shape: ints = [3, 3], pads: ints = [1, 1, 1, 1]> (x, w1)\n\
         h1 = Relu (h)\n\
         h2 = Conv <kernel_shape: ints = [1, 1]> (h1, w2{b2_in})\n\
         {add}\n y = Relu (s)\n}}",
        list(&w1),
        list(&w2),
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let x = data(batch * c * hw * hw, 4);
    (m, vec![f32_tensor(&[batch, c, hw, hw], &x)])
}

#[test]
fn a_bottleneck_end_adds_its_shortcut_image_by_image_with_the_same_bits() {
    for (batch, hw, swap, bias) in [
        (3, 20, false, true),
        (2, 20, true, false),
        (1, 12, false, true),
        (2, 12, true, true),
    ] {
        let (m, inputs) = block(batch, hw, swap, bias);
        let name = format!("batch {batch} {hw}x{hw} swap {swap} bias {bias}");
        check(&name, &m, &inputs, 1);
    }
}

/// Where the block's output is the next block's input (the shortcut dies
/// at the Add), the sum goes over it: the plan has a ConvAdd in-place
/// pair and less arena than the Conv's output beside the shortcut; image
/// by image (20x20) and the whole batch at once (12x12).
#[test]
fn the_sum_goes_over_a_dying_shortcut() {
    for hw in [20, 12] {
        let (batch, c) = (2, 8);
        let w0 = data(c * c, 5);
        let w2 = data(c * c, 6);
        let text = format!(
            "<ir_version: 10, opset_import: [\"\" : 17]>\n\
             g (float[{batch},{c},{hw},{hw}] x) => (float[{batch},{c},{hw},{hw}] y)\n\
             <float[{c},{c},1,1] w0 = {{{}}}, float[{c},{c},1,1] w2 = {{{}}}>\n{{\n\
             r = Conv <kernel_shape: ints = [1, 1]> (x, w0)\n\
             h = Relu (r)\n\
             h2 = Conv <kernel_shape: ints = [1, 1]> (h, w2)\n\
             s = Add (h2, r)\n y = Relu (s)\n}}",
            list(&w0),
            list(&w2),
        );
        let m = graphopt_text::parse_model(&text).expect("fixture parses");
        let inputs = [f32_tensor(
            &[batch, c, hw, hw],
            &data(batch * c * hw * hw, 7),
        )];
        let name = format!("dying shortcut {hw}x{hw}");
        let (plain, fused) = check(&name, &m, &inputs, 1);
        assert!(fused < plain, "{name}: arena {fused} !< {plain}");
        let mut lowered = m.clone();
        lower_coded(&mut lowered);
        let mp =
            plan_model(&lowered, &DimValues::default(), &PlanOptions::default()).expect("plans");
        assert!(
            mp.plan
                .aliases
                .iter()
                .any(|a| a.op_type == graphopt_plan::CONV_ADD),
            "{name}: the ConvAdd should write over the shortcut: {:?}",
            mp.plan.aliases
        );
    }
}

/// Not fused: a Conv output read besides the Add, a broadcast residual,
/// and a graph output.
#[test]
fn other_readers_broadcasts_and_outputs_stay_unfused() {
    let (c, hw) = (4, 18);
    let w = data(c * c, 8);
    let text = format!(
        "<ir_version: 10, opset_import: [\"\" : 17]>\n\
         g (float[1,{c},{hw},{hw}] x, float[1,{c},1,1] b) => (float[1,{c},{hw},{hw}] y, float[1,{c},{hw},{hw}] z, float[1,{c},{hw},{hw}] o)\n\
         <float[{c},{c},1,1] w = {{{}}}>\n{{\n\
         h = Conv <kernel_shape: ints = [1, 1]> (x, w)\n y = Add (h, x)\n z = Mul (h, x)\n\
         k = Conv <kernel_shape: ints = [1, 1]> (x, w)\n o0 = Add (k, b)\n\
         o = Conv <kernel_shape: ints = [1, 1]> (o0, w)\n}}",
        list(&w)
    );
    let m = graphopt_text::parse_model(&text).expect("fixture parses");
    let inputs = [
        f32_tensor(&[1, c, hw, hw], &data(c * hw * hw, 9)),
        f32_tensor(&[1, c, 1, 1], &data(c, 10)),
    ];
    check("unfused", &m, &inputs, 0);
}

/// The ResNet of `testdata` from three exporters: its blocks' last
/// convolutions take their shortcuts, with the same bits.
#[test]
fn resnet_tiny_fuses_its_shortcuts_with_the_same_bits() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for name in [
        "resnet_tiny.ts9",
        "resnet_tiny.ts14",
        "resnet_tiny.dynamo18",
    ] {
        let m = graphopt_onnx::load(&dir.join(format!("{name}.onnx")))
            .expect("loads")
            .model;
        let inputs = [f32_tensor(&[2, 3, 32, 32], &data(2 * 3 * 32 * 32, 11))];
        let mut lowered = m.clone();
        let r = lower_coded(&mut lowered);
        assert!(r.residual_convs >= 4, "{name}: {r:?}");
        check(name, &m, &inputs, r.residual_convs);
    }
}
