"""Core types every layer shares: where a server is and how to reach it, what a model declares.

* :mod:`.endpoint`: the one URL parser (:func:`parse_model_url`) and :class:`ServerSettings`
  (address, protocol, TLS, secret headers, restricted-protocol key);
* :mod:`.tensors`: :class:`TensorInfo`, :class:`ModelInfo`, Triton <-> numpy datatypes;
* :mod:`.secrets` and :mod:`.tls`: tokens and certificates that never leak;
* :mod:`.settings`: where run-time settings come from (environment, Dask config, facility file).

Errors (:mod:`coffea_sonic.errors`), settings (:mod:`coffea_sonic.config`) and statistics types
(:mod:`coffea_sonic.stats`) belong to this layer too. Nothing here imports a transport.

>>> from coffea_sonic.core import parse_model_url
>>> parse_model_url("triton+grpcs://h:443/jet_tagger").tls
True
"""

from .endpoint import ModelRef, ServerSettings, parse_address, parse_model_url
from .secrets import Secret
from .tensors import ModelInfo, TensorInfo, numpy_dtype, triton_dtype
from .tls import TlsOptions

__all__ = ["ModelInfo", "ModelRef", "Secret", "ServerSettings", "TensorInfo", "TlsOptions",
           "numpy_dtype", "parse_address", "parse_model_url", "triton_dtype"]
