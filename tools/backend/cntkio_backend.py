"""The package's PEP 517 build backend: maturin, after cargo has built the ``cntkio`` command.

The Python extension (``crates/cntkio-py``, built by maturin) does not link the command line; the
``cntkio`` console script and ``python -m cntkio`` run the command's own binary, which the wheel carries
as ``cntkio/_bin/cntkio`` (``cntkio.exe`` on Windows). maturin builds one crate, so this backend builds the
binary first — ``cargo rustc --release -p cntkio-cli --bin cntkio``, stripped as maturin strips the
extension — copies it to ``python/cntkio/_bin/`` (ignored by git) and hands over to maturin, whose
``include`` setting in ``pyproject.toml`` puts it in the wheel. Every other hook is maturin's own.

Builds that bypass this backend (``maturin build``, ``maturin develop``) make a package without the
command: ``python -m cntkio`` then says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Callable, Mapping, Optional

import maturin
from maturin import (  # noqa: F401  (PEP 517 hooks served by maturin as they are)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

BIN_DIR = os.path.join("python", "cntkio", "_bin")


def build_cli() -> str:
    """Builds the ``cntkio`` binary with cargo and copies it into the package; returns the copy's path."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if not cargo:
        sys.exit("cntkio: building the package needs cargo (a Rust toolchain >= 1.89) on the PATH")
    command = [cargo, "rustc", "--release", "-p", "cntkio-cli", "--bin", "cntkio", "--message-format"]
    command += ["json-render-diagnostics", "--", "-C", "strip=symbols"]
    print("Running `{}`".format(" ".join(command)), flush=True)
    # stdout: cargo's JSON messages, one of which names the binary; stderr (progress, errors) passes through.
    result = subprocess.run(command, stdout=subprocess.PIPE, check=False)
    if result.returncode != 0:
        sys.exit(f"cntkio: `{' '.join(command)}` failed with exit status {result.returncode}")
    built = None
    for line in result.stdout.decode(errors="replace").splitlines():
        message = json.loads(line) if line.startswith("{") else {}
        target = message.get("target", {})
        if message.get("reason") == "compiler-artifact" and target.get("name") == "cntkio":
            built = message.get("executable") or built
    if not built:
        sys.exit("cntkio: cargo built no `cntkio` binary")
    os.makedirs(BIN_DIR, exist_ok=True)
    copy = os.path.join(BIN_DIR, os.path.basename(built))
    shutil.copy2(built, copy)
    return copy


def _after_cli(hook: Callable[..., str]) -> Callable[..., str]:
    """maturin's wheel hook ``hook``, run once the binary is in place."""

    def build(
        wheel_directory: str,
        config_settings: Optional[Mapping[str, Any]] = None,
        metadata_directory: Optional[str] = None,
    ) -> str:
        build_cli()
        return hook(wheel_directory, config_settings, metadata_directory)

    return build


build_wheel = _after_cli(maturin.build_wheel)
build_editable = _after_cli(maturin.build_editable)
