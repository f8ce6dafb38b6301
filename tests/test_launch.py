"""The launcher's parameter buffer: each value lands at its C-aligned slot (no GPU needed)."""
import ctypes
import struct

import pytest

pytest.importorskip("cupy_backends")
from fusedkit._launch import Launcher  # noqa: E402

CTYPES = {"p": ctypes.c_uint64, "q": ctypes.c_int64, "i": ctypes.c_int32, "f": ctypes.c_float}


class _FakeFunction:
    ptr = 0


@pytest.mark.parametrize("codes", ["ppppppppqifi", "ppppppppqiii", "pqip", "pqipp", "pppppppqfi", "ifq", "fqp"])
def test_slots_follow_c_layout(codes):
    launcher = Launcher(_FakeFunction(), codes, device=0)
    values = [float(k) + 0.5 if c == "f" else 1000 + k for k, c in enumerate(codes)]
    launcher._fmt.pack_into(launcher._buf, 0, *values)
    for k, c in enumerate(codes):
        addr = launcher._params[k]
        got = CTYPES[c].from_address(addr).value
        assert got == values[k], (codes, k)
    layout = type("Args", (ctypes.Structure,), {"_fields_": [(f"a{k}", CTYPES[c]) for k, c in enumerate(codes)]})
    base = ctypes.addressof(launcher._buf)
    assert [launcher._params[k] - base for k in range(len(codes))] == \
        [getattr(layout, f"a{k}").offset for k in range(len(codes))]
    assert launcher._fmt.size <= struct.calcsize("@" + "Q" * len(codes))
