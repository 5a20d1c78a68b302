//! NCCL with one rank on one GPU: every collective of
//! `graphopt_exec::collective::nccl::Nccl`, on the device and through host
//! staging. Skips without a GPU and NCCL; fails instead with
//! `GRAPHOPT_REQUIRE_GPU=1` (benches/device/cuda_check.sh).

#![cfg(feature = "cuda")]

use graphopt_exec::collective::nccl::{unavailable, Nccl};
use graphopt_exec::collective::{Collective, Solo};

#[test]
fn nccl_one_rank_self_test() {
    if let Some(why) = unavailable() {
        graphopt_testutil::skip_or_fail(
            "nccl_one_rank_self_test",
            &why,
            graphopt_testutil::require_gpu(),
            "GRAPHOPT_REQUIRE_GPU=1",
        );
        return;
    }
    let n = Nccl::init(&Solo, 0).expect("NCCL starts on one GPU");
    assert_eq!((n.rank(), n.ranks(), n.engine()), (0, 1, "nccl"));
    let mut v = vec![1.5f32, -2.0, 3.25];
    n.all_reduce_sum(&mut v).unwrap();
    assert_eq!(v, [1.5, -2.0, 3.25]);
    let mut r = vec![0f32; 3];
    n.reduce_scatter_sum(&v, &mut r).unwrap();
    assert_eq!(r, v);
    let mut g = vec![0f32; 3];
    n.all_gather(&v, &mut g).unwrap();
    assert_eq!(g, v);
    let mut b = vec![7u8, 8, 9];
    n.broadcast(&mut b, 0).unwrap();
    assert_eq!(b, [7, 8, 9]);
    let mut bytes = vec![0u8; 2];
    n.all_gather_bytes(&[4, 5], &mut bytes).unwrap();
    assert_eq!(bytes, [4, 5]);
    n.barrier().unwrap();
    assert!(n.all_gather(&v, &mut [0f32; 2]).is_err());
    println!(
        "NCCL one-rank self-test: all-reduce, reduce-scatter, all-gather, broadcast, barrier ok"
    );
}
