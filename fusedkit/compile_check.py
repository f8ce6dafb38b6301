"""Compile every registered kernel instantiation through NVRTC for each target, without a GPU.

``python -m fusedkit compile-check`` (also a test). For sm_90a it asks ptxas for its resource report
and fails on any spill (stack frame or spill stores/loads) and on any kernel whose wgmma ptxas serialised
(C7514: a wait after every wgmma).
"""
from __future__ import annotations

import os
import re
import time

from . import _jit
from ._registry import all_expressions

TARGETS = tuple(os.environ.get("FUSEDKIT_COMPILE_TARGETS", "sm_80,sm_90a,sm_100a").split(","))
_SPILL = re.compile(r"Function properties for (\S+)\s*\n\s*ptxas\s*\.\s*(\d+) bytes stack frame, "
                    r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SERIAL = re.compile(r"\(C7514\).*?in the function '(\S+)'")
_REGS = re.compile(r"Compiling entry function '(\S+)' for '(\S+)'.*?Used (\d+) registers", re.S)


def _compile_one(file: str, exprs: list, arch: str) -> tuple[list[str], str]:
    """Compile one file's instantiations for one target: (problems, a line for the log)."""
    t0 = time.perf_counter()
    extra = ("-Xptxas=-v",) if arch == "sm_90a" else ()
    try:
        res = _jit.compile_cubin(file, exprs, arch, extra)
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        return [f"{file} {arch}: {str(e)[:4000]}"], f"{file:12s} {arch:8s} FAILED"
    problems = []
    if arch == "sm_90a":
        names = {v: k for k, v in res.lowered.items()}
        for fn in _SERIAL.findall(res.log):  # ptxas put a wait after every wgmma
            problems.append(f"{file} {arch}: {names.get(fn, fn)}: wgmma serialised by ptxas (C7514)")
        for fn, stack, st, ld in _SPILL.findall(res.log):
            if int(stack) or int(st) or int(ld):
                problems.append(f"{file} {arch}: {names.get(fn, fn)} spills: {stack} B stack, "
                                f"{st} B spill stores, {ld} B spill loads")
    dt = time.perf_counter() - t0
    return problems, f"{file:12s} {arch:8s} {len(exprs):4d} kernels  {dt:6.1f} s  cubin {len(res.cubin)} B"


def run(targets=TARGETS, verbose=True, workers=None) -> list[str]:
    """Returns a list of problems (empty when every kernel compiled without spills). The (file, target)
    compilations run in ``workers`` processes (default: one per CPU; NVRTC compiles one program on
    one thread, and the norms alone are ~860 instantiations a target)."""
    jobs = [(file, exprs, arch) for file, exprs in all_expressions().items() for arch in targets]
    jobs.sort(key=lambda j: -len(j[1]))  # the largest first, so the pool ends together
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_compile_one, *zip(*jobs)))
    else:
        results = [_compile_one(*job) for job in jobs]
    problems = []
    for probs, line in results:
        problems += probs
        if verbose:
            print(line)
    return problems


def main() -> int:
    problems = run()
    for p in problems:
        print("FAIL", p)
    print("compile-check:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0
