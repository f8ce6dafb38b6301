"""fusedkit: fused transformer kernels (CUDA C++ through CuPy/NVRTC) with a NumPy-like API.

Arrays of any framework go in (NumPy, CuPy, PyTorch, JAX, any DLPack producer) and come back in the
same type. NumPy arrays run on the CPU backend, which is also the GPUs' reference.
"""
from ._version import __version__
from .norms import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from .fp8.api import cast_transpose, dequantize, quantize
from .activations import (geglu, geglu_backward, gelu, gelu_backward, reglu, reglu_backward, relu,
                          relu_backward, silu, silu_backward, squared_relu, squared_relu_backward, swiglu,
                          swiglu_backward)

__all__ = ["__version__", "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
           "quantize", "cast_transpose", "dequantize",
           "gelu", "gelu_backward", "silu", "silu_backward", "relu", "relu_backward", "squared_relu",
           "squared_relu_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward", "reglu",
           "reglu_backward"]
