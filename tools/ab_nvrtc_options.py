"""A/B of compile-time experiments (NVRTC defines) in one process, on the GPU.

Each variant is a set of FUSEDKIT_NVRTC_OPTIONS (AB_OPTIONS: ';'-separated, the shipped build first and
always included); between variants the in-memory kernel and launcher caches are dropped, so the next
call compiles (or loads from the disk cache, whose key covers the options) that variant's kernels.
Times the ops whose names contain one of AB_OPS (comma-separated; default all): the FP8 cast-transpose at
the benchmark's three shapes, with current scaling and with dbias too, dgelu + dbias (dact), the
current-scaling quantize at the same shapes, the delayed quantize at 32768 x 4096, the FP8-output LayerNorm
/ RMSNorm at the three shapes, the plain LayerNorm forward at 32768 x 4096, 131072 x 1024 and 16384 x 8192
and the plain RMSNorm forward at 131072 x 1024, 16384 x 8192 and 8192 x 16384 (each a control for the
others' defines), bf16 inputs as the benchmark's, AB_ROUNDS (3) interleaved rounds, each op as a fraction of
a copy timed in the same round; checks that every variant's output bytes equal the shipped build's. Writes
JSON to argv[1].

    AB_OPTIONS="-DFK_FP8_FWD_PREFETCH=0" AB_OPS=norm_fp8 PYTHONPATH=. python3 tools/ab_nvrtc_options.py out.json
    AB_OPTIONS="-DA=1;-DB=1 @ 4096,1024" AB_NUMERICS=1 ...   (B timed only on ops named *4096* / *1024*)
    AB_PEERS=1 ...   (the benchmark's torch.compile of the plain norm forwards, timed in the same rounds)
    AB_OPTIONS="-DFK_AMAX_REVERSE=1" AB_OPS=_current AB_NUMERICS=1 ...   (the amax pass walking backwards)
    AB_OPTIONS="-DFK_GEMM_WG_LAG_NS=300" AB_OPS=fp8_gemm AB_PEERS=1 ...   (GEMM cases, cuBLASLt beside them)
    AB_OPTIONS="-DFK_GEMM_AMAX_ONCE=1" AB_OPS=fp8_gemm_epilogue AB_PEERS=1 AB_NUMERICS=1 ...   (the fused
        bias + GeLU + E4M3 epilogue, cuBLASLt + torch.compile's epilogue beside it)
    AB_OPTIONS="-DFK_GEMM_BLOCK_FFMA=1" AB_OPS=fp8_gemm_block AB_PEERS=1 AB_NUMERICS=1 ...   (block scaling,
        the per-tensor split GEMM beside it)
    AB_OPTIONS="-DFK_SOFTMAX_FULL=1" AB_OPS=softmax AB_PEERS=1 ...   (softmax forwards, torch.compile / Liger)
    AB_OPTIONS="-DFK_STAGED_PIECES=2;-DFK_STAGED_PIECES=4" AB_OPS=long_ ...   (the persistent staged
        softmax / cross-entropy kernels at their long rows; named only, as they allocate ~10 GB)
    AB_OPTIONS="-DFK_SOFTMAX_ONE_EXP=3" AB_OPS=softmax,long_softmax AB_SOFTMAX_CFGS="262144:staged,8,4,16,16"
        AB_NUMERICS=1 ...   (softmax forwards with one exponential per element, also at other configs)

Until 2026-12-04 21:10Z the switch between variants left the norms' plan caches (cuda_norms._fwd_plans,
_fwd_fp8_plans) in place, so the norm rows of every variant ran the shipped kernels (runs 1935Z and
2059Z: their norm rows compare the shipped build with itself); _jit.clear_memory_cache now empties every
plan cache. Run 2026-12-04 (ab_ct_order_store_2026-12-04T1913Z.json): two cast-transpose experiments
(blocks down the rows first; evict-first stores) lost 2-6 % in every round and were removed. The first
rounds of a freshly started machine ran slow for every variant: read the last round, or add rounds.
"""
import json
import os
import sys

import torch

import fusedkit as fk
from fusedkit import _jit
from fusedkit.bench import (FP8_SHAPES, GpuTimer, _gemm_impls, _impls, _softmax_impls, copy_gbps, run_meta,
                            norm_fp8_inputs)

ROUNDS = int(os.environ.get("AB_ROUNDS", "3"))


_IMPLS: dict = {}


def impls_of(make, *args):
    """bench's {impl: fn} for one op and shape, built once: the cases and their peers (AB_PEERS) then share
    the inputs, and nothing is allocated or quantized twice."""
    key = (make.__name__,) + args
    if key not in _IMPLS:
        _IMPLS[key] = make(torch, *args)
    return _IMPLS[key]


def ab_ops() -> list:
    """AB_OPS: the substrings that select cases (empty: all; the softmax, long_ and GEMM cases only when
    named, as they allocate 1-10 GB and, for the GEMM, compile for minutes)."""
    return [s for s in os.environ.get("AB_OPS", "").split(",") if s]


def cases():
    only = ab_ops()
    g = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.full((1,), 0.37, device="cuda")
    out = []
    for M, N in FP8_SHAPES:
        x = (torch.randn(M, N, device="cuda", generator=g) * 100).to(torch.bfloat16)
        out.append((f"fp8_cast_transpose {M}x{N}", 4 * M * N,
                    lambda x=x: fk.cast_transpose(x, fmt="e4m3", scale=scale)))
        if (M, N) == FP8_SHAPES[0]:
            out.append((f"fp8_quantize_delayed {M}x{N}", 3 * M * N,
                        lambda x=x: fk.quantize(x, fmt="e4m3", scale=scale)))
        # current scaling: the amax pass, then the cast (5MN; FK_AMAX_REVERSE's A/B)
        out.append((f"fp8_quantize_current {M}x{N}", 5 * M * N, lambda x=x: fk.quantize(x, fmt="e4m3")))
        out.append((f"fp8_cast_transpose_current {M}x{N}", 6 * M * N, lambda x=x: fk.cast_transpose(x, fmt="e4m3")))
        # with the bias gradient (E5M2)
        out.append((f"fp8_cast_transpose_dbias {M}x{N}", 4 * M * N,
                    lambda x=x: fk.cast_transpose_dbias(x, fmt="e5m2", scale=scale)))
        # dgelu + dbias (TE's dgelu_cast_transpose_dbias): dy and x read, two FP8 layouts written
        dy = (torch.randn(M, N, device="cuda", generator=g)).to(torch.bfloat16)
        out.append((f"fp8_dact_cast_transpose {M}x{N}", 6 * M * N,
                    lambda x=x, dy=dy: fk.dact_cast_transpose(dy, x, activation="gelu", fmt="e5m2", scale=scale,
                                                              dbias=True)))
    for M, N in FP8_SHAPES:
        xn, w, b, s8 = norm_fp8_inputs(torch, M, N, torch.bfloat16)
        out.append((f"layer_norm_fp8_fwd {M}x{N}", 3 * M * N,
                    lambda xn=xn, w=w, b=b, s8=s8: fk.layer_norm(xn, w, b, fp8_fmt="e4m3", fp8_scale=s8)))
        out.append((f"rms_norm_fp8_fwd {M}x{N}", 3 * M * N,
                    lambda xn=xn, w=w, s8=s8: fk.rms_norm(xn, w, fp8_fmt="e4m3", fp8_scale=s8)))
    # the plain forward (131072 x 1024: issue 2's closest shape; 16384 x 8192: its one LayerNorm row below
    # 0.93 on the H200)
    for M, N in (FP8_SHAPES[0], (131072, 1024), (16384, 8192)):
        xn, w, b, _ = norm_fp8_inputs(torch, M, N, torch.bfloat16)
        out.append((f"layer_norm_fwd {M}x{N}", 4 * M * N, lambda xn=xn, w=w, b=b: fk.layer_norm(xn, w, b)))
    # RMSNorm: at or below the best peer at these shapes
    for M, N in ((131072, 1024), FP8_SHAPES[0], (16384, 8192), (8192, 16384)):
        xn, w, _, _ = norm_fp8_inputs(torch, M, N, torch.bfloat16)
        out.append((f"rms_norm_fwd {M}x{N}", 4 * M * N, lambda xn=xn, w=w: fk.rms_norm(xn, w)))
    # softmax forward at issue 3's register-kernel shapes (FK_SOFTMAX_FULL's A/B)
    if any("softmax" in s for s in only):
        for M, N in ((131072, 1024), (32768, 4096), (16384, 8192), (8192, 16384)):
            fn = impls_of(_softmax_impls, "softmax_fwd", M, N, torch.bfloat16)["fusedkit"]
            out.append((f"softmax_fwd {M}x{N}", 4 * M * N, fn))
    # the persistent staged row kernels (FK_STAGED_PIECES' A/B): softmax forward and backward at 512 x
    # 262144, cross-entropy (loss + gradient) at the benchmark's three shapes (16384 x 32768: the staged
    # kernel, one CTA a row), 4096 x 262144 also with the persistent kernel (8 CTAs x 512 threads x 8
    # vectors)
    if any("long_" in s for s in only):
        from fusedkit.backends import cuda_cross_entropy as cce
        M, N = 512, 262144
        xs = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
        ys = fk.softmax(xs)
        dys = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
        out.append((f"long_softmax_fwd {M}x{N}", 4 * M * N, lambda: fk.softmax(xs)))
        out.append(("long_softmax_fwd 2048x65536", 4 * 2**27,
                    lambda x=xs.view(2048, 65536): fk.softmax(x)))
        # AB_SOFTMAX_CFGS="262144:staged,8,4,16,16;65536:cluster,8,4,32,2": the forward of 2^27 elements at
        # row length N with other configs (cuda_softmax's tuples), each timed in every variant
        from fusedkit.backends import cuda_softmax as csm
        stream = torch.cuda.current_stream().cuda_stream
        for spec in filter(None, os.environ.get("AB_SOFTMAX_CFGS", "").split(";")):
            n, _, fields = spec.partition(":")
            kind, *nums = fields.split(",")
            cfg, n = (kind,) + tuple(int(f) for f in nums), int(n)

            def run(cfg=cfg, y=torch.empty_like(xs), n=n):
                csm.forward(xs.data_ptr(), 0, y.data_ptr(), 2**27 // n, n, "bfloat16", "bfloat16", 1.0, False,
                            csm.MASK_NONE, csm.NO_MASK, 0, stream, config=cfg)
                return y
            out.append((f"long_softmax_fwd {2**27 // n}x{n} {fields}", 4 * 2**27, run))
        out.append((f"long_softmax_bwd {M}x{N}", 6 * M * N, lambda: fk.softmax_backward(dys, ys)))
        for M, N, cfg in ((16384, 32768, None), (8192, 131072, None), (4096, 262144, None),
                          (4096, 262144, ("persistent", 8, 8, 16, 8))):
            xl = (torch.randn(M, N, device="cuda", generator=g) * 2).to(torch.bfloat16)
            tl = torch.randint(0, N, (M,), device="cuda", generator=g)
            if cfg is None:
                out.append((f"long_cross_entropy_fwdbwd {M}x{N}", 4 * M * N,
                            lambda xl=xl, tl=tl: fk.cross_entropy(xl, tl, return_grad=True)[1]))
                continue
            gl, loss = torch.empty_like(xl), torch.empty(M, device="cuda")
            stream = torch.cuda.current_stream().cuda_stream

            def run(xl=xl, tl=tl, gl=gl, loss=loss, M=M, N=N, cfg=cfg):
                cce.forward(xl.data_ptr(), tl.data_ptr(), False, gl.data_ptr(), loss.data_ptr(), 0, 0, M, N,
                            "bfloat16", -100, 0.0, 0.0, 1.0, 0, stream, config=cfg)
                return gl
            out.append((f"long_cross_entropy_persistent {M}x{N}", 4 * M * N, run))
    # the FP8 GEMM (bf16 output; "bytes" here are 2MNK / 1000, so "of copy" only compares variants and
    # cuBLASLt, AB_PEERS=1, with each other): split accumulation at the K = 4096 / 8192 shapes and the
    # fused epilogue's two shapes below 1.2x (8192^3, 16384 x 14336 x 4096), fast as a control for
    # split-only defines
    if any("gemm" in s for s in only):
        for M, K, N in ((4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336), (16384, 14336, 4096)):
            ops = ("fp8_gemm", "fp8_gemm_block", "fp8_gemm_epilogue") + (
                ("fp8_gemm_fast",) if (M, K, N) == (4096, 4096, 4096) else ())
            for op in ops:
                out.append((f"{op} {M}x{K}x{N}", 2 * M * N * K // 1000, impls_of(_gemm_impls, M, K, N)[op]["fusedkit"]))
    return [c for c in out if not only or any(s in c[0] for s in only)]


def peers(cs):
    """AB_PEERS=1: the benchmark's torch.compile peer (bench._impls) of the plain norm forwards among the
    cases, torch.compile and Liger beside the softmax cases, cuBLASLt beside the GEMM cases, timed once
    per round beside the variants: a same-process ratio against the peer the issues name. The recompile
    limit is raised so no case's compile falls back to eager."""
    if os.environ.get("AB_PEERS") != "1":
        return []
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 64
    out = []
    for name, nbytes, _ in cs:
        op, shape = name.split()[:2]  # a per-config case names its config third
        if op.startswith("fp8_gemm"):  # cuBLASLt in the same accumulation mode; block: our per-tensor split
            M, K, N = (int(v) for v in shape.split("x"))
            label = {"fp8_gemm_block": "fusedkit_per_tensor",
                     "fp8_gemm_epilogue": "cublaslt+compile"}.get(op, "cublaslt")
            out.append((name, nbytes, impls_of(_gemm_impls, M, K, N)[op][label], label))
            continue
        M, N = (int(v) for v in shape.split("x"))
        if op == "softmax_fwd":  # torch.compile and Liger (where installed)
            impls = impls_of(_softmax_impls, op, M, N, torch.bfloat16)
            for label in ("torch_compile", "liger"):
                if label in impls:
                    impls[label]()
                    out.append((name, nbytes, impls[label], label.replace("_", ".")))
            continue
        if op not in ("layer_norm_fwd", "rms_norm_fwd"):
            continue
        fn = _impls(torch, op, M, N, torch.bfloat16).get("torch_compile")
        if fn is not None:
            fn()  # compile now, outside the timed rounds
            out.append((name, nbytes, fn, "torch.compile"))
    return out


def select(opts):
    os.environ["FUSEDKIT_NVRTC_OPTIONS"] = opts
    _jit.clear_memory_cache()  # the kernels and every plan built from them (norms, softmax, launchers)


def output_bytes(res):
    """The uint8 tensors of an op's result (FP8Tensor data and its transpose), a bf16 result's bits."""
    ts = res if isinstance(res, (tuple, list)) else (res,)
    got = []
    for t in ts:
        if isinstance(t, torch.Tensor):  # a bf16 output (GEMM, softmax) as bits; a tensor's .data is itself
            if t.dtype == torch.bfloat16:
                got.append(t.view(torch.int16))
            continue
        for name in ("data", "data_t"):
            a = getattr(t, name, None)
            if a is not None and hasattr(a, "dtype"):
                got.append(a)
    return got


def parse_variants():
    """AB_OPTIONS entries: "defines" or "defines @ op1,op2" (that variant times only the ops whose names
    contain one of op1, op2: for a define that is only valid at some shapes)."""
    out = [("", None)]
    for v in os.environ.get("AB_OPTIONS", "").split(";"):
        opts, _, ops = v.partition("@")
        if opts.strip():
            out.append((opts.strip(), [s.strip() for s in ops.split(",") if s.strip()] or None))
    return out


def runs(cs, only):
    return [c for c in cs if only is None or any(s in c[0] for s in only)]


def main(out_path):
    variants = parse_variants()
    # AB_NUMERICS=1: a variant may round differently (e.g. another order of operations); the share of
    # differing FP8 bytes is recorded instead of failing
    may_differ = os.environ.get("AB_NUMERICS") == "1"
    timer = GpuTimer(torch)
    cs = cases()
    peer_cases = peers(cs)
    ref, differ = {}, []
    for v, only in variants:  # compile, then check every variant's bytes against the shipped build's
        select(v)
        for name, _, fn in runs(cs, only):
            got = output_bytes(fn())
            if not v:
                ref[name] = [a.clone() for a in got]  # a case may write into one buffer each call
                continue
            n_diff = sum(int((a != b).sum()) for a, b in zip(got, ref[name]))
            n_all = sum(a.numel() for a in got)
            if n_diff:
                differ.append(dict(options=v, op=name, bytes_differ=n_diff, bytes=n_all))
                print(f"{v!r}: {name}: {n_diff} of {n_all} FP8 bytes differ from the shipped build's", flush=True)
            assert may_differ or not n_diff, f"{v!r}: {name} output differs from the shipped build's"
    torch.cuda.synchronize()
    rows = []
    for rnd in range(ROUNDS):
        select("")
        copy = copy_gbps(torch, timer)
        for name, nbytes, fn, label in peer_cases:
            ms = timer.ms(fn)
            rows.append(dict(op=name, options=label, round=rnd, ms=ms, copy_GBps=copy,
                             of_copy=nbytes / ms / 1e6 / copy))
        for v, only in variants:
            select(v)
            for name, nbytes, fn in runs(cs, only):
                ms = timer.ms(fn)
                rows.append(dict(op=name, options=v or "(shipped)", round=rnd, ms=ms, copy_GBps=copy,
                                 of_copy=nbytes / ms / 1e6 / copy))
                print(f"{name:34s} {v or '(shipped)':24s} round {rnd}: {ms * 1e3:7.1f} us "
                      f"{rows[-1]['of_copy']:.3f} of copy", flush=True)
    for name, _, _ in cs:
        for v in [v for v, _ in variants] + ["torch.compile", "liger", "cublaslt"]:
            label = v or "(shipped)"
            got = sorted(r["of_copy"] for r in rows if r["op"] == name and r["options"] == label)
            if not got:
                continue
            print(f"SUMMARY {name:34s} {label:24s} median {got[len(got) // 2]:.3f} best {got[-1]:.3f}")
    with open(out_path, "w") as f:
        json.dump(dict(**run_meta(torch.cuda.get_device_name()), variants=[v for v, _ in variants], rows=rows,
                       bytes_differ=differ), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ab_nvrtc_options.json")
