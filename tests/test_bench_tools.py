"""The benchmark bookkeeping that needs no GPU: the source commit in the results JSON, the README
table that takes each (op, shape) from the newest run that measured it, and the command line's checks."""
import importlib.util
import json
import os
import zlib

import pytest

from fusedkit import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readme_table():
    return _tool("readme_table")


def _sass(*kernels):
    """nvdisasm-like text: (mangled name, instructions) per kernel."""
    out = ["\t.target\tsm_90a"]
    for name, body in kernels:
        out.append(f"//--------------------- .text.{name} --------------------------")
        out.append(f"\t.section\t.text.{name},\"ax\",@progbits")
        out += [f"        /*{16 * i:04x}*/  {ins} ;" for i, ins in enumerate(body)]
    return "\n".join(out)


def test_sass_digest_compares_kernel_by_kernel(capsys):
    """tools/sass_digest.py --against: labels, offsets and whitespace do not count, instructions do; added
    kernel parameters and a trailing template argument added with a default still match."""
    sd = _tool("sass_digest")
    before = sd.kernels(_sass(("_ZN2fk1kILi1EEEvPKfi", ["MOV R1, R2", "BRA `(.L_x_3)"]),
                              ("_ZN2fk1kILi2EEEvPKfi", ["FADD R1, R2, R3"])))
    same = sd.kernels(_sass(("_ZN2fk1kILi1ELi0EEEvPKfii", ["MOV  R1, R2", "BRA `(.L_x_17)"]),
                            ("_ZN2fk1kILi2ELi0EEEvPKfii", ["FADD R1, R2, R3"]),
                            ("_ZN2fk1kILi2ELi1EEEvPKfii", ["FMUL R1, R2, R3"])))
    assert sd.compare(before, same, "0") == 0
    assert "2 same, 0 changed, 0 only before, 1 only after" in capsys.readouterr().out
    assert sd.compare(before, same) == 1  # without --default-arg the renamed kernels do not match
    flagged = sd.kernels(_sass(("_ZN2fk1kILi1ELb0EEEvPKfiPv", ["MOV R1, R2", "BRA `(.L_x_9)"]),
                               ("_ZN2fk1kILi2ELb0EEEvPKfiPv", ["FADD R1, R2, R3"])))
    assert sd.compare(before, flagged, "false") == 0  # a bool template argument added with default false
    assert "2 same, 0 changed, 0 only before, 0 only after" in capsys.readouterr().out
    changed = sd.kernels(_sass(("_ZN2fk1kILi1EEEvPKfi", ["MOV R1, R2", "BRA `(.L_x_3)"]),
                               ("_ZN2fk1kILi2EEEvPKfi", ["FFMA R1, R2, R3, R4"])))
    assert sd.compare(before, changed) == 1
    assert "1 same, 1 changed" in capsys.readouterr().out


def test_source_commit_prefers_the_environment(monkeypatch):
    monkeypatch.setenv("FUSEDKIT_COMMIT", "abc123")
    assert bench.source_commit() == "abc123"


def _row(op, shape, impl, ms, gbps=None, tflops=None):
    return {"op": op, "shape": shape, "dtype": "bfloat16", "impl": impl, "ms": ms, "GBps": gbps, "TFLOPs": tflops}


def test_readme_table_takes_each_op_from_its_newest_run(tmp_path, monkeypatch):
    rt = _readme_table()
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    old = {"device": "NVIDIA H200", "date": "2026-01-01T00:00:00+00:00", "copy_GBps": 4000.0,
           "rows": [_row("layer_norm_fwd", [8, 8], "fusedkit", 1.0, 3600.0),
                    _row("layer_norm_fwd", [8, 8], "torch_eager", 2.0, 1800.0),
                    _row("softmax_fwd", [8, 8], "fusedkit", 1.0, 2000.0)]}
    new = {"device": "NVIDIA H200", "date": "2026-02-01T00:00:00+00:00", "copy_GBps": 4000.0,
           "rows": [_row("softmax_fwd", [8, 8], "fusedkit", 0.5, 3000.0),
                    _row("fp8_gemm", [16, 16, 16], "fusedkit", 1.0, tflops=900.0),
                    _row("fp8_gemm", [16, 16, 16], "cublaslt", 0.9, tflops=1000.0)]}
    exp = dict(new, date="2026-03-01T00:00:00+00:00", experiment={"FUSEDKIT_NVRTC_OPTIONS": "-DX=1"},
               rows=[_row("softmax_fwd", [8, 8], "fusedkit", 0.1, 9999.0)])
    other_card = dict(new, device="NVIDIA H100 80GB HBM3", date="2026-04-01T00:00:00+00:00",
                      rows=[_row("softmax_fwd", [8, 8], "fusedkit", 0.1, 8888.0)])
    for name, r in (("a.json", old), ("b.json", new), ("c_experiment.json", exp), ("sweep_x.json", exp),
                    ("d_h100.json", other_card)):
        (res / name).write_text(json.dumps(r))
    monkeypatch.setattr(rt, "ROOT", str(tmp_path))
    groups = rt.newest_groups()
    assert groups[("layer_norm_fwd", (8, 8))][0]["fusedkit"]["GBps"] == 3600.0   # only the old run has it
    assert groups[("softmax_fwd", (8, 8))][0]["fusedkit"]["GBps"] == 3000.0      # newest, not the experiment
    # nor the newer run on another card (README_DEVICE, H200 by default)
    text = rt.table()
    assert "| layer_norm_fwd | 8 x 8 | 3600 | 0.90 | 2.00x | - | - |" in text
    assert "| fp8_gemm | 16 x 16 x 16 | 900 | cublaslt 0.90x |" in text
    assert "9999" not in text and "8888" not in text


def test_bench_rejects_zero_rounds(capsys):
    """CPU: --rounds below 1 is a usage error that says what to give, not an empty benchmark."""
    with pytest.raises(SystemExit) as e:
        bench.main(["--rounds", "0"])
    assert e.value.code == 2
    assert "give 1 or more rounds" in capsys.readouterr().err



def test_sigterm_keeps_the_rows_measured_so_far():
    import signal
    rows = []

    def measure():
        rows.append({"op": "a"})
        os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` sends it
        rows.append({"op": "never"})

    before = signal.getsignal(signal.SIGTERM)
    note = bench.measure_until_sigterm(measure, rows)
    assert rows == [{"op": "a"}] and "1 rows" in note
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    assert bench.measure_until_sigterm(lambda: rows.append({"op": "b"}), rows) is None


def test_gemm_rows_interleave_rounds_and_keep_the_fastest(monkeypatch):
    calls, times = [], {"fusedkit": [3.0, 1.0, 2.0], "cublaslt": [2.0, 2.5, 1.5]}

    class Timer:
        def ms(self, fn):
            return fn()

    def impl(name):
        def fn():
            calls.append(name)
            if name == "broken":
                raise RuntimeError("no kernel")
            return times[name][sum(c == name for c in calls) - 1]
        return fn

    class FakeTorch:
        class cuda:
            @staticmethod
            def empty_cache():
                pass

    monkeypatch.setattr(bench, "GEMM_WORK", [(128, 256, 512)])
    monkeypatch.setattr(bench, "_gemm_impls", lambda torch, M, K, N: {
        "fp8_gemm": {n: impl(n) for n in ("fusedkit", "cublaslt", "broken")}})
    rows = bench.gemm_rows(FakeTorch, Timer(), rounds=3)
    assert calls[:3] == ["fusedkit", "cublaslt", "broken"]  # interleaved; a failing impl is dropped
    assert calls[3:] == ["fusedkit", "cublaslt"] * 2
    got = {r["impl"]: r for r in rows}
    assert set(got) == {"fusedkit", "cublaslt"}
    assert got["fusedkit"]["ms"] == 1.0 and got["cublaslt"]["ms"] == 1.5
    assert got["fusedkit"]["TFLOPs"] == pytest.approx(2 * 128 * 256 * 512 / 1.0 / 1e9)


def _fake_device_torch(flush_us, fn_host_us, fn_device_us):
    """A torch stand-in with one stream: host work advances a host clock, each queued op starts when both
    the host has queued it and the device is free; events time the device (ms)."""
    clock = {"host": 0.0, "device": 0.0}

    def enqueue(host_us, device_us):
        clock["host"] += host_us
        clock["device"] = max(clock["host"], clock["device"]) + device_us
        return clock["device"]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = enqueue(1.0, 0.0)

        def synchronize(self):
            clock["host"] = max(clock["host"], self.t)

        def elapsed_time(self, other):
            return (other.t - self.t) / 1e3

    class Buffer:
        def zero_(self):
            enqueue(5.0, flush_us)

    class FakeTorch:
        uint8 = None

        @staticmethod
        def empty(*a, **k):
            return Buffer()

        class cuda:
            pass

    FakeTorch.cuda.Event = Event
    FakeTorch.cuda.synchronize = staticmethod(lambda: clock.update(host=max(clock["host"], clock["device"])))
    return FakeTorch, lambda: enqueue(fn_host_us, fn_device_us)


def test_gpu_timer_keeps_host_time_out_of_the_events():
    """A call whose host cost (120 us) exceeds the flush (85 us): timed with a synchronize after each
    call, the gap lands between the events; queued as do_bench does, the device time alone is read."""
    torch, fn = _fake_device_torch(flush_us=85.0, fn_host_us=120.0, fn_device_us=100.0)
    assert bench.GpuTimer(torch).ms(fn, min_time_ms=0.0) == pytest.approx(0.100)
    torch, fn = _fake_device_torch(flush_us=85.0, fn_host_us=120.0, fn_device_us=100.0)
    assert bench.GpuTimer(torch, sync_each=True).ms(fn, min_time_ms=0.0) > 0.130


@pytest.mark.parametrize("op", bench.FP8_BLOCK_OPS)
def test_block_scale_peer_equals_the_reference(op):
    """The benchmark's torch peer of the block-scaled casts computes what fusedkit does (the reference,
    byte for byte, scales exactly) on finite inputs, all-zero blocks and power-of-two amaxes included,
    so its timings compare like with like. Runs on CPU torch."""
    torch = pytest.importorskip("torch")
    import numpy as np
    import ml_dtypes
    from fusedkit.reference import fp8 as ref
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    x = (rng.standard_normal((256, 384)) * rng.choice([1e-3, 1.0, 100.0], size=(256, 1))).astype(np.float32)
    x[:128, :128] = 0.0                  # all-zero blocks in every layout
    x[200, 5] = 448.0 * 4                # amax / 448 a power of two: ceil and floor of log2 at the edge
    x[5, 300] = 2.0**-9                  # a tiny block value beside the zeros
    xb = x.astype(ml_dtypes.bfloat16)
    q, s = bench.block_scale_peer(torch, torch.from_numpy(xb.astype(np.float32)).to(torch.bfloat16), op)
    if op == "fp8_quantize_mxfp8":
        want_q, want_s = ref.quantize_mxfp8(xb, "e4m3")
    elif op == "fp8_quantize_mxfp8_cols":
        want_q, want_s = ref.quantize_mxfp8_columnwise(xb, "e4m3")
    else:
        want_q, want_s = ref.quantize_blockwise(xb, (1, 128) if op.endswith("1x128") else (128, 128), "e4m3")
    np.testing.assert_array_equal(q.view(torch.uint8).numpy(), np.asarray(want_q).view(np.uint8))
    np.testing.assert_array_equal(s.numpy(), want_s)
