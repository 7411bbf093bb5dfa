"""What the object-store tests share: the objects they put in a store, local servers started on free ports,
the store variables set for the test process while a server runs, the `cntkio` command, and the checks that
reading objects gives what reading their local files gives."""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Protocol

import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource
from test_convert_inspect import SLOTS, same

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
SLOTS_CLI = ["--stream", "word:13:sparse", "--stream", "intent:5:sparse", "--stream", "slot:12:sparse"]
LOGREG_CLI = ["--stream", "features:2:dense", "--stream", "labels:1:dense"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(command: List[str], probe: str, env: Optional[Dict[str, str]] = None) -> "subprocess.Popen[bytes]":
    """Starts the server `command` and waits until `probe`, one of its URLs, answers (with any status);
    raises if it exits first or has not answered within 60 s."""
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(probe, timeout=2).close()
            return proc
        except urllib.error.HTTPError as e:
            e.close()
            return proc  # it answers
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"{os.path.basename(command[0])} did not start: nothing answers {probe}")
            time.sleep(0.2)


def stop(proc: "subprocess.Popen[bytes]") -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def environment(variables: Dict[str, str]) -> Iterator[None]:
    """Sets `variables` in this process's environment (which its commands inherit), then restores it."""
    saved = {k: os.environ.get(k) for k in variables}
    try:
        os.environ.update(variables)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cli(*args: str, env: Optional[Dict[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "cntkio", *args], capture_output=True, text=True, env=env, timeout=300
    )


def keys(src: MinibatchSource, size: int) -> List[List[int]]:
    """The sequence keys of each minibatch of `size` samples that `src` gives until it ends."""
    out = []
    while True:
        mb = src.next_minibatch(size)
        if not mb:
            return out
        out.append([int(k) for k in mb.sequence_keys])


def big_ctf(path: Path, lines: int) -> None:
    """A CTF file of `lines` one-sample sequences of 64 dense values (about 250 bytes a line)."""
    tail = " ".join(str(j % 10) for j in range(63))
    path.write_text("".join(f"|x {i % 1000} {tail}\n" for i in range(lines)))


def sample(tmp: Path) -> Dict[str, Path]:
    """The objects a store's tests put in it, by key, each the local file it is made from (built in `tmp`):
    examples/data/logreg.ctf and slots.ctf, slots.cbf (several chunks) and slots.ctf.gz."""
    cbf = tmp / "slots.cbf"
    assert cntkio.convert(CTFDeserializer(EXAMPLES / "slots.ctf", SLOTS), cbf, chunk_size=2000)["chunks"] > 1
    gz = tmp / "slots.ctf.gz"
    gz.write_bytes(gzip.compress((EXAMPLES / "slots.ctf").read_bytes()))
    examples = {key: EXAMPLES / key for key in ["logreg.ctf", "slots.ctf"]}
    return {**examples, "dir/slots.cbf": cbf, "z/slots.ctf.gz": gz}


class Store(Protocol):
    """A store holding `sample`'s objects: `url` names one by its key, `local` maps each key to its file."""

    local: Dict[str, Path]

    def url(self, key: str) -> str: ...


def check_dumps(store: Store) -> None:
    """`cntkio dump` of each object prints what it prints for the local file (a gzip object: the plain file)."""
    cases = [("logreg.ctf", "logreg.ctf", LOGREG_CLI), ("slots.ctf", "slots.ctf", SLOTS_CLI)]
    cases += [("dir/slots.cbf", "dir/slots.cbf", []), ("z/slots.ctf.gz", "slots.ctf", SLOTS_CLI)]
    for key, plain, streams in cases:
        remote = cli("dump", store.url(key), *streams)
        local = cli("dump", str(store.local[plain]), *streams)
        assert remote.returncode == 0, remote.stderr
        assert local.returncode == 0 and local.stdout
        assert remote.stdout == local.stdout, key


def check_randomized_batches(store: Store) -> None:
    """`cntkio batches --randomize` over two sweeps of the CBF object gives the local file's minibatches."""
    args = ["--mb-size", "7", "--randomize", "--seed", "3", "--window-chunks", "2", "--max-sweeps", "2"]
    remote = cli("batches", store.url("dir/slots.cbf"), *args)
    local = cli("batches", str(store.local["dir/slots.cbf"]), *args)
    assert remote.returncode == 0, remote.stderr
    assert local.stdout.count('{"mb"') > 10
    assert remote.stdout == local.stdout


def check_python_readers(store: Store) -> None:
    """The Python deserializers read the objects' arrays, and a randomized MinibatchSource over the CBF
    object gives the local file's minibatches."""
    cbf = store.local["dir/slots.cbf"]
    same(CBFDeserializer(store.url("dir/slots.cbf")).read(), CBFDeserializer(cbf).read())
    same(CTFDeserializer(store.url("slots.ctf"), SLOTS).read(), CTFDeserializer(store.local["slots.ctf"], SLOTS).read())

    def source(path: object) -> MinibatchSource:
        return MinibatchSource(CBFDeserializer(path), randomization_window_in_chunks=2, randomization_seed=5, max_sweeps=2)

    got = keys(source(store.url("dir/slots.cbf")), 9)
    assert len(got) > 5
    assert got == keys(source(cbf), 9)


def check_missing_objects(store: Store) -> None:
    """A missing object, and one in a missing bucket, are I/O errors (exit 2, `NotFoundError`) naming it."""
    scheme = store.url("").split(":", 1)[0]
    for url in [store.url("nothing.ctf"), f"{scheme}://no-such-bucket/x.ctf"]:
        r = cli("dump", url, *LOGREG_CLI)
        assert r.returncode == 2, r.stderr
        assert url in r.stderr and "does not exist" in r.stderr, r.stderr
        with pytest.raises(cntkio.NotFoundError, match="does not exist"):
            CTFDeserializer(url, SLOTS).read()
