"""Core types every layer shares: servers, settings, signatures (docs/internals/core.md)."""

from .endpoint import ModelRef, ServerSettings, parse_address, parse_model_url
from .secrets import Secret
from .tensors import ModelInfo, TensorInfo, numpy_dtype, triton_dtype
from .tls import TlsOptions

__all__ = ["ModelInfo", "ModelRef", "Secret", "ServerSettings", "TensorInfo", "TlsOptions",
           "numpy_dtype", "parse_address", "parse_model_url", "triton_dtype"]
