#!/usr/bin/env python3
"""Run the Python model of CNTK 2.7's V2 MinibatchSource (testdata/model: v2model.py's CTFD,
readerref.py's randomizers, with v2dist.py's worker limits and restore call sequence) on a CTF file and print
its minibatches as canonical JSON, for differential tests (crates/cntkio/tests/minibatch.rs).

    echo '{"path": "x.ctf", "streams": [...], "mb": 4, ...}' | python3 tools/v2_oracle.py
    echo '[job, job, ...]' | python3 tools/v2_oracle.py      # a batch: prints a list of results

The model is found in `testdata/model`, or via $CNTKIO_SHARED_DIR (tools/testdata.py).

A job: {"path", "streams": [{"name", "alias", "dense", "dim", "defines"}], "mb": int,
        "chunk_size": 33554432, "skip_ids": false, "randomize": false, "seed": 0,
        "window_chunks": 128, "window_samples": null (given: a window in samples),
        "max_sweeps": null, "max_samples": null, "frame": false, "workers": 1, "rank": 0,
        "max_mbs": 1000 (stop after this many minibatches), "checkpoint_after": null (K: also restore a fresh
        source from the state after K minibatches and read on), "quirk": true (CNTK's seek quirk)}

A result: {"batches": [B...], "error": str|null, "state": int|null, "restored": [B...]|null}, where
B = {"mb": i, "sweep_end": bool, "keys": [...], "lens": [declared lengths],
     "streams": {NAME: [SEQUENCE...]}}, a SEQUENCE a list of samples, a dense sample a list of dim numbers,
a sparse sample a list of [index, value]; values are the element type's value (float32 rounded).
"""
import json
import sys

from testdata import testdata_dir  # tools/testdata.py, beside this script

sys.path.insert(0, testdata_dir('model'))
from v2model import CTFD, f32  # noqa: E402
from readerref import BlockRandomizer, NoRandomizer  # noqa: E402

SIZE_MAX = (1 << 64) - 1


def make(job, data, streams):
    d = CTFD(data, streams, int(job.get('chunk_size', 32 << 20)), 0, bool(job.get('skip_ids', False)), 'x')
    if job.get('randomize'):
        ws = job.get('window_samples')
        if ws:
            en = BlockRandomizer(d, ws, True, job.get('seed', 0), seek_bug=job.get('quirk', True))
        else:
            wc = job.get('window_chunks')
            en = BlockRandomizer(d, 128 if wc is None else wc, False, job.get('seed', 0),
                                 seek_bug=job.get('quirk', True))
    else:
        en = NoRandomizer(d)
    return d, en


def start(job, en):
    ms = job.get('max_samples')
    total = SIZE_MAX // 2 if ms is None else ms
    en.start_epoch(total, 0, job.get('workers', 1), job.get('rank', 0), sweeps=job.get('max_sweeps'), cross=True)


def sample_list(st, b):
    out = []
    off = 0
    for t in range(b['n']):
        if st['dense']:
            dim = st['dim']
            out.append([f32(v) for v in b['vals'][t * dim:(t + 1) * dim]])
        else:
            n = b['nnz'][t]
            out.append([[b['idx'][off + j], f32(b['vals'][off + j])] for j in range(n)])
            off += n
    return out


def read(job, d, en, streams, first_index, limit):
    """Minibatches until the end of the run or `limit` of them; (batches, error)."""
    W = job.get('workers', 1)
    r = job.get('rank', 0)
    mb = job['mb']
    local = mb // W + (1 if mb % W > r else 0)
    if local == 0:
        local = 1
    out = []
    while len(out) < limit:
        seqs, eos, eoe = en.get_next(SIZE_MAX, local)
        if isinstance(en, BlockRandomizer):
            items = [(sd.chunk.orig.id, sd.idx, sd.ns, sd.key) for sd in seqs]
        else:
            items = [(c, i, L, key) for (c, i, L, key) in seqs]
        if not items:
            break
        try:
            data = [d.load_chunk(c)[i] for (c, i, _, _) in items]
        except Exception as e:  # noqa: BLE001
            return out, str(e)
        if job.get('frame'):
            for x in data:
                for b in x:
                    if b['n'] > 1:
                        return out, 'Detected a non-frame sequence of size %d in frame mode.' % b['n']
        for x in data:
            for b in x:
                if b['n'] == 0:
                    return out, 'AddSequence: Sequences must be a least one frame long.'
        out.append({
            'mb': first_index + len(out), 'sweep_end': bool(eos),
            'keys': [it[3] for it in items], 'lens': [it[2] for it in items],
            'streams': {st['name']: [sample_list(st, x[k]) for x in data] for k, st in enumerate(streams)},
        })
        if eoe:
            break
    return out, None


def run_job(job):
    data = open(job['path'], 'rb').read()
    streams = [dict(name=s['name'], alias=s['alias'], dense=bool(s['dense']), dim=int(s['dim']),
                    defines=bool(s.get('defines', False))) for s in job['streams']]
    limit = job.get('max_mbs', 1000)
    res = {'batches': [], 'error': None, 'state': None, 'restored': None}
    try:
        d, en = make(job, data, streams)
        start(job, en)
        k = job.get('checkpoint_after')
        if k is None:
            res['batches'], res['error'] = read(job, d, en, streams, 0, limit)
            return res
        res['batches'], res['error'] = read(job, d, en, streams, 0, k)
        if res['error'] is not None:
            return res
        saved = en.get_state()
        res['state'] = saved
        # CNTK 2.7's V2 restore sequence on a fresh source (v2dist.py).
        d2, en2 = make(job, data, streams)
        if saved != 0:
            en2.set_state(saved)
        start(job, en2)
        if en2.get_state() != saved:
            en2.set_state(saved)
        en2.set_state(en2.get_state())
        res['restored'], res['error'] = read(job, d2, en2, streams, len(res['batches']), limit)
    except Exception as e:  # noqa: BLE001
        res['error'] = str(e)
    return res


def main():
    job = json.load(sys.stdin)
    if isinstance(job, list):
        print(json.dumps([run_job(j) for j in job], sort_keys=True, separators=(',', ':')))
    else:
        print(json.dumps(run_job(job), sort_keys=True, separators=(',', ':')))


if __name__ == '__main__':
    main()
