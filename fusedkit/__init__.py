"""fusedkit: fused transformer kernels (CUDA C++ through CuPy/NVRTC) with a NumPy-like API.

Arrays of any framework go in (NumPy, CuPy, PyTorch, JAX, any DLPack producer) and come back in the
same type. NumPy arrays run on the CPU backend, which is also the GPUs' reference.
"""
from ._version import __version__
from .norms import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from .fp8.api import cast_transpose, cast_transpose_dbias, dact_cast_transpose, dequantize, quantize
from .activations import (geglu, geglu_backward, gelu, gelu_backward, reglu, reglu_backward, relu,
                          relu_backward, silu, silu_backward, squared_relu, squared_relu_backward, swiglu,
                          swiglu_backward)
from .cross_entropy import cross_entropy, cross_entropy_backward
from .softmax import log_softmax, log_softmax_backward, softmax, softmax_backward  # noqa: E402
from .fp8.gemm import fp8_gemm  # noqa: E402

__all__ = ["__version__", "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
           "quantize", "cast_transpose", "cast_transpose_dbias", "dact_cast_transpose", "dequantize",
           "gelu", "gelu_backward", "silu", "silu_backward", "relu", "relu_backward", "squared_relu",
           "squared_relu_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward", "reglu",
           "reglu_backward"]
__all__ += ["cross_entropy", "cross_entropy_backward"]
__all__ += ["softmax", "softmax_backward", "log_softmax", "log_softmax_backward"]
__all__ += ["fp8_gemm"]
