"""Benchmark with the winners of a sweep in place: reads the sweep JSON of tools/sweep_norms.py (each
(op, N)'s fastest backward config into cuda_norms.TUNED_STAGED / TUNED_PAIR) or of
tools/sweep_cross_entropy.py (each N's fastest config into cuda_cross_entropy.TUNED, bf16), for this
process only, prints them, then runs ``fusedkit bench`` with the remaining arguments. For a device call
that sweeps and confirms in one go; a winner is shipped only by editing cuda_norms.py /
cuda_cross_entropy.py afterwards.

    python3 tools/bench_sweep_winners.py SWEEP_JSON --only norm_fwd --rounds 3 --out DIR
"""
import json
import sys

from fusedkit import bench
from fusedkit.backends import cuda_cross_entropy as cc
from fusedkit.backends import cuda_norms as cn


def cross_entropy_winners(rows):
    best = {}
    for r in rows:
        if r.get("ms") is not None and (r["N"] not in best or r["ms"] < best[r["N"]]["ms"]):
            best[r["N"]] = r
    for N, r in sorted(best.items()):
        cc.TUNED[(N, 2)] = tuple(r["config"])
        print(f"bench_sweep_winners: cross_entropy N={N} -> {tuple(r['config'])} ({r['of_copy']:.3f} of copy "
              "in the sweep)", flush=True)


def main(argv):
    path, rest = argv[0], argv[1:]
    sweep = json.load(open(path))
    if "rows" in sweep:  # tools/sweep_cross_entropy.py
        cross_entropy_winners(sweep["rows"])
        return bench.main(rest)
    best = {}
    for r in sweep["results"]:
        if r["dir"] != "bwd":
            continue
        key = ("rms" if r["rms"] else "ln", r["N"], 2)
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    for key, r in sorted(best.items()):
        cfg = tuple(r["cfg"])
        if cfg[0] == "pair":  # TUNED_PAIR takes precedence over TUNED_STAGED
            cn.TUNED_PAIR[key] = cfg[2:]
        else:
            cn.TUNED_PAIR.pop(key, None)
            cn.TUNED_STAGED[key] = cfg[2:]
        print(f"bench_sweep_winners: {key} -> {cfg} ({r['of_copy']:.3f} of copy in the sweep)", flush=True)
    return bench.main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
