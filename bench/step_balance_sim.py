#!/usr/bin/env python3
"""How evenly a step's seeds split across data-parallel workers, cut as shuffled or dealt by in-degree.

A design study for issue 38 (no GPU, no Gale binary): a step waits for its slowest worker, and a
worker's step grows with the nodes its batch samples. It shuffles a store's training seeds into
steps of --batch-size x WORKERS, samples each worker's slice as Gale does (neighbours drawn
uniformly per hop, with replacement here), and prints the largest slice's sampled nodes (summed
over the hops) over the mean, for two splits:

  cut    the step's shuffled seeds cut into near-equal slices (Gale before the seventh session);
  snake  the step's seeds sorted by in-degree, largest first, dealt to the slices in snake order
         (0, 1, .., W-1, W-1, .., 0, ..), as scheduler::EpochPlan now does.

usage: step_balance_sim.py STORE WORKERS [--batch-size 1024] [--fanouts 15,10,5] [--steps 60] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readahead_sim import Graph  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("workers", type=int)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.workers < 2 or a.batch_size < 1 or a.steps < 1:
        raise SystemExit("step_balance_sim.py: expected WORKERS >= 2, --batch-size >= 1, --steps >= 1")
    graph = Graph(a.store, a.fanouts, a.seed)
    deg = graph.deg

    def sampled_nodes(seeds):
        return sum(len(nodes) for nodes in graph.hops(seeds))

    def snake(step):
        slices = [[] for _ in range(a.workers)]
        for i, v in enumerate(step[np.argsort(-deg[step], kind="stable")]):
            turn, pos = divmod(i, a.workers)
            slices[pos if turn % 2 == 0 else a.workers - 1 - pos].append(v)
        return [np.array(s) for s in slices]

    order = graph.rng.permutation(graph.train)
    width = a.batch_size * a.workers
    cut, dealt = [], []
    for s in range(min(a.steps, len(order) // width)):
        step = order[s * width:(s + 1) * width]
        for split, out in ((np.array_split(step, a.workers), cut), (snake(step), dealt)):
            sizes = [sampled_nodes(part) for part in split]
            out.append(max(sizes) / np.mean(sizes))
    print(f"{a.workers} workers, {len(cut)} steps of {width} seeds: the largest slice's sampled nodes over the mean: "
          f"cut {np.mean(cut):.4f} (p90 {np.percentile(cut, 90):.4f}), "
          f"snake by in-degree {np.mean(dealt):.4f} (p90 {np.percentile(dealt, 90):.4f})")


if __name__ == "__main__":
    main()
