#!/usr/bin/env python3
"""Plain-PyTorch GPU neighbour sampling + PyG SAGEConv on a Gale store: the mini-batch anchor.

The anchor ../shared/anchors/torch_gpu_sampling.py run on the graph Gale trains on instead of a
generated one: graph/indptr.npy and graph/indices.npy (rows are destinations, so a row's entries
are the in-neighbours a node aggregates), features.npy (f32, f16 or bf16 per manifest.json; f16 and
bf16 stay so on the GPU and the gathered rows are widened to f32), labels.npy, and as training seeds
the entries of splits/train.npy whose label is >= 0. Sampling and model are the anchor's: per hop,
`fanout` neighbours drawn with replacement from each frontier node (none for a node without
neighbours), the frontier remapped to the first positions of the next one, SAGEConv((h, h[:ndst]),
edge_index) per block with ReLU between layers, cross-entropy on the seeds, Adam lr 0.003;
everything on the GPU. Fanouts are listed seeds' hop first, as Gale's --fanouts.

--features gpu (the default) copies features.npy to the GPU whole. --features mmap leaves it in an
np.memmap (np.load(mmap_mode='r')), as PyG users do with features larger than memory: each batch's
input rows are gathered on the host (sorted unique ids, fancy index of the memmap into a reused
pinned buffer), copied with .to(device, non_blocking=True) and put back in the sampler's order on
the GPU. Pages come from the page cache or the disk, so the run's read_bytes are reported.

--batches N times N batches after --warmup-batches W (default 20) instead of whole epochs, going
on into the next epoch's permutation as needed; the JSON then has s_per_batch for those N.

--tf32 lets cuBLAS and cuDNN use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32), as gale --tf32 does; without it both are off and the GEMMs run in
fp32. The JSON says which in "precision" (see pyg_fullgraph.set_precision).

Progress goes to stderr; stdout gets one JSON line:
  {"model": "sage", "device": ..., "features": "gpu" or "mmap", "precision": "fp32" or "tf32",
   "epoch_s": [timed epochs],
   "s_per_epoch": median, "s_per_batch": median / batches, "ms_per_batch": ..., "batches": per epoch,
   "peak_gib": torch max_memory_allocated, "host_peak_rss_bytes": ru_maxrss,
   "disk_read_bytes": read_bytes of /proc/self/io (null where unreadable), "fanouts": [...],
   "batch_size": ...}
with --batches N: "timed_batches": N, "warmup_batches": W, "s_per_batch" and "timed_read_bytes" (the
disk reads of the timed batches alone; disk_read_bytes also counts loading torch's libraries) in
place of the epoch keys;
or {"model": "sage", "error": "OOM", "precision": ..., ...} (exit 0) when the GPU runs out of memory.
Exit 2 without a CUDA device.

usage: bench/torch_minibatch.py STORE [--fanouts 15,10,5] [--batch-size 1024] [--hidden 256]
                                [--layers 3] [--epochs 3] [--warmup 1] [--seed 0]
                                [--features gpu|mmap] [--batches N [--warmup-batches 20]] [--tf32]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyg_fullgraph import set_precision  # noqa: E402


def disk_read_bytes():
    """read_bytes of /proc/self/io: what this process made the block layer read, or None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class MmapFeatures:
    """features.npy left on disk: rows gathered per batch on the host, then copied to the GPU."""

    def __init__(self, feats, dtype, device):
        self.feats = feats  # np.memmap, read-only
        self.bf16 = dtype == "bf16"
        self.device = device
        self.shape = feats.shape
        self.host = feats.view(np.int16) if self.bf16 else feats  # a dtype torch has
        # Grown to the largest batch and reused: the previous batch's copy out of it has finished
        # by the time the next batch's ids come back to the host (nodes.cpu() synchronises).
        self.pinned = None

    def rows(self, nodes):
        ids = nodes.cpu().numpy()
        uniq, inv = np.unique(ids, return_inverse=True)  # sorted: the memmap is read in file order
        n = uniq.size
        if self.pinned is None or self.pinned.shape[0] < n:
            dtype = torch.from_numpy(np.empty(0, dtype=self.host.dtype)).dtype
            self.pinned = torch.empty((max(n, 1), self.shape[1]), dtype=dtype, pin_memory=True)
        buf = self.pinned[:n]
        # mode="clip": with the default "raise", numpy gathers into a temporary and copies it to out.
        np.take(self.host, uniq, axis=0, out=buf.numpy(), mode="clip")
        x = buf.to(self.device, non_blocking=True)
        if self.bf16:
            x = x.view(torch.bfloat16)
        return x[torch.from_numpy(inv.reshape(-1)).to(self.device, non_blocking=True)]


def to_device_int64(array, device, chunk=1 << 26):
    out = torch.empty(array.shape[0], dtype=torch.int64, device=device)
    for first in range(0, array.shape[0], chunk):
        part = np.ascontiguousarray(array[first:first + chunk]).astype(np.int64)
        out[first:first + part.shape[0]].copy_(torch.from_numpy(part))
    return out


def load_store(path, device, features="gpu"):
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    # Memory-mapped and widened to int64 a chunk at a time on its way to the device, so the host
    # never holds the topology (R-MAT 25's 4.2 GB of int32 indices would be 8.4 GB as int64: more
    # than an 8 GB cgroup) and the GPU never an int32 and an int64 copy at once.
    rowptr = to_device_int64(np.load(os.path.join(path, "graph/indptr.npy"), mmap_mode="r"), device)
    col = to_device_int64(np.load(os.path.join(path, "graph/indices.npy"), mmap_mode="r"), device)
    dtype = manifest.get("feature_dtype", "f32")
    if dtype not in ("f32", "f16", "bf16"):
        sys.exit(f"{path}: feature_dtype '{dtype}': expected f32, f16 or bf16")
    if features == "mmap":
        x = MmapFeatures(np.load(os.path.join(path, "features.npy"), mmap_mode="r"), dtype, device)
    else:
        feats = np.load(os.path.join(path, "features.npy"))
        if dtype == "bf16":  # stored as <u2: reinterpret the bits
            x = torch.from_numpy(feats.view(np.int16)).view(torch.bfloat16)
        else:
            x = torch.from_numpy(feats)
        x = x.to(device)
        del feats
    y = torch.from_numpy(np.load(os.path.join(path, "labels.npy")).astype(np.int64)).to(device)
    train = torch.from_numpy(np.load(os.path.join(path, "splits/train.npy")).astype(np.int64)).to(device)
    train = train[y[train] >= 0]
    return rowptr, col, x, y, train, int(manifest["num_classes"])


def sample(rowptr, col, seeds, fanouts):
    """The anchor's sampler: per hop, k neighbours with replacement; dst nodes first in each block."""
    dev = seeds.device
    nodes = seeds
    blocks = []
    for k in fanouts:
        deg = rowptr[nodes + 1] - rowptr[nodes]
        off = (torch.rand(nodes.numel(), k, device=dev) * deg.unsqueeze(1)).long()
        nb = col[(rowptr[nodes].unsqueeze(1) + off).clamp(max=col.numel() - 1)]
        valid = (deg > 0).unsqueeze(1).expand(-1, k)
        d = torch.arange(nodes.numel(), device=dev).unsqueeze(1).expand(-1, k)[valid]
        s = nb[valid]
        allv, inv = torch.unique(torch.cat([nodes, s]), return_inverse=True)
        # keep dst nodes first: remap so that nodes occupy positions [0, len(nodes))
        order = torch.full((allv.numel(),), -1, device=dev, dtype=torch.long)
        order[inv[: nodes.numel()]] = torch.arange(nodes.numel(), device=dev)
        rest = (order < 0).nonzero().squeeze(1)
        order[rest] = torch.arange(nodes.numel(), nodes.numel() + rest.numel(), device=dev)
        newnodes = torch.empty_like(allv)
        newnodes[order] = allv
        blocks.append((torch.stack([order[inv[nodes.numel():]], d]), nodes.numel()))
        nodes = newnodes
    return nodes, blocks[::-1]


def run(a, dev):
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(a.seed)
    rowptr, col, x, y, train, ncls = load_store(a.store, dev, a.features)
    kind = f"mmap {x.feats.dtype}" if a.features == "mmap" else f"{x.dtype} on the GPU"
    print(f"store {a.store}: n={rowptr.numel() - 1} nnz={col.numel()} features {tuple(x.shape)} {kind} "
          f"classes={ncls} train seeds={train.numel()}", file=sys.stderr, flush=True)
    if train.numel() == 0:
        sys.exit(f"{a.store}: no labelled training nodes in splits/train.npy")
    dims = [x.shape[1]] + [a.hidden] * (a.layers - 1) + [ncls]
    convs = torch.nn.ModuleList([SAGEConv(dims[i], dims[i + 1]) for i in range(a.layers)]).to(dev)
    opt = torch.optim.Adam(convs.parameters(), lr=0.003)
    bsz = a.batch_size
    nb = (train.numel() + bsz - 1) // bsz
    gather = x.rows if a.features == "mmap" else (lambda nodes: x[nodes])

    def step(seeds):
        allnodes, blocks = sample(rowptr, col, seeds, a.fanouts)
        h = gather(allnodes).float()
        for j, (ei, ndst) in enumerate(blocks):
            h = convs[j]((h, h[:ndst]), ei)
            if j < a.layers - 1:
                h = F.relu(h)
        opt.zero_grad()
        F.cross_entropy(h, y[seeds]).backward()
        opt.step()

    if a.batches:
        def seed_batches():  # one permutation per epoch, as many epochs as it takes
            while True:
                p = train[torch.randperm(train.numel(), device=dev)]
                for i in range(nb):
                    yield p[i * bsz:(i + 1) * bsz]

        batches = seed_batches()
        # Every 10 batches a progress line on stderr ("progress warmup|timed DONE SECONDS", seconds
        # since that phase began): a run stopped by a timeout (an mmap'd store thrashing under a
        # memory limit) still tells its rate.
        t = time.time()
        for i in range(a.warmup_batches):
            step(next(batches))
            if (i + 1) % 10 == 0:
                torch.cuda.synchronize()
                print(f"progress warmup {i + 1} {time.time() - t:.3f}", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        read0 = disk_read_bytes()
        t = time.time()
        for i in range(a.batches):
            step(next(batches))
            if (i + 1) % 10 == 0 and i + 1 < a.batches:
                torch.cuda.synchronize()
                print(f"progress timed {i + 1} {time.time() - t:.3f}", file=sys.stderr, flush=True)
        torch.cuda.synchronize()
        dt = time.time() - t
        read1 = disk_read_bytes()
        print(f"{a.batches} batches after {a.warmup_batches} warmup: {dt:.2f} s "
              f"({dt / a.batches * 1000:.1f} ms/batch)", file=sys.stderr, flush=True)
        return {"s_per_batch": round(dt / a.batches, 5), "ms_per_batch": round(dt / a.batches * 1000, 3),
                "timed_batches": a.batches, "warmup_batches": a.warmup_batches, "batches": nb,
                "timed_read_bytes": read1 - read0 if read0 is not None and read1 is not None else None,
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)}

    times = []
    for ep in range(a.warmup + a.epochs):
        torch.cuda.synchronize()
        t = time.time()
        p = train[torch.randperm(train.numel(), device=dev)]
        for i in range(nb):
            step(p[i * bsz:(i + 1) * bsz])
        torch.cuda.synchronize()
        dt = time.time() - t
        timed = ep >= a.warmup
        if timed:
            times.append(dt)
        print(f"epoch {ep}{'' if timed else ' (warmup)'}: {dt:.2f} s for {nb} batches "
              f"({dt / nb * 1000:.1f} ms/batch)", file=sys.stderr, flush=True)
    med = statistics.median(times)
    return {"epoch_s": [round(t, 4) for t in times], "s_per_epoch": round(med, 4),
            "s_per_batch": round(med / nb, 5), "ms_per_batch": round(med / nb * 1000, 3), "batches": nb,
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--features", choices=("gpu", "mmap"), default="gpu")
    p.add_argument("--batches", type=int, default=0, help="time N batches instead of whole epochs")
    p.add_argument("--warmup-batches", type=int, default=20)
    p.add_argument("--tf32", action="store_true", help="GEMMs on TF32 tensor cores (default: fp32)")
    a = p.parse_args()
    try:
        a.fanouts = [int(v) for v in a.fanouts.split(",")]
    except ValueError:
        p.error(f"--fanouts: expected integers such as 15,10,5, found '{a.fanouts}'")
    if len(a.fanouts) != a.layers:
        p.error(f"--fanouts has {len(a.fanouts)} hops but --layers is {a.layers}")
    if min(a.fanouts) < 1 or a.batch_size < 1 or a.hidden < 1 or a.layers < 1 or a.epochs < 1 or a.warmup < 0:
        p.error("fanouts, --batch-size, --hidden, --layers and --epochs must be positive, --warmup >= 0")
    if a.batches < 0 or a.warmup_batches < 0:
        p.error("--batches and --warmup-batches must be >= 0")
    if not torch.cuda.is_available():
        print("torch_minibatch.py: no CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda")
    precision = set_precision(a.tf32)
    row = {"model": "sage", "device": torch.cuda.get_device_name(), "features": a.features, **precision}
    try:
        row.update(run(a, dev))
        row.update(fanouts=a.fanouts, batch_size=a.batch_size)
    except torch.cuda.OutOfMemoryError as e:
        row = {"model": "sage", "error": "OOM", "device": row["device"], "features": a.features, **precision,
               "detail": str(e)[:160]}
    # ru_maxrss is KiB on Linux.
    row.update(host_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               disk_read_bytes=disk_read_bytes())
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
