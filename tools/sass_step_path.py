#!/usr/bin/env python3
"""The instructions a kernel's step loop runs, from its SASS (cuobjdump --dump-sass of one kernel).

    tools/sass_step_path.py KERNEL.sass [--hgmma N] [--edge] [--list]

The step loop: the innermost backward branch whose body holds at least N HGMMA instructions
(default 32: the sm90 backward's step; 16 for the forward's key loop). Prints the loop's static
instruction, STL and LDL counts, and the shortest path through one iteration, counted per
instruction: with branches taken or not as the shortest way round, that is the step that skips
every rare branch (no softcap / ALiBi, no edge mask, no guard scrub, no mbarrier retry). --edge:
the shortest path that passes through the edge mask's selects (the run of `FSEL R, R, RZ`,
`FSEL R, R, -INF` or `FSEL R, RZ, +QNAN`, selects to 0, -inf or NaN, densest in the loop: the
backward masks P^T and dS^T to 0, the forward masks S to -inf), the step of an edge block. --list
prints the path.
"""
import heapq
import re
import sys


def parse(path):
    ins = []
    for line in open(path):
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def target(text):
    m = re.search(r'\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)', text)
    return int(m.group(1), 16) if m else None


def main():
    args = sys.argv[1:]
    path = args[0]
    hg_min = int(args[args.index('--hgmma') + 1]) if '--hgmma' in args else 32
    ins = parse(path)
    idx = {a: i for i, (a, _) in enumerate(ins)}
    loop = None
    for i, (a, t) in enumerate(ins):
        tg = target(t)
        if tg is not None and tg < a:
            hg = sum('HGMMA' in x for _, x in ins[idx[tg]:i + 1])
            if hg >= hg_min and (loop is None or a - tg < loop[1] - loop[0]):
                loop = (tg, a)
    if loop is None:
        sys.exit('no loop with %d HGMMA instructions' % hg_min)
    src, dst = idx[loop[0]], idx[loop[1]]

    def succ(i):
        t = ins[i][1]
        tg = target(t)
        pred = t.startswith('@')
        out = []
        if tg is not None:
            out.append(idx[tg])
            if pred:
                out.append(i + 1)
        elif re.search(r'\b(EXIT|RET)\b', t):
            if pred:
                out.append(i + 1)
        else:
            out.append(i + 1)
        return [j for j in out if j < len(ins)]

    def shortest(a, b):
        dist, prev, pq = {a: 1}, {}, [(1, a)]
        while pq:
            d, i = heapq.heappop(pq)
            if i == b:
                break
            if d > dist[i]:
                continue
            for j in succ(i):
                if j != src and d + 1 < dist.get(j, 1 << 30):
                    dist[j], prev[j] = d + 1, i
                    heapq.heappush(pq, (d + 1, j))
        if b not in dist:
            return None
        p = [b]
        while p[-1] != a:
            p.append(prev[p[-1]])
        return p[::-1]

    if '--edge' in args:
        sel = re.compile(r'(@!?P\d )?FSEL R\d+, (R\d+(\.reuse)?, (RZ|-INF )|RZ, \+QNAN)')
        body = list(range(src, dst + 1))
        dens = [sum(bool(sel.match(ins[j][1])) for j in body[k:k + 64]) if sel.match(ins[i][1])
                else 0 for k, i in enumerate(body)]
        top = max(dens)
        steps = []
        for k, i in enumerate(body):
            if top and dens[k] >= top // 2:
                a, b = shortest(src, i), shortest(i, dst)
                if a and b:
                    steps.append(a + b[1:])
        if not steps:
            sys.exit('no edge mask found')
        step = min(steps, key=len)
    else:
        step = shortest(src, dst)
    body = [t for _, t in ins[src:dst + 1]]
    text = [ins[i][1] for i in step]

    def n(lst, key):
        return sum(key in t for t in lst)

    print('%s: loop %#x..%#x, %d instructions (STL %d, LDL %d); %s step: %d instructions '
          '(STL %d, LDL %d, HGMMA %d, LDS %d, BAR.SYNC %d)' %
          (path, loop[0], loop[1], len(body), n(body, 'STL'), n(body, 'LDL'),
           'edge' if '--edge' in args else 'plain', len(text), n(text, 'STL'), n(text, 'LDL'),
           n(text, 'HGMMA'), n(text, 'LDS'), n(text, 'BAR.SYNC')))
    if '--list' in args:
        for i in step:
            print('  %#07x %s' % ins[i])


main()
