use super::*;
use graphopt_text::{parse_model, print_model, PrintOptions};

#[test]
fn parse_specs() {
    assert_eq!(
        Method::parse("cluster:4", 0.05).unwrap(),
        Method::Cluster {
            bits: 4,
            group: None
        }
    );
    assert_eq!(
        Method::parse("cluster:6:per-channel-groups=8", 0.05).unwrap(),
        Method::Cluster {
            bits: 6,
            group: Some(8)
        }
    );
    assert_eq!(
        Method::parse("lowrank", 0.05).unwrap(),
        Method::LowRank(Rank::Energy(DEFAULT_ENERGY))
    );
    assert_eq!(
        Method::parse("lowrank:0.9", 0.05).unwrap(),
        Method::LowRank(Rank::Energy(0.9))
    );
    assert_eq!(
        Method::parse("lowrank:64", 0.05).unwrap(),
        Method::LowRank(Rank::Fixed(64))
    );
    assert_eq!(
        Method::parse("lowrank:params=0.7", 0.05).unwrap(),
        Method::LowRank(Rank::Params(0.7))
    );
    assert_eq!(
        Method::parse("share", 0.02).unwrap(),
        Method::Share { tolerance: 0.02 }
    );
    for (spec, want) in [
        ("cluster:5", "bits must be 2, 3, 4, 6 or 8, not 5"),
        ("cluster", "expected cluster:BITS"),
        ("cluster:4:per-channel-groups=0", "per-channel-groups '0'"),
        ("lowrank:0", "the rank must be at least 1, not 0"),
        ("lowrank:-3", "the rank must be at least 1, not -3"),
        ("lowrank:1.5", "the energy must be in (0, 1], not 1.5"),
        ("lowrank:0.0", "the energy must be in (0, 1], not 0"),
        ("lowrank:params=1.2", "params must be a fraction in (0, 1)"),
        ("zip", "unknown method"),
    ] {
        let e = Method::parse(spec, 0.05).unwrap_err().0;
        assert!(e.starts_with(&format!("--compress {spec}: ")), "{e}");
        assert!(e.contains(want), "{spec}: {e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

/// The options a fixture's first line gives:
/// `# compress: METHOD [min=N] [exclude=OP]`.
fn options_from(src: &str) -> Compress {
    let line = src.lines().next().unwrap();
    let spec = line.strip_prefix("# compress: ").expect("a '# compress:' header");
    let mut words = spec.split_whitespace();
    let mut c = Compress {
        method: Method::parse(words.next().unwrap(), 0.05).unwrap(),
        ..Compress
    };
    for w in words {
        let (k, v) = w.split_once('=').unwrap();
        match k {
            "min" => c.min_weight_elems = v.parse().unwrap(),
            "exclude" => c.exclude.push(v.into()),
            _ => panic!("unknown fixture option {k}"),
        }
    }
    c
}

fn fixtures() -> Vec<std::path::PathBuf> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes/compress/modes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnxtxt"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

/// `testdata/passes/compress/modes/*.onnxtxt`: one fixture per method and
/// case, the report and the before→after diff snapshotted.
#[test]
fn mode_fixtures() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/passes/compress/modes");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(dir.join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let _guard = settings.bind_to_scope();
    let opts = PrintOptions::default();
    for f in fixtures() {
        let src = std::fs::read_to_string(&f).unwrap();
        let mut m = parse_model(&src).unwrap();
        let c = options_from(&src);
        graphopt_ir::verify::verify_model(&m).unwrap();
        let before = print_model(&m, &opts);
        let r = c.compress(&mut m).unwrap();
        let after = print_model(&m, &opts);
        let diff = similar::TextDiff::from_lines(&before, &after)
            .unified_diff()
            .context_radius(1000)
            .header("before", "after")
            .to_string();
        let layers: Vec<String> = r
            .layers
            .iter()
            .map(|l| {
                format!(
                    "{} [{}] {}: {} -> {} bytes, error {:.4}",
                    l.weight,
                    l.op,
                    l.detail,
                    l.bytes_before,
                    l.bytes_after,
                    l.weight_error
                )
            })
            .collect();
        let snap = format!(
            "method: {}\nlayers: {layers:#?}\nkept: {:?}\nwarnings: {:?}\nweight bytes: {} -> {}\nopset: {:?} -> {:?}\n\n{diff}",
            r.method,
            r.kept,
            r.warnings,
            r.weight_bytes_before,
            r.weight_bytes_after,
            r.opset_before,
            r.opset_after
        );
        let case = f.file_stem().unwrap().to_string_lossy().to_string();
        insta::assert_snapshot!(case.as_str(), snap);
    }
}

/// Compressing a fixture's output again with the same options changes
/// nothing: codebooks, indices and factors are not weights by rule 1
/// (below the size floor, or not float).
#[test]
fn compressing_twice_changes_nothing_more() {
    let opts = PrintOptions::default();
    for f in fixtures() {
        let src = std::fs::read_to_string(&f).unwrap();
        let mut m = parse_model(&src).unwrap();
        let c = options_from(&src);
        c.compress(&mut m).unwrap();
        let once = print_model(&m, &opts);
        let r = c.compress(&mut m).unwrap();
        let case = f.file_stem().unwrap().to_string_lossy().to_string();
        // lowrank's factors are weights too, but [K, r] at its own rank
        // saves nothing (r·(K+r) >= 0.8·K·r).
        assert!(r.layers.is_empty(), "{case}: {:?}", r.layers);
        assert_eq!(once, print_model(&m, &opts), "{case}");
    }
}
