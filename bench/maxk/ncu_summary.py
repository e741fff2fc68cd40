#!/usr/bin/env python3
"""Condenses `ncu --csv --page details` output of the MaxK kernels into one line per launch.

usage: ncu_summary.py NCU_CSV   (prints a fixed-width table: kernel, time, DRAM and L2 traffic,
hit rates, occupancy, issue activity, top stall reasons)
"""
import csv
import re
import sys
from collections import OrderedDict


def short(name):
    m = re.search(r"(\w+_kernel)<([^>]*)>", name)
    if not m:
        m = re.search(r"(\w+)\(", name)
        return m.group(1) if m else name[:40]
    args = m.group(2).replace("unsigned char", "u8").replace("unsigned short", "u16")
    args = args.replace("true", "T").replace("false", "F").replace(" ", "")
    return "%s<%s>" % (m.group(1).replace("_kernel", ""), args)


def main(path):
    rows = OrderedDict()
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    table = list(csv.reader(lines))
    if not table:
        print("no ncu rows in", path)
        return
    header = table[0]
    if "Metric Name" in header:  # --page details: one row per metric
        for r in csv.DictReader(lines):
            key = (r["ID"], short(r["Kernel Name"]))
            rows.setdefault(key, {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
    else:  # --page raw: a header of metric names, a row of units, one row per launch
        units = table[1]
        for r in table[2:]:
            d = dict(zip(header, r))
            key = (d.get("ID", str(len(rows))), short(d.get("Kernel Name", "?")))
            rows[key] = {h: (v, u) for h, v, u in zip(header, r, units)}

    def val(m, name, scale=1.0):
        v = m.get(name)
        if v is None:
            return float("nan")
        try:
            x = float(v[0].replace(",", ""))
        except ValueError:
            return float("nan")
        unit = v[1]
        mult = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
                "nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
                "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}.get(unit, 1.0)
        return x * mult * scale

    print("%-30s %8s %7s %7s %7s %6s %6s %6s %6s %8s  %s" % (
        "kernel", "ms", "dramR", "dramW", "L2GB", "L2hit", "L1hit", "occ%", "issue%", "Minst", "top stalls (cycles/issue)"))
    for (i, k), m in rows.items():
        stalls = []
        for name, v in m.items():
            s = re.match(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", name)
            if s:
                try:
                    stalls.append((float(v[0]), s.group(1)))
                except ValueError:
                    pass
        stalls.sort(reverse=True)
        top = " ".join("%s=%.1f" % (n, x) for x, n in stalls[:4])
        print("%-30s %8.3f %7.3f %7.3f %7.2f %6.1f %6.1f %6.1f %6.1f %8.1f  %s" % (
            k[:30], val(m, "gpu__time_duration.sum"), val(m, "dram__bytes_read.sum", 1e-9),
            val(m, "dram__bytes_write.sum", 1e-9), val(m, "lts__t_bytes.sum", 1e-9),
            val(m, "lts__t_sector_hit_rate.pct"), val(m, "l1tex__t_sector_hit_rate.pct"),
            val(m, "sm__warps_active.avg.pct_of_peak_sustained_active"),
            val(m, "smsp__issue_active.avg.pct_of_peak_sustained_active"),
            val(m, "smsp__inst_executed.sum", 1e-6), top))


if __name__ == "__main__":
    main(sys.argv[1])
