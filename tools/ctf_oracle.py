#!/usr/bin/env python3
"""Print what the Python model of CNTK 2.7 (testdata/model/ctfref.py) makes of CTF files, as
canonical JSON, for differential tests (crates/cntkio/tests/ctf_model.rs).

    echo '{"path": "x.ctf", "streams": [...], ...}' | python3 tools/ctf_oracle.py
    echo '[job, job, ...]' | python3 tools/ctf_oracle.py      # a batch: prints a list of results

The model is found in `testdata/model`, or via $CNTKIO_SHARED_DIR (tools/testdata.py).

A job: {"path": str, "streams": [{"name", "alias", "dense": bool, "dim": int, "defines": bool}],
        "skip_ids": bool, "chunk_size": int, "max_errors": int, "precision": "float" | "double"}
(all but path and streams optional; defaults: false, 33554432, 0, "float").

A result (keys sorted, no spaces):
  chunks     null if indexing failed, else [{"start", "end", "ns", "seqs": [[key, ns, offset, size], ...]}]
  sequences  every sequence loaded completely, in file order (all chunks are loaded once, in order, with
             one parser, i.e. one maxErrors budget): {"key", "ns", "streams": [{"n", "values", "indices",
             "nnz"}]}; values are hex of the element type's bits (8 digits for float, 16 for double).
             Dense streams hold exactly n*dim values: a too-long dense sample on a last row without a
             newline keeps its extra values in the model, but CNTK's packer (and cntkio) never read them.
  errors     number of counted errors that did not stop parsing (calls of err() that did not raise)
  error      the message of the exception that stopped indexing or parsing, or null
"""
import ctypes
import json
import os
import struct
import sys

from testdata import testdata_dir  # tools/testdata.py, beside this script

sys.path.insert(0, testdata_dir('model'))
import ctfref  # noqa: E402


class CountingParser(ctfref.Parser):
    """The model's parser, counting the errors it tolerated."""
    counted = 0

    def err(self):
        ctfref.Parser.err(self)  # raises MaxErrors when the budget is used up
        self.counted += 1


def hexbits(v, is_float):
    if is_float:
        # C's double -> float conversion (round to nearest, inf on overflow, NaN sign kept), as cntkio's `as f32`.
        return '%08x' % struct.unpack('<I', bytes(ctypes.c_float(v)))[0]
    return '%016x' % struct.unpack('<Q', struct.pack('<d', v))[0]


def run_job(job):
    path = job['path']
    data = open(path, 'rb').read()
    streams = [dict(name=s['name'], alias=s['alias'], dense=bool(s['dense']), dim=int(s['dim']),
                    defines=bool(s.get('defines', False))) for s in job['streams']]
    is_float = job.get('precision', 'float') == 'float'
    main = [s['alias'] for s in streams if s['defines']]
    out = {'chunks': None, 'sequences': [], 'errors': 0, 'error': None}
    try:
        chunks = ctfref.index(data, bool(job.get('skip_ids', False)), main[0] if main else None,
                              int(job.get('chunk_size', 32 << 20)))
    except RuntimeError as e:
        out['error'] = str(e)
        return out
    out['chunks'] = [{'start': c.start, 'end': c.end, 'ns': c.ns,
                      'seqs': [[q.key, q.ns, q.off, q.size] for q in c.seqs]} for c in chunks]
    p = CountingParser(data, streams, int(job.get('max_errors', 0)), 0, os.path.basename(path))
    try:
        for c in chunks:
            for q in c.seqs:
                bufs = p.load(q)
                seq = {'key': q.key, 'ns': q.ns, 'streams': []}
                for st, b in zip(streams, bufs):
                    vals = b['vals'][:b['n'] * st['dim']] if st['dense'] else b['vals']
                    seq['streams'].append({'n': b['n'], 'values': [hexbits(v, is_float) for v in vals],
                                           'indices': list(b['idx']), 'nnz': list(b['nnz'])})
                out['sequences'].append(seq)
    except (ctfref.MaxErrors, RuntimeError) as e:
        out['error'] = str(e)
    out['errors'] = p.counted
    return out


def main():
    jobs = json.load(sys.stdin)
    res = [run_job(j) for j in jobs] if isinstance(jobs, list) else run_job(jobs)
    json.dump(res, sys.stdout, sort_keys=True, separators=(',', ':'))
    sys.stdout.write('\n')


if __name__ == '__main__':
    main()
