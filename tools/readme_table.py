"""Regenerate the README's performance tables from the committed GPU results in benchmarks/results/.

python tools/readme_table.py          # rewrites the block between the PERF markers in README.md

Each (op, shape) comes from the newest GPU run on the reference card (README_DEVICE, default H200: the
card the issues' targets are set on) that measured it (a run of some ops, e.g. `--only gemm`, does not
hide the others); the file each figure comes from is named under the table. Runs on other cards (an
H100 when no H200 was lent) stay in benchmarks/results/ and out of the table. Ratios are always within
one run: GB/s over that run's copy, peer time over fusedkit time.
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("torch_eager", "torch_compile", "liger")
DEVICE = os.environ.get("README_DEVICE", "H200")


def gpu_results(device=None):
    """The reference card's result files (not sweeps, probes, CPU runs, compile-option experiments or other
    cards; ``device``: a substring of the run's device name, default README_DEVICE), oldest first."""
    device = DEVICE if device is None else device
    out = []
    for f in glob.glob(os.path.join(ROOT, "benchmarks/results/*.json")):
        if os.path.basename(f).startswith(("sweep_", "ab_", "probe_", "cpu")):
            continue
        res = json.load(open(f))
        if "experiment" in res or "rows" not in res or device not in res.get("device", ""):
            continue
        out.append((res["date"], f, res))
    return sorted(out, key=lambda t: t[0])


def newest_groups():
    """{(op, shape): (impls, copy_GBps, file, date)} from the newest run that has each (op, shape). A run's
    ``host_bound_ops`` ({key: why}, written into the results file after the run; a key is an op, every
    shape, or "op@MxN", one shape) are left to older runs: rows whose peers were limited by the host in
    that run, so their ratios say nothing of the kernels."""
    groups = {}
    for date, f, res in gpu_results():
        mine = {}
        marked = res.get("host_bound_ops", {})
        for r in res["rows"]:
            if r["op"] in marked or f"{r['op']}@{'x'.join(map(str, r['shape']))}" in marked:
                continue
            mine.setdefault((r["op"], tuple(r["shape"])), {})[r["impl"]] = r
        for k, impls in mine.items():
            groups[k] = (impls, res.get("copy_GBps"), f, date, res["device"], res.get("torch_compile_fresh", False))
    return groups


def eager_fallback(impls) -> bool:
    """A torch.compile time within 5 % of torch eager's in a run that did not reset dynamo per (op, shape)."""
    c, e = impls.get("torch_compile"), impls.get("torch_eager")
    return c is not None and e is not None and abs(c["ms"] / e["ms"] - 1) < 0.05


def table() -> str:
    groups = newest_groups()
    used = sorted({(v[3][:10], os.path.relpath(v[2], ROOT), v[4]) for v in groups.values()})
    lines = ["Bandwidth-bound ops, bf16: GB/s from each op's byte model (4MN forward, 10MN forward+backward for "
             "the norms; docs list the rest), \"of copy\" = over a device copy timed in the same run; speedup = "
             "peer time / fusedkit time, same run.", "",
             "| op | M x N | fusedkit GB/s | of copy | vs torch eager | vs torch.compile | vs Liger |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    gemm, overhead = [], []
    suspect = 0
    for (op, shape), (impls, copy, _f, _d, _dev, fresh) in groups.items():
        mine = impls.get("fusedkit")
        if "overhead" in op:
            overhead.append(f"{op.split('_host')[0]} {' x '.join(map(str, shape))}: "
                            + ", ".join(f"{k} {v['ms'] * 1e3:.1f} us" for k, v in impls.items()))
        elif mine is None:
            continue
        elif mine.get("TFLOPs"):
            peers = [f"{k} {impls[k]['ms'] / mine['ms']:.2f}x" for k in impls if k != "fusedkit"]
            gemm.append(f"| {op} | {shape[0]} x {shape[1]} x {shape[2]} | {mine['TFLOPs']:.0f} | "
                        + ", ".join(peers) + " |")
        else:
            sp = [f"{impls[p]['ms'] / mine['ms']:.2f}x" if p in impls else "-" for p in PEERS]
            if not fresh and eager_fallback(impls):
                sp[1] = "(eager)"
                suspect += 1
            lines.append(f"| {op} | {shape[0]} x {shape[1]} | {mine['GBps']:.0f} | {mine['GBps'] / copy:.2f} | "
                         + " | ".join(sp) + " |")
    if suspect:
        lines += ["", f"(eager): {suspect} rows of runs before 2026-12-04 21:50Z whose torch.compile time is within 5 % "
                  "of torch eager's. In those runs a compiled peer function serving more than 8 shapes fell back to "
                  "eager at torch._dynamo's recompile limit, and such rows cannot be told apart from a compiled kernel "
                  "that is merely no faster than eager; their torch.compile ratio is left out until they are measured "
                  "again (the benchmark now resets dynamo per op and shape)."]
    if gemm:
        lines += ["", "FP8 GEMM (E4M3 x E4M3, TN), TFLOP/s = 2MNK / time; speedup = peer time / fusedkit time, same "
                  "run (cuBLASLt through torch._scaled_mm in the same accumulation mode).", "",
                  "| op | M x K x N | fusedkit TFLOP/s | speedup over |", "| --- | --- | --- | --- |"] + gemm
    if overhead:
        lines += ["", "Host time per call (launches queued back to back): " + "; ".join(overhead) + "."]
    lines += ["", "Runs: " + "; ".join(f"{d} {dev} (`{f}`)" for d, f, dev in used) + "."]
    for _, f, res in gpu_results():
        by_why = {}
        for op, why in res.get("host_bound_ops", {}).items():
            by_why.setdefault(why, []).append(op)
        for why, ops in by_why.items():
            lines.append(f"Left out of `{os.path.relpath(f, ROOT)}`: {', '.join(ops)} ({why}).")
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1:  # no options: anything else (e.g. --help) prints the usage, README untouched
        print(__doc__)
        return
    readme = os.path.join(ROOT, "README.md")
    text = open(readme).read()
    block = table()
    text = re.sub(r"(<!-- PERF:BEGIN -->\n).*?(<!-- PERF:END -->)", lambda m: m.group(1) + block + "\n" + m.group(2),
                  text, flags=re.S)
    open(readme, "w").write(text)
    print(block)


if __name__ == "__main__":
    main()
