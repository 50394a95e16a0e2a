"""Repository agents of a model config (``model_repository_agents``), honoured without the agents.

The checksum agent's digests are verified here; any other agent is a refusal. How it works:
docs/internals/standard-repositories.md, "Repository agents".
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

from tritonclient.grpc import model_config_pb2

from .model_signatures import Mismatch

__all__ = ["CHECKSUM_AGENT", "agent_problems", "checksum_config", "file_digest",
           "strip_agents", "verified_files"]

#: The name Triton's checksum repository agent is configured under.
CHECKSUM_AGENT = "checksum"
#: Digest algorithms Triton's checksum agent computes (key prefix, lower case).
ALGORITHMS: dict[str, str] = {"md5": "md5"}
_CHUNK = 1 << 20


def file_digest(path: Path, algorithm: str = "md5") -> str:
    """Lowercase hex digest of a file, read in 1 MiB pieces (what the checksum agent compares)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(piece)
    return digest.hexdigest()


def _checksum_problems(folder: Path,
                       agent: model_config_pb2.ModelRepositoryAgents.Agent) -> list[Mismatch]:
    problems = []
    for key, expected in sorted(agent.parameters.items()):
        algorithm, separator, relative = key.partition(":")
        if not separator:
            problems.append(Mismatch(f"checksum agent parameter {key!r}",
                                     "ALGORITHM:path relative to the model folder", key,
                                     'e.g. key: "MD5:1/model.onnx"'))
            continue
        if algorithm.lower() not in ALGORITHMS:
            problems.append(Mismatch(
                f"checksum agent algorithm of {relative}", "MD5 (the only one Triton's "
                "checksum agent computes; the official container refuses this model too)",
                algorithm, f'write key: "MD5:{relative}" with the file\'s MD5'))
            continue
        path = folder / relative
        try:
            actual = file_digest(path, ALGORITHMS[algorithm.lower()])
        except OSError as error:
            problems.append(Mismatch(f"checksum agent: {algorithm.upper()} of {relative}",
                                     "a readable file",
                                     f"{type(error).__name__}: {error.strerror or error}"))
            continue
        if actual != expected:
            case = (" (same digest in upper case: the agent compares lowercase hex exactly)"
                    if actual == expected.lower() else "")
            problems.append(Mismatch(f"checksum agent: {algorithm.upper()} of {relative}",
                                     expected, actual + case,
                                     "the file is not the one the config was written for"))
    return problems


def agent_problems(folder: Path, config: model_config_pb2.ModelConfig | None, *,
                   others: bool = True) -> list[Mismatch]:
    """Every reason ``config``'s repository agents refuse the model in ``folder`` here.

    Checksum agents: each listed file's digest is computed and compared; agents of another name
    cannot run in the embedded server (it has none) and are reported as such unless ``others`` is
    False (what the official container, which may have them, would judge).
    """
    if config is None:
        return []
    problems = []
    for agent in config.model_repository_agents.agents:
        if agent.name == CHECKSUM_AGENT:
            problems += _checksum_problems(folder, agent)
        elif others:
            problems.append(Mismatch(
                f"repository agent {agent.name!r}", "an agent the embedded server "
                f"can honour ({CHECKSUM_AGENT!r})", f"libtritonrepoagent_{agent.name}.so, which "
                "it cannot load", "serve this model with the official container that has the agent"))
    return problems


def verified_files(config: model_config_pb2.ModelConfig | None) -> list[str]:
    """The files whose digests ``config``'s checksum agents list (``ALGORITHM:path`` keys)."""
    if config is None:
        return []
    return [key for agent in config.model_repository_agents.agents
            if agent.name == CHECKSUM_AGENT for key in sorted(agent.parameters)]


def strip_agents(config: model_config_pb2.ModelConfig) -> bool:
    """Remove the ``model_repository_agents`` block (served copy only); whether there was one."""
    had = bool(config.model_repository_agents.agents)
    config.ClearField("model_repository_agents")
    return had


def checksum_config(digests: Mapping[str, str],
                    config: model_config_pb2.ModelConfig | None = None
                    ) -> model_config_pb2.ModelConfig:
    """``config`` (or a new one) with a checksum agent listing ``{relative path: md5}``.

    An existing checksum agent is kept and its entries for these files replaced, so a config that
    lists version 1 still does after version 2 is added.

    >>> config = checksum_config({"1/model.onnx": "0" * 32})
    >>> config = checksum_config({"2/model.onnx": "1" * 32}, config)
    >>> sorted(config.model_repository_agents.agents[0].parameters)
    ['MD5:1/model.onnx', 'MD5:2/model.onnx']
    """
    config = config if config is not None else model_config_pb2.ModelConfig()
    agents = config.model_repository_agents.agents
    agent = next((a for a in agents if a.name == CHECKSUM_AGENT), None) or agents.add(
        name=CHECKSUM_AGENT)
    for relative, digest in digests.items():
        for key in [k for k in agent.parameters if k.partition(":")[2] == relative]:
            del agent.parameters[key]
        agent.parameters[f"MD5:{relative}"] = digest
    return config
