"""The committed benchmark history per (op, shape): where the newest run reads below the best run since a
date, by more than a margin. It finds regressions that no single run shows (the LayerNorm forward at
16384 x 8192 fell from 0.930 to 0.903 of copy with one commit and stayed there for six runs).

    python3 tools/results_history.py [--device H200] [--since 2026-12-03] [--margin 0.02]
                                     [--op layer_norm_fwd --shape 16384x8192]

Reads the committed runs of the device as tools/readme_table.py does (no sweeps, A/B files or runs with
an NVRTC experiment in place),
takes fusedkit's fraction of copy (GB/s over the copy timed in the same run) for bandwidth-bound rows
and its speedup over cuBLASLt for the GEMM rows, and prints each flagged row with the run and commit of
its best and newest value. With --op (and --shape) it prints that row's whole history instead. One
run's value is one timing: the benchmark machine is noisy, so a flag is a lead to check in the history,
not a verdict (the FP8 norm rows swing 10-25 % between runs of one commit).
"""
import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readme_table import gpu_results  # noqa: E402  (the committed runs, as the README table reads them)


def runs(device: str):
    """(run tag, commit, {(op, shape): value}) per committed run of the device, oldest first."""
    out = []
    for date, path, d in gpu_results(device):
        copy, values, peers = d.get("copy_GBps"), {}, defaultdict(dict)
        for r in d["rows"]:
            key = (r["op"], "x".join(str(v) for v in r["shape"]))
            peers[key][r["impl"]] = r["ms"]
            if r["impl"] == "fusedkit" and r.get("GBps") and copy:
                values[key] = r["GBps"] / copy
        for key, ms in peers.items():  # GEMM rows: speedup over cuBLASLt in the same run
            if key[0].startswith("fp8_gemm") and "fusedkit" in ms and "cublaslt" in ms:
                values[key] = ms["cublaslt"] / ms["fusedkit"]
        out.append((date[:19], str(d.get("commit", ""))[:7], values))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="H200", help="a substring of the runs' device name")
    p.add_argument("--since", default="", help="the best run is taken from runs on or after this date")
    p.add_argument("--margin", type=float, default=0.02)
    p.add_argument("--op")
    p.add_argument("--shape", help="e.g. 16384x8192 (with --op)")
    args = p.parse_args(argv)
    history = runs(args.device)
    if not history:
        print(f"no committed runs of a device named like {args.device!r}")
        return 1
    if args.op:
        for tag, commit, values in history:
            for (op, shape), v in sorted(values.items()):
                if op == args.op and (args.shape is None or shape == args.shape):
                    print(f"{tag:22s} {commit:8s} {op} {shape} {v:.3f}")
        return 0
    series = defaultdict(list)
    for tag, commit, values in history:
        for key, v in values.items():
            series[key].append((tag, commit, v))
    for (op, shape), s in sorted(series.items()):
        recent = [t for t in s if t[0] >= args.since]
        if len(recent) < 2:
            continue
        best, last = max(recent, key=lambda t: t[2]), s[-1]
        if last[2] < best[2] - args.margin:
            print(f"{op:28s} {shape:16s} newest {last[2]:.3f} ({last[0]} {last[1]})  "
                  f"best {best[2]:.3f} ({best[0]} {best[1]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
