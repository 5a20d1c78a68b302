//! Plans of small hand-built graphs, as insta snapshots of the JSON the CLI
//! prints, plus targeted checks.

mod common;
use common::B;
use graphopt_ir::{DType, Type};
use graphopt_plan::{check_graph_plan, plan_graph, PlanError, PlanOptions};

fn opts(alignment: u64) -> PlanOptions {
    PlanOptions {
        alignment,
        ..PlanOptions::default()
    }
}

/// x -> Conv-like MatMul -> Relu (in place) -> Reshape (view) -> MatMul -> y
fn chain() -> B {
    let mut b = B::new();
    let x = b.input("x", 256);
    let w = b.weight("w", 64);
    let a = b.node("MatMul", "mm1", &[x, w], "a", 512);
    let r = b.node("Relu", "relu", &[a], "r", 512);
    let s = b.node("Reshape", "reshape", &[r], "s", 512);
    let y = b.node("MatMul", "mm2", &[s, w], "y", 128);
    b.output(y);
    b
}

#[test]
fn chain_plan() {
    let b = chain();
    let plan = plan_graph(&b.g, &opts(64)).unwrap();
    check_graph_plan(&b.g, &plan).unwrap();
    assert_eq!(plan.weights_bytes, 256);
    // a, r, s share one buffer: x + a (1024 + 2048) is the peak.
    assert_eq!(plan.lower_bound_bytes, 3072);
    assert_eq!(plan.arena_bytes, 3072);
    assert_eq!(plan.aliases.len(), 2);
    insta::assert_snapshot!(serde_json::to_string_pretty(&plan).unwrap());
}

/// Two branches from one input; scheduling one branch to completion
/// before starting the other lowers the peak.
fn branches() -> B {
    let mut b = B::new();
    let x = b.input("x", 16);
    let a1 = b.node("Exp", "a1", &[x], "a1", 1024);
    let b1 = b.node("Exp", "b1", &[x], "b1", 1024);
    let a2 = b.node("ReduceSum", "a2", &[a1], "a2", 1);
    let b2 = b.node("ReduceSum", "b2", &[b1], "b2", 1);
    let y = b.node("Add", "add", &[a2, b2], "y", 1);
    b.output(y);
    b
}

#[test]
fn branches_reordered() {
    let b = branches();
    let plan = plan_graph(&b.g, &opts(4)).unwrap();
    check_graph_plan(&b.g, &plan).unwrap();
    assert!(plan.lower_bound_bytes < plan.lower_bound_original_order_bytes);
    assert_eq!(plan.lower_bound_original_order_bytes, 64 + 4096 * 2);
    insta::assert_snapshot!(serde_json::to_string_pretty(&plan).unwrap());
    let keep = plan_graph(
        &b.g,
        &PlanOptions {
            reorder: false,
            ..opts(4)
        },
    )
    .unwrap();
    assert_eq!(keep.schedule_names, ["a1", "b1", "a2", "b2", "add"]);
    assert_eq!(
        keep.lower_bound_bytes,
        keep.lower_bound_original_order_bytes
    );
}

#[test]
fn elementwise_needs_a_dying_input() {
    // x is read again later: Relu cannot overwrite it.
    let mut b = B::new();
    let x = b.input("x", 8);
    let a = b.node("Neg", "neg", &[x], "a", 8);
    let r = b.node("Relu", "relu", &[a], "r", 8);
    let s = b.node("Add", "add", &[r, a], "s", 8);
    b.output(s);
    let plan = plan_graph(&b.g, &opts(1)).unwrap();
    check_graph_plan(&b.g, &plan).unwrap();
    // relu keeps its own buffer (a lives on); add may take r or a.
    assert!(plan.aliases.iter().all(|a| a.op_type != "Relu"));
    assert_eq!(plan.aliases.len(), 1);
}

#[test]
fn unknown_sizes_are_reported() {
    let mut b = B::new();
    let x = b.input("x", 8);
    let o =
        b.g.add_value("o", Some(Type::tensor(DType::F32, None)))
            .unwrap();
    b.g.add_node(
        graphopt_ir::NewNode::new("Relu")
            .name("r")
            .inputs(&[x])
            .outputs(&[o]),
    )
    .unwrap();
    b.output(o);
    let strict = PlanOptions {
        strict: true,
        ..opts(1)
    };
    match plan_graph(&b.g, &strict) {
        Err(PlanError::UnknownSizes(v)) => assert_eq!(v, ["o"]),
        other => panic!("{other:?}"),
    }
    // By default it is a dynamic allocation outside the arena.
    let plan = plan_graph(&b.g, &opts(1)).unwrap();
    assert_eq!(plan.dynamic_values, ["o"]);
    assert!(plan.tensors.iter().all(|t| t.name != "o"));
    check_graph_plan(&b.g, &plan).unwrap();
}

#[test]
fn checker_rejects_a_corrupted_plan() {
    let b = chain();
    let mut plan = plan_graph(&b.g, &opts(64)).unwrap();
    let xi = plan.tensors.iter().position(|t| t.name == "x").unwrap();
    let ai = plan.tensors.iter().position(|t| t.name == "a").unwrap();
    plan.tensors[ai].offset = plan.tensors[xi].offset;
    assert!(check_graph_plan(&b.g, &plan).is_err());
    let mut plan = plan_graph(&b.g, &opts(64)).unwrap();
    plan.schedule.reverse();
    assert!(check_graph_plan(&b.g, &plan).is_err());
}

#[test]
fn peak_tensors_name_producers() {
    let b = chain();
    let plan = plan_graph(&b.g, &opts(64)).unwrap();
    let names: Vec<(&str, Option<&str>)> = plan
        .peak_tensors
        .iter()
        .map(|t| (t.name.as_str(), t.producer.as_deref()))
        .collect();
    assert_eq!(names, [("a", Some("mm1")), ("x", None)]);
}

/// A Scatter writes over its `data` input when that dies there (the
/// update rule), and only over `data`: not over updates of the same size,
/// nor over `data` that is read later or that also feeds another slot.
#[test]
fn scatter_writes_over_dying_data() {
    let scatter = |data_lives_on: bool, same_value: bool| {
        let mut b = B::new();
        let x = b.input("x", 64);
        let i = b.input("i", 64);
        let z = b.node("Neg", "zeros", &[x], "z", 64);
        let u = b.node("Relu", "upd", &[x], "u", 64);
        let upd = if same_value { z } else { u };
        let s = b.node("ScatterElements", "scatter", &[z, i, upd], "s", 64);
        let y = if data_lives_on {
            b.node("Add", "add", &[s, z], "y", 64)
        } else {
            b.node("Exp", "exp", &[s], "y", 64)
        };
        b.output(y);
        let plan = plan_graph(&b.g, &opts(4)).unwrap();
        check_graph_plan(&b.g, &plan).unwrap();
        plan.aliases
            .iter()
            .filter(|a| a.op_type == "ScatterElements")
            .map(|a| {
                (
                    plan.tensors[a.input].name.clone(),
                    plan.tensors[a.output].name.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(scatter(false, false), [("z".to_string(), "s".to_string())]);
    assert!(scatter(true, false).is_empty());
    assert!(scatter(false, true).is_empty());
}
