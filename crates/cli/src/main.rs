//! The `graphopt` binary: [`graphopt_cli::process_main`].

fn main() -> std::process::ExitCode {
    graphopt_cli::process_main()
}
