"""The embedded real Triton server and the model-repository writer.

>>> from coffea_sonic.server import LocalTritonServer, write_repository
>>> LocalTritonServer().running
False
"""

from .launcher import LocalTritonServer, free_port, gpu_available, server_binary
from .repository import model_config, parse_config, write_repository

__all__ = ["LocalTritonServer", "free_port", "gpu_available", "model_config", "parse_config",
           "server_binary", "write_repository"]
