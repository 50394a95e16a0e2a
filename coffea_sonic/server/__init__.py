"""The embedded real Triton server, the repository writer and planner, and your own models.

How it works, with examples: docs/internals/server.md and docs/internals/standard-repositories.md.
"""

from .launcher import LocalTritonServer, free_port, gpu_available, server_binary
from .model_check import validate_repository
from .model_files import add_model
from .repository import model_config, parse_config, write_repository
from .standard import Refusal, ServedModel, plan_repository

__all__ = ["LocalTritonServer", "Refusal", "ServedModel", "add_model", "free_port", "gpu_available",
           "model_config", "parse_config", "plan_repository", "server_binary", "validate_repository",
           "write_repository"]
