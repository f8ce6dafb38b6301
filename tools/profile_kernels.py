"""Two launches of each kernel whose H200 ratio is below its target, for Nsight Compute:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
        --section SchedulerStats --section WarpStateStats -k regex:'CASES' -c 40 python3 tools/profile_kernels.py

Cases (bf16, 2^27 elements, the benchmark shapes; name them as arguments to run only some):
  norm_fwd        LayerNorm forward at 32768 x 4096 (the reference point: 0.94 of copy)
  ln1024          LayerNorm forward at 131072 x 1024, fusedkit and torch.compile (NCU_KERNELS="norm_fwd|triton")
  rms8192         RMSNorm forward at 16384 x 8192, fusedkit and torch.compile (0.95x on the H200)
  norm_fwd_fp8    the same with E4M3 output (0.75-0.83: the gap to explain)
  rms_fwd_fp8     RMSNorm with E4M3 output at 32768 x 4096 (0.82-0.88: same bytes, one row sum and no bias)
  fp8_8192        LayerNorm -> FP8, RMSNorm -> FP8, plain LayerNorm at 16384 x 8192 (0.87 / 0.93 / 0.97)
  norm_bwd        LayerNorm backward at 8192 x 16384 (fwd+bwd 0.71)
  norm_bwd_1024 / norm_bwd_4096 / rms_bwd_4096
                  LayerNorm / RMSNorm backward at 131072 x 1024 and 32768 x 4096 (fwd+bwd 0.81-0.85)
  rms_bwd_8192 / rms_bwd_16384
                  RMSNorm backward at 16384 x 8192 and 8192 x 16384 (0.92 against 0.86 of copy, and no
                  launch config moved the 16384 one: sweep 1607Z)
  softmax_fwd     softmax forward at 131072 x 1024 and 2048 x 65536 (0.55-0.70)
  long_rows       softmax forward at 2048 x 65536 and 512 x 262144, cross-entropy at 4096 x 262144
  ce              cross-entropy forward + gradient at 16384 x 32768 (0.52)
  ct              cast_transpose at 32768 x 4096 (0.86-0.87 of copy, target 0.90)
  quantize        the delayed quantize at 32768 x 4096 (0.90-0.91: the same reads, one output stream)
  ct_dbias        cast_transpose_dbias at 16384 x 8192 (0.34; 0.76-0.79 at the other shapes)
  dact            dact_cast_transpose (GeLU) at 32768 x 4096 (0.70)
  gemm            FP8 GEMM 4096^3, fast then split accumulation, direct and staged output stores, the
                  fused epilogue (bias + GeLU + E4M3 + amax), then cuBLASLt in both modes (0.80x / 0.83x
                  cuBLASLt; the fused epilogue 0.71x of our plain split GEMM): tensor pipe, shared memory, L2
                  (NCU_SECTIONS="--section ComputeWorkloadAnalysis" adds the pipe utilisation)
Each case runs its op twice (the first call compiles and plans), so `-c` should allow 2 per kernel.
"""
import os
import sys

import cupy

import fusedkit as fk


def bf16(shape, loc=0.0, scale=1.0, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale + loc).to(torch.bfloat16)


def case_norm_fwd():
    x, w = bf16((32768, 4096), -2.3, 0.5), bf16((4096,), 1.0, 0.3, 1)
    return lambda: fk.layer_norm(x, w, w)


def case_ln1024():
    """LayerNorm forward at 131072 x 1024: fusedkit and torch.compile's Triton kernel (0.98x, issue 2)."""
    import torch
    from fusedkit.bench import norm_fp8_inputs
    x, w, b, _ = norm_fp8_inputs(torch, 131072, 1024, torch.bfloat16)
    compiled = torch.compile(lambda x_, w_, b_: torch.nn.functional.layer_norm(x_, (1024,), w_, b_, 1e-5),
                             dynamic=False)
    compiled(x, w, b)  # compile outside the profiled launches
    return lambda: (fk.layer_norm(x, w, b), compiled(x, w, b))


def case_rms8192():
    """RMSNorm forward at 16384 x 8192: fusedkit (0.93 of copy on the H200) and torch.compile's Triton
    kernel (0.978 there, 0.95x; 2026-12-05 192907Z) side by side (NCU_KERNELS="norm_fwd|triton")."""
    import torch
    x, w = bf16((16384, 8192), -2.3, 0.5), bf16((8192,), 1.0, 0.3, 1)
    compiled = torch.compile(lambda x_, w_: torch.nn.functional.rms_norm(x_, (8192,), w_, 1e-6), dynamic=False)
    compiled(x, w)  # compile outside the profiled launches
    return lambda: (fk.rms_norm(x, w, eps=1e-6), compiled(x, w))


def case_norm_fwd_fp8():
    import torch
    from fusedkit.bench import norm_fp8_inputs  # the benchmark's inputs
    x, w, b, s = norm_fp8_inputs(torch, 32768, 4096, torch.bfloat16)
    return lambda: fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=s)


def case_rms_fwd_fp8():
    import torch
    from fusedkit.bench import norm_fp8_inputs
    x, w, _, s = norm_fp8_inputs(torch, 32768, 4096, torch.bfloat16)
    return lambda: fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=s)


def case_fp8_8192():
    """LayerNorm -> FP8, RMSNorm -> FP8 and the plain LayerNorm forward at 16384 x 8192 (H100: 0.866 /
    0.933 / 0.969 of copy, 2026-12-06): what LayerNorm's second row sum costs the FP8 kernel."""
    import torch
    from fusedkit.bench import norm_fp8_inputs
    x, w, b, s = norm_fp8_inputs(torch, 16384, 8192, torch.bfloat16)
    return lambda: (fk.layer_norm(x, w, b, fp8_fmt="e4m3", fp8_scale=s), fk.rms_norm(x, w, fp8_fmt="e4m3", fp8_scale=s),
                    fk.layer_norm(x, w, b))


def case_norm_bwd():
    x, w = bf16((8192, 16384), -2.3, 0.5), bf16((16384,), 1.0, 0.3, 1)
    y, mean, rstd = fk.layer_norm(x, w, w, return_stats=True)
    return lambda: fk.layer_norm_backward(y, x, w, mean, rstd)


def _norm_bwd(M, N, rms):
    x, w = bf16((M, N), -2.3, 0.5), bf16((N,), 1.0, 0.3, 1)
    dy = bf16((M, N), 0.0, 1.0, 2)
    if rms:
        _, rstd = fk.rms_norm(x, w, return_stats=True)
        return lambda: fk.rms_norm_backward(dy, x, w, rstd)
    _, mean, rstd = fk.layer_norm(x, w, w, return_stats=True)
    return lambda: fk.layer_norm_backward(dy, x, w, mean, rstd)


def case_norm_bwd_1024():
    return _norm_bwd(131072, 1024, False)


def case_norm_bwd_4096():
    return _norm_bwd(32768, 4096, False)


def case_rms_bwd_4096():
    return _norm_bwd(32768, 4096, True)


def case_rms_bwd_8192():
    return _norm_bwd(16384, 8192, True)


def case_rms_bwd_16384():
    return _norm_bwd(8192, 16384, True)


def case_softmax_fwd():
    a, b = bf16((131072, 1024), 0.0, 3.0), bf16((2048, 65536), 0.0, 3.0, 1)

    def run():
        fk.softmax(a)
        fk.softmax(b)
    return run


def case_long_rows():
    """Softmax forward at 2048 x 65536 and 512 x 262144, cross-entropy (loss + gradient) at 4096 x 262144:
    the long-row kernels (one register CTA per row, staged clusters) below their targets."""
    import torch
    a, b, c = bf16((2048, 65536), 0.0, 3.0), bf16((512, 262144), 0.0, 3.0, 1), bf16((4096, 262144), 0.0, 2.0, 2)
    t = torch.randint(0, 262144, (4096,), device="cuda")

    def run():
        fk.softmax(a)
        fk.softmax(b)
        fk.cross_entropy(c, t, return_grad=True)
    return run


def case_ce():
    import torch
    x = bf16((16384, 32768), 0.0, 2.0)
    t = torch.randint(0, 32768, (16384,), device="cuda")
    return lambda: fk.cross_entropy(x, t, return_grad=True)


def _fp8_cast_input():
    """The benchmark's FP8 cast input at 32768 x 4096 (x * 100, delayed scale 0.37)."""
    import torch
    return bf16((32768, 4096), 0.0, 100.0), torch.full((1,), 0.37, device="cuda")


def case_ct():
    x, s = _fp8_cast_input()
    return lambda: fk.cast_transpose(x, fmt="e4m3", scale=s)


def case_quantize():
    x, s = _fp8_cast_input()
    return lambda: fk.quantize(x, fmt="e4m3", scale=s)


def case_ct_dbias():
    d = bf16((16384, 8192), 0.0, 1.0)
    return lambda: fk.cast_transpose_dbias(d, scale=64.0)


def case_dact():
    d, x = bf16((32768, 4096), 0.0, 1.0), bf16((32768, 4096), 0.0, 3.0, 1)
    return lambda: fk.dact_cast_transpose(d, x, activation="gelu", scale=64.0)


def case_gemm():
    """FP8 GEMM at 4096^3 (fast accumulation 0.80x cuBLASLt, split 0.83x): ours with direct and with
    staged output stores, and cuBLASLt (NCU_KERNELS="fp8_gemm|sm90_xmma|cutlass|gemm", NCU_SECTIONS=
    "--section ComputeWorkloadAnalysis" for the tensor pipe)."""
    import torch
    from fusedkit.backends import cuda_gemm
    from fusedkit.bench import _gemm_impls
    impls = _gemm_impls(torch, 4096, 4096, 4096)
    ours = {m: impls[op]["fusedkit"] for m, op in (("fast", "fp8_gemm_fast"), ("split", "fp8_gemm"))}
    lt = [impls["fp8_gemm_fast"]["cublaslt"], impls["fp8_gemm"]["cublaslt"]]
    # the fused epilogue (bias + GeLU + E4M3 + amax): 762 TFLOP/s against the plain split GEMM's 1077 in
    # the README's run, i.e. ~50 us more at 4096^3 for an epilogue of 64 values per thread and tile
    fused = impls["fp8_gemm_epilogue"]["fusedkit"]

    def run():
        for mode, fn in ours.items():
            for store in ("direct",) if os.environ.get("FK_STORES") == "none" else ("direct", "staged"):
                with cuda_gemm.forced_tiles(**{mode: (256 if mode == "fast" else 128, 1, store)}):
                    fn()
        fused()
        for fn in lt:
            fn()
    return run


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}

if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if a in CASES] or list(CASES)
    for name in names:
        fn = CASES[name]()
        for _ in range(2):
            fn()
        cupy.cuda.Device().synchronize()
        print(f"{name}: done", flush=True)
