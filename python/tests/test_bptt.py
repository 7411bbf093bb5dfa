"""Truncated BPTT through the Python MinibatchSource (READER.md §5.3, CNTK's TruncatedBPTTPacker): the
worked example checked by hand, CNTK's Value form and the packed rows, checkpoints with the rows, pickling,
errors."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import cntkio
from cntkio import BpttLayout, CTFDeserializer, MinibatchSource, StreamDef, StreamDefs, UsageError

# Sequences 0..4 of 3, 1, 2, 4 and 1 samples; stream a dense (its value = the sample's number 1..11),
# b sparse dim 3.
WORKED = (
    "0 |a 1 |b 0:1\n0 |a 2 |b 1:1\n0 |a 3 |b 2:1\n1 |a 4 |b 0:1\n2 |a 5 |b 1:2\n2 |a 6 |b 2:2\n"
    "3 |a 7 |b 0:3\n3 |a 8 |b 0:3\n3 |a 9 |b 0:3\n3 |a 10 |b 0:3\n4 |a 11 |b 1:4\n"
)
STREAMS = StreamDefs(a=StreamDef(shape=1), b=StreamDef(shape=3, is_sparse=True))


def worked(tmp_path, **kw):
    p = tmp_path / "bptt.ctf"
    p.write_text(WORKED)
    args = dict(randomize=False, max_sweeps=1, truncation_length=2)
    args.update(kw)
    return MinibatchSource(CTFDeserializer(p, STREAMS), **args)


def drain(src, size=4, **kw):
    out = []
    while True:
        mb = src.next_minibatch(size, **kw)
        if not mb:
            return out
        out.append(mb)


def summary(mb):
    """(keys, fragments, a's values, end_of_sweep, end_of_run) of a minibatch."""
    return (
        mb.sequence_keys.tolist(),
        [tuple(f) for f in mb.bptt.fragments.tolist()],
        mb["a"].values.ravel().tolist(),
        mb.end_of_sweep,
        mb.end_of_run,
    )


# By hand (§5.3): M = 4, τ = 2 → P = 2 rows. mb0: row 0 fetches 0 (3 samples > τ, stop); row 1 fetches 1
# (1 ≤ τ) then 2 (3 > τ). Row 0 emits 0[0:2]; row 1 emits 1 and 2[0:1]. mb1: row 0 (1 left) fetches 3;
# row 1 (1 left) fetches 4, whose request reaches the sweep's end; row 0 emits 0[2:3], 3[0:1]; row 1 2[1:2],
# 4 — which ends in this minibatch, so end_of_sweep. mb2, mb3: row 0 emits 3[1:3], then 3[3:4]; the run
# ends with the rows empty.
WANT = [
    ([0, 1, 2], [(0, 0, 0, 3), (1, 0, 0, 1), (1, 1, 0, 2)], [1.0, 2.0, 4.0, 5.0], False, False),
    ([0, 3, 2, 4], [(0, 0, 2, 3), (0, 1, 0, 4), (1, 0, 1, 2), (1, 1, 0, 1)], [3.0, 7.0, 6.0, 11.0], True, False),
    ([3], [(0, 0, 1, 4)], [8.0, 9.0], False, False),
    ([3], [(0, 0, 3, 4)], [10.0], False, True),
]


def test_worked_example(tmp_path):
    src = worked(tmp_path)
    assert src.truncation_length == 2
    # every stream is delivered dense under BPTT
    assert [(i.name, i.is_sparse, i.dim) for i in src.stream_infos()] == [("a", False, 1), ("b", False, 3)]
    mbs = drain(src)
    assert [summary(mb) for mb in mbs] == WANT
    assert all(isinstance(mb.bptt, BpttLayout) and (mb.bptt.rows, mb.bptt.columns) == (2, 2) for mb in mbs)
    # the fragments' lengths are the minibatch's sequence lengths; num_samples counts the fragments' samples
    assert mbs[0].sequence_lengths.tolist() == [2, 1, 1] and mbs[0].num_samples == 4
    assert mbs[0]["a"].lengths.tolist() == [2, 1, 1]
    # sparse b densified: 0:1, 1:1 | 0:1 | 1:2
    b = mbs[0]["b"]
    assert not b.is_sparse and b.indices is None
    assert b.values.tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 2, 0]]
    layout = mbs[1].bptt
    assert layout.starts.tolist() == [False, True, False, True]
    assert layout.ends.tolist() == [True, False, True, True]
    assert layout.row.tolist() == [0, 0, 1, 1] and layout.column.tolist() == [0, 1, 0, 1]


def test_cntk_value_form(tmp_path):
    """asarray / mask / shape as CNTK's Value of a BPTT minibatch: one row per fragment, the time axis the
    truncation length, 2 only where a sequence begins in this minibatch."""
    mbs = drain(worked(tmp_path))
    a0 = mbs[0]["a"]
    assert a0.shape == (3, 2, 1)
    assert a0.asarray()[..., 0].tolist() == [[1, 2], [4, 0], [5, 0]]
    assert a0.mask.tolist() == [[2, 1], [2, 0], [2, 0]]
    a1 = mbs[1]["a"]
    assert a1.mask.tolist() == [[1, 0], [2, 0], [1, 0], [2, 0]]  # 0 and 2 continue, 3 and 4 begin
    a2 = mbs[2]["a"]
    assert a2.shape == (1, 2, 1) and a2.mask.tolist() == [[1, 1]]
    assert a2.asarray()[..., 0].tolist() == [[8, 9]]
    assert mbs[3]["a"].mask.tolist() == [[1, 0]]
    assert [s.ravel().tolist() for s in a1.as_sequences()] == [[3], [7], [6], [11]]


def test_packed_rows(tmp_path):
    mbs = drain(worked(tmp_path))
    values, mask = mbs[0]["a"].rows()
    assert values.shape == (2, 2, 1) and values.dtype == np.float32
    assert values[..., 0].tolist() == [[1, 2], [4, 5]]
    assert mask.tolist() == [[2, 1], [2, 2]] and mask.dtype == np.uint8
    values, mask = mbs[1]["a"].rows()
    assert values[..., 0].tolist() == [[3, 7], [6, 11]] and mask.tolist() == [[1, 2], [1, 2]]
    values, mask = mbs[3]["a"].rows()
    assert values[..., 0].tolist() == [[10, 0], [0, 0]] and mask.tolist() == [[1, 0], [0, 0]]
    b, _ = mbs[1]["b"].rows()
    assert b.shape == (2, 2, 3) and b[1, 1].tolist() == [0, 4, 0]  # sequence 4's 1:4
    assert mbs[1].bptt.mask().tolist() == [[1, 2], [1, 2]]
    plain = MinibatchSource(CTFDeserializer(tmp_path / "bptt.ctf", STREAMS), randomize=False).next_minibatch(4)
    assert plain.bptt is None and plain["a"].bptt is None
    with pytest.raises(UsageError, match="truncated BPTT"):
        plain["a"].rows()


def test_checkpoints_hold_the_rows(tmp_path):
    src = worked(tmp_path)
    want = drain(worked(tmp_path))
    states = []
    for _ in range(len(want)):
        states.append(src.get_checkpoint_state())
        src.next_minibatch(4)
    states.append(src.get_checkpoint_state())
    # after mb0, sequence 0 (1 sample left) and 2 are held: version 2 with the rows
    st = states[1]
    assert st["version"] == 2 and st["bptt"]["mb_size"] == 4
    assert [[(q["key"], q["samples"]) for q in r["sequences"]] for r in st["bptt"]["rows"]] == [[(0, 3)], [(2, 2)]]
    assert [r["cursor"] for r in st["bptt"]["rows"]] == [2, 1]
    assert states[0]["version"] == 1 and "bptt" not in states[0]
    for at, state in enumerate(states):
        fresh = worked(tmp_path)
        fresh.restore_from_checkpoint(json.loads(json.dumps(state)))
        assert [summary(mb) for mb in drain(fresh)] == [summary(mb) for mb in want[at:]], at
    # in place, and from the JSON text
    src.restore_from_checkpoint(json.dumps(states[2]))
    assert [summary(mb) for mb in drain(src)] == WANT[2:]


def test_randomized_restore_continues(tmp_path):
    """A larger randomized case over several sweeps: every restore point continues as the uninterrupted run."""
    p = tmp_path / "r.ctf"
    rng = np.random.default_rng(5)
    lines = []
    for sid in range(40):
        for _ in range(int(rng.integers(1, 7))):
            lines.append(f"{sid} |a {int(rng.integers(100))} |b {int(rng.integers(3))}:1")
    p.write_text("\n".join(lines) + "\n")

    def make():
        d = CTFDeserializer(p, STREAMS, chunkSizeInBytes=100)
        return MinibatchSource(d, randomization_window_in_chunks=3, randomization_seed=7, max_sweeps=2, truncation_length=3)

    full = [summary(mb) for mb in drain(make(), 7)]
    assert len(full) > 20 and any(mb[3] for mb in full)
    src = make()
    for at in range(0, len(full), 4):
        again = make()
        again.restore_from_checkpoint(src.get_checkpoint_state())
        assert [summary(mb) for mb in drain(again, 7)] == full[at:], at
        for _ in range(4):
            src.next_minibatch(7)


def test_pickle_keeps_truncation_and_rows(tmp_path):
    src = worked(tmp_path)
    src.next_minibatch(4)
    again = pickle.loads(pickle.dumps(src))
    assert again.truncation_length == 2
    assert [summary(mb) for mb in drain(again)] == WANT[1:]
    # CNTK's configuration names
    p = tmp_path / "bptt.ctf"
    named = MinibatchSource(CTFDeserializer(p, STREAMS), randomize=False, maxSweeps=1, truncated=True, truncationLength=2)
    assert [summary(mb) for mb in drain(named)] == WANT


def test_bptt_errors(tmp_path):
    p = tmp_path / "bptt.ctf"
    p.write_text(WORKED)
    d = CTFDeserializer(p, STREAMS)
    with pytest.raises(UsageError, match="mutually exclusive"):
        MinibatchSource(d, frame_mode=True, truncation_length=2)
    with pytest.raises(UsageError, match="Too many workers"):
        worked(tmp_path).next_minibatch(4, num_data_partitions=3, partition_index=0)
    uneven = tmp_path / "uneven.ctf"
    uneven.write_text("0 |a 1 |b 0:1\n0 |a 2\n")
    with pytest.raises(cntkio.CntkError, match="same length") as e:
        MinibatchSource(CTFDeserializer(uneven, STREAMS), randomize=False, truncation_length=2).next_minibatch(4)
    assert e.value.sequence_id == 0
    # a state with rows does not restore into a source without BPTT
    src = worked(tmp_path)
    src.next_minibatch(4)
    plain = MinibatchSource(d, randomize=False, max_sweeps=1)
    with pytest.raises(UsageError, match="does not use truncated BPTT"):
        plain.restore_from_checkpoint(src.get_checkpoint_state())
    with pytest.raises(UsageError, match="truncated-BPTT"):
        src._plan(4)


def test_workers_share_the_rows(tmp_path):
    """P = 4 // 1 = 4 rows dealt to 2 workers: 2 each; together they read every sample once per sweep."""
    seen = {}
    for rank in (0, 1):
        src = worked(tmp_path, truncation_length=1)
        for mb in drain(src, 4, num_data_partitions=2, partition_index=rank):
            assert mb.bptt.rows == 2 and mb.bptt.columns == 1
            for key, frag, v in zip(mb.sequence_keys.tolist(), mb.bptt.fragments.tolist(), mb["a"].values.ravel().tolist()):
                seen.setdefault(key, []).append((frag[2], v))
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert [v for k in sorted(seen) for _, v in sorted(seen[k])] == [float(x) for x in range(1, 12)]
