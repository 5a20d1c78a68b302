use super::*;
use crate::manager::testing::{assert_pass, assert_unchanged};
use graphopt_text::parse_model;

#[test]
fn doc_example() {
    assert_pass(
        &UpgradeOpset,
        r#"
<ir_version: 6, opset_import: ["" : 11]>
g (float[2,3] x) => (float[2,1] y) {
  y = ReduceMean <axes = [1]> (x)
}
"#,
        r#"
<ir_version: 9, opset_import: ["" : 20]>
g (float[2,3] x) => (float[2,1] y) <int64[1] y_axes = {1}> {
  y = ReduceMean (x, y_axes)
}
"#,
    );
}

#[test]
fn target_17_keeps_reduce_mean_attribute() {
    assert_pass(
        &UpgradeOpset { target: 17 },
        r#"
<ir_version: 6, opset_import: ["" : 11]>
g (float[2,3] x) => (float[3,2] y) {
  a = ReduceMean <axes = [1]> (x)
  b = Unsqueeze <axes = [0]> (a)
  y = Softmax <axis = 1> (x)
}
"#,
        r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[3,2] y) <int64[1] b_axes = {0}> {
  a = ReduceMean <axes = [1]> (x)
  b = Unsqueeze (a, b_axes)
  y = Softmax <axis = 1> (x)
}
"#,
    );
}

#[test]
fn unknown_op_is_refused_and_model_left_alone() {
    let src = r#"
<ir_version: 6, opset_import: ["" : 9]>
g (float[1,3,2,2] x) => (float[1,3,2,2] y) {
  a = Unsqueeze <axes = [0]> (x)
  y = ImageScaler <scale = 2.0> (x)
}
"#;
    let mut m = parse_model(src).unwrap();
    let before = m.clone();
    let err = UpgradeOpset.run(&mut m).unwrap_err();
    assert!(err.0.contains("ImageScaler") && err.0.contains("'y'"), "{err}");
    assert_eq!(m, before);
}

#[test]
fn used_dropout_mask_is_refused() {
    let mut m = parse_model(
        r#"
<ir_version: 6, opset_import: ["" : 9]>
g (float[2] x) => (float[2] y, float[2] mask) {
  y, mask = Dropout <ratio = 0.1> (x)
}
"#,
    )
    .unwrap();
    let err = UpgradeOpset.run(&mut m).unwrap_err();
    assert!(err.0.contains("Dropout") && err.0.contains("mask"), "{err}");
}

#[test]
fn bad_targets() {
    let src = r#"
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y) {
  y = Relu (x)
}
"#;
    let mut m = parse_model(src).unwrap();
    assert!(UpgradeOpset { target: 99 }.run(&mut m).is_err());
    // At or above the target: nothing to do.
    assert_unchanged(&UpgradeOpset { target: 13 }, src);
    assert_unchanged(&UpgradeOpset { target: 17 }, src);
    let mut old = parse_model(&src.replace("\"\" : 17", "\"\" : 6")).unwrap();
    assert!(UpgradeOpset.run(&mut old).is_err());
}

#[test]
fn function_bodies_get_constant_nodes() {
    assert_pass(
        &UpgradeOpset { target: 13 },
        r#"
<ir_version: 7, opset_import: ["" : 11, "local" : 1]>
g (float[2] x) => (float[1,2] y) {
  y = local.f (x)
}
<domain: "local", opset_import: ["" : 11]>
f (a) => (b) {
  b = Unsqueeze <axes = [0]> (a)
}
"#,
        r#"
<ir_version: 7, opset_import: ["" : 13, "local" : 1]>
g (float[2] x) => (float[1,2] y) {
  y = local.f (x)
}
<domain: "local", opset_import: ["" : 13]>
f (a) => (b) {
  b_axes = Constant <value = int64[1] {0}> ()
  b = Unsqueeze (a, b_axes)
}
"#,
    );
}
