"""Regenerate the README's performance table from the newest benchmarks/results/*.json of a GPU run.

python tools/readme_table.py          # rewrites the block between the PERF markers in README.md
"""
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("torch_eager", "torch_compile", "liger")


def newest_gpu_result():
    files = [f for f in glob.glob(os.path.join(ROOT, "benchmarks/results/*.json"))
             if not os.path.basename(f).startswith(("sweep_", "cpu"))]
    files = [f for f in files if "experiment" not in json.load(open(f))]  # experiments are not the code
    return max(files, key=lambda f: json.load(open(f))["date"])


def table(path) -> str:
    res = json.load(open(path))
    copy = res["copy_GBps"]
    groups = {}
    for r in res["rows"]:
        groups.setdefault((r["op"], tuple(r["shape"])), {})[r["impl"]] = r
    lines = [f"Measured {res['date'][:10]} on {res['device']} (`{os.path.relpath(path, ROOT)}`); copy ceiling "
             f"{copy:.0f} GB/s in the same run. GB/s from the byte model (4MN forward, 10MN forward+backward, "
             f"bf16); speedup = peer time / fusedkit time.", "",
             "| op | M x N | fusedkit GB/s | of copy | vs torch eager | vs torch.compile | vs Liger |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    overhead = []
    for (op, shape), impls in groups.items():
        if "overhead" in op:
            overhead = [f"{k}: {v['ms'] * 1e3:.1f} us" for k, v in impls.items()]
            continue
        mine = impls.get("fusedkit")
        if mine is None:
            continue
        sp = [f"{impls[p]['ms'] / mine['ms']:.2f}x" if p in impls else "-" for p in PEERS]
        lines.append(f"| {op} | {shape[0]} x {shape[1]} | {mine['GBps']:.0f} | {mine['GBps'] / copy:.2f} | "
                     + " | ".join(sp) + " |")
    if overhead:
        lines += ["", "Host time per call (4 x 1024 layer_norm, launches queued back to back): " + ", ".join(overhead) + "."]
    return "\n".join(lines)


def main():
    readme = os.path.join(ROOT, "README.md")
    text = open(readme).read()
    block = table(newest_gpu_result())
    text = re.sub(r"(<!-- PERF:BEGIN -->\n).*?(<!-- PERF:END -->)", lambda m: m.group(1) + block + "\n" + m.group(2),
                  text, flags=re.S)
    open(readme, "w").write(text)
    print(block)


if __name__ == "__main__":
    main()
