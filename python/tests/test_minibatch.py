"""MinibatchSource: the behaviours of CNTK 2.7's io_tests.py that concern CTF/CBF sources, written against
cntkio's API, plus READER.md's worked examples, argument rules, arrays, checkpoints and pickling."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from typing import List

import numpy as np
import pytest

import cntkio
from cntkio import (
    FULL_DATA_SWEEP,
    INFINITELY_REPEAT,
    CBFDeserializer,
    CTFDeserializer,
    MinibatchSource,
    StreamDef,
    StreamDefs,
    UsageError,
)

MBDATA_DENSE_1 = """0  |S0 0   |S1 0
0   |S0 1   |S1 1
0   |S0 2
0   |S0 3   |S1 3
1   |S0 4
1   |S0 5   |S1 1
1   |S0 6   |S1 2
"""

MBDATA_DENSE_2 = """0  |S0 0   |S1 0
0   |S0 1   |S1 1
0   |S0 2
0   |S0 3   |S1 3
0   |S0 4
0   |S0 5   |S1 1
0   |S0 6   |S1 2
"""

MBDATA_SPARSE = """0\t|x 560:1\t|y 1 0 0 0 0
0\t|x 0:1
0\t|x 0:1
1\t|x 560:1\t|y 0 1 0 0 0
1\t|x 0:1
1\t|x 0:1
1\t|x 424:1
"""

MBDATA_SPARSE1 = """0\t|x 560:1
0\t|x 0:1
0\t|x 0:1
1\t|x 560:1
1\t|x 0:1
1\t|x 0:1
1\t|x 424:1
"""

MBDATA_SPARSE2 = """0\t|y 1 0 0 0 0
1\t|y 0 1 0 0 0
"""

DENSE_STREAMS = StreamDefs(features=StreamDef(field="S0", shape=1), labels=StreamDef(field="S1", shape=1))
SPARSE_STREAMS = StreamDefs(
    features=StreamDef(field="x", shape=1000, is_sparse=True), labels=StreamDef(field="y", shape=5)
)


def write(tmp_path: Path, text: str, name: str = "mbdata.txt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def four_rows(tmp_path: Path) -> CTFDeserializer:
    """io_tests.py's create_ctf_deserializer: 4 one-sample sequences 1..4 (no ids, no final newline)."""
    p = write(tmp_path, "|S0 1\n|S0 2\n|S0 3\n|S0 4", "mbtest.txt")
    return CTFDeserializer(p, StreamDefs(features=StreamDef(field="S0", shape=1)))


def twenty_rows(tmp_path: Path) -> CTFDeserializer:
    """READER.md §3.6 / CTF.md §3: `i |a i -i |b (i mod 4):1`, 7 chunks of 64 bytes."""
    text = "".join(f"{i} |a {i} {-i} |b {i % 4}:1\n" for i in range(20))
    d = CTFDeserializer(
        write(tmp_path, text, "twenty.ctf"),
        StreamDefs(a=StreamDef(field="a", shape=2), b=StreamDef(field="b", shape=4, is_sparse=True)),
    )
    d["chunkSizeInBytes"] = 64
    return d


def twelve_rows(tmp_path: Path) -> CTFDeserializer:
    """READER.md §6 / §8.3: `i |a i`, i = 0…11, chunkSizeInBytes=16 (7 chunks)."""
    text = "".join(f"{i} |a {i}\n" for i in range(12))
    return CTFDeserializer(
        write(tmp_path, text, "twelve.ctf"), StreamDefs(a=StreamDef(field="a", shape=1)), chunkSizeInBytes=16
    )


def keys_of(src: MinibatchSource, size: int, **kw) -> List[List[int]]:
    out = []
    while True:
        mb = src.next_minibatch(size, **kw)
        if not mb:
            return out
        out.append([int(k) for k in mb.sequence_keys])


# ------------------------------------------------------------------------------------------------------------
# io_tests.py


def test_text_format(tmp_path):
    src = MinibatchSource(CTFDeserializer(write(tmp_path, MBDATA_SPARSE), SPARSE_STREAMS), randomize=False)
    assert isinstance(src, MinibatchSource)
    features_si = src.stream_info("features")
    labels_si = src.stream_info("labels")
    mb = src.next_minibatch(7)
    features = mb[features_si]
    assert features.shape == (2, 4, 1000)
    assert features.end_of_sweep
    assert features.num_sequences == 2
    assert features.num_samples == 7
    assert features.is_sparse
    labels = mb[labels_si]
    assert labels.shape == (2, 1, 5)
    assert labels.end_of_sweep
    assert labels.num_sequences == 2
    assert labels.num_samples == 2
    assert not labels.is_sparse
    np.testing.assert_array_equal(labels.asarray(), [[[1, 0, 0, 0, 0]], [[0, 1, 0, 0, 0]]])

    mb = src.next_minibatch(1)
    features, labels = mb[features_si], mb[labels_si]
    assert not features.end_of_sweep
    assert not labels.end_of_sweep
    assert features.num_samples < 7
    assert labels.num_samples == 1


def test_full_sweep_minibatch(tmp_path):
    src = MinibatchSource(
        CTFDeserializer(write(tmp_path, MBDATA_DENSE_1), DENSE_STREAMS), randomization_window_in_chunks=0, max_sweeps=1
    )
    mb = src.next_minibatch(1000)
    features = mb[src.stream_info("features")]
    labels = mb[src.stream_info("labels")]
    assert features.num_sequences == 2 and labels.num_sequences == 2
    assert features.end_of_sweep
    assert len(features.as_sequences()) == 2
    for res, exp in zip(features.as_sequences(), [[[0], [1], [2], [3]], [[4], [5], [6]]]):
        np.testing.assert_array_equal(res, exp)
    np.testing.assert_array_equal(features.data.mask, [[2, 1, 1, 1], [2, 1, 1, 0]])
    assert labels.end_of_sweep
    for res, exp in zip(labels.as_sequences(), [[[0], [1], [3]], [[1], [2]]]):
        np.testing.assert_array_equal(res, exp)
    np.testing.assert_array_equal(labels.data.mask, [[2, 1, 1], [2, 1, 0]])
    assert not src.next_minibatch(1000)


def test_max_samples(tmp_path):
    src = MinibatchSource(four_rows(tmp_path), max_samples=1)
    input_map = {"features": src["features"]}
    mb = src.next_minibatch(10, input_map)
    assert "features" in mb
    assert mb["features"].num_samples == 1
    assert not mb["features"].end_of_sweep
    assert not src.next_minibatch(10, input_map)


def test_max_sweeps(tmp_path):
    src = MinibatchSource(four_rows(tmp_path), max_sweeps=3)
    input_map = {"features": src["features"]}
    for _ in range(2):
        mb = src.next_minibatch(5, input_map)
        assert mb["features"].num_samples == 5
        assert mb["features"].end_of_sweep
    mb = src.next_minibatch(5, input_map)
    assert mb["features"].num_samples == 2
    assert mb["features"].end_of_sweep
    assert not src.next_minibatch(1, input_map)
    assert not src.next_minibatch(1)  # and it stays over


def test_max_samples_over_several_sweeps(tmp_path):
    src = MinibatchSource(four_rows(tmp_path), max_samples=11)
    input_map = {"features": src["features"]}
    for _ in range(2):
        mb = src.next_minibatch(5, input_map)
        assert mb["features"].num_samples == 5
        assert mb["features"].end_of_sweep
    mb = src.next_minibatch(5, input_map)
    assert mb["features"].num_samples == 1
    assert not mb["features"].end_of_sweep
    assert not src.next_minibatch(1, input_map)


def test_one_sweep(tmp_path):
    ctf = four_rows(tmp_path)
    sources = [
        MinibatchSource(ctf, max_sweeps=1),
        MinibatchSource(ctf, max_samples=FULL_DATA_SWEEP),
        MinibatchSource(ctf, max_sweeps=1, max_samples=INFINITELY_REPEAT),
        MinibatchSource(ctf, max_samples=FULL_DATA_SWEEP, max_sweeps=INFINITELY_REPEAT),
    ]
    for src in sources:
        input_map = {"features": src["features"]}
        mb = src.next_minibatch(100, input_map)
        assert mb["features"].num_samples == 4
        assert mb["features"].end_of_sweep
        assert not src.next_minibatch(100, input_map)


def test_random_seed(tmp_path):
    ctf = four_rows(tmp_path)
    sources = [
        MinibatchSource(ctf),
        MinibatchSource(ctf, randomization_seed=123),
        MinibatchSource(ctf, randomization_seed=0),
        MinibatchSource(ctf, randomization_seed=1),
    ]
    data = [s.next_minibatch(100, {"features": s["features"]})["features"].asarray() for s in sources]
    assert data[0].shape == (100, 1, 1)
    assert not (data[0] == data[1]).all()
    assert (data[0] == data[2]).all()
    # after the first sweep (4 samples) the first source is seeded with 1, as the last one
    assert (data[0][4:] == data[3][:-4]).all()


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("window", [dict(), dict(randomization_window_in_chunks=2), dict(
    randomization_window_in_chunks=0, randomization_window_in_samples=4)])
def test_sweep_k_of_seed_s_is_sweep_0_of_seed_s_plus_k(tmp_path, seed, window):
    d = twenty_rows(tmp_path)
    long_run = keys_of(MinibatchSource(d, max_sweeps=4, randomization_seed=seed, **window), 20)
    assert len(long_run) == 4
    for k in range(4):
        first = keys_of(MinibatchSource(d, max_sweeps=1, randomization_seed=seed + k, **window), 20)
        assert first == [long_run[k]]
        assert sorted(long_run[k]) == list(range(20))


def test_large_minibatch(tmp_path):
    src = MinibatchSource(
        CTFDeserializer(write(tmp_path, MBDATA_DENSE_2), DENSE_STREAMS), randomization_window_in_chunks=0
    )
    mb = src.next_minibatch(1000)
    features, labels = mb[src.stream_info("features")], mb[src.stream_info("labels")]
    assert features.end_of_sweep and labels.end_of_sweep
    assert features.num_samples == 1000 - 1000 % 7
    assert labels.num_samples == 5 * (1000 // 7)


def _assert_defined_by_labels(src: MinibatchSource) -> None:
    features_si, labels_si = src.stream_info("features"), src.stream_info("labels")
    mb = src.next_minibatch(2)
    features = mb[features_si]
    assert features.shape == (2, 4, 1000)
    assert features.end_of_sweep
    assert features.num_sequences == 2
    assert features.num_samples == 7
    assert features.is_sparse
    labels = mb[labels_si]
    assert labels.shape == (2, 1, 5)
    assert labels.end_of_sweep
    assert labels.num_sequences == 2
    assert labels.num_samples == 2
    assert not labels.is_sparse
    np.testing.assert_array_equal(labels.asarray(), [[[1, 0, 0, 0, 0]], [[0, 1, 0, 0, 0]]])
    mb = src.next_minibatch(3)
    assert mb[features_si].num_samples == 10
    assert mb[labels_si].num_samples == 3


def test_minibatch_defined_by_labels(tmp_path):
    streams = StreamDefs(
        features=StreamDef(field="x", shape=1000, is_sparse=True),
        labels=StreamDef(field="y", shape=5, defines_mb_size=True),
    )
    _assert_defined_by_labels(MinibatchSource(CTFDeserializer(write(tmp_path, MBDATA_SPARSE), streams), randomize=False))
    combined = MinibatchSource(
        [
            CTFDeserializer(write(tmp_path, MBDATA_SPARSE1, "1"), StreamDefs(features=streams.features)),
            CTFDeserializer(write(tmp_path, MBDATA_SPARSE2, "2"), StreamDefs(labels=streams.labels)),
        ],
        randomize=False,
    )
    assert [i.name for i in combined.stream_infos()] == ["features", "labels"]
    _assert_defined_by_labels(combined)


def test_prefetch_with_unpacking(tmp_path):
    text = "".join(f"{i} |S0 {' '.join([str(i % 3 + 1)] * 4)} |S1 {v}\n" for i, v in enumerate(
        [1000, 100, 100, 10, 1, 2000, 200, 200, 20, 2]))
    src = MinibatchSource(
        CTFDeserializer(write(tmp_path, text), StreamDefs(
            features=StreamDef(field="S0", shape=4), labels=StreamDef(field="S1", shape=1))),
        randomize=False,
        max_samples=FULL_DATA_SWEEP,
    )
    input_map = {"S0": src.streams.features, "S1": src.streams.labels}
    expected = np.array([[[1, 1, 1, 1]], [[2, 2, 2, 2]], [[3, 3, 3, 3]]], dtype=np.float32)
    n = 0
    while True:
        mb = src.next_minibatch(3, input_map=input_map)
        if not mb:
            break
        size = mb["S0"].shape[0]
        np.testing.assert_array_equal(mb["S0"].asarray(), expected[:size])
        n += size
    assert n == 10


INPUTS = [
    (MBDATA_DENSE_1, DENSE_STREAMS),
    (MBDATA_DENSE_2, DENSE_STREAMS),
    (MBDATA_SPARSE, SPARSE_STREAMS),
    (MBDATA_SPARSE1, StreamDefs(features=SPARSE_STREAMS.features)),
    (MBDATA_SPARSE2, StreamDefs(labels=SPARSE_STREAMS.labels)),
]


@pytest.mark.parametrize("case", range(len(INPUTS)))
def test_compare_cbf_and_ctf(tmp_path, case):
    text, streams = INPUTS[case]
    ctf_path = write(tmp_path, text)
    cntkio.convert(ctf_path, tmp_path / "data.bin", streams)
    for randomize in (False, True):
        for num_mbs, size in zip([1, 1, 3, 10], [1, 10, 100, 2]):
            ctf = MinibatchSource(CTFDeserializer(ctf_path, streams), randomize=randomize)
            cbf = MinibatchSource(CBFDeserializer(tmp_path / "data.bin"), randomize=randomize)
            names = sorted(i.name for i in ctf.stream_infos())
            assert names == sorted(i.name for i in cbf.stream_infos())
            for _ in range(num_mbs):
                a, b = ctf.next_minibatch(size), cbf.next_minibatch(size)
                for name in names:
                    x, y = a[name], b[name]
                    assert (x.num_samples, x.num_sequences, x.shape, x.end_of_sweep, x.is_sparse) == (
                        y.num_samples, y.num_sequences, y.shape, y.end_of_sweep, y.is_sparse)
                    np.testing.assert_array_equal(x.mask, y.mask)
                    np.testing.assert_array_equal(x.values, y.values)
                    np.testing.assert_array_equal(x.offsets, y.offsets)
                    if x.is_sparse:
                        np.testing.assert_array_equal(x.indices, y.indices)
                        np.testing.assert_array_equal(x.indptr, y.indptr)
                np.testing.assert_array_equal(a.sequence_lengths, b.sequence_lengths)


# ------------------------------------------------------------------------------------------------------------
# READER.md's worked examples


def test_worked_example_order(tmp_path):
    d = twenty_rows(tmp_path)
    assert d.num_chunks == 7
    order = [9, 13, 7, 12, 17, 14, 16, 1, 2, 4, 18, 10, 8, 15, 3, 11, 19, 5, 0, 6]
    src = MinibatchSource(d, max_sweeps=1)
    mbs = [src.next_minibatch(5) for _ in range(4)]
    assert [[int(k) for k in mb.sequence_keys] for mb in mbs] == [order[i:i + 5] for i in range(0, 20, 5)]
    assert [mb.end_of_sweep for mb in mbs] == [False, False, False, True]
    assert mbs[-1].end_of_run and not src.next_minibatch(5)
    a = mbs[0]["a"]
    np.testing.assert_array_equal(a.values, [[k, -k] for k in order[:5]])
    b = mbs[0]["b"].csr()
    np.testing.assert_array_equal(b.indices, [k % 4 for k in order[:5]])
    for window, expected in [
        (dict(randomization_window_in_chunks=1), "9 10 11 0 1 2 12 13 14 19 18 6 7 8 3 5 4 17 16 15"),
        (dict(randomization_window_in_chunks=2), "0 11 10 9 1 2 14 13 12 18 19 8 7 6 4 3 5 16 17 15"),
        (dict(randomization_window_in_chunks=0, randomization_window_in_samples=4),
         "9 10 11 0 1 2 12 13 14 19 18 7 8 6 3 5 4 17 16 15"),
    ]:
        assert keys_of(MinibatchSource(d, max_sweeps=1, **window), 20) == [[int(k) for k in expected.split()]]


def test_distributed_examples(tmp_path):
    d = twelve_rows(tmp_path)
    assert d.num_chunks == 7
    plain = [MinibatchSource(d, randomize=False, max_sweeps=1) for _ in range(2)]
    assert keys_of(plain[0], 4, num_data_partitions=2, partition_index=0) == [[0, 2], [4, 6], [8, 10]]
    assert keys_of(plain[1], 4, num_data_partitions=2, partition_index=1) == [[1, 3], [5, 7], [9, 11]]
    rand = [MinibatchSource(d, randomization_window_in_chunks=1, max_sweeps=1) for _ in range(2)]
    assert keys_of(rand[0], 4, num_data_partitions=2, partition_index=0) == [[6, 7], [9, 8], [5, 4], [10]]
    assert keys_of(rand[1], 4, num_data_partitions=2, partition_index=1) == [[0, 1], [11, 3], [2]]


def test_balanced_workers_deal_sequences(tmp_path):
    # cntkio's addition: 8 partitions over 7 chunks each get every 8th sequence of the single reader's order
    # (with CNTK's chunk dealing the last partition gets nothing); a pickled source keeps the option.
    d = twelve_rows(tmp_path)
    order = [k for mb in keys_of(MinibatchSource(d, max_sweeps=1, randomization_seed=5), 3) for k in mb]
    assert sorted(order) == list(range(12))
    for p in range(8):
        src = MinibatchSource(d, max_sweeps=1, randomization_seed=5, balanced_workers=True)
        got = [k for mb in keys_of(src, 3, num_data_partitions=8, partition_index=p) for k in mb]
        assert got == order[p::8], p
    cntk = MinibatchSource(d, max_sweeps=1, randomization_seed=5)
    assert keys_of(cntk, 3, num_data_partitions=8, partition_index=7) == []
    src = MinibatchSource(d, max_sweeps=1, randomization_seed=5, balanced_workers=True)
    first = [int(k) for k in src.next_minibatch(3, num_data_partitions=2, partition_index=1).sequence_keys]
    rest = [k for mb in keys_of(pickle.loads(pickle.dumps(src)), 3, num_data_partitions=2, partition_index=1) for k in mb]
    assert first + rest == order[1::2]


def test_partitions_cover_the_data_without_overlap(tmp_path):
    d = twenty_rows(tmp_path)
    for randomize in (False, True):
        for parts in (1, 2, 3, 5):
            seen: List[int] = []
            for p in range(parts):
                src = MinibatchSource(d, randomize=randomize, max_sweeps=1, randomization_seed=3)
                seen += [k for mb in keys_of(src, 6, num_data_partitions=parts, partition_index=p) for k in mb]
            assert sorted(seen) == list(range(20))


def test_partitions_may_change_between_calls(tmp_path):
    d = twenty_rows(tmp_path)
    src = MinibatchSource(d, max_sweeps=1)
    first = [int(k) for k in src.next_minibatch(5).sequence_keys]
    rest = keys_of(src, 10, num_data_partitions=2, partition_index=0)
    assert first == [9, 13, 7, 12, 17] and rest and not set(first) & {k for mb in rest for k in mb}


# ------------------------------------------------------------------------------------------------------------
# Checkpoints


def test_checkpoint_restore_continues_exactly(tmp_path):
    d = twenty_rows(tmp_path)
    for kw in (dict(randomization_seed=5, randomization_window_in_chunks=1), dict(randomize=False), dict()):
        full = MinibatchSource(d, max_sweeps=3, **kw)
        states, batches = [], []
        while True:
            states.append(full.get_checkpoint_state())
            mb = full.next_minibatch(4)
            if not mb:
                break
            batches.append([int(k) for k in mb.sequence_keys])
        for i in (1, 4, 7, len(batches) - 1):
            src = MinibatchSource(d, max_sweeps=3, **kw)
            src.restore_from_checkpoint(json.loads(json.dumps(states[i])))
            assert keys_of(src, 4) == batches[i:]
            assert states[i]["minibatchSourcePosition"] == states[i]["position"]


def test_cntk_checkpoint_and_restore_quirk(tmp_path):
    d = twelve_rows(tmp_path)
    kw = dict(randomization_window_in_chunks=1, randomization_seed=1, max_sweeps=1)
    assert keys_of(MinibatchSource(d, **kw), 3) == [[7, 6, 1], [0, 2, 3], [10, 8, 9], [5, 4, 11]]
    exact = MinibatchSource(d, **kw)
    exact.restore_from_checkpoint({"minibatchSourcePosition": 6})  # CNTK's own state dict
    assert keys_of(exact, 3) == [[10, 8, 9], [5, 4, 11]]
    quirk = MinibatchSource(d, cntk_restore_quirk=True, **kw)
    quirk.current_position = {"minibatchSourcePosition": 6}
    assert keys_of(quirk, 3) == [[10, 9, 8], [5, 4, 11]]


def test_checkpoint_errors(tmp_path):
    src = MinibatchSource(four_rows(tmp_path))
    other = MinibatchSource(twenty_rows(tmp_path))
    with pytest.raises(UsageError, match="samples per sweep"):
        src.restore_from_checkpoint(other.get_checkpoint_state())
    with pytest.raises(UsageError, match="version"):
        src.restore_from_checkpoint({**src.get_checkpoint_state(), "version": 2})
    with pytest.raises(UsageError):
        src.restore_from_checkpoint("not json")
    with pytest.raises(UsageError):
        src.restore_from_checkpoint([1, 2])
    src.restore_from_checkpoint(json.dumps(src.get_checkpoint_state()))


def test_pickle_continues(tmp_path):
    d = twenty_rows(tmp_path)
    src = MinibatchSource(d, max_sweeps=2, randomization_seed=9)
    src.next_minibatch(7)
    copy = pickle.loads(pickle.dumps(src))
    assert keys_of(copy, 7) == keys_of(src, 7)


# ------------------------------------------------------------------------------------------------------------
# Arguments


def test_randomization_arguments(tmp_path):
    d = twenty_rows(tmp_path)
    file_order = [list(range(20))]
    with pytest.raises(UsageError, match="mutually exclusive"):
        MinibatchSource(d, randomization_window_in_samples=100)
    assert not MinibatchSource(d, randomization_window_in_chunks=0).randomized
    assert keys_of(MinibatchSource(d, randomization_window_in_chunks=0, max_sweeps=1), 20) == file_order
    assert keys_of(MinibatchSource(d, randomize=False, max_sweeps=1), 20) == file_order
    # randomize=False wins over windows, as in CNTK (no error for both windows)
    s = MinibatchSource(d, randomize=False, randomization_window_in_samples=100, max_sweeps=1)
    assert not s.randomized and keys_of(s, 20) == file_order
    assert MinibatchSource(d, randomization_window_in_chunks=0, randomization_window_in_samples=4).randomized


def test_run_length_arguments(tmp_path):
    d = four_rows(tmp_path)
    with pytest.raises(UsageError, match="mutually exclusive"):
        MinibatchSource(d, max_samples=100, max_sweeps=3)
    assert not MinibatchSource(d, max_samples=0).next_minibatch(1)


def test_frame_mode_and_truncation(tmp_path):
    d = CTFDeserializer(write(tmp_path, MBDATA_DENSE_1), DENSE_STREAMS)
    with pytest.raises(UsageError, match="mutually exclusive"):
        MinibatchSource(d, frame_mode=True, truncation_length=10)
    assert MinibatchSource(four_rows(tmp_path), truncation_length=10).next_minibatch(10).bptt.columns == 10
    with pytest.raises(UsageError, match="truncationLength"):
        MinibatchSource(d, truncated=True)
    with pytest.raises(cntkio.FormatError, match="non-frame sequence") as e:
        MinibatchSource(d, frame_mode=True).next_minibatch(10)
    assert e.value.code == "E0023" and e.value.kind == "NonFrameSequence"
    frames = MinibatchSource(four_rows(tmp_path), frame_mode=True, max_sweeps=1)
    assert frames.next_minibatch(10).num_sequences == 4


def test_bad_arguments(tmp_path):
    d = four_rows(tmp_path)
    for kw in (dict(max_samples=-1), dict(randomization_seed=1.5), dict(frame_mode=1), dict(randomize="yes"),
               dict(randomization_window_in_chunks=True)):
        with pytest.raises(UsageError):
            MinibatchSource(d, **kw)
    with pytest.raises(UsageError):
        MinibatchSource([])
    with pytest.raises(UsageError):
        MinibatchSource({"type": "CNTKTextFormatDeserializer"})
    src = MinibatchSource(d)
    with pytest.raises(UsageError, match="> 0"):
        src.next_minibatch(0)
    with pytest.raises(UsageError):
        src.next_minibatch(True)
    with pytest.raises(UsageError, match="partition_index"):
        src.next_minibatch(4, num_data_partitions=2, partition_index=2)
    with pytest.raises(UsageError):
        src.next_minibatch(4, num_data_partitions=0)


def test_cntk_config_names(tmp_path):
    d = twenty_rows(tmp_path)

    def run(**kw):
        return keys_of(MinibatchSource(d, **kw), 7)

    assert run(randomizationWindow=1, maxSweeps=2) == run(randomization_window_in_chunks=1, max_sweeps=2)
    assert run(randomizationWindow=4, sampleBasedRandomizationWindow=True, maxSamples=30) == run(
        randomization_window_in_chunks=0, randomization_window_in_samples=4, max_samples=30)
    assert run(randomizationSeed=3, maxSweeps=1) == run(randomization_seed=3, max_sweeps=1)
    assert run(frameMode=True, maxSweeps=1, traceLevel=2, multiThreadedDeserialization=True, maxErrors=0) == run(
        frame_mode=True, max_sweeps=1)
    with pytest.raises(UsageError, match="requires"):
        MinibatchSource(d, sampleBasedRandomizationWindow=True)
    with pytest.raises(UsageError, match="unknown MinibatchSource argument 'randomisationWindow' \\(did you mean "
                       "'randomizationWindow'\\?\\)"):
        MinibatchSource(d, randomisationWindow=3)
    with pytest.raises(UsageError, match="'randomization_sed' \\(did you mean 'randomization_seed'\\?\\)"):
        MinibatchSource(d, randomization_sed=3)
    with pytest.raises(UsageError) as e:
        MinibatchSource(d, colour=3)
    assert "did you mean" not in str(e.value)
    # The deserializers' options likewise.
    with pytest.raises(UsageError, match="option 'chunkSizeInByte' \\(did you mean 'chunkSizeInBytes'\\?\\)"):
        d["chunkSizeInByte"] = 100
    with pytest.raises(UsageError, match="both given"):
        MinibatchSource(d, randomization_seed=1, randomizationSeed=2)


# ------------------------------------------------------------------------------------------------------------
# Streams, arrays


def test_streams(tmp_path):
    src = MinibatchSource(CTFDeserializer(write(tmp_path, MBDATA_SPARSE), SPARSE_STREAMS))
    infos = src.stream_infos()
    assert [(i.name, i.alias, i.dim, i.is_sparse, i.storage_format) for i in infos] == [
        ("features", "x", 1000, True, "sparse"), ("labels", "y", 5, False, "dense")]
    assert src.streams.features is src.streams["features"] == infos[0]
    assert src.stream_info("x") == infos[0] and src["labels"] == infos[1] and infos[1].m_name == "labels"
    with pytest.raises(KeyError):
        src.stream_info("nope")
    assert (src.sweep_size, src.num_sequences, src.num_chunks) == (7, 2, 1)


def test_arrays_shapes_and_dtypes(tmp_path):
    src = MinibatchSource(CTFDeserializer(write(tmp_path, MBDATA_SPARSE), SPARSE_STREAMS), randomize=False)
    mb = src.next_minibatch(7)
    assert len(mb) == 2 and mb.num_sequences == 2 and mb.num_samples == 7 and mb.end_of_sweep
    assert mb.sequence_keys.dtype == np.uint64 and mb.sequence_lengths.dtype == np.uint32
    f, lab = mb["features"], mb["labels"]
    assert f.values.dtype == np.float32 and f.values.shape == (3 + 4,)
    assert f.indices.dtype == np.int32 and f.indptr.dtype == np.int32 and f.offsets.dtype == np.int64
    assert f.csr().shape == (7, 1000) and f.csr().nnz == 7
    np.testing.assert_array_equal(f.lengths, [3, 4])
    np.testing.assert_array_equal(f.keys, [0, 1])
    dense, mask = f.padded()
    assert dense.shape == (2, 4, 1000) and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, [[True, True, True, False], [True] * 4])
    assert dense[0, 0, 560] == 1 and dense[1, 3, 424] == 1 and dense[0, 3].sum() == 0
    seqs = f.asarray()  # sparse: one CSR matrix per sequence, as CNTK
    assert [s.shape for s in seqs] == [(3, 1000), (4, 1000)]
    assert lab.values.shape == (2, 5) and lab.values.dtype == np.float32
    # dense sequences of one length: asarray() is a view of the array the reader filled
    assert np.shares_memory(lab.asarray(), lab.values) and lab.asarray().shape == (2, 1, 5)
    assert lab.values.flags.writeable and lab.values.flags.c_contiguous
    assert repr(mb).startswith("<Minibatch") and repr(f).startswith("<MinibatchData")
    double = CTFDeserializer(write(tmp_path, MBDATA_SPARSE), SPARSE_STREAMS, precision="double")
    mb = MinibatchSource(double, randomize=False).next_minibatch(7)
    assert mb["features"].dtype == np.float64 and mb["labels"].values.dtype == np.float64


def test_dense_padding(tmp_path):
    src = MinibatchSource(CTFDeserializer(write(tmp_path, MBDATA_DENSE_1), DENSE_STREAMS), randomize=False)
    f = src.next_minibatch(7)["features"]
    arr = f.asarray()
    assert arr.shape == (2, 4, 1) and arr[1, 3, 0] == 0
    np.testing.assert_array_equal(arr[:, :, 0], [[0, 1, 2, 3], [4, 5, 6, 0]])


def test_concat_shards(tmp_path):
    a = write(tmp_path, "".join(f"{i} |a {i}\n" for i in range(5)), "a.ctf")
    b = write(tmp_path, "".join(f"{i} |a {10 + i}\n" for i in range(3)), "b.ctf")
    streams = StreamDefs(a=StreamDef(field="a", shape=1))
    src = MinibatchSource([CTFDeserializer(a, streams), CTFDeserializer(b, streams)], concat=True, randomize=False,
                          max_sweeps=1)
    mb = src.next_minibatch(100)
    np.testing.assert_array_equal(mb["a"].values.ravel(), [0, 1, 2, 3, 4, 10, 11, 12])
    joined = MinibatchSource([CTFDeserializer(a, streams), CTFDeserializer(b, StreamDefs(
        c=StreamDef(field="a", shape=1)))], randomize=False, max_sweeps=1).next_minibatch(100)
    np.testing.assert_array_equal(joined["c"].values.ravel(), [10, 11, 12])
    np.testing.assert_array_equal(joined.sequence_keys, [0, 1, 2])


def test_threads_share_a_source(tmp_path):
    d = twenty_rows(tmp_path)
    src = MinibatchSource(d, max_sweeps=50)
    got: List[int] = []
    lock = threading.Lock()

    def read() -> None:
        while True:
            mb = src.next_minibatch(3)
            if not mb:
                return
            with lock:
                got.extend(int(k) for k in mb.sequence_keys)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(list(range(20)) * 50)


# ------------------------------------------------------------------------------------------------------------
# Real CNTK-made CBF files (testdata/real)


@pytest.mark.parametrize("name", ["10x10_dense", "10x10_sparse", "50x20_jagged_sequences_dense",
                                  "50x20_jagged_sequences_sparse", "Simple_dense"])
def test_real_cbf_files(real, name):
    d = CBFDeserializer(real / "cbf" / f"{name}.bin")
    whole = d.read()
    src = MinibatchSource(d, randomize=False, max_sweeps=1)
    mb = src.next_minibatch(src.sweep_size)
    assert mb.end_of_sweep and mb.end_of_run and not src.next_minibatch(1)
    np.testing.assert_array_equal(mb.sequence_keys, whole.sequence_keys)
    for s in whole:
        a, b = mb[s], whole[s]
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.offsets, b.offsets)
        if a.is_sparse:
            np.testing.assert_array_equal(a.indices, b.indices)
            np.testing.assert_array_equal(a.indptr, b.indptr)
    by_key = {int(k): i for i, k in enumerate(whole.sequence_keys)}
    shuffled = MinibatchSource(d, randomization_seed=2, max_sweeps=2)
    seen: List[int] = []
    while True:
        mb = shuffled.next_minibatch(7)
        if not mb:
            break
        for s in whole:
            for j, k in enumerate(mb.sequence_keys):
                got, want = mb[s].sequence(j), whole[s].sequence(by_key[int(k)])
                if mb[s].is_sparse:
                    got, want = got.toarray(), want.toarray()
                np.testing.assert_array_equal(got, want)
        seen += [int(k) for k in mb.sequence_keys]
    assert sorted(seen) == sorted(list(by_key) * 2)


def test_plan_matches_reading(tmp_path):
    """The checkpoints found from the index alone (used to resume PyTorch workers) are those of reading."""
    d = twenty_rows(tmp_path)
    for kw in (dict(randomization_seed=4), dict(randomize=False), dict(randomization_window_in_chunks=1)):
        for parts, index in ((1, 0), (3, 1), (3, 2)):
            src = MinibatchSource(d, max_sweeps=2, **kw)
            plan = src._plan(6, parts, index)
            states = []
            while src.next_minibatch(6, num_data_partitions=parts, partition_index=index):
                states.append(src.get_checkpoint_state())
            assert [json.loads(p) for p in plan] == [{k: v for k, v in s.items() if k != "minibatchSourcePosition"}
                                                     for s in states]
            assert src._plan(6, parts, index, limit=2) == plan[:2]
    with pytest.raises(UsageError, match="infinite"):
        MinibatchSource(d)._plan(6)
