"""asv benchmarks for fusedkit (run from asv_bench/: ``asv run --python=same``).

With ``environment_type: existing`` asv does not install the project, so when fusedkit is not
installed the repository checkout above this folder is put on the path.
"""
import os
import sys

try:
    import fusedkit  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
