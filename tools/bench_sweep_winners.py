"""Benchmark with the winners of a norm sweep in place: reads the sweep JSON (tools/sweep_norms.py), puts
each (op, N)'s fastest backward config into cuda_norms.TUNED_STAGED / TUNED_PAIR for this process only,
prints them, then runs ``fusedkit bench`` with the remaining arguments. For a device call that sweeps and
confirms in one go; a winner is shipped only by editing cuda_norms.py afterwards.

    python3 tools/bench_sweep_winners.py SWEEP_JSON --only norm_fwd --rounds 3 --out DIR
"""
import json
import sys

from fusedkit import bench
from fusedkit.backends import cuda_norms as cn


def main(argv):
    path, rest = argv[0], argv[1:]
    best = {}
    for r in json.load(open(path))["results"]:
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
