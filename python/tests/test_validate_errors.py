"""cntkio.validate's error objects, the exception classes and their attributes, log forwarding."""

from __future__ import annotations

import errno
import json
import logging
import pickle
import subprocess
import sys

import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, StreamDef, StreamDefs

ATIS_LIKE = StreamDefs(query=StreamDef(field="S0", shape=943, is_sparse=True), slots=StreamDef(field="S2", shape=129, is_sparse=True))
BAD = (
    b"0 |S0 943:1 |# flights |S2 128:1\n0 |S0 3:1 |S2 1:1\n"
    b"1 |S0 7:1 |# from |S2 3,1\n1 |S0 5:1 |S2 4:1\n"
    b"2 |S0 5:1 |S2 4:1\n"
)
# the README's example: the bad samples leave sequences without a stream
EMPTY = b"0 |S0 943:1 |# flights |S2 128:1\n1 |S0 7:1 |# from |S2 3,1\n"


@pytest.fixture
def bad(tmp_path):
    p = tmp_path / "bad.ctf"
    p.write_bytes(BAD)
    return p


def test_validate_reports_every_error(bad):
    r = cntkio.validate(bad, ATIS_LIKE, max_errors=1)
    assert not r.valid and r.format == "ctf"
    assert r.verdict == "invalid: 2 error(s), more than maxErrors = 1"
    assert (r.sequences, r.samples, r.num_errors, r.dropped_sequences) == (3, 5, 2, 0)
    codes = [(e.code, e.kind, e.line, e.column) for e in r.errors]
    assert codes == [("E0015", "SparseIndexOutOfRange", 1, 7), ("E0016", "SparseMissingColon", 3, 24)]
    first = r.errors[0]
    assert first.path == str(bad) and first.byte == 6 and first.sequence_id == 0
    assert first.category == "format" and first.severity == "error"
    assert first.message == 'sparse index 943 >= dim 943 in stream "query"'
    assert first.help and "0-based" in first.help
    assert str(first) == f'{bad}:1:7: error[E0015]: sparse index 943 >= dim 943 in stream "query"'


def test_validate_sequences_without_a_stream(tmp_path):
    p = tmp_path / "empty.ctf"
    p.write_bytes(EMPTY)
    r = cntkio.validate(p, ATIS_LIKE, max_errors=10)
    assert not r.valid and r.dropped_sequences == 2
    assert [(e.code, e.line) for e in r.errors] == [("E0015", 1), ("E0021", 1), ("E0016", 2), ("E0021", 2)]
    assert r.errors[1].kind == "EmptyStream" and r.errors[1].sequence_id == 0


def test_validate_tolerated_and_valid(tmp_path, examples):
    p = tmp_path / "one_bad.ctf"
    p.write_bytes(b"|x 1\n|x 2,5 |x 7\n|x 3\n")
    streams = StreamDefs(x=StreamDef(shape=1))
    assert not cntkio.validate(p, streams).valid
    r = cntkio.validate(p, streams, max_errors=1)
    assert r.valid and r.num_errors == 1 and r.verdict.startswith("readable")
    ok = cntkio.validate(CTFDeserializer(examples / "logreg.ctf", StreamDefs(features=StreamDef(shape=2), labels=StreamDef(shape=1))))
    assert ok.valid and ok.errors == [] and ok.sequences == 300 and ok.verdict == "valid"


def test_validate_warnings(tmp_path):
    p = tmp_path / "short.ctf"
    p.write_bytes(b"|x 1 2 |y 5\n|x 1\n")
    r = cntkio.validate(p, StreamDefs(x=StreamDef(shape=2)), warnings=True)
    assert r.valid
    assert {w.code for w in r.warnings} >= {"W0001", "W0003"}
    assert all(w.severity == "warning" and w.line in (1, 2) for w in r.warnings)


def test_validate_real_invalid_inputs(real):
    r = cntkio.validate(
        real / "edge" / "invalid_inputs.ctf",
        StreamDefs(A=StreamDef(shape=1), B=StreamDef(shape=10, is_sparse=True)),
        max_errors=99999,
    )
    assert r.valid and r.num_errors == len(r.errors) > 10
    assert all(e.line is not None and e.column is not None and e.code.startswith("E") for e in r.errors)


def test_validate_cbf(real, tmp_path):
    assert cntkio.validate(real / "cbf" / "Simple_dense.bin").valid
    broken = tmp_path / "broken.bin"
    data = bytearray((real / "cbf" / "10x10_dense.bin").read_bytes())
    data[-8:] = (10**6).to_bytes(8, "little")  # header offset past the end
    broken.write_bytes(bytes(data))
    r = cntkio.validate(broken)
    assert not r.valid and r.format == "cbf"
    assert r.errors[0].code == "E0100" and r.errors[0].path == str(broken)


def test_validate_ctf_without_streams_uses_the_schema_its_rows_suggest(examples, tmp_path):
    r = cntkio.validate(examples / "logreg.ctf")
    assert r.valid and r.sequences == 300 and r.errors == []
    bad = tmp_path / "bad.ctf"
    bad.write_bytes(b"|a 1 2\n|a 1 x\n")
    r = cntkio.validate(bad)
    assert not r.valid and [(e.code, e.line) for e in r.errors][:1] == [("E0008", 2)]


def test_reading_with_a_misspelled_stream_names_the_inputs_the_file_has(tmp_path):
    p = tmp_path / "s.ctf"
    p.write_bytes(b"|features 1 2 |labels 0 1\n|features 3 4 |labels 1 0\n")
    misspelled = StreamDefs(featurs=StreamDef(shape=2), labels=StreamDef(shape=2))
    for read in (lambda: list(cntkio.Loader(paths=p, streams=misspelled, batch_size=2)),):
        with pytest.raises(cntkio.FormatError) as e:
            read()
        assert e.value.code == "E0032" and e.value.kind == "MissingInput"
        assert "input |featurs of the schema is in no row up to here; the rows have |features: did you mean |features?" in str(e.value)


def test_validate_explains_schema_mistakes_and_logs_them_once(tmp_path, caplog):
    p = tmp_path / "s.ctf"
    p.write_bytes(b"|features 1 2 |labels 0 1\n|features 3 4 |labels 1 0\n")
    misspelled = StreamDefs(featurs=StreamDef(shape=2), labels=StreamDef(shape=2))
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        r = cntkio.validate(p, misspelled)
    assert not r.valid
    assert r.verdict.startswith("invalid: input |featurs of the schema never appears in the file (did you mean |features?)")
    assert r.notes[0] == (
        'input |featurs of the schema (stream "featurs") never appears in the file; its rows have |features '
        "(2 samples), which the schema lacks: did you mean |features?"
    )
    logged = [rec.getMessage() for rec in caplog.records if rec.name == "cntkio"]
    assert sum("did you mean |features?" in m for m in logged) == 1
    # a dim larger than the data: valid, and the zero-filling is said, not silent
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        r = cntkio.validate(p, StreamDefs(features=StreamDef(shape=3), labels=StreamDef(shape=2)))
    assert r.valid and r.num_warnings == 2 and r.warnings == []
    assert r.notes == [
        'W0001: 2 sample(s) of stream "features" had fewer than 3 values (the first: 2) and were zero-filled, as '
        "CNTK does; check the stream's dim"
    ]
    assert any("zero-filled" in rec.getMessage() for rec in caplog.records)


# ---- exceptions ---------------------------------------------------------------------------------------


def test_format_error_attributes(bad):
    with pytest.raises(cntkio.FormatError) as e:
        CTFDeserializer(bad, ATIS_LIKE).read()
    exc = e.value
    assert isinstance(exc, cntkio.CntkError) and isinstance(exc, ValueError)
    assert (exc.code, exc.kind, exc.category) == ("E0022", "MaxErrorsReached", "format")
    assert (exc.path, exc.line, exc.column, exc.byte, exc.sequence_id) == (str(bad), 1, 7, 6, 0)
    assert str(exc).startswith(f"{bad}:1:7: error[E0022]: too many errors (maxErrors = 0)")
    assert exc.message.startswith("too many errors") and "E0015" in exc.message
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cntkio.FormatError and again.line == 1 and str(again) == str(exc)


def test_max_errors_tolerates(bad, tmp_path):
    d = CTFDeserializer(bad, ATIS_LIKE)
    d["maxErrors"] = 1
    with pytest.raises(cntkio.FormatError) as e:
        d.read()
    assert (e.value.code, e.value.line, e.value.column) == ("E0022", 3, 24)
    d["maxErrors"] = 2
    data = d.read()
    assert data.num_sequences == 3 and data["query"].lengths.tolist() == [1, 2, 1]
    assert data["slots"].lengths.tolist() == [2, 1, 1]
    empty = tmp_path / "empty.ctf"
    empty.write_bytes(EMPTY)
    with pytest.raises(cntkio.FormatError) as e:  # a sequence without a stream is fatal whatever maxErrors
        CTFDeserializer(empty, ATIS_LIKE, maxErrors=100).read()
    assert e.value.code == "E0021" and e.value.line == 1


def test_io_errors_are_oserrors(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        CTFDeserializer(tmp_path / "nope.ctf", StreamDefs(x=StreamDef(shape=1))).read()
    exc = e.value
    assert isinstance(exc, cntkio.NotFoundError) and isinstance(exc, cntkio.IoError) and isinstance(exc, cntkio.CntkError)
    assert exc.errno == errno.ENOENT and exc.code == "E2001" and exc.category == "io"
    assert exc.path == str(tmp_path / "nope.ctf")
    with pytest.raises(OSError):
        CBFDeserializer(tmp_path).num_chunks  # a directory


@pytest.mark.parametrize(
    "make",
    [
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef())),  # no shape
        lambda p: CTFDeserializer(p, {}),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(field="a", shape=1), y=StreamDef(field="a", shape=1))).read(),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(shape=1, defines_mb_size=True), y=StreamDef(shape=1, defines_mb_size=True))).read(),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(shape=1)), maxErrors=-1).read(),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(shape=1)), chunkSizeInBytes=0).read(),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(shape=1)), precision="half"),
        lambda p: CTFDeserializer(p, StreamDefs(x=StreamDef(shape=1)), randomize=True),
        lambda p: CBFDeserializer(p, maxErrors=1),
        lambda p: StreamDef(shape="big"),
    ],
)
def test_usage_errors(examples, make):
    with pytest.raises(cntkio.UsageError) as e:
        make(examples / "logreg.ctf")
    assert e.value.category == "usage" and isinstance(e.value, ValueError)


def test_duplicate_alias_code(examples):
    with pytest.raises(cntkio.UsageError) as e:
        CTFDeserializer(examples / "logreg.ctf", StreamDefs(x=StreamDef(field="a", shape=1), y=StreamDef(field="a", shape=1))).read()
    assert e.value.code == "E1003" and e.value.kind == "DuplicateAlias"


def test_typed_errors_name_their_kind_and_code(examples):
    src = cntkio.MinibatchSource(CTFDeserializer(examples / "logreg.ctf", StreamDefs(x=StreamDef(field="features", shape=2))))
    with pytest.raises(cntkio.UsageError) as e:
        src.restore_from_checkpoint({"version": 99})
    assert (e.value.code, e.value.kind, e.value.category) == ("E1007", "InvalidState", "usage")
    assert e.value.message.startswith("not a minibatch source state")


@pytest.mark.parametrize(
    "code,cls",
    [
        ("E0026", cntkio.FormatError),
        ("E0100", cntkio.FormatError),
        ("E1010", cntkio.UsageError),
        ("E3002", cntkio.LimitError),
        ("E9001", cntkio.InternalError),
    ],
)
def test_exception_class_follows_the_code(code, cls):
    from cntkio._errors import _from_native

    exc = _from_native({"code": code, "message": "m", "display": f"error[{code}]: m", "category": "usage"})
    assert type(exc) is cls and exc.code == code and str(exc) == f"error[{code}]: m"
    assert issubclass(cntkio.InternalError, (cntkio.CntkError, RuntimeError))


def test_rust_log_records_reach_logging(real, caplog):
    d = CBFDeserializer(real / "cbf" / "Simple_dense.bin", StreamDefs(x=StreamDef(field="no_such_stream")))
    with caplog.at_level(logging.WARNING):
        data = d.read()
    assert list(data) == ["features", "labels"]
    records = [r for r in caplog.records if "no_such_stream" in r.getMessage()]
    assert records and records[0].levelno == logging.WARNING and records[0].name.startswith("cntkio")


def test_validate_agrees_with_the_cli(tmp_path, bad):
    """cntkio.validate and `cntkio validate --json` are one library function: same verdicts and counts."""

    nothing = tmp_path / "nothing.ctf"
    nothing.write_bytes(b"0 |S2 1:1\n")  # no row mentions the main stream
    main = StreamDefs(query=StreamDef(field="S0", shape=943, is_sparse=True, defines_mb_size=True), slots=StreamDef(field="S2", shape=129, is_sparse=True))
    for path, streams, max_errors in [(bad, ATIS_LIKE, 1), (bad, ATIS_LIKE, 2), (nothing, main, 0)]:
        r = cntkio.validate(path, streams, max_errors=max_errors)
        argv = [sys.executable, "-m", "cntkio", "validate", str(path), "--json", "--max-errors", str(max_errors)]
        for name, s in streams.items():
            argv += ["--stream", f"{name}:{s['dim']}:{'sparse' if s['is_sparse'] else 'dense'}:{s['stream_alias']}"]
            if s["defines_mb_size"]:
                argv += ["--defines-mb-size", name]
        cli = json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)["files"][0]
        # One shape: the report as a dict is the command's JSON object for the file, field for field.
        assert r.to_dict() == cli
        assert (r.valid, r.num_errors, len(r.errors)) == (cli["valid"], cli["num_errors"], len(cli["errors"]))
    empty = cntkio.validate(nothing, main)
    assert not empty.valid and empty.sequences == 0
    assert empty.verdict == "invalid: no sequence found: no row mentions |S0 (the definesMBSize stream); check the alias"


def test_validate_report_is_the_cli_json_for_every_format(tmp_path, examples):
    """Inferred-schema CTF, CBF and Parquet: cntkio.validate(...).to_dict() is `cntkio validate --json`'s
    object for the file."""
    ctf = tmp_path / "t.ctf"
    ctf.write_text("0 |a 1 2 |b 3:1\n0 |a 1 x\n1 |a 3 4 |b 0:1\n")
    good = tmp_path / "good.ctf"
    good.write_text("0 |a 1 2 |b 3:1\n1 |a 3 4 |b 0:1\n")
    cbf = tmp_path / "good.cbf"
    cntkio.convert(good, cbf, StreamDefs(a=StreamDef(shape=2), b=StreamDef(shape=4, is_sparse=True)))
    for path in (ctf, cbf, examples / "slots.ctf"):
        r = cntkio.validate(path)
        argv = [sys.executable, "-m", "cntkio", "validate", str(path), "--json"]
        doc = json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)
        assert doc["version"] == 2
        assert r.to_dict() == doc["files"][0], path
    bad = cntkio.validate(ctf)
    assert bad.schema_inferred and bad.schema == ["a:2:dense", "b:4:sparse"] and not bad.valid
    assert bad.errors[0].code == "E0008" and bad.errors[0].sequence_id == 0
