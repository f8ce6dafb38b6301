"""A digest of the machine code of every registered kernel instantiation, per .cu file, without a GPU.

    PYTHONPATH=. python3 tools/sass_digest.py [file.cu ...] [--arch sm_90a] [--save DIR]

Compiles each file's instantiations through NVRTC (as the compile-all check does), disassembles the
cubin with nvdisasm (the nvidia-cuda-nvdisasm wheel or the CUDA toolkit) and prints the SHA-1 of the
SASS text. Run it before and after a change that should not alter the shipped kernels (a removed
experiment, a comment, a refactor): equal digests prove it. Line tables differ with every edit, so the
cubin bytes are not compared; the instructions are. --save writes each file's SASS for a diff.
"""
import argparse
import glob
import hashlib
import os
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
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    main()
