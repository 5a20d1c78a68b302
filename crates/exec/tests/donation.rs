//! Donation end to end: the planner places each donated output at its
//! input's offset (in place at the input's last reader when that node is
//! elementwise, after the input died otherwise) and refuses pairs the
//! schedule does not allow; the runtime then keeps the donated values in
//! the arena across runs (`run_donated`), giving the same results as
//! feeding them back from the host.

use graphopt_exec::{CpuBackend, Executable, HostTensor, RunOptions};
use graphopt_plan::{check_graph_plan, plan_model, set_donations, DimValues, PlanOptions};

/// One SGD-with-momentum step: `m_new = 0.9 m + g`, `p_new = p - 0.5 m_new`;
/// `y = p * g` reads `p` first.
const STEP: &str = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[4] p, float[4] g, float[4] m) => (float[4] y, float[4] p_new, float[4] m_new)
  <float lr = {0.5}, float beta = {0.9}> {
  y = Mul (p, g)
  m1 = Mul (m, beta)
  m_new = Add (m1, g)
  s = Mul (m_new, lr)
  p_new = Sub (p, s)
}"#;

fn pairs() -> Vec<(String, String)> {
    vec![
        ("p".to_string(), "p_new".to_string()),
        ("m".to_string(), "m_new".to_string()),
    ]
}

fn plan(text: &str, donate: bool) -> graphopt_plan::ModelPlan {
    let mut m = graphopt_text::parse_model(text).unwrap();
    set_donations(&mut m, &pairs());
    let opts = PlanOptions {
        donate,
        ..PlanOptions::default()
    };
    plan_model(&m, &DimValues::default(), &opts).unwrap()
}

fn offset(p: &graphopt_plan::Plan, name: &str) -> u64 {
    p.tensors.iter().find(|t| t.name == name).unwrap().offset
}

#[test]
fn donated_outputs_take_their_inputs_bytes() {
    let mp = plan(STEP, true);
    let p = &mp.plan;
    check_graph_plan(&mp.model.graph, p).unwrap();
    let mut donated = p.donated.clone();
    donated.sort();
    let mut want = pairs();
    want.sort();
    assert_eq!(donated, want);
    assert!(p.donations_refused.is_empty(), "{:?}", p.donations_refused);
    assert_eq!(p.donated_bytes, 32);
    assert_eq!(offset(p, "p"), offset(p, "p_new"));
    assert_eq!(offset(p, "m"), offset(p, "m_new"));
    // p_new is written in place at Sub, p's last reader.
    assert!(
        p.aliases.iter().any(|a| a.op_type == "Sub"),
        "{:?}",
        p.aliases
    );
    // Without donation they are planned apart.
    let apart = plan(STEP, false);
    assert!(apart.plan.donated.is_empty());
    assert_ne!(offset(&apart.plan, "p"), offset(&apart.plan, "p_new"));
}

#[test]
fn a_pair_the_schedule_forbids_is_refused_with_why() {
    // `z` reads p after p_new is written: p_new may not take p's bytes.
    let text = STEP
        .replace(
            "=> (float[4] y, float[4] p_new, float[4] m_new)",
            "=> (float[4] y, float[4] p_new, float[4] m_new, float[4] z)",
        )
        .replace(
            "p_new = Sub (p, s)\n",
            "p_new = Sub (p, s)\n  z = Add (p, p_new)\n",
        );
    let mp = plan(&text, true);
    check_graph_plan(&mp.model.graph, &mp.plan).unwrap();
    assert_eq!(
        mp.plan.donated,
        vec![("m".to_string(), "m_new".to_string())]
    );
    assert_eq!(
        mp.plan.donations_refused,
        vec!["p:p_new: the input is read after the output is written".to_string()]
    );
}

fn t(v: &[f32]) -> HostTensor {
    HostTensor::from_f32(&[4], v)
}

#[test]
fn kept_state_steps_as_host_feedback_does() {
    let mp = plan(STEP, true);
    let mut kept = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let mut fed = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let ro = RunOptions {
        threads: 2,
        poison: false,
    };
    let grads = [
        t(&[1.0, -2.0, 0.5, 0.0]),
        t(&[0.25, 1.0, -1.0, 3.0]),
        t(&[2.0, 0.0, 1.0, -0.5]),
    ];
    let (mut p, mut m) = (t(&[1.0, 2.0, 3.0, 4.0]), t(&[0.0; 4]));
    // Before anything was given, nothing can be kept.
    let err = kept
        .run_donated(&[None, Some(&grads[0]), None], &ro)
        .unwrap_err();
    assert!(err.to_string().contains("input 'p' must be given"), "{err}");
    for (k, g) in grads.iter().enumerate() {
        // The host loop: feed p and m, take p_new and m_new back.
        let (outs, _) = fed.run(&[p.clone(), g.clone(), m.clone()], &ro).unwrap();
        let y_fed = outs[0].clone();
        p = outs[1].clone();
        m = outs[2].clone();
        // The kept loop: p and m given once, then left in the arena.
        let first = k == 0;
        let p0 = t(&[1.0, 2.0, 3.0, 4.0]);
        let m0 = t(&[0.0; 4]);
        let feed = if first {
            [Some(&p0), Some(g), Some(&m0)]
        } else {
            [None, Some(g), None]
        };
        let (outs, _) = kept.run_donated(&feed, &ro).unwrap();
        assert_eq!(outs[0].as_ref(), Some(&y_fed), "step {k}: y");
        assert!(
            outs[1].is_none() && outs[2].is_none(),
            "donated outputs are not copied"
        );
        assert_eq!(kept.read_input("p").as_ref(), Some(&p), "step {k}: p");
        assert_eq!(kept.read_input("m").as_ref(), Some(&m), "step {k}: m");
    }
    // Three steps moved p (the comparison above is not of a constant).
    assert_ne!(p, t(&[1.0, 2.0, 3.0, 4.0]));
}

#[test]
fn the_schedule_puts_each_update_after_its_inputs_readers() {
    // dx = g * p reads p; written in program order after p_new, so p would
    // be read after p_new is written. The scheduler orders the update
    // after that reader, and the pair is donated.
    let text = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[4] p, float[4] g) => (float[4] p_new, float[4] dx)
  <float lr = {0.5}> {
  s = Mul (g, lr)
  p_new = Sub (p, s)
  dx = Mul (g, p)
}"#;
    let mut m = graphopt_text::parse_model(text).unwrap();
    set_donations(&mut m, &[("p".to_string(), "p_new".to_string())]);
    let mp = plan_model(&m, &DimValues::default(), &PlanOptions::default()).unwrap();
    check_graph_plan(&mp.model.graph, &mp.plan).unwrap();
    assert_eq!(
        mp.plan.donated,
        vec![("p".to_string(), "p_new".to_string())]
    );
    let at = |op: &str| {
        mp.plan
            .schedule
            .iter()
            .position(|&n| {
                mp.model.graph.node(n).op_type == op && {
                    let o = mp.model.graph.node(n).output(0).unwrap();
                    let name = mp.model.graph.name(o);
                    name == if op == "Sub" { "p_new" } else { "dx" }
                }
            })
            .unwrap()
    };
    assert!(at("Mul") < at("Sub"), "{:?}", mp.plan.schedule_names);
    // Kept across runs, it gives what feeding p back does.
    let mut e = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let ro = RunOptions {
        threads: 1,
        poison: false,
    };
    let (p0, g) = (t(&[1.0, 2.0, 3.0, 4.0]), t(&[2.0, 2.0, 2.0, 2.0]));
    let (outs, _) = e.run_donated(&[Some(&p0), Some(&g)], &ro).unwrap();
    assert_eq!(
        outs[1].as_ref().unwrap().to_f32().unwrap(),
        vec![2.0, 4.0, 6.0, 8.0]
    );
    let (outs, _) = e.run_donated(&[None, Some(&g)], &ro).unwrap();
    // p is now p0 - 1: dx = 2 * (p0 - 1).
    assert_eq!(
        outs[1].as_ref().unwrap().to_f32().unwrap(),
        vec![0.0, 2.0, 4.0, 6.0]
    );
    // Handed over with write_input, the state needs no feeding; taken
    // out with take_input, it must be given again.
    e.write_input("p", &p0).unwrap();
    let (outs, _) = e.run_donated(&[None, Some(&g)], &ro).unwrap();
    assert_eq!(
        outs[1].as_ref().unwrap().to_f32().unwrap(),
        vec![2.0, 4.0, 6.0, 8.0]
    );
    let p = e.take_input("p").unwrap();
    assert_eq!(p.to_f32().unwrap(), vec![0.0, 1.0, 2.0, 3.0]);
    let err = e
        .run_donated(&[None, Some(&g)], &ro)
        .unwrap_err()
        .to_string();
    assert!(err.contains("input 'p' must be given"), "{err}");
    let bad = e.write_input("p", &t(&[1.0])).unwrap_err().to_string();
    assert!(
        bad.contains("input 'p' holds 4 bytes; float [4] takes 16"),
        "{bad}"
    );
}

/// An SGD step whose update is inside the weight gradient's Gemm
/// (`w_new = Gemm(x, dy, w, alpha = -lr, transA = 1)`, as
/// `fuse_gemm_update` writes it): planned in place over `w` at the Gemm
/// (its `Over(2)` rule), kept in the arena across runs, it gives the bits
/// of the same step planned without donation; `release_scratch` between
/// runs hands back the intermediates and leaves the weight alone.
#[test]
fn a_gemm_accumulates_its_update_in_place_over_the_donated_weight() {
    let text = r#"<ir_version: 8, opset_import: ["" : 17]>
g (float[32,64] x, float[32,64] dy, float[64,64] w) => (float[32,64] y, float[64,64] w_new) {
  y = MatMul (x, w)
  w_new = Gemm <alpha: float = -0.01, transA: int = 1> (x, dy, w)
}"#;
    let mut m = graphopt_text::parse_model(text).unwrap();
    set_donations(&mut m, &[("w".to_string(), "w_new".to_string())]);
    let planned = |donate: bool| {
        let opts = PlanOptions {
            donate,
            ..PlanOptions::default()
        };
        plan_model(&m, &DimValues::default(), &opts).unwrap()
    };
    let (mp, apart) = (planned(true), planned(false));
    check_graph_plan(&mp.model.graph, &mp.plan).unwrap();
    assert_eq!(
        mp.plan.donated,
        vec![("w".to_string(), "w_new".to_string())]
    );
    assert!(
        mp.plan.aliases.iter().any(|a| a.op_type == "Gemm"),
        "{:?}",
        mp.plan.aliases
    );
    assert_eq!(offset(&mp.plan, "w"), offset(&mp.plan, "w_new"));
    let ro = RunOptions {
        threads: 2,
        poison: false,
    };
    let fill = |n: usize, seed: u32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                    / (1u32 << 24) as f32
                    - 0.5
            })
            .collect()
    };
    let x = HostTensor::from_f32(&[32, 64], &fill(2048, 1));
    let mut w = HostTensor::from_f32(&[64, 64], &fill(4096, 2));
    let w0 = w.clone();
    let mut kept = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let mut fed = Executable::new(&apart.model, &apart.plan, &CpuBackend).unwrap();
    for step in 0..3u32 {
        let dy = HostTensor::from_f32(&[32, 64], &fill(2048, 10 + step));
        let (outs, _) = fed.run(&[x.clone(), dy.clone(), w.clone()], &ro).unwrap();
        let feed_w = (step == 0).then_some(&w0);
        let (k, _) = kept
            .run_donated(&[Some(&x), Some(&dy), feed_w], &ro)
            .unwrap();
        assert_eq!(k[0].as_ref(), Some(&outs[0]), "step {step}: y");
        w = outs[1].clone();
        kept.release_scratch();
        assert_eq!(kept.read_input("w").as_ref(), Some(&w), "step {step}: w");
    }
    assert_ne!(w, w0);
}

#[test]
fn outputs_left_in_place_are_taken_once_and_equal_the_copied_ones() {
    // `z` is an Identity of `y`: two outputs that may share bytes, so the
    // first taken must not hand back pages the second still reads.
    let text = STEP
        .replace(
            "=> (float[4] y, float[4] p_new, float[4] m_new)",
            "=> (float[4] y, float[4] p_new, float[4] m_new, float[4] z)",
        )
        .replace("y = Mul (p, g)\n", "y = Mul (p, g)\n  z = Identity (y)\n");
    let mp = plan(&text, true);
    assert_eq!(
        offset(&mp.plan, "y"),
        offset(&mp.plan, "z"),
        "z is a view of y"
    );
    let mut copied = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let mut held = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let ro = RunOptions {
        threads: 2,
        poison: false,
    };
    let err = held.take_outputs().unwrap_err();
    assert!(err.to_string().contains("no run has left"), "{err}");
    let (p, g, m) = (
        t(&[1.0, 2.0, 3.0, 4.0]),
        t(&[0.5, -1.0, 2.0, 0.25]),
        t(&[0.1, 0.2, 0.3, 0.4]),
    );
    let (want, _) = copied.run(&[p.clone(), g.clone(), m.clone()], &ro).unwrap();
    for _ in 0..2 {
        held.run_in_place(&[&p, &g, &m], &ro).unwrap();
    }
    let got = held.take_outputs().unwrap();
    assert_eq!(got, want);
    assert_eq!(got[0], got[3], "z is y");
    assert_ne!(got[1], p, "the step moved p");
    // Taken once; the arena's values are gone, a donated input included.
    assert!(held.take_outputs().is_err());
    let err = held.run_donated(&[None, Some(&g), None], &ro).unwrap_err();
    assert!(err.to_string().contains("input 'p' must be given"), "{err}");
    // Runs from fresh inputs give the same again.
    held.run_in_place(&[&p, &g, &m], &ro).unwrap();
    assert_eq!(held.take_outputs().unwrap(), want);
}

/// Outputs of several chunks each (4 MB), one a view of another: taken
/// chunk by chunk as their pages are handed back, they equal the copied
/// outputs; a call that changes the arena between the run and the take
/// (a donated run, a written input) leaves nothing to take.
#[test]
fn large_outputs_are_taken_chunk_by_chunk() {
    const N: usize = 1_000_003;
    let text = STEP
        .replace("float[4] m_new)", "float[4] m_new, float[4] z)")
        .replace("y = Mul (p, g)\n", "y = Mul (p, g)\n  z = Identity (y)\n")
        .replace("float[4]", &format!("float[{N}]"));
    let mp = plan(&text, true);
    assert_eq!(
        offset(&mp.plan, "y"),
        offset(&mp.plan, "z"),
        "z is a view of y"
    );
    let big = |seed: f32| {
        let v: Vec<f32> = (0..N).map(|i| ((i % 977) as f32) * 0.01 + seed).collect();
        HostTensor::from_f32(&[N], &v)
    };
    let (p, g, m) = (big(1.0), big(-0.5), big(0.25));
    let ro = RunOptions {
        threads: 2,
        poison: false,
    };
    let mut copied = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    let (want, _) = copied.run(&[p.clone(), g.clone(), m.clone()], &ro).unwrap();
    let mut held = Executable::new(&mp.model, &mp.plan, &CpuBackend).unwrap();
    for _ in 0..2 {
        held.run_in_place(&[&p, &g, &m], &ro).unwrap();
        let got = held.take_outputs().unwrap();
        assert!(got == want, "the taken outputs differ from the copied ones");
    }
    // A donated run between the run and the take: its outputs were not
    // left for taking.
    held.run_in_place(&[&p, &g, &m], &ro).unwrap();
    held.run_donated(&[Some(&p), Some(&g), Some(&m)], &ro)
        .unwrap();
    assert!(held.take_outputs().is_err());
    // Nor after an input was written over a donated output's bytes.
    held.run_in_place(&[&p, &g, &m], &ro).unwrap();
    held.write_input("p", &g).unwrap();
    assert!(held.take_outputs().is_err());
}
