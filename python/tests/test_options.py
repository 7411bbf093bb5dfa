"""Options accepted for CNTK compatibility: each works or logs that it has no effect (no silent no-op)."""

from __future__ import annotations

import logging
import pickle

import pytest

import cntkio
from cntkio import CBFDeserializer, CTFDeserializer, MinibatchSource, StreamDef, StreamDefs

STREAMS = StreamDefs(x=StreamDef(shape=1))
# sequence 1 has a bad value on its second row (several errors: the value, the row without a valid sample…)
TEXT = "0 |x 1\n1 |x 2\n1 |x z\n2 |x 3\n"


@pytest.fixture
def bad(tmp_path):
    p = tmp_path / "bad.ctf"
    p.write_text(TEXT)
    return p


def errors_of(path):
    return cntkio.validate(path, STREAMS, max_errors=100).num_errors


def keys(src):
    out = []
    while True:
        mb = src.next_minibatch(10)
        if not mb:
            return out
        out += mb.sequence_keys.tolist()


def test_max_errors_is_cntks_no_op_with_a_warning(bad, caplog):
    n = errors_of(bad)
    assert n > 1
    # As in CNTK 2.7, the source's max_errors does not reach the CTF parser: the first error is fatal.
    for kw in ({"max_errors": n}, {"maxErrors": n}):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cntkio"):
            src = MinibatchSource(CTFDeserializer(bad, STREAMS), randomize=False, max_sweeps=1, **kw)
        assert [r.levelno for r in caplog.records if f"d['maxErrors'] = {n}" in r.getMessage()] == [logging.WARNING]
        with pytest.raises(cntkio.FormatError, match="maxErrors = 0"):
            keys(src)
    # the deserializer's option is what tolerates errors
    assert keys(MinibatchSource(CTFDeserializer(bad, STREAMS, maxErrors=n), randomize=False, max_sweeps=1)) == [0, 1, 2]
    src = MinibatchSource(CTFDeserializer(bad, STREAMS, maxErrors=n), randomize=False, max_sweeps=1)
    assert keys(pickle.loads(pickle.dumps(src))) == [0, 1, 2]


def test_max_errors_with_cbf_logs(real, caplog):
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        src = MinibatchSource(CBFDeserializer(real / "cbf" / "Simple_dense.bin"), max_errors=3)
    assert src.num_sequences == 10000
    assert [r.levelno for r in caplog.records if "max_errors=3" in r.getMessage()] == [logging.WARNING]


def test_trace_level_logs_that_it_has_no_effect(bad, caplog, tmp_path):
    good = tmp_path / "good.ctf"
    good.write_text("0 |x 1\n1 |x 2\n")
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        MinibatchSource(CTFDeserializer(good, STREAMS))
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        MinibatchSource(CTFDeserializer(good, STREAMS), trace_level=2)
        MinibatchSource(CTFDeserializer(good, STREAMS), traceLevel=0)
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("trace_level=2" in m and "no effect" in m for m in msgs) == 1
    assert sum("trace_level=0" in m for m in msgs) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        data = CTFDeserializer(good, STREAMS, traceLevel=2).read()
        CTFDeserializer(good, STREAMS, trace_level=1).num_chunks
    assert data.num_sequences == 2
    msgs = [r.getMessage() for r in caplog.records]
    assert any("traceLevel=1" in m and "no effect" in m for m in msgs)


def test_multithreaded_deserializer_false_loads_on_the_calling_thread(tmp_path):
    p = tmp_path / "d.ctf"
    p.write_text("".join(f"{i} |x {i}\n" for i in range(50)))
    d = CTFDeserializer(p, STREAMS, chunkSizeInBytes=64)
    one = MinibatchSource(d, randomize=False, max_sweeps=1, multithreaded_deserializer=False)
    many = MinibatchSource(d, randomize=False, max_sweeps=1, multithreaded_deserializer=True)
    named = MinibatchSource(d, randomize=False, max_sweeps=1, multiThreadedDeserialization=False)
    a, b, c = keys(one), keys(many), keys(named)
    assert a == b == c == list(range(50))
    assert one._src.loader_threads() == 0 and named._src.loader_threads() == 0
    assert many._src.loader_threads() >= 1


def test_device_logs_once(tmp_path, caplog):
    p = tmp_path / "d.ctf"
    p.write_text("0 |x 1\n1 |x 2\n")
    src = MinibatchSource(CTFDeserializer(p, STREAMS), randomize=False)
    with caplog.at_level(logging.WARNING, logger="cntkio"):
        src.next_minibatch(1, device="gpu:0")
        mb = src.next_minibatch(1, device="gpu:0")
    assert mb.num_sequences == 1
    assert [r.getMessage().startswith("next_minibatch(device='gpu:0') has no effect") for r in caplog.records] == [True]
