#!/usr/bin/env python3
"""Generate the differential fixtures of crates/cntkio/tests/shuffle.rs from the Python model of CNTK 2.7's
randomizers (testdata/model/readerref.py, READER.md §3-§8).

    python3 tools/gen_shuffle_fixtures.py [--readerref DIR] [--cases N] [--seed S] [--out FILE]

Each output line is one JSON case:

    {"id": 7,
     "chunks": [[L, L, ...], ...],          # declared length of every sequence, chunk by chunk
     "key_base": K,                         # key of global sequence g (file order) = K + 7*g
     "randomize": true,                     # BlockRandomizer (true) or NoRandomizer (false)
     "window": ["chunks", W] | ["samples", W],
     "seed": S, "seek_quirk": false,        # randomization seed, readerref's seek_bug
     "runs": [[op, ...], ...]}              # one fresh enumerator per run (e.g. one per worker rank)

and the ops, each followed by the model's output:

    ["start", epoch_size, epoch_index, workers, rank, sweeps|null, cross, state_after]
    ["next", global, local, [g, ...], end_of_sweep, end_of_epoch, state_after]
    ["set", position, state_after]

where [g, ...] are the delivered sequences as global sequence indices (file order). The Rust test needs no
Python; rerun this script only when the model changes, and commit its output.
"""
import argparse, json, os, random, sys

from testdata import testdata_dir  # tools/testdata.py, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SIZE_MAX = (1 << 64) - 1
REQUEST_DATA_SIZE = SIZE_MAX >> 2


class Source:
    """The chunk/sequence structure of a case, as readerref's deserializer interface."""

    def __init__(self, lens, key_base, ChunkInfo):
        self.lens = lens
        self.key_base = key_base
        self.offsets = []
        g = 0
        for c in lens:
            self.offsets.append(g)
            g += len(c)
        self.infos = [ChunkInfo(i, sum(c), len(c)) for i, c in enumerate(lens)]

    def chunk_infos(self):
        return self.infos

    def seqs(self, cid):
        return [(k, L, self.key(self.offsets[cid] + k)) for k, L in enumerate(self.lens[cid])]

    def key(self, g):
        return self.key_base + 7 * g


class Recorder:
    """Drives one enumerator and records every call with its result."""

    def __init__(self, rr, src, case):
        self.rr = rr
        self.src = src
        if case['randomize']:
            kind, w = case['window']
            self.en = rr.BlockRandomizer(src, w, kind == 'samples', case['seed'], case['seek_quirk'])
        else:
            self.en = rr.NoRandomizer(src)
        self.block = case['randomize']
        self.ops = []
        self.picks = 0
        self.sweep_size = sum(sum(c) for c in src.lens)
        self.n_chunks = len(src.lens)

    def start(self, es, ei, w, r, sweeps, cross):
        self.en.start_epoch(es, ei, w, r, sweeps=sweeps, cross=cross)
        self.ops.append(['start', es, ei, w, r, sweeps, cross, self.en.get_state()])

    def next(self, g, l):
        seqs, eos, eoe = self.en.get_next(g, l)
        out = []
        for x in seqs:
            if self.block:
                c, i, L, key = x.chunk.orig.id, x.idx, x.ns, x.key
            else:
                c, i, L, key = x
            gi = self.src.offsets[c] + i
            assert self.src.lens[c][i] == L and self.src.key(gi) == key
            out.append(gi)
        self.picks += len(out)
        self.ops.append(['next', g, l, out, bool(eos), bool(eoe), self.en.get_state()])
        return out, eos, eoe

    def set(self, p):
        self.en.set_state(p)
        self.ops.append(['set', p, self.en.get_state()])

    def state(self):
        return self.en.get_state()


def epoch_fits(size, index):
    return size * (index + 1) <= SIZE_MAX


def run_v2(rec, rnd, w, r, budget):
    """V2/Python API: one endless or bounded epoch, G = inf, cross sweeps; optional checkpoint restore."""
    S = rec.sweep_size
    mode = rnd.choice(['inf', 'samples', 'sweeps'])
    es, sweeps = SIZE_MAX // 2, None
    if mode == 'samples':
        es = rnd.randint(1, 4 * S)
    elif mode == 'sweeps':
        sweeps = rnd.randint(1, 3)
    mb = rnd.choice([1, 2, 3, 5, 8, 16, 32, 64, rnd.randint(1, 2 * S)])
    local = mb // w + (1 if mb % w > r else 0)
    if local == 0:
        local = 1
    rec.start(es, 0, w, r, sweeps, True)
    restore_at = rnd.randint(1, 8) if rnd.random() < 0.4 else None
    n = 0
    while rec.picks < budget and n < 200:
        seqs, eos, eoe = rec.next(SIZE_MAX, local)
        n += 1
        if eoe or not seqs:
            break
        if restore_at is not None and n == restore_at:
            # CNTK 2.7's V2 restore sequence (READER.md §8.3, v2dist.py), on a checkpoint taken earlier.
            saved = rnd.randint(0, rec.state())
            if rec.state() != saved:
                rec.set(saved)
            rec.start(es, 0, w, r, sweeps, True)
            if rec.state() != saved:
                rec.set(saved)
            rec.set(rec.state())
    # one more call after the end: empty, end_of_epoch
    rec.next(SIZE_MAX, local)


def run_legacy(rec, rnd, w, r, budget):
    """BrainScript legacy path: StartEpoch per epoch, G = L = M, no sweep crossing."""
    S = rec.sweep_size
    es = rnd.choice([REQUEST_DATA_SIZE, REQUEST_DATA_SIZE, S, rnd.randint(1, 2 * S), rnd.randint(S, 3 * S)])
    mb = rnd.choice([1, 3, 7, 16, 50, rnd.randint(1, S + 5)])
    epochs = rnd.randint(1, 4)
    first = rnd.choice([0, 0, 0, rnd.randint(0, 5)])
    for ep in range(first, first + epochs):
        if not epoch_fits(S if es == REQUEST_DATA_SIZE else es, ep):
            break
        rec.start(es, ep, w, r, None, False)
        n = 0
        while n < 100 and rec.picks < budget:
            seqs, eos, eoe = rec.next(mb, mb)
            n += 1
            if eoe:
                break
        if rec.picks >= budget:
            break


def run_random(rec, rnd, w, r, budget):
    """Random calls: epochs, requests of every shape, seeks anywhere."""
    S = rec.sweep_size
    started = False
    if not rec.block or rnd.random() < 0.8:
        started = True
    cross = rnd.random() < 0.5

    def start():
        es = rnd.choice([SIZE_MAX // 2, SIZE_MAX, REQUEST_DATA_SIZE, rnd.randint(1, 3 * S), S])
        sweeps = rnd.choice([None, None, None, rnd.randint(1, 4)])
        size = S * sweeps if sweeps is not None else (S if es == REQUEST_DATA_SIZE else es)
        ei = 0
        if rnd.random() < 0.3:
            ei = rnd.randint(0, 4)
            while not epoch_fits(size, ei):
                ei -= 1
        rec.start(es, ei, w, r, sweeps, cross)

    if started:
        start()
    ops = 0
    while rec.picks < budget and ops < 120:
        ops += 1
        x = rnd.random()
        if x < 0.65:
            g = rnd.choice([SIZE_MAX, SIZE_MAX, rnd.randint(1, 2 * S), rnd.randint(1, 30)])
            l = rnd.choice([SIZE_MAX, rnd.randint(1, S + 3), rnd.randint(1, 30), 0 if rnd.random() < 0.05 else 1])
            if cross and g > 4 * S and l > 4 * S:
                l = rnd.randint(1, 4 * S)  # a request that crosses sweeps needs some bound
            rec.next(g, l)
        elif x < 0.85:
            p = rnd.choice([rnd.randint(0, 4 * S), S * rnd.randint(0, 3), rec.state(), max(0, rec.state() - rnd.randint(0, S))])
            rec.set(p)
        elif x < 0.95:
            start()
        else:
            rec.set(rec.state())


def make_case(rr, rnd, cid):
    n_chunks = rnd.choice([1, 2, 3, rnd.randint(1, 10), rnd.randint(1, 40)])
    max_seqs = rnd.choice([1, 3, 30, rnd.randint(1, 30)])
    max_len = rnd.choice([1, 1, 5, 20])
    lens = [[rnd.randint(1, max_len) for _ in range(rnd.randint(1, max_seqs))] for _ in range(n_chunks)]
    S = sum(sum(c) for c in lens)
    randomize = rnd.random() < 0.75
    if rnd.random() < 0.5:
        window = ['chunks', rnd.choice([0, 1, 2, 3, rnd.randint(0, 10), 128])]
    else:
        window = ['samples', rnd.choice([0, 1, 4, rnd.randint(0, S), rnd.randint(0, 2 * S), 1 << 62])]
    seed = rnd.choice([0, 0, 1, rnd.randint(0, 100), rnd.getrandbits(64), SIZE_MAX])
    case = dict(id=cid, chunks=lens, key_base=rnd.getrandbits(40), randomize=randomize, window=window,
                seed=seed, seek_quirk=rnd.random() < 0.5, runs=[])
    src = Source(lens, case['key_base'], rr.ChunkInfo)
    workers = rnd.choice([1, 1, 2, 3, 4])
    scenario = rnd.choice([run_v2, run_legacy, run_random, run_random])
    budget = max(40, 1500 // workers)
    for r in range(workers):
        rec = Recorder(rr, src, case)
        scenario(rec, random.Random(rnd.getrandbits(64)), workers, r, budget)
        case['runs'].append(rec.ops)
    return case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--readerref', help='the folder of readerref.py (default: testdata/model)')
    ap.add_argument('--cases', type=int, default=200)
    ap.add_argument('--seed', type=int, default=20181)
    ap.add_argument('--out', default=os.path.join(REPO, 'crates', 'cntkio', 'tests', 'fixtures', 'shuffle', 'cases.jsonl'))
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.readerref or testdata_dir('model')))
    import readerref as rr
    rnd = random.Random(a.seed)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, 'w') as f:
        for cid in range(a.cases):
            f.write(json.dumps(make_case(rr, rnd, cid), separators=(',', ':')) + '\n')
    print('wrote %d cases to %s (%d bytes)' % (a.cases, a.out, os.path.getsize(a.out)))


if __name__ == '__main__':
    main()
