"""Compare the machine code of the FP8 GEMM's two tile walks (data-parallel and stream-K) without a GPU.

    PYTHONPATH=. python3 tools/gemm_sass_walks.py [split fast block]

For each accumulation mode, compiles its table kernel (bf16 output) with SCHED = dp and sk for sm_90a and
prints, per walk: instructions, registers, R2UR moves (vector to uniform register) in all and within 8
instructions before a wgmma, and uniform-datapath instructions. A walk whose K loop left the uniform
datapath shows R2UR before every wgmma: the stream-K split kernel did (35 against 18) and ran 7-10 %
slower than the data-parallel one on the H200 (cuda/fp8_gemm_sm90.cu, GemmWalk).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_digest  # noqa: E402  (nvdisasm lookup)

from fusedkit import _jit  # noqa: E402
from fusedkit.backends import cuda_gemm  # noqa: E402

_OP = re.compile(r"\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def table_variant(mode):
    bn, _, cluster, store = cuda_gemm.config(8192, 8192, mode)
    return [v for v in cuda_gemm.SK_VARIANTS if v[0] == mode and v[1] == bn] or [(mode, bn, cluster, store)]


def profile(body):
    ops = [m.group(2).split(".")[0] for m in map(_OP.search, body.split("\n")) if m]
    near = sum(ops[max(0, i - 8):i].count("R2UR") for i, op in enumerate(ops) if op.endswith("GMMA"))
    uniform = sum(1 for op in ops if op.startswith("U") and op != "UTMALDG")
    return len(ops), ops.count("R2UR"), near, uniform


def main(modes):
    for mode in modes:
        _, bn, cluster, store = table_variant(mode)[0]
        exprs = [cuda_gemm.expr("e4m3", "e4m3", bn, mode, "bfloat16", cuda_gemm.stages_for(bn, "bfloat16", store),
                                1, store, walk) for walk in ("dp", "sk")]
        res = _jit.compile_cubin(cuda_gemm.FILE, exprs, "sm_90a", ("-Xptxas=-v",))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(res.cubin)
            f.flush()
            sass = subprocess.run([sass_digest.nvdisasm(), "-c", f.name], capture_output=True, text=True,
                                  check=True).stdout
        parts = re.split(r"\n\s*\.text\.(\S+):", sass)
        bodies = dict(zip(parts[1::2], parts[2::2]))
        for walk, e in zip(("dp", "sk"), exprs):
            low = res.lowered[e]
            regs = re.search(r"Compiling entry function '%s'.*?Used (\d+) registers" % re.escape(low), res.log, re.S)
            n, r2ur, near, uniform = profile(bodies[low])
            print(f"{mode:5s} BN={bn} {store:6s} {walk}: {n:5d} instructions, {regs.group(1) if regs else '?'} "
                  f"registers, R2UR {r2ur:3d} ({near:2d} within 8 before a wgmma), uniform {uniform:3d}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["split", "fast", "block"])
