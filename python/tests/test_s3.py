"""Inputs in an object store: s3:// paths read from a local S3 server (moto_server, started here) give what
the local files give, through the command line and the Python readers; a missing object and refused
credentials are clear errors."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource
from fault_proxy import Fault, FaultProxy
from stores import (
    LOGREG_CLI,
    SLOTS_CLI,
    big_ctf,
    check_dumps,
    check_missing_objects,
    check_python_readers,
    check_randomized_batches,
    cli,
    environment,
    free_port,
    keys,
    sample,
    start_server,
    stop,
)
from test_convert_inspect import SLOTS, same

boto3 = pytest.importorskip("boto3", reason="moto[server] (the `test` extra) is not installed")

BUCKET = "data"


def start_moto(extra_env: Optional[Dict[str, str]] = None) -> "tuple[subprocess.Popen[bytes], str]":
    """Starts moto_server on a free port and waits until it answers; returns the process and its URL."""
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    if exe is None:
        pytest.skip("moto_server (moto[server], the `test` extra) is not installed")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return start_server([exe, "-H", "127.0.0.1", "-p", str(port)], url + "/moto-api/", extra_env), url


def aws_env(endpoint: str, key: str = "testing") -> Dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": key,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


class Server:
    def __init__(self, endpoint: str, local: Dict[str, Path]):
        self.endpoint = endpoint
        self.local = local

    def url(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A moto S3 server holding the `sample` objects in bucket `data`, with the AWS_* variables set for this
    process and its children while it runs."""
    local = sample(tmp_path_factory.mktemp("s3"))
    proc, endpoint = start_moto()
    try:
        with environment(aws_env(endpoint)):
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            for name, path in local.items():
                # Public: an http:// URL reads it with plain GETs (S3's own answers to unsigned requests).
                acl = "public-read" if name == "logreg.ctf" else "private"
                client.put_object(Bucket=BUCKET, Key=name, Body=path.read_bytes(), ACL=acl)
            yield Server(endpoint, local)
    finally:
        stop(proc)


def test_dump_of_an_object_equals_dump_of_the_file(s3: Server) -> None:
    check_dumps(s3)


def test_http_urls_read_objects(s3: Server) -> None:
    remote = cli("dump", f"{s3.endpoint}/{BUCKET}/logreg.ctf", *LOGREG_CLI)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == cli("dump", str(s3.local["logreg.ctf"]), *LOGREG_CLI).stdout


def test_validate_and_inspect_read_objects(s3: Server) -> None:
    v = cli("validate", s3.url("logreg.ctf"), *LOGREG_CLI)
    assert v.returncode == 0, v.stderr
    remote = cli("inspect", "--json", s3.url("dir/slots.cbf"))
    local = cli("inspect", "--json", str(s3.local["dir/slots.cbf"]))
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.replace(s3.url("dir/slots.cbf"), "X") == local.stdout.replace(
        str(s3.local["dir/slots.cbf"]), "X"
    )


def test_randomized_batches_from_an_object_equal_the_local_ones(s3: Server) -> None:
    check_randomized_batches(s3)


def test_python_readers_read_objects(s3: Server) -> None:
    check_python_readers(s3)


def test_a_missing_object_is_an_io_error_naming_it(s3: Server) -> None:
    check_missing_objects(s3)


def test_refused_credentials_are_a_clear_error(tmp_path: Path) -> None:
    # With INITIAL_NO_AUTH_ACTION_COUNT=0 moto checks every request's access key: ours is unknown to it.
    proc, endpoint = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        env = {**os.environ, **aws_env(endpoint, key="wrong")}
        r = cli("dump", f"s3://{BUCKET}/logreg.ctf", *LOGREG_CLI, env=env)
        assert r.returncode == 2, r.stderr
        assert f"s3://{BUCKET}/logreg.ctf" in r.stderr, r.stderr
        assert "permission denied" in r.stderr or "credentials were refused" in r.stderr, r.stderr
    finally:
        stop(proc)


def test_compressed_objects_read_as_the_plain_files(s3: Server, tmp_path: Path) -> None:
    """gzip, zstd (one frame), BGZF and seekable zstd objects: dump equals the plain file's, and randomized
    batches from the seekable ones (read by ranges of their blocks) equal the plain file's."""
    zstandard = pytest.importorskip("zstandard", reason="zstandard (the `test` extra) is not installed")
    import gzip

    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    cbf = s3.local["dir/slots.cbf"]
    plain = {"ctf": s3.local["slots.ctf"].read_bytes(), "cbf": cbf.read_bytes()}
    for kind, data in plain.items():
        client.put_object(Bucket=BUCKET, Key=f"z/slots.{kind}.gz", Body=gzip.compress(data))
        client.put_object(Bucket=BUCKET, Key=f"z/slots.{kind}.zst", Body=zstandard.ZstdCompressor().compress(data))
    for ext in ["bgz", "zst"]:
        out = tmp_path / f"slots.cbf.seekable.{ext}"
        cntkio.recompress(cbf, out)
        client.put_object(Bucket=BUCKET, Key=f"z/slots.cbf.seekable.{ext}", Body=out.read_bytes())

    want = {"ctf": cli("dump", str(s3.local["slots.ctf"]), *SLOTS_CLI).stdout, "cbf": cli("dump", str(cbf)).stdout}
    assert want["ctf"] and want["cbf"]
    for name, kind in [
        ("slots.ctf.gz", "ctf"),
        ("slots.ctf.zst", "ctf"),
        ("slots.cbf.gz", "cbf"),
        ("slots.cbf.zst", "cbf"),
        ("slots.cbf.seekable.bgz", "cbf"),
        ("slots.cbf.seekable.zst", "cbf"),
    ]:
        r = cli("dump", s3.url(f"z/{name}"), *(SLOTS_CLI if kind == "ctf" else []))
        assert r.returncode == 0, (name, r.stderr)
        assert r.stdout == want[kind], name

    args = ["--mb-size", "7", "--randomize", "--seed", "3", "--window-chunks", "2", "--max-sweeps", "2"]
    local = cli("batches", str(cbf), *args)
    assert local.returncode == 0 and local.stdout.count('{"mb"') > 10
    for ext in ["bgz", "zst"]:
        remote = cli("batches", s3.url(f"z/slots.cbf.seekable.{ext}"), *args)
        assert remote.returncode == 0, remote.stderr
        assert remote.stdout == local.stdout, ext
    same(CBFDeserializer(s3.url("z/slots.cbf.seekable.zst")).read(), CBFDeserializer(cbf).read())


@pytest.fixture(scope="module")
def proxy(s3: Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the moto server (no faults until a test injects them)."""
    p = FaultProxy(s3.endpoint)
    try:
        yield p
    finally:
        p.close()


def through(proxy: FaultProxy, **variables: str) -> Dict[str, str]:
    """The environment of a command that reaches the S3 server through the proxy."""
    return {**os.environ, **aws_env(proxy.url), **variables}


# Short timeouts, so that a test waits seconds rather than the default minute.
QUICK = {"CNTKIO_OBJECT_TIMEOUT": "1", "CNTKIO_OBJECT_RETRY_TIMEOUT": "3"}


@pytest.mark.parametrize(
    "fault",
    [
        Fault("status", status=500, times=2),
        Fault("status", status=503, times=3),
        Fault("status", status=503, method="HEAD", times=2),
        Fault("cut", times=2),
        Fault("delay", delay_s=3, times=1),
        Fault("delay", delay_s=3, method="HEAD", times=1),
    ],
    ids=["500-get", "503-get", "503-head", "cut-body", "timeout-get", "timeout-head"],
)
def test_transient_failures_are_retried(s3: Server, proxy: FaultProxy, fault: Fault) -> None:
    name = "dir/slots.cbf"
    local = cli("dump", str(s3.local[name]))
    proxy.inject(fault)
    remote = cli("dump", s3.url(name), env=through(proxy, **QUICK))
    assert fault.hits == fault.times, "the fault was injected"
    assert remote.returncode == 0, remote.stderr
    assert local.stdout and remote.stdout == local.stdout


def test_minibatches_survive_cut_bodies_and_errors(
    s3: Server, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    def source(path: object) -> MinibatchSource:
        return MinibatchSource(CBFDeserializer(path), randomization_window_in_chunks=2, randomization_seed=7, max_sweeps=2)

    expected = keys(source(s3.local["dir/slots.cbf"]), 9)
    faults = [Fault("cut", times=3), Fault("status", status=500, method="HEAD", times=1)]
    proxy.inject(*faults)
    for k, v in {**aws_env(proxy.url), **QUICK}.items():
        monkeypatch.setenv(k, v)
    assert keys(source(s3.url("dir/slots.cbf")), 9) == expected
    assert [f.hits for f in faults] == [3, 1]


@pytest.mark.parametrize(
    "fault",
    [
        Fault("status", status=503, times=None),
        Fault("status", status=500, method="HEAD", times=None),
        Fault("cut", times=None),
        Fault("delay", delay_s=4, times=None),
    ],
    ids=["503-get", "500-head", "cut-body", "timeout-get"],
)
def test_persistent_failures_end_with_an_error_naming_the_url(
    s3: Server, proxy: FaultProxy, fault: Fault, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = s3.url("dir/slots.cbf")
    settings = {"CNTKIO_OBJECT_TIMEOUT": "1", "CNTKIO_OBJECT_RETRY_TIMEOUT": "2"}
    proxy.inject(fault)
    start = time.monotonic()
    r = cli("dump", url, env=through(proxy, **settings))
    took = time.monotonic() - start
    assert fault.hits > 1, "the request was retried"
    assert r.returncode == 2, r.stderr
    assert url in r.stderr and "panicked" not in r.stderr, r.stderr
    # The retry budget (2 s) plus the last request's timeout and backoff, far below the 60 s default.
    assert took < 30, f"gave up after {took:.1f} s"
    for k, v in through(proxy, **settings).items():
        monkeypatch.setenv(k, v)
    fault.hits = 0
    with pytest.raises(cntkio.IoError, match="s3://data/dir/slots.cbf"):
        CBFDeserializer(url).read()
    assert fault.hits > 1


def test_bad_object_store_variables_are_usage_errors(s3: Server) -> None:
    r = cli("dump", s3.url("dir/slots.cbf"), env={**os.environ, "CNTKIO_OBJECT_RETRY_TIMEOUT": "soon"})
    assert r.returncode == 2, r.stderr
    assert "CNTKIO_OBJECT_RETRY_TIMEOUT" in r.stderr and "seconds" in r.stderr, r.stderr
    # A part size S3 would refuse stops a conversion to an object before it begins.
    env = {**os.environ, "CNTKIO_OBJECT_PART_SIZE": "1000"}
    r = cli("convert", str(s3.local["dir/slots.cbf"]), s3.url("out/never.ctf"), env=env)
    assert r.returncode == 2, r.stderr
    assert "CNTKIO_OBJECT_PART_SIZE" in r.stderr and "5242880" in r.stderr, r.stderr
    assert "sequences" not in r.stdout + r.stderr, "nothing was converted"


def object_bytes(s3: Server, key: str) -> bytes:
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    return bytes(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_conversions_to_an_object_equal_the_local_ones(
    s3: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setenv("CNTKIO_TMPDIR", str(spool))
    cases = [
        (["convert", s3.local["slots.ctf"], "{}", *SLOTS_CLI, "--chunk-size", "2000"], "out/slots.cbf"),
        (["convert", s3.local["dir/slots.cbf"], "{}"], "out/slots.ctf"),
        (["convert", s3.local["dir/slots.cbf"], "{}"], "out/slots.parquet"),
        (["convert", s3.local["dir/slots.cbf"], "{}"], "out/slots.ctf.zst"),
        (["recompress", s3.local["slots.ctf"], "{}"], "out/recompressed.ctf.gz"),
    ]
    for args, key in cases:
        local = tmp_path / key.replace("/", "_")
        run = [str(a).replace("{}", str(local)) for a in args]
        assert cli(*run).returncode == 0
        r = cli(*[str(a).replace("{}", s3.url(key)) for a in args])
        assert r.returncode == 0, r.stderr
        assert object_bytes(s3, key) == local.read_bytes(), key
    # What was written reads back from the store as the local file does.
    remote = cli("dump", s3.url("out/slots.cbf"))
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == cli("dump", str(tmp_path / "out_slots.cbf")).stdout
    # The Python conversion goes the same way.
    summary = cntkio.convert(CTFDeserializer(s3.local["slots.ctf"], SLOTS), s3.url("out/py.cbf"), chunk_size=2000)
    assert summary["chunks"] > 1
    cntkio.convert(CTFDeserializer(s3.local["slots.ctf"], SLOTS), tmp_path / "py.cbf", chunk_size=2000)
    assert object_bytes(s3, "out/py.cbf") == (tmp_path / "py.cbf").read_bytes()
    assert list(spool.iterdir()) == [], "the temporary files are removed"


def test_an_upload_failing_midway_leaves_nothing_at_the_key(
    s3: Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    ctf = tmp_path / "big.ctf"
    big_ctf(ctf, 60_000)  # a CBF of about 15 MiB: three parts of 5 MiB
    spool = tmp_path / "spool"
    spool.mkdir()
    env = through(proxy, **QUICK, CNTKIO_OBJECT_PART_SIZE=str(5 << 20), CNTKIO_TMPDIR=str(spool))
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")

    # A part refused every time: the upload is aborted and the key stays empty.
    fault = Fault("status", status=500, method="PUT", where="partNumber=2", times=None)
    proxy.inject(fault)
    url = s3.url("out/big.cbf")
    r = cli("convert", str(ctf), url, "--stream", "x:64:dense", env=env)
    assert fault.hits > 1, "the part was retried"
    assert r.returncode == 2, r.stderr
    assert url in r.stderr and "panicked" not in r.stderr, r.stderr
    with pytest.raises(client.exceptions.ClientError, match="404|Not Found"):
        client.head_object(Bucket=BUCKET, Key="out/big.cbf")
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == [], "the upload was aborted"
    assert list(spool.iterdir()) == [], "the temporary file is removed"
    assert sum(1 for m, p in proxy.requests if m == "PUT" and "partNumber=" in p) >= 3, "parts were sent"

    # A part refused twice is sent again, and the object is the whole file.
    fault = Fault("status", status=503, method="PUT", where="partNumber=2", times=2)
    proxy.inject(fault)
    local = tmp_path / "big.cbf"
    assert cli("convert", str(ctf), str(local), "--stream", "x:64:dense").returncode == 0
    assert local.stat().st_size > 2 * (5 << 20)
    r = cli("convert", str(ctf), url, "--stream", "x:64:dense", env=env)
    assert r.returncode == 0, r.stderr
    assert fault.hits == 2
    assert object_bytes(s3, "out/big.cbf") == local.read_bytes()


def test_an_interrupted_upload_is_aborted_and_leaves_nothing(s3: Server, proxy: FaultProxy, tmp_path: Path) -> None:
    from cntkio.__main__ import executable

    ctf = tmp_path / "big.ctf"
    big_ctf(ctf, 60_000)  # a CBF of about 15 MiB: three parts of 5 MiB
    spool = tmp_path / "spool"
    spool.mkdir()
    env = through(proxy, CNTKIO_OBJECT_PART_SIZE=str(5 << 20), CNTKIO_TMPDIR=str(spool))
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    # The second part hangs in the proxy: the upload is under way when the interrupt comes.
    fault = Fault("delay", delay_s=30, method="PUT", where="partNumber=2", times=1)
    proxy.inject(fault)
    url = s3.url("out/interrupted.cbf")
    args = [executable(), "convert", str(ctf), url, "--stream", "x:64:dense"]
    p = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if fault.hits or p.poll() is not None:
                break
            time.sleep(0.1)
        assert fault.hits == 1, "the second part was sent"
        p.send_signal(signal.SIGINT)
        # Well before the hanging part would be answered.
        _, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGINT, err
    assert "interrupted: stopping" in err and url in err and "panicked" not in err, err
    with pytest.raises(client.exceptions.ClientError, match="404|Not Found"):
        client.head_object(Bucket=BUCKET, Key="out/interrupted.cbf")
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == [], "the upload was aborted"
    assert list(spool.iterdir()) == [], "the temporary file is removed"


def test_an_objects_index_cache_is_kept_locally_and_keyed_on_its_etag(s3: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "CNTKIO_CACHE_DIR": str(cache), "RUST_LOG": "cntkio::ctf::cache=debug"}
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    lines = s3.local["logreg.ctf"].read_text().splitlines(keepends=True)
    key = "cached/logreg.ctf"
    client.put_object(Bucket=BUCKET, Key=key, Body="".join(lines).encode())
    args = ["dump", s3.url(key), *LOGREG_CLI, "--cache-index"]
    local = cli("dump", str(s3.local["logreg.ctf"]), *LOGREG_CLI).stdout

    first = cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == local
    written = sorted(p.name for p in cache.iterdir())
    assert len(written) == 1 and written[0].startswith("logreg.ctf-") and written[0].endswith(".idx"), written
    assert "using the index cache" not in first.stderr

    second = cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert "using the index cache" in second.stderr, second.stderr
    assert second.stdout == local

    # Replaced by other content of the same length: a new ETag, so the cache is not used.
    lines[0], lines[1] = lines[1], lines[0]
    client.put_object(Bucket=BUCKET, Key=key, Body="".join(lines).encode())
    third = cli(*args, env=env)
    assert third.returncode == 0, third.stderr
    assert "using the index cache" not in third.stderr, third.stderr
    swapped = tmp_path / "swapped.ctf"
    swapped.write_text("".join(lines))
    assert third.stdout != local and third.stdout == cli("dump", str(swapped), *LOGREG_CLI).stdout


def test_a_gzip_objects_seek_points_are_kept_locally_with_the_index_cache(s3: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "CNTKIO_CACHE_DIR": str(cache), "RUST_LOG": "cntkio::compress=debug"}
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    key = "cached/logreg.ctf.gz"
    client.put_object(Bucket=BUCKET, Key=key, Body=gzip.compress(s3.local["logreg.ctf"].read_bytes()))
    args = ["dump", s3.url(key), *LOGREG_CLI, "--cache-index"]
    local = cli("dump", str(s3.local["logreg.ctf"]), *LOGREG_CLI).stdout

    first = cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == local
    assert "seek points kept in" in first.stderr, first.stderr
    assert any(p.name.endswith(".cntkio-points.idx") for p in cache.iterdir()), list(cache.iterdir())

    second = cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == local
    assert "seek points from" in second.stderr and "decompressing to the end" not in second.stderr, second.stderr

    # Replaced (a new ETag): the points are not used, and are written again.
    client.put_object(Bucket=BUCKET, Key=key, Body=gzip.compress(s3.local["logreg.ctf"].read_bytes(), 1))
    third = cli(*args, env=env)
    assert third.returncode == 0, third.stderr
    assert third.stdout == local
    assert "seek points from" not in third.stderr and "seek points kept in" in third.stderr, third.stderr
