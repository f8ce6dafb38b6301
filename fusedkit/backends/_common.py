"""What every CUDA launcher module shares: vector widths under pointer alignment, the SM count, the
grid of a grid-stride kernel, memoized ``Launcher``s (fusedkit/_launch.py) per kernel, the row kernels'
launch plans and the staged kernels' ring depth."""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Optional

from .. import _jit
from .._launch import Launcher


def vec_width(n: int, itemsize: int, max_vec: int = 16) -> int:
    """Elements per vector access: 16 bytes when n (and the pointers' alignment, max_vec elements)
    allow, else the largest power of two that divides both."""
    v = min(16 // itemsize, max_vec)
    while n % v:
        v //= 2
    return v


def check_row_config(op: str, cfg, N: int, vec: int, slots: int) -> None:
    """A register-mapped launch config (``slots`` vector slots per row: CTAs x threads x vectors each) must
    hold a whole row of N: N in whole vectors of ``vec`` and slots x vec >= N. A forced config that does
    not would leave part of every row out, silently; this refuses it before anything launches."""
    if N % vec or slots * vec < N:
        raise ValueError(f"fusedkit: {op} launch config {cfg} does not hold rows of {N} elements (it needs N "
                         f"in whole vectors of {vec} and {slots} slots x {vec} >= N); leave config unset for "
                         f"the tuned one")


def align_elems(pairs) -> int:
    """Largest power-of-two element count (at most 16) every (pointer, element size) pair is aligned
    to; null pointers are ignored."""
    a = 16
    for ptr, size in pairs:
        if ptr:
            low = ptr & -ptr
            while a > 1 and low < a * size:
                a //= 2
    return a


@lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    import cupy
    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


class LaunchPlan(NamedTuple):
    """A row kernel's launch, built once per shape and config: the Launcher, the block, rows per block,
    CTAs per row (the cluster size), dynamic shared memory, and the grid cap: the resident clusters for a
    persistent kernel, None for a grid of one block (cluster) per row group (cross-entropy: 0 for its
    staged kernel's one row per cluster)."""
    fn: Launcher
    block: tuple
    rows_per_block: int
    ctas_per_row: int
    smem: int
    cap: Optional[int]


def ring_stages(cfg, fields: int = 5) -> int:
    """The ring depth of a persistent staged config (common/staged.cuh STAGES): its field after the first
    ``fields`` (kind, vec, items, warps, C), 1 when absent. 1 to 4."""
    stages = cfg[fields] if len(cfg) > fields else 1
    if len(cfg) > fields + 1 or not 1 <= stages <= 4:
        raise ValueError(f"fusedkit: a staged config is (kind, vec, items, warps, C) with an optional ring "
                         f"depth of 1 to 4 buffers, got {cfg}")
    return stages


def stages_arg(stages: int) -> str:
    """The kernels' STAGES template argument as their names carry it (none for the default 1)."""
    return "" if stages == 1 else f", {stages}"


def grid_stride_blocks(work: int, threads: int, device: int, per_sm: int = 8) -> int:
    """Blocks for a grid-stride kernel over ``work`` items, one per thread: enough to cover them, at
    most ``per_sm`` blocks per SM."""
    return max(1, min(-(-work // threads), sm_count(device) * per_sm))


_launchers: dict = _jit.plan_cache()


def launcher(file: str, expr: str, codes: str, device: int, cluster: int = 1) -> Launcher:
    """The Launcher of kernel ``expr`` of ``cuda/<file>`` on ``device`` (compiled and loaded once);
    ``cluster`` > 1: launched with clusters of that many CTAs (a cluster attribute)."""
    key = (file, expr, device, cluster)
    fn = _launchers.get(key)
    if fn is None:
        fn = _launchers[key] = Launcher(_jit.get_kernel(file, expr, device).kernel, codes, device,
                                        cluster=cluster if cluster > 1 else None)
    return fn


_occ: dict = _jit.plan_cache()


def blocks_per_sm(kernel, expr, device, threads, smem) -> int:
    """Resident blocks per SM of ``kernel`` (a RawKernel from _jit.get_kernel) with ``threads`` threads
    and ``smem`` bytes of dynamic shared memory; opts the kernel in to more than 48 KB where needed."""
    key = (device, expr, threads, smem)
    n = _occ.get(key)
    if n is None:
        import cupy
        if smem > 32 * 1024 and kernel.max_dynamic_shared_size_bytes < smem:  # opt in past 48 KB
            kernel.max_dynamic_shared_size_bytes = smem
        n = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, smem)
        if n < 1:
            raise RuntimeError(f"fusedkit: {expr} cannot launch {threads} threads with {smem} B of "
                               f"shared memory on device {device}")
        _occ[key] = n
    return n


def resident_clusters(fn: Launcher, block, device: int, smem: int = 0) -> int:
    """Clusters of a cluster Launcher's shape that can be resident at once on ``device`` with ``block``
    threads and ``smem`` bytes of dynamic shared memory (0: it cannot launch here)."""
    import cupy
    with cupy.cuda.Device(device):
        return fn.cluster.max_active_clusters(block, smem)
