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

  carry    (--carry-fill F) windows whose own misses fill at most F of their rows, the rest holding
           rows of the window before, those used again soonest first, among the rows needed within
           --carry-horizon windows ahead (Belady at a window's grain).

  pool     (--pool S [--pool-horizon H]) Gale's read-ahead since the seventh session: windows whose
           own rows fill at most S of a pool of --belady-rows slots that they share; a row stays in
           the pool while it has room, and to read a window's new rows the pool drops rows neither
           live window needs, those no window within H ahead needs first (least recently needed
           first), then those needed latest.

Rows, not pages: read amplification (rows per 4 KiB page) multiplies both alike.

usage: readahead_sim.py STORE --cache-rows N --window-rows L [--belady-rows C] [--epochs 2]
                        [--batch-size 1024] [--fanouts 15,10,5] [--seed 0]
                        [--carry-fill F [--carry-horizon W]] [--pool S [--pool-horizon H]]
"""
import argparse
import collections
import os
import sys

import numpy as np


class Graph:
    """A store's topology and training seeds, and Gale's sampling over them (uniform neighbours per
    hop, here with replacement). bench/step_balance_sim.py uses it too."""

    def __init__(self, store, fanouts, seed):
        self.fanouts = [int(f) for f in fanouts.split(",")]
        self.indptr = np.load(os.path.join(store, "graph/indptr.npy"))
        self.indices = np.load(os.path.join(store, "graph/indices.npy"), mmap_mode="r")
        self.train = np.load(os.path.join(store, "splits/train.npy"))
        self.deg = np.diff(self.indptr)
        self.rng = np.random.default_rng(seed)

    def hops(self, seeds):
        """The node sets of the seeds and each hop after (each includes the one before)."""
        nodes, out = seeds, [seeds]
        for k in self.fanouts:
            has = self.deg[nodes] > 0
            src, d = nodes[has], self.deg[nodes][has]
            offsets = (self.indptr[src][:, None] + (self.rng.random((len(src), k)) * d[:, None]).astype(np.int64)).ravel()
            nodes = np.unique(np.concatenate([nodes, self.indices[offsets]]))
            out.append(nodes)
        return out


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
    p.add_argument("--carry-horizon", type=int, default=0,
                   help="carry only rows needed within this many windows ahead (0: the whole future)")
    p.add_argument("--carry-fill", type=float, default=0.0,
                   help="also simulate windows whose own misses fill at most this share, the rest carried by next use")
    p.add_argument("--pool", type=float, default=0.0,
                   help="also simulate windows sharing one pool of --belady-rows slots, a window's own rows at most this share")
    p.add_argument("--pool-horizon", type=int, default=0,
                   help="with --pool: next uses known over this many windows ahead (0: the whole future)")
    a = p.parse_args()
    if a.cache_rows < 0 or a.window_rows < 16 or a.epochs < 1 or a.batch_size < 1:
        sys.exit("readahead_sim.py: expected --cache-rows >= 0, --window-rows >= 16, --epochs >= 1, --batch-size >= 1")
    if not 0 <= a.carry_fill <= 1 or a.carry_horizon < 0:
        sys.exit("readahead_sim.py: expected --carry-fill in [0, 1] (0: no carrying) and --carry-horizon >= 0")
    graph = Graph(a.store, a.fanouts, a.seed)
    train, deg, rng = graph.train, graph.deg, graph.rng

    def inputs(seeds):
        return graph.hops(seeds)[-1]

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

    # Windows that carry: each window's own misses fill at most --carry-fill of its limit, and the
    # rest holds rows of the previous window it does not need, those used again soonest first
    # (Belady at a window's grain; the future is the batches sampled ahead).
    next_use = {}
    carry_read, carry_windows = 0, 0
    if a.carry_fill:
        plan, b, limit = [], 0, max(1, a.window_rows // 16)
        while b < len(batches):
            rows, first = set(), b
            while b < len(batches):
                fresh = set(batches[b]) - rows
                if b > first and len(rows) + len(fresh) > a.carry_fill * limit:
                    break
                rows |= fresh
                b += 1
            plan.append((first, b, rows, limit))
            limit = min(a.window_rows, limit * 2)
        # Per row, the windows that need it, in order.
        needed_in = collections.defaultdict(collections.deque)
        for k, (_, _, rows, _) in enumerate(plan):
            for r in rows:
                needed_in[r].append(k)
        held = set()
        for k, (_, _, rows, limit) in enumerate(plan):
            carry_read += len(rows - held)
            for r in rows:
                needed_in[r].popleft()
            # Rows whose next use falls within the windows sampled ahead (--carry-horizon; 0: all).
            spare = [r for r in held - rows if needed_in[r] and (a.carry_horizon == 0 or needed_in[r][0] <= k + a.carry_horizon)]
            spare.sort(key=lambda r: needed_in[r][0])
            held = rows | set(spare[:max(0, limit - len(rows))])
        carry_windows = len(plan)

    # A pool of --belady-rows slots shared by the windows (--pool A): a window's rows that the pool
    # already holds are not read again, whichever window brought them in; window k + 1 grows while
    # the rows of windows k and k + 1 fit the pool together and its own rows stay within A of it;
    # to read its new rows, the pool drops rows neither window needs, those used again latest first
    # (Belady among the rows outside the two live windows).
    pool_read, pool_windows = 0, 0
    if a.pool:
        capacity = a.belady_rows or 2 * a.window_rows
        plan, b, current, limit = [], 0, set(), max(1, a.window_rows // 16)
        while b < len(batches):
            rows, first = set(), b
            while b < len(batches):
                fresh = set(batches[b]) - rows
                if b > first and (len(rows) + len(fresh) > min(limit, a.pool * capacity) or
                                  len(current | rows | fresh) > capacity):
                    break
                rows |= fresh
                b += 1
            plan.append(rows)
            current, limit = rows, min(2 * a.window_rows, limit * 2)
        needed_in = collections.defaultdict(collections.deque)
        for k, rows in enumerate(plan):
            for r in rows:
                needed_in[r].append(k)
        pool, previous, last_used = set(), set(), {}

        def farthest_first_key(r, k):  # larger: dropped first
            if needed_in[r] and (a.pool_horizon == 0 or needed_in[r][0] <= k + a.pool_horizon):
                return needed_in[r][0]
            return (1 << 40) + k - last_used[r]  # not needed within the horizon: least recently used first

        for k, rows in enumerate(plan):
            new = rows - pool
            pool_read += len(new)
            spare = len(pool) + len(new) - capacity
            if spare > 0:
                evictable = sorted(pool - rows - previous, key=lambda r: farthest_first_key(r, k))
                pool -= set(evictable[len(evictable) - spare:])
            pool |= new
            for r in rows:
                needed_in[r].popleft()
                last_used[r] = k
            previous = rows
        pool_windows = len(plan)

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
    if a.pool:
        horizon = f"{a.pool_horizon} windows" if a.pool_horizon else "the whole future"
        print(f"windows sharing a pool of {capacity} rows (own rows <= {a.pool} of it, next uses over {horizon}): {pool_read} rows read in "
              f"{pool_windows} windows ({pool_read / read:.2f}x the windows')")
    if a.carry_fill:
        horizon = f"the next {a.carry_horizon} windows" if a.carry_horizon else "the whole future"
        print(f"windows that carry (own misses <= {a.carry_fill} of a window, next uses known over {horizon}): {carry_read} rows read in "
              f"{carry_windows} windows ({carry_read / read:.2f}x the windows')")


if __name__ == "__main__":
    main()
