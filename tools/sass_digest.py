"""A digest of the machine code of every registered kernel instantiation, per .cu file, without a GPU.

    PYTHONPATH=. python3 tools/sass_digest.py [file.cu ...] [--arch sm_90a] [--save DIR]

Compiles each file's instantiations through NVRTC (as the compile-all check does), disassembles the
cubin with nvdisasm (the nvidia-cuda-nvdisasm wheel or the CUDA toolkit) and prints the SHA-1 of the
SASS text. Run it before and after a change that should not alter the shipped kernels (a removed
experiment, a comment, a refactor): equal digests prove it. Line tables differ with every edit, so the
cubin bytes are not compared; the instructions are. --save writes each file's SASS for a diff.

    PYTHONPATH=. python3 tools/sass_digest.py fp8_gemm_sm90.cu --save /tmp/after --against /tmp/before
    [--default-arg 0]

--against DIR compares kernel by kernel with a --save of an earlier build: per function, label names,
the file-wide numbering of internal helper routines and whitespace aside, matched by mangled name
without the parameter list (so added kernel parameters do not hide a match); --default-arg V also
matches a kernel whose last template argument V was added with that default value. Prints same /
changed / only-before / only-after counts and the changed names; exits 1 when an earlier kernel changed
or disappeared.
"""
import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys

from fusedkit import _jit
from fusedkit._registry import all_expressions


def nvdisasm() -> str:
    found = shutil.which("nvdisasm")
    if found:
        return found
    import nvidia
    for root in nvidia.__path__:
        hits = glob.glob(os.path.join(root, "*", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    sys.exit("nvdisasm not found: pip install nvidia-cuda-nvdisasm (or put the CUDA toolkit's bin on PATH)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="kernel files (default: all registered)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--save", metavar="DIR", help="write <file>.sass into DIR")
    p.add_argument("--against", metavar="DIR", help="compare per kernel with an earlier --save")
    p.add_argument("--default-arg", metavar="V",
                   help="a trailing template argument V (an int, true or false) added with a default")
    args = p.parse_args(argv)
    status = 0
    tool = nvdisasm()
    exprs = all_expressions()
    for f in args.files or sorted(exprs):
        res = _jit.compile_cubin(f, exprs[f], args.arch, ())
        cubin = os.path.join(args.save or "/tmp", f"{f}.{args.arch}.cubin")
        os.makedirs(os.path.dirname(cubin), exist_ok=True)
        with open(cubin, "wb") as fh:
            fh.write(res.cubin)
        sass = subprocess.run([tool, "-c", cubin], capture_output=True, text=True, check=True).stdout
        if args.save:
            with open(os.path.join(args.save, f"{f}.{args.arch}.sass"), "w") as fh:
                fh.write(sass)
        print(f"{f:20s} {len(exprs[f]):5d} instantiations  sass sha1 {hashlib.sha1(sass.encode()).hexdigest()[:12]}",
              flush=True)
        if args.against:
            with open(os.path.join(args.against, f"{f}.{args.arch}.sass")) as fh:
                status |= compare(kernels(fh.read()), kernels(sass), args.default_arg)
    return status


def kernels(sass: str) -> dict:
    """{mangled name without its parameter list: instructions with labels and whitespace normalised}."""
    out = {}
    for part in re.split(r"\n(?=//-+ \.text\.)", sass):
        m = re.match(r"//-+ \.text\.(\S+)", part)
        if not m:
            continue
        part = re.split(r"\n//-+ SYMBOLS", part)[0]  # the file's last section runs into the symbol table
        lines = [ln for ln in part.splitlines()[1:]
                 if not ln.strip().startswith((".section", ".type", ".size", ".weak", ".global", ".other"))
                 and "_ZN" not in ln]
        body = re.sub(r"\.L_x_\d+", "L", "\n".join(lines))
        body = re.sub(r"\$__internal_\d+_", "$__internal_", body)  # numbered per file: helper routines
        body = re.sub(r"/\*[0-9a-f]{4,}\*/", "", body)
        out[m.group(1).rsplit("EEv", 1)[0]] = re.sub(r"[ \t]+", " ", body).strip()
    return out


def compare(before: dict, after: dict, default_arg=None) -> int:
    bools = {"false": "ELb0E", "true": "ELb1E"}
    suffix = bools.get(default_arg, f"ELi{default_arg}E") if default_arg is not None else None
    renamed = {}
    for name, body in after.items():
        key = name
        if suffix and name.endswith(suffix):   # ...E Li<V> E: V as the last template argument
            key = name[: -len(suffix)] + "E"
        renamed[key] = body
    same = [k for k in before if renamed.get(k) == before[k]]
    changed = [k for k in before if k in renamed and renamed[k] != before[k]]
    gone = [k for k in before if k not in renamed]
    new = [k for k in renamed if k not in before]
    print(f"  per kernel: {len(same)} same, {len(changed)} changed, {len(gone)} only before, {len(new)} only after")
    for k in changed[:20]:
        print("  changed:", k)
    for k in gone[:20]:
        print("  only before:", k)
    return 1 if changed or gone else 0


if __name__ == "__main__":
    sys.exit(main())
