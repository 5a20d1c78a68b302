use super::*;

fn ew(shape: &[usize], d: DType) -> EwIn {
    EwIn {
        shape: shape.to_vec(),
        dtype: d,
    }
}

#[test]
fn collapse_merges_contiguous_dims_and_drops_ones() {
    let (d, s) = collapse(&[2, 1, 3, 4], &[vec![12, 12, 4, 1], vec![0, 0, 4, 1]]);
    assert_eq!(d, vec![2, 12]);
    assert_eq!(s, vec![vec![12, 1], vec![0, 1]]);
    let (d, _) = collapse(&[2, 3, 4], &[strides_of(&[2, 3, 4])]);
    assert_eq!(d, vec![24]);
}

#[test]
fn broadcast_strides_follow_numpy() {
    assert_eq!(
        broadcast_strides(&[3, 1], &[2, 3, 4]).unwrap(),
        vec![0, 1, 0]
    );
    assert_eq!(broadcast_strides(&[4], &[2, 3, 4]).unwrap(), vec![0, 0, 1]);
    assert!(broadcast_strides(&[5], &[2, 3, 4]).is_err());
}

#[test]
fn same_source_same_name_and_different_source_different_name() {
    let a = elementwise(
        "add",
        &[8],
        DType::F32,
        &[ew(&[8], DType::F32), ew(&[8], DType::F32)],
        "v0 + v1",
    )
    .unwrap();
    let b = elementwise(
        "add",
        &[8],
        DType::F32,
        &[ew(&[8], DType::F32), ew(&[8], DType::F32)],
        "v0 + v1",
    )
    .unwrap();
    let c = elementwise(
        "add",
        &[9],
        DType::F32,
        &[ew(&[9], DType::F32), ew(&[9], DType::F32)],
        "v0 + v1",
    )
    .unwrap();
    assert_eq!(a, b);
    assert_ne!(a.name, c.name);
    assert!(a.code.contains(&format!("void {}(", a.name)));
}

/// One kernel per family and dtype (the snapshots under `snapshots/`).
fn samples() -> Vec<(&'static str, Src)> {
    use DType::*;
    let conv = ConvShape {
        n: 2,
        c: 4,
        h: 8,
        w: 8,
        oc: 8,
        kh: 3,
        kw: 3,
        oh: 8,
        ow: 8,
        stride: [1, 1],
        pad: [1, 1],
        dilation: [1, 1],
        group: 1,
    };
    let pool = PoolShape {
        nc: 8,
        h: 8,
        w: 8,
        oh: 4,
        ow: 4,
        k: [3, 3],
        stride: [2, 2],
        pad: [1, 1],
        dilation: [1, 1],
        count_include_pad: false,
    };
    vec![
        (
            "elementwise_add_f32_broadcast",
            elementwise(
                "add",
                &[2, 3, 4],
                F32,
                &[ew(&[2, 3, 4], F32), ew(&[3, 1], F32)],
                "v0 + v1",
            )
            .unwrap(),
        ),
        (
            "elementwise_gelu_f16",
            elementwise(
                "gelu",
                &[64],
                F16,
                &[ew(&[64], F16)],
                "0.5f * v0 * (1 + erff(v0 * 0.7071067812f))",
            )
            .unwrap(),
        ),
        (
            "elementwise_where_bf16",
            elementwise(
                "where",
                &[2, 8],
                BF16,
                &[ew(&[1, 8], Bool), ew(&[2, 8], BF16), ew(&[], BF16)],
                "v0 ? v1 : v2",
            )
            .unwrap(),
        ),
        (
            "elementwise_cast_f32_i64",
            elementwise("cast", &[16], I64, &[ew(&[16], F32)], "v0").unwrap(),
        ),
        (
            "copy_transpose_u32",
            strided_copy("transpose", 4, &[2, 4, 3], &[12, 1, 4], 0, &[12, 3, 1], 0).unwrap(),
        ),
        (
            "copy_concat_u16",
            strided_copy("concat", 2, &[2, 3], &[3, 1], 0, &[5, 1], 2).unwrap(),
        ),
        ("gather_u32_i64", gather(4, I64, 1, 100, 6, 16).unwrap()),
        (
            "slice_dynamic_f32",
            slice_dynamic(4, &[4, 6], &[4, 3], 1, I64, Some(I64), None).unwrap(),
        ),
        (
            "reduce_mean_f32",
            reduce(&[2, 3, 4], F32, &[1], ReduceKind::Mean).unwrap(),
        ),
        (
            "reduce_max_f16",
            reduce(&[4, 32], F16, &[1], ReduceKind::Max).unwrap(),
        ),
        (
            "reduce_sum_i64",
            reduce(&[3, 5], I64, &[0, 1], ReduceKind::Sum).unwrap(),
        ),
        ("softmax_f32", softmax(F32, 8, 128, 1, false).unwrap()),
        (
            "logsoftmax_bf16_inner",
            softmax(BF16, 2, 10, 3, true).unwrap(),
        ),
        (
            "layernorm_f32_bias",
            layer_norm(F32, F32, 16, 768, 1e-5, true, false).unwrap(),
        ),
        (
            "layernorm_f16_stats",
            layer_norm(F16, F16, 16, 64, 1e-12, false, true).unwrap(),
        ),
        ("conv2d_f32_bias", conv2d(F32, &conv, true).unwrap()),
        (
            "conv2d_f16_grouped",
            conv2d(
                F16,
                &ConvShape {
                    group: 4,
                    oc: 4,
                    ..conv.clone()
                },
                false,
            )
            .unwrap(),
        ),
        ("maxpool_f32", pool2d(F32, &pool, true).unwrap()),
        ("avgpool_f16", pool2d(F16, &pool, false).unwrap()),
        ("fill_f32", fill(&1.5f32.to_le_bytes(), 10).unwrap()),
        ("range_i64", range(I64, 7).unwrap()),
    ]
}

#[test]
fn generated_sources_snapshots() {
    insta::assert_snapshot!("prelude", PRELUDE);
    for (name, src) in samples() {
        insta::assert_snapshot!(name, src.code);
    }
}

/// The snapshots (and the prelude) parse as C++ with the emulation's
/// stand-ins for CUDA's built-ins: a cheap check that NVRTC will at
/// least see well-formed code.
#[test]
fn generated_sources_parse_as_cpp() {
    if super::super::emulate::skip_without_gxx() {
        return;
    }
    let srcs: Vec<Src> = samples().into_iter().map(|s| s.1).collect();
    let dir = tempfile::tempdir().unwrap();
    super::super::emulate::gxx(
        &super::super::emulate::emulation_source(&srcs),
        dir.path(),
        &["-fsyntax-only"],
    )
    .unwrap();
}

#[test]
fn unsupported_dtypes_are_refused_not_generated() {
    assert!(softmax(DType::I64, 1, 4, 1, false).is_err());
    assert!(conv2d(
        DType::F64,
        &ConvShape {
            n: 1,
            c: 1,
            h: 1,
            w: 1,
            oc: 1,
            kh: 1,
            kw: 1,
            oh: 1,
            ow: 1,
            stride: [1, 1],
            pad: [0, 0],
            dilation: [1, 1],
            group: 1
        },
        false
    )
    .is_err());
    assert!(storage(DType::String).is_err());
}
