"""The ``cntkio`` command line: ``python -m cntkio …`` or the ``cntkio`` console script."""

from __future__ import annotations

import signal
import sys
from typing import Sequence


def run(args: Sequence[str]) -> int:
    """Runs the command line with ``args`` (without the program name) and returns its exit status.

    The command runs in Rust with the GIL released and writes to the process's stdout and stderr
    (file descriptors 1 and 2), not to ``sys.stdout``.
    """
    from cntkio import _native

    sys.stdout.flush()
    sys.stderr.flush()
    return _native.run_cli(["cntkio", *[str(a) for a in args]])


def main() -> int:
    """The console script: runs the command line with ``sys.argv`` and returns its exit status."""
    # The commands run in Rust with the GIL released, where Python's KeyboardInterrupt cannot reach them;
    # let Ctrl-C stop the process as it stops the native binary.
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except (ValueError, AttributeError):  # not the main thread, or no SIGINT
        pass
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
