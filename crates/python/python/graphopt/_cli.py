"""The ``graphopt`` console script: the Rust CLI, run in this process."""

import signal
import sys


def main() -> None:
    """Runs the ``graphopt`` command (the same code as the Rust binary) and exits with its status."""
    # Behave as the binary does: Ctrl-C ends the process even while Rust
    # works, and a closed stdout pipe (`graphopt ... | head`) ends it quietly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from ._graphopt import cli_main

    sys.stdout.flush()
    sys.exit(cli_main(["graphopt", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
