#!/usr/bin/env python3
"""How many feature rows the disk tier's read-ahead reads, against Belady's replacement, on a store.

A design study for issue 36 (no GPU, no Gale binary): it samples mini-batches as Gale does (the
training seeds shuffled into batches, neighbours drawn uniformly per hop, here with replacement),
removes the rows a static cache of the `--cache-rows` highest in-degree nodes holds, and counts
the rows read from disk by

  windows  Gale's read-ahead (engine/train/read_ahead.hpp): a window grows batch by batch until
           its distinct misses would pass its limit (the first a sixteenth of --window-rows, each
           next twice the last); the rows the previous window holds are carried, the rest read;
  belady   a cache of --belady-rows rows (default twice --window-rows: the memory of Gale's two
           live windows) that holds every batch's misses while it trains and, when full, keeps the
           rows whose next use comes soonest (the future is known: the batches are sampled ahead).

Rows, not pages: read amplification (rows per 4 KiB page) multiplies both alike.

usage: readahead_sim.py STORE --cache-rows N --window-rows L [--belady-rows C] [--epochs 2]
                        [--batch-size 1024] [--fanouts 15,10,5] [--seed 0]
"""
import argparse
import collections
import os
import sys

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--cache-rows", type=int, required=True)
    p.add_argument("--window-rows", type=int, required=True)
    p.add_argument("--belady-rows", type=int)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.cache_rows < 0 or a.window_rows < 16 or a.epochs < 1 or a.batch_size < 1:
        sys.exit("readahead_sim.py: expected --cache-rows >= 0, --window-rows >= 16, --epochs >= 1, --batch-size >= 1")
    fanouts = [int(f) for f in a.fanouts.split(",")]
    indptr = np.load(os.path.join(a.store, "graph/indptr.npy"))
    indices = np.load(os.path.join(a.store, "graph/indices.npy"), mmap_mode="r")
    train = np.load(os.path.join(a.store, "splits/train.npy"))
    deg = np.diff(indptr)
    rng = np.random.default_rng(a.seed)

    def inputs(seeds):
        nodes = seeds
        for k in fanouts:
            has = deg[nodes] > 0
            src, d = nodes[has], deg[nodes][has]
            picks = indices[(indptr[src][:, None] + (rng.random((len(src), k)) * d[:, None]).astype(np.int64)).ravel()]
            nodes = np.unique(np.concatenate([nodes, picks]))
        return nodes

    cached = np.zeros(len(deg), dtype=bool)
    cached[np.argsort(-deg, kind="stable")[:a.cache_rows]] = True
    batches = []
    for _ in range(a.epochs):
        order = rng.permutation(train)
        for i in range(0, len(order), a.batch_size):
            nodes = inputs(order[i:i + a.batch_size])
            batches.append(nodes[~cached[nodes]].tolist())

    # Gale's windows.
    read, windows, carried, b, limit = 0, 0, set(), 0, max(1, a.window_rows // 16)
    while b < len(batches):
        rows, first = set(), b
        while b < len(batches):
            fresh = set(batches[b]) - rows
            if b > first and len(rows) + len(fresh) > limit:
                break
            rows |= fresh
            b += 1
        read += len(rows - carried)
        carried, windows, limit = rows, windows + 1, min(a.window_rows, limit * 2)

    # Belady: the next use of every row, batch by batch.
    capacity = a.belady_rows or 2 * a.window_rows
    uses = collections.defaultdict(collections.deque)
    for t, rows in enumerate(batches):
        for r in rows:
            uses[r].append(t)
    held, belady = set(), 0
    for rows in batches:
        for r in rows:
            uses[r].popleft()
            if r not in held:
                held.add(r)
                belady += 1
        if len(held) > capacity:
            held = set(sorted(held, key=lambda r: uses[r][0] if uses[r] else len(batches))[:capacity])
    distinct = len(set().union(*map(set, batches)))
    print(f"{len(batches)} batches, {np.mean([len(r) for r in batches]):.0f} misses a batch, {distinct} distinct rows")
    print(f"windows of {a.window_rows} rows: {read} rows read in {windows} windows")
    print(f"belady, {capacity} rows: {belady} rows read ({belady / read:.2f}x the windows')")


if __name__ == "__main__":
    main()
