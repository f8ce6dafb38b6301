"""Every registered kernel instantiation compiles through NVRTC for sm_80, sm_90a and sm_100a, with no
register spills on sm_90a. Needs only libnvrtc (pip install nvidia-cuda-nvrtc), no GPU."""
import os

import pytest

from fusedkit import _nvrtc, compile_check


def test_every_kernel_compiles_without_spills():
    try:
        _nvrtc.lib()
    except _nvrtc.NVRTCError as e:
        if os.environ.get("CI"):
            raise  # CI installs NVRTC: a missing compiler must fail there, not skip
        pytest.skip(str(e).splitlines()[0])
    problems = compile_check.run(verbose=False)
    assert not problems, "\n".join(problems)


def test_cache_key_covers_headers(tmp_path, monkeypatch):
    """Changing a header changes the key (CuPy's own cache would miss this)."""
    from fusedkit import _jit
    files, h = _jit.sources()
    key = _jit._cache_key("norms.cu", "fk::column_sum<float>", "sm_90a")
    _jit.sources.cache_clear()
    orig = dict(files)
    try:
        patched = dict(files)
        patched["common/reduce.cuh"] = files["common/reduce.cuh"] + "\n// changed\n"
        monkeypatch.setattr(_jit, "sources", lambda: (patched, "different-tree-hash"))
        assert _jit._cache_key("norms.cu", "fk::column_sum<float>", "sm_90a") != key
    finally:
        monkeypatch.undo()
        _jit.sources.cache_clear()
    assert _jit.sources()[0] == orig


@pytest.mark.parametrize("family", ["gemm", "softmax"])
def test_family_compiles_without_spills(family, monkeypatch):
    """One kernel family alone (``pytest tests/test_compile_all.py -k gemm`` / ``-k softmax``): every
    instantiation of cuda/fp8_gemm_sm90.cu or cuda/softmax.cu for each target, no spills on sm_90a."""
    try:
        _nvrtc.lib()
    except _nvrtc.NVRTCError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e).splitlines()[0])
    from fusedkit.backends import cuda_gemm, cuda_softmax
    backend = {"gemm": cuda_gemm, "softmax": cuda_softmax}[family]
    monkeypatch.setattr(compile_check, "all_expressions", backend.all_expressions)
    problems = compile_check.run(verbose=False)
    assert not problems, "\n".join(problems)


def test_nvrtc_path_preloads_its_builtins(tmp_path, monkeypatch):
    """A libnvrtc given by path (FUSEDKIT_NVRTC, an unpacked wheel) brings the builtins library beside it
    in first, globally, so NVRTC's load of it by name works without LD_LIBRARY_PATH; the .alt variant is
    not taken, and a library that fails to load is left for the compile to report."""
    for name in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0"):
        (tmp_path / name).write_bytes(b"")
    loaded = []

    def fake_cdll(path, mode=0):
        loaded.append((os.path.basename(path), mode))
        raise OSError("not a library")

    monkeypatch.setattr(_nvrtc.ctypes, "CDLL", fake_cdll)
    _nvrtc._preload_builtins(str(tmp_path / "libnvrtc.so.13"))
    assert loaded == [("libnvrtc-builtins.so.13.0", _nvrtc.ctypes.RTLD_GLOBAL)]
    loaded.clear()
    _nvrtc._preload_builtins("libnvrtc.so.13")  # a bare name: the loader's own search, nothing to preload
    assert loaded == []
