//! `Executable::run_observed`: each output is readable, with its final
//! value, from the step that makes it on (`output_ready_steps`), while the
//! rest of the schedule runs; a training step hands gradients on this way.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{plan_model, DimValues, PlanOptions};

/// `a` is final after the first node, `b` after the third; `c` is the
/// input itself.
const MODEL: &str = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x) => (float[3] a, float[3] b, float[3] x) {
  a = Relu (x)
  t = Mul (a, x)
  b = Add (t, x)
}"#;

#[test]
fn outputs_are_read_as_they_become_final() {
    let m = graphopt_text::parse_model(MODEL).unwrap();
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    let mut exe = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let ready = exe.output_ready_steps();
    assert_eq!(ready.len(), 3);
    let (ra, rb) = (ready[0].expect("a is made"), ready[1].expect("b is made"));
    assert!(ra < rb, "{ready:?}");
    assert_eq!(ready[2], None, "an input is final before the first step");
    let x = HostTensor::from_f32(&[3], &[-1.0, 2.0, 3.0]);
    let mut seen: Vec<(usize, usize, Vec<f32>)> = Vec::new();
    let (outs, _) = exe
        .run_observed(&[&x], &RunOptions::default(), &mut |si, read| {
            for (k, r) in [(0, ra), (1, rb)] {
                if si == r {
                    seen.push((si, k, read(k).unwrap().to_f32().unwrap()));
                }
            }
        })
        .unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], (ra, 0, vec![0.0, 2.0, 3.0]));
    assert_eq!(seen[1], (rb, 1, vec![-1.0, 6.0, 12.0]));
    for (k, s) in [(0, &seen[0].2), (1, &seen[1].2)] {
        assert_eq!(
            &outs[k].to_f32().unwrap(),
            s,
            "output {k} read early differs"
        );
    }
}
