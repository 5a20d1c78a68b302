//! The `graphopt` binary: [`graphopt_cli::main_with_args`] with the
//! process's arguments.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when stdout is a closed pipe
    // (`graphopt optimize ... | head`) instead of panicking in println!.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread
    // starts touches no Rust state.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let code = graphopt_cli::main_with_args(std::env::args_os());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
