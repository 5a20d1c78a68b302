//! Property tests: on random interval sets and random DAGs the checker
//! accepts every plan, the arena is never below the lower bound, and
//! reordering never raises the peak above the original order's.

mod common;
use common::B;
use graphopt_plan::{
    check_graph_plan, check_plan, plan_graph, plan_intervals, Buffer, IntervalOptions, PlanOptions,
};
use proptest::prelude::*;

fn buffers() -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((0i64..20, 0i64..8, 0u64..100), 0..24).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (lo, len, size))| Buffer::new(i as u64, lo, lo + len, size))
            .collect()
    })
}

/// A random DAG: node i reads one or two earlier values (or the input).
fn dag() -> impl Strategy<Value = Vec<(u8, usize, usize, i64)>> {
    prop::collection::vec((0u8..4, any::<usize>(), any::<usize>(), 1i64..64), 1..16)
}

fn build(spec: &[(u8, usize, usize, i64)]) -> B {
    let mut b = B::new();
    let x = b.input("x", 32);
    let mut vals = vec![x];
    let mut read = vec![false];
    for (i, &(op, p, q, n)) in spec.iter().enumerate() {
        let (pi, qi) = (p % vals.len(), q % vals.len());
        let (a, c) = (vals[pi], vals[qi]);
        let name = format!("n{i}");
        let v = match op {
            0 => b.node("Relu", &name, &[a], &format!("v{i}"), 32),
            1 => b.node("Add", &name, &[a, c], &format!("v{i}"), 32),
            2 => b.node("Reshape", &name, &[a], &format!("v{i}"), 32),
            _ => b.node("MatMul", &name, &[a, c], &format!("v{i}"), n),
        };
        read[pi] = true;
        read[qi] |= op == 1 || op == 3;
        vals.push(v);
        read.push(false);
    }
    // Unread values are outputs.
    for (v, r) in vals.iter().zip(&read) {
        if !r {
            b.output(*v);
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn interval_plans_are_valid(bufs in buffers(), align in prop::sample::select(vec![1u64, 4, 16])) {
        let opts = IntervalOptions { alignment: align, node_budget: 2_000, ..IntervalOptions::default() };
        let plan = plan_intervals(&bufs, &opts);
        prop_assert!(check_plan(&bufs, &plan.offsets, plan.arena, align, &[]).is_ok());
        prop_assert!(plan.arena >= plan.lower_bound);
        prop_assert!(plan.arena <= plan.greedy_arena);
    }

    #[test]
    fn graph_plans_are_valid(spec in dag(), align in prop::sample::select(vec![1u64, 64, 256])) {
        let b = build(&spec);
        let opts = PlanOptions { alignment: align, node_budget: 2_000, ..PlanOptions::default() };
        let plan = plan_graph(&b.g, &opts).unwrap();
        prop_assert!(check_graph_plan(&b.g, &plan).is_ok(), "{:?}", check_graph_plan(&b.g, &plan));
        prop_assert!(plan.arena_bytes >= plan.lower_bound_bytes);
        prop_assert!(plan.lower_bound_bytes <= plan.lower_bound_original_order_bytes);
        prop_assert!(plan.arena_bytes <= plan.naive_bytes);
        // Same input, same plan.
        prop_assert_eq!(&plan, &plan_graph(&b.g, &opts).unwrap());
    }
}
