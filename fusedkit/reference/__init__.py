"""CPU backend: NumPy implementations with the public API's signatures and the GPU kernels' numerics
(fp32 math on inputs rounded to their storage dtype). The GPU tests compare against these."""
from .norms import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward  # noqa: F401
from . import fp8  # noqa: F401,E402  (FP8 quantizers: fusedkit.reference.fp8)
from . import activations  # noqa: F401,E402  (fusedkit.reference.activations)
from . import cross_entropy  # noqa: F401,E402  (fusedkit.reference.cross_entropy)
from .softmax import log_softmax, log_softmax_backward, softmax, softmax_backward  # noqa: F401,E402
