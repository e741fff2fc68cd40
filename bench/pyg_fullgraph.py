#!/usr/bin/env python3
"""PyG full-graph training on a Gale store: the anchor Gale is compared against.

Reads the same store Gale trains on (graph/indptr.npy, graph/indices.npy, features.npy,
labels.npy) so both sides see identical graphs and features, builds PyG's fastest path (the
adjacency as a torch sparse CSR tensor, rows = destinations, passed as adj_t), and times full-graph
training epochs of GCN / SAGE / GIN / GAT with Adam, as ../shared/anchors/pyg_fullgraph_and_spmm.py
does. Prints one JSON object per model: median ms per epoch, peak GPU memory, and "precision"
("fp32" or "tf32", what the GEMMs ran in).

usage: bench/pyg_fullgraph.py STORE [--models gcn,sage,gin] [--layers 3] [--hidden 256]
                              [--heads 4] [--epochs 5] [--warmup 2] [--norm none|batch] [--tf32]

--norm batch puts torch.nn.BatchNorm1d after each hidden conv, before its activation (gale
--norm batch). --tf32 lets cuBLAS and cuDNN use TF32 tensor cores (torch.backends.cuda.matmul
.allow_tf32 and torch.backends.cudnn.allow_tf32), as gale --tf32 does; without it both are off and
the GEMMs run in fp32. The SpMM (cuSPARSE) stays fp32 either way.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def set_precision(tf32):
    """Sets PyTorch's TF32 switches for this process and returns the row keys saying what the GEMMs
    run in: {"precision": "fp32" | "tf32"}, plus "tf32_forced_by" when the environment turned TF32
    on although --tf32 was not given (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 makes cuBLAS use TF32
    whatever allow_tf32 says), so that a comparison never pairs fp32 with TF32 unknowingly."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if torch.backends.cuda.matmul.allow_tf32:
        return {"precision": "tf32"}
    if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1":
        return {"precision": "tf32", "tf32_forced_by": "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"}
    return {"precision": "fp32"}


def load_store(path, device):
    indptr = torch.from_numpy(np.load(os.path.join(path, "graph/indptr.npy")).astype(np.int64))
    indices = torch.from_numpy(np.load(os.path.join(path, "graph/indices.npy")).astype(np.int64))
    n = indptr.numel() - 1
    adj_t = torch.sparse_csr_tensor(indptr, indices, torch.ones(indices.numel()), (n, n)).to(device)
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("feature_dtype") == "bf16":
        sys.exit(f"{path}: bf16 features: preprocess with --feature-dtype f32 or f16 for the PyG side")
    x = torch.from_numpy(np.load(os.path.join(path, "features.npy")).astype(np.float32)).to(device)
    y = torch.from_numpy(np.load(os.path.join(path, "labels.npy")).astype(np.int64)).to(device)
    return adj_t, x, y, int(manifest["num_classes"])


def build(kind, fdim, hidden, ncls, layers, heads):
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    convs = []
    for i in range(layers):
        last = i == layers - 1
        if kind == "gat":
            fin = fdim if i == 0 else hidden * heads
            convs.append(GATConv(fin, ncls if last else hidden, heads=1 if last else heads))
            continue
        fin = fdim if i == 0 else hidden
        fout = ncls if last else hidden
        if kind == "gcn":
            convs.append(GCNConv(fin, fout, cached=True))
        elif kind == "sage":
            convs.append(SAGEConv(fin, fout))
        else:
            mlp = torch.nn.Sequential(torch.nn.Linear(fin, fout), torch.nn.ReLU(), torch.nn.Linear(fout, fout))
            convs.append(GINConv(mlp))
    return torch.nn.ModuleList(convs)


def time_model(kind, adj_t, x, y, ncls, a):
    # Loss over every labelled node, as `gale bench train` does.
    rows = (y >= 0).nonzero().squeeze(1)
    y_rows = y[rows]
    convs = build(kind, x.shape[1], a.hidden, ncls, a.layers, a.heads).to(x.device)
    width = a.hidden * a.heads if kind == "gat" else a.hidden
    norms = torch.nn.ModuleList(
        [torch.nn.BatchNorm1d(width) for _ in range(a.layers - 1)] if a.norm == "batch" else []).to(x.device)
    opt = torch.optim.Adam(list(convs.parameters()) + list(norms.parameters()), lr=0.01)
    act = F.elu if kind == "gat" else F.relu

    def step():
        opt.zero_grad()
        h = x
        for i, conv in enumerate(convs):
            h = conv(h, adj_t)
            if i < len(convs) - 1:
                if len(norms) > 0:
                    h = norms[i](h)
                h = act(h)
        F.cross_entropy(h[rows], y_rows).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.epochs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2], torch.cuda.max_memory_allocated() / 2**30


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--models", default="gcn,sage,gin")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--norm", default="none", choices=["none", "batch"])
    p.add_argument("--tf32", action="store_true", help="GEMMs on TF32 tensor cores (default: fp32)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pyg_fullgraph.py: no CUDA device")
    dev = torch.device("cuda")
    precision = set_precision(a.tf32)
    adj_t, x, y, ncls = load_store(a.store, dev)
    for kind in a.models.split(","):
        row = {"side": "pyg", "model": kind, "layers": a.layers, "hidden": a.hidden,
               "device": torch.cuda.get_device_name(), **precision}
        try:
            ms, peak = time_model(kind, adj_t, x, y, ncls, a)
            row.update(ms_per_epoch=round(ms, 2), peak_gib=round(peak, 2))
        except torch.cuda.OutOfMemoryError as e:
            row.update(error="out of memory", detail=str(e)[:160])
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
