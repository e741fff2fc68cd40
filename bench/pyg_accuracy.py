#!/usr/bin/env python3
"""PyG trained on a Gale store with `gale train`'s full-graph recipe: accuracy to compare with Gale's.

The same store (graph/indptr.npy, graph/indices.npy, features.npy, labels.npy, splits/*.npy), the
same model shape and placement as Gale's: dropout on every layer's input, the conv, then on hidden
layers BatchNorm1d (with --norm batch) and ReLU; Adam with L2 weight decay; the loss over the
training split; after each epoch the model in eval mode (BatchNorm's running statistics) scores the
validation and test splits, and the test accuracy at the best validation accuracy (ties to the later
epoch) is the run's. Prints one JSON object per seed and a last one with the mean, each with
"precision": "fp32" or "tf32" (what the GEMMs ran in; fp32 on the CPU).

usage: bench/pyg_accuracy.py STORE [--model gcn|sage] [--layers 2] [--hidden 16] [--norm none|batch]
                             [--epochs 200] [--lr 0.01] [--weight-decay 5e-4] [--dropout 0.5] [--seeds 5]
                             [--tf32]

--tf32 lets cuBLAS and cuDNN use TF32 tensor cores on the GPU (torch.backends.cuda.matmul.allow_tf32
and torch.backends.cudnn.allow_tf32), as gale train --tf32 does; without it the GEMMs run in fp32.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyg_fullgraph import load_store, set_precision  # noqa: E402


def split(path, name, y, device):
    ids = torch.from_numpy(np.load(os.path.join(path, "splits", name + ".npy")).astype(np.int64)).to(device)
    return ids[y[ids] >= 0]


class Net(torch.nn.Module):
    def __init__(self, kind, fin, hidden, ncls, layers, norm, dropout):
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv

        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        self.norms = torch.nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            a, b = (fin if i == 0 else hidden), (ncls if last else hidden)
            self.convs.append(GCNConv(a, b, cached=True) if kind == "gcn" else SAGEConv(a, b))
            if not last and norm == "batch":
                self.norms.append(torch.nn.BatchNorm1d(b))

    def forward(self, x, adj_t):
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, adj_t)
            if i < len(self.convs) - 1:
                if len(self.norms) > 0:
                    x = self.norms[i](x)
                x = F.relu(x)
        return x


def run(a, adj_t, x, y, ncls, train, valid, test, seed):
    torch.manual_seed(seed)
    model = Net(a.model, x.shape[1], a.hidden, ncls, a.layers, a.norm, a.dropout).to(x.device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    best_valid, test_at_best = -1.0, 0.0
    for _ in range(a.epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x, adj_t)[train], y[train]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(x, adj_t).argmax(dim=1)
        va = (pred[valid] == y[valid]).float().mean().item()
        te = (pred[test] == y[test]).float().mean().item()
        if va >= best_valid:
            best_valid, test_at_best = va, te
    return best_valid, test_at_best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--model", default="gcn", choices=["gcn", "sage"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--norm", default="none", choices=["none", "batch"])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--tf32", action="store_true", help="GPU GEMMs on TF32 tensor cores (default: fp32)")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # TF32 is a GPU format: on the CPU the switches change nothing and the run is fp32.
    precision = set_precision(a.tf32) if dev.type == "cuda" else {"precision": "fp32"}
    adj_t, x, y, ncls = load_store(a.store, dev)
    train, valid, test = (split(a.store, name, y, dev) for name in ("train", "valid", "test"))
    accs = []
    for seed in range(a.seeds):
        best_valid, acc = run(a, adj_t, x, y, ncls, train, valid, test, seed)
        accs.append(acc)
        print(json.dumps({"side": "pyg", "model": a.model, "norm": a.norm, "seed": seed, **precision,
                          "best_valid_acc": round(best_valid, 4), "test_acc_at_best_valid": round(acc, 4)}), flush=True)
    print(json.dumps({"side": "pyg", "model": a.model, "norm": a.norm, "hidden": a.hidden, "layers": a.layers, **precision,
                      "seeds": a.seeds, "mean_test_acc": round(sum(accs) / len(accs), 4)}), flush=True)


if __name__ == "__main__":
    main()
