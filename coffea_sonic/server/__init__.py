"""The embedded real Triton server, the model-repository writer, and the planner of repositories
written for NVIDIA's official container (:func:`plan_repository`).

>>> from coffea_sonic.server import LocalTritonServer, write_repository
>>> LocalTritonServer().running
False
"""

from .launcher import LocalTritonServer, free_port, gpu_available, server_binary
from .repository import model_config, parse_config, write_repository
from .standard import Refusal, ServedModel, plan_repository

__all__ = ["LocalTritonServer", "Refusal", "ServedModel", "free_port", "gpu_available",
           "model_config", "parse_config", "plan_repository", "server_binary", "write_repository"]
