"""cntkio.torch elastic resume (balanced_workers=True, shuffle=True): the states of every rank of one world size
and DataLoader worker count resume the epoch on another, and every sequence of the epoch is read exactly once
across the runs. Without PyTorch: MinibatchIterable with rank/world_size arguments, DataLoader workers
simulated."""

from __future__ import annotations

import json
import pickle
import random
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import cntkio.torch as ct
from cntkio import CTFDeserializer, MinibatchSource, StreamDef, StreamDefs, UsageError

from test_torch import keys, simulate_loader


def data(tmp_path: Path, n: int = 61, chunk: int = 90) -> CTFDeserializer:
    """`n` sequences of 1 to 4 rows (key i, values i), in several chunks."""
    rows = []
    for i in range(n):
        for r in range(1 + (i * 7) % 4):
            rows.append(f"{i} |a {i} {r}\n")
    p = tmp_path / "var.ctf"
    p.write_text("".join(rows))
    return CTFDeserializer(p, StreamDefs(a=StreamDef(field="a", shape=2)), chunkSizeInBytes=chunk)


N = 61
EPOCH = 1


def maker(
    d, rank: int, world: int, states: Any = None, num_workers: Optional[int] = None, **kw
) -> Callable[[], ct.MinibatchIterable]:
    def make() -> ct.MinibatchIterable:
        args: Dict[str, Any] = dict(batch_size=3, seed=7, balanced_workers=True)
        args.update(kw)
        it = ct.MinibatchIterable(d, rank=rank, world_size=world, **args)
        it.set_epoch(EPOCH)
        if states is not None:
            it.load_state_dict(states, num_workers=num_workers)
        return it

    return make


def old_run(d, world: int, workers: int, rng: random.Random, states: Any = None, old_workers: Optional[int] = None):
    """Every rank of `world` (with `workers` simulated DataLoader workers, 0: in process) reads a random number
    of batches; returns the keys each read and the states, taken as a training loop would."""
    read: List[int] = []
    out = []
    for rank in range(world):
        make = maker(d, rank, world, states, workers if states is not None else None)
        if workers == 0:
            it = make()
            gen = it.minibatches()
            n = rng.randrange(0, 8)
            taken = []
            for _ in range(n):
                mb = next(gen, None)
                if mb is None:
                    break
                taken.append(mb)
            state = it.state_dict()
            assert state["consumed"] == [sum(mb.num_sequences for mb in taken)]
            read += [k for b in keys(taken) for k in b]
        else:
            order = list(simulate_loader(make, workers))
            n = rng.randrange(0, len(order) + 1)
            state = make().state_dict(batches=n, num_workers=workers)
            per_worker = [sum(len(b) for w, b in order[:n] if w == v) for v in range(workers)]
            assert state["consumed"] == per_worker, (rank, n)
            read += [k for _, b in order[:n] for k in b]
        assert state["rank"] == rank and json.loads(json.dumps(state)) == state
        out.append(state)
    return read, out


def new_run(d, world: int, workers: int, states: Any) -> List[int]:
    read: List[int] = []
    for rank in range(world):
        make = maker(d, rank, world, states, workers)
        if workers == 0:
            read += [k for b in keys(make().minibatches()) for k in b]
        else:
            read += [k for _, b in simulate_loader(make, workers) for k in b]
    return read


def assert_once(read: List[int]) -> None:
    c = Counter(read)
    assert sorted(c) == list(range(N)), sorted(set(range(N)) - set(c))
    assert max(c.values()) == 1, [k for k, v in c.items() if v > 1]


# (world size, DataLoader workers; 0: in process) of the old and the new run.
CASES = [((2, 0), (3, 0)), ((4, 0), (2, 0)), ((3, 0), (1, 0)), ((1, 0), (4, 0)),
         ((2, 2), (3, 0)), ((1, 3), (2, 2)), ((2, 0), (1, 3)), ((3, 2), (2, 3))]


@pytest.mark.parametrize("old,new", CASES)
def test_every_sequence_once_on_another_world_size_and_worker_count(tmp_path, old, new):
    d = data(tmp_path)
    for seed in range(4):
        rng = random.Random(seed * 100 + old[0] * 10 + new[0])
        first, states = old_run(d, old[0], old[1], rng)
        rest = new_run(d, new[0], new[1], states)
        assert_once(first + rest)


def test_chained_elastic_resumes(tmp_path):
    d = data(tmp_path)
    for seed in range(5):
        rng = random.Random(seed)
        a, s1 = old_run(d, 2, 0, rng)
        b, s2 = old_run(d, 3, 0, rng, states=s1)
        assert all(s["elastic"] == [[c for s in s1 for c in s["consumed"]]] for s in s2)
        c, s3 = old_run(d, 2, 2, rng, states=s2)
        rest = new_run(d, 1, 0, s3)
        assert_once(a + b + c + rest)


def test_same_world_size_is_the_exact_resume(tmp_path):
    d = data(tmp_path)
    rng = random.Random(3)
    for workers in (0, 2):
        _, states = old_run(d, 3, workers, rng)
        for rank in range(3):
            by_list = maker(d, rank, 3, states, workers or None)
            by_own = maker(d, rank, 3, states[rank], workers or None)
            if workers == 0:
                assert keys(by_list().minibatches()) == keys(by_own().minibatches())
            else:
                assert list(simulate_loader(by_list, workers)) == list(simulate_loader(by_own, workers))


def test_a_resumed_run_checkpoints_and_resumes_exactly(tmp_path):
    """After an elastic resume, a state of the same world size resumes exactly (the base is kept)."""
    d = data(tmp_path)
    _, states = old_run(d, 2, 0, random.Random(1))
    make = maker(d, 0, 3, states)
    full = keys(make().minibatches())
    it = make()
    gen = it.minibatches()
    taken = [next(gen) for _ in range(min(2, len(full)))]
    state = it.state_dict()
    assert state["elastic"] == [[c for s in states for c in s["consumed"]]]
    assert state["consumed"] == [sum(mb.num_sequences for mb in taken)]
    again = maker(d, 0, 3, state)()
    assert keys(again.minibatches()) == full[len(taken):]
    back = pickle.loads(pickle.dumps(make()))
    assert keys(back.minibatches()) == full


def test_elastic_resume_needs_balanced_dealing_with_shuffle(tmp_path):
    d = data(tmp_path)
    _, states = old_run(d, 2, 0, random.Random(0))
    for kw in (dict(balanced_workers=False), dict(shuffle=False)):
        plain = [dict(s, shuffle=kw.get("shuffle", True)) for s in states]
        with pytest.raises(UsageError, match=r"needs balanced_workers=True\s+and shuffle=True"):
            maker(d, 0, 3, plain, **kw)()
    # One state of another world size.
    with pytest.raises(UsageError, match="give the list of every rank's state"):
        maker(d, 0, 3, states[0])()
    # Not every rank.
    with pytest.raises(UsageError, match=r"ranks \[0\]"):
        maker(d, 0, 3, states[:1])()
    # Counts beyond a partition's share are refused by the source, when loading.
    bad = [dict(s, consumed=[N]) for s in states]
    with pytest.raises(UsageError, match="consumed 61 sequences, but its share"):
        maker(d, 0, 3, bad)()
    # States of different checkpoints.
    with pytest.raises(UsageError, match="differ in epoch"):
        maker(d, 0, 3, [states[0], dict(states[1], epoch=0)])()
    # The source itself: elastic resume without balanced dealing.
    with pytest.raises(UsageError, match="balanced_workers=True and shuffle=True"):
        MinibatchSource(d, elastic_resume={"sweep": 0, "rounds": [[1, 1]]})
    with pytest.raises(UsageError, match="elastic_resume must be"):
        MinibatchSource(d, balanced_workers=True, elastic_resume={"rounds": [[1]], "x": 1})


def test_source_counts_and_plans_sequences(tmp_path):
    d = data(tmp_path)
    src = MinibatchSource(d, max_sweeps=1, balanced_workers=True, randomization_seed=3)
    assert src.sequences_delivered() == 0
    total = 0
    plan = src._plan_counts(8, 2, 1)
    for i, (state, count) in enumerate(plan):
        mb = src.next_minibatch(8, num_data_partitions=2, partition_index=1)
        total += mb.num_sequences
        assert src.sequences_delivered(0) == total == count, i
        assert json.loads(state)["position"] == src.get_checkpoint_state()["position"]
    assert total == N // 2
    # A rest dealt to three partitions: each its turn of the sequences left.
    rounds = [[3, total]]
    parts = []
    for r in range(3):
        s = MinibatchSource(d, max_sweeps=1, balanced_workers=True, randomization_seed=3,
                            elastic_resume={"sweep": 0, "rounds": rounds})
        got = []
        while True:
            mb = s.next_minibatch(9, num_data_partitions=3, partition_index=r)
            if not mb:
                break
            got += [int(k) for k in mb.sequence_keys]
        assert s.sequences_delivered() == len(got)
        parts.append(got)
    assert sum(len(p) for p in parts) == N - 3 - total
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    with pytest.raises(UsageError, match="only with balanced dealing"):
        MinibatchSource(d).sequences_delivered()


def test_gather_states_without_distributed(tmp_path):
    d = data(tmp_path)
    it = maker(d, 1, 2)()
    assert ct.gather_states(it) == [it.state_dict()]
    assert ct.gather_states(it, batches=0, num_workers=2) == [it.state_dict(batches=0, num_workers=2)]
    assert ct.gather_states({"version": 1}) == [{"version": 1}]
    with pytest.raises(UsageError, match="apply to a dataset"):
        ct.gather_states({"version": 1}, batches=3)
    with pytest.raises(UsageError, match="gather_states takes"):
        ct.gather_states(3)  # type: ignore[arg-type]
