//! The `graphopt` command built with the `mpi` feature, under its own name
//! so that the distributed tests can build it next to the plain command
//! (see `crates/cli/tests/distributed.rs`). Users build the command itself:
//! `cargo build --release --features mpi`.

fn main() -> std::process::ExitCode {
    graphopt_cli::process_main()
}
