#!/usr/bin/env python3
"""Writes the benchmark files the issues describe (deterministic, seed 1):

  dense:  every line `|features` + 100 floats with 6 significant digits + `|labels` one-hot of 10
  sparse: every line `|features` + ~30 `index:1` pairs in dim 100000 + `|labels` one-hot `k:1` of dim 10

    python3 tools/gen_bench_data.py dense  OUT.ctf  SIZE_MB
    python3 tools/gen_bench_data.py sparse OUT.ctf  SIZE_MB

Schemas:  dense  --stream features:100:dense --stream labels:10:dense
          sparse --stream features:100000:sparse --stream labels:10:sparse
"""
import random, sys

def main():
    kind, out, size_mb = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rnd = random.Random(1)
    target = int(size_mb * 1e6)
    # A pool of distinct lines keeps generation fast; lines are sampled from it in random order.
    pool = []
    for _ in range(4096):
        if kind == 'dense':
            vals = ' '.join('%.6g' % rnd.gauss(0, 3) for _ in range(100))
            k = rnd.randrange(10)
            lab = ' '.join('1' if i == k else '0' for i in range(10))
            pool.append('|features %s |labels %s\n' % (vals, lab))
        else:
            n = rnd.randint(25, 35)
            idx = sorted(rnd.sample(range(100000), n))
            pool.append('|features %s |labels %d:1\n' % (' '.join('%d:1' % i for i in idx), rnd.randrange(10)))
    pool = [p.encode() for p in pool]
    written = 0
    with open(out, 'wb') as f:
        buf = []
        while written < target:
            line = pool[rnd.randrange(len(pool))]
            buf.append(line)
            written += len(line)
            if len(buf) >= 10000:
                f.write(b''.join(buf)); buf = []
        f.write(b''.join(buf))

if __name__ == '__main__':
    main()
