"""The ``cntkio`` command line: ``python -m cntkio …`` or the ``cntkio`` console script.

Both run the ``cntkio`` binary the package carries (``cntkio/_bin``, built by cargo with the package), so
the command is the one ``cargo build -p cntkio-cli`` makes: the same output, exit statuses and signal
handling (Ctrl-C during a conversion removes its temporary output).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from typing import List, Sequence


def executable() -> str:
    """The path of the ``cntkio`` binary in the package."""
    name = "cntkio.exe" if os.name == "nt" else "cntkio"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            errno.ENOENT,
            "this installation of cntkio has no command line (built without its build backend, say by "
            "`maturin develop`); install the package with pip, which builds it",
            path,
        )
    return path


def _argv(args: Sequence[str]) -> List[str]:
    # The program name the command's usage and errors show, whatever the binary's path.
    return ["cntkio", *[str(a) for a in args]]


def run(args: Sequence[str]) -> int:
    """Runs the command line with ``args`` (without the program name) and returns its exit status
    (``-N`` when signal ``N`` ended it, as :mod:`subprocess` says).

    The command is a child process writing to this process's stdout and stderr (file descriptors 1 and 2),
    not to ``sys.stdout``. Ctrl-C (``KeyboardInterrupt``) interrupts it too, and is raised once it has
    ended (a conversion first removes its temporary output).
    """
    binary = executable()
    sys.stdout.flush()
    sys.stderr.flush()
    with subprocess.Popen(_argv(args), executable=binary) as child:
        try:
            return child.wait()
        except KeyboardInterrupt:
            if child.poll() is None and os.name == "posix":
                child.send_signal(signal.SIGINT)
            child.wait()
            raise


def main() -> int:
    """The console script: becomes the command (POSIX: ``exec``, so that its exit status and signals are
    this process's own); elsewhere runs it and returns its exit status."""
    try:
        binary = executable()
    except FileNotFoundError as e:
        print(f"cntkio: error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    if os.name == "posix":
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(binary, _argv(sys.argv[1:]))
    # Ctrl-C reaches the command (it shares the console); this process only waits for its status.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
