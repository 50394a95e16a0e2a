"""The gRPC transport under :class:`~coffea_sonic.model.TritonModel`.

* :mod:`.url` parses ``triton+grpc[s]://host:port/model[/version]``;
* :mod:`.channel` keeps one fork-safe gRPC channel per process and server;
* :mod:`.metadata` fetches and caches what a served model declares;
* :mod:`.validation` checks inputs and splits calls into requests;
* :mod:`.codec` turns numpy dicts into Triton requests and responses back;
* :mod:`.status` classifies gRPC failures (retry elsewhere, or raise);
* :mod:`.secrets` and :mod:`.tls` carry tokens and certificates safely.

>>> from coffea_sonic.transport import Secret, TlsOptions, parse_model_url
>>> parse_model_url("triton+grpcs://h:443/jet_tagger").tls
True
"""

from .channel import channel_options, close_all, get_connection
from .metadata import ModelInfo, TensorInfo, fetch_model_info, served_models
from .secrets import Secret
from .tls import TlsOptions
from .url import ModelRef, parse_address, parse_model_url

__all__ = [
    "ModelInfo", "ModelRef", "Secret", "TensorInfo", "TlsOptions", "channel_options",
    "close_all", "fetch_model_info", "get_connection", "parse_address", "parse_model_url",
    "served_models",
]
