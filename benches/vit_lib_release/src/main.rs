//! Bench helper (issue 25): the library path of `graphopt optimize IN -o OUT` (load,
//! default pipeline up to 8 rounds, verify once, save) in release.
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let t0 = Instant::now();
    let mut loaded = graphopt_onnx::load(std::path::Path::new(&a[0])).expect("load");
    let t1 = Instant::now();
    let passes = graphopt_passes::default_pipeline();
    let mut mo = graphopt_passes::manager::ManagerOptions {
        verify: false,
        dump_filter: None,
        dump: None,
        dump_sink: None,
        max_rounds: 8,
        stop_after: None,
    };
    if a.get(2).map(|s| s.as_str()) != Some("none") {
        graphopt_passes::manager::run_pipeline(&mut loaded.model, &passes, &mut mo)
            .expect("passes");
    }
    graphopt_ir::verify::verify_model(&loaded.model).expect("verify");
    let t2 = Instant::now();
    let save = graphopt_onnx::SaveOptions {
        external: graphopt_onnx::ExternalData::Auto {
            input_used_external: loaded.info.used_external_data,
        },
        location: None,
    };
    graphopt_onnx::save(&loaded.model, std::path::Path::new(&a[1]), &save).expect("save");
    let t3 = Instant::now();
    eprintln!(
        "import {:.1} ms, passes+verify {:.1} ms, export {:.1} ms",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3,
        (t3 - t2).as_secs_f64() * 1e3
    );
}
