"""What a benchmark run measures: modes, models, sweeps, repetitions, and the presets.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial

from .. import zoo
from ..errors import ConfigurationError

#: Every mode the suite knows, in the order they run and appear in tables.
MODES: tuple[str, ...] = ("cpu", "local-gpu", "remote", "remote-sync", "coffea-wrapper")
#: Modes that send requests to a Triton server.
SERVED_MODES: frozenset[str] = frozenset({"remote", "remote-sync", "coffea-wrapper"})

#: Model rows per physics event, to turn rows/s into events/s. Assumptions, overridable per run:
#: jets per event of a ttbar-like NanoAOD sample for the jet taggers; for the ProtoDUNE CNN one
#: "event" here is a slice of 2048 wire-plane patches (a full ProtoDUNE event holds far more).
DEFAULT_ROWS_PER_EVENT: dict[str, float] = {"jet_tagger": 4.0, "particlenet_lite": 4.0,
                                            "emtrk_cnn": 2048.0}
#: Outputs of all modes must agree to this (max |difference| over every output element).
OUTPUT_TOLERANCE = 1e-5
#: ... except where the model ran on a GPU (cuDNN picks other kernels and summation orders than
#: onnxruntime on the CPU): then this.
GPU_OUTPUT_TOLERANCE = 1e-4


@dataclass
class BenchConfig:
    """Settings of one ``coffea-sonic bench`` run (JSON-serialisable with :meth:`to_dict`).
    Design notes: docs/internals/bench.md.

    >>> BenchConfig(models=("emtrk_cnn",), chunk_rows=512).chunk_rows_for("emtrk_cnn")
    512
    """

    models: tuple[str, ...] = ("jet_tagger", "emtrk_cnn")
    modes: tuple[str, ...] = MODES
    batch_sizes: tuple[int, ...] = (256, 1024, 4096, 16384)
    #: also run every mode at its own default batching (batch_size 0 in the records)
    include_default_batch: bool = True
    batch_sizes_per_model: dict[str, tuple[int, ...]] = field(default_factory=dict)
    in_flight: tuple[int, ...] = (1, 2, 4, 8)
    default_in_flight: int = 4
    clients: tuple[int, ...] = (1, 2, 4)
    #: modes that get the concurrent-clients sweep (in-process modes give the per-node baseline)
    client_modes: tuple[str, ...] = ("remote",)
    chunk_rows: int = 65536
    chunk_rows_per_model: dict[str, int] = field(default_factory=dict)
    reference_batch_per_model: dict[str, int] = field(default_factory=dict)
    repetitions: int = 5
    warmup: int = 1
    rows_per_event: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ROWS_PER_EVENT))
    server: str | None = None
    device: str = "auto"
    server_instances: int = 1
    #: threads of the in-process onnxruntime engine (0: all cores, as a user would run it)
    cpu_threads: int = 0
    link_gbps: tuple[float, ...] = (1.0, 10.0, 25.0, 100.0)
    timeout_s: float = 120.0
    e2e_events: int = 0
    e2e_workers: tuple[int, ...] = (1, 2)
    preset: str = "custom"

    def __post_init__(self) -> None:
        unknown = [mode for mode in self.modes if mode not in MODES]
        if unknown:
            raise ConfigurationError(f"unknown bench modes {unknown}; choose from {list(MODES)}")
        for name in self.models:
            zoo.spec(name)  # raises ModelNotFoundError naming the zoo
        if self.repetitions < 1 or self.warmup < 0:
            raise ConfigurationError(
                f"repetitions must be >= 1 and warmup >= 0, got {self.repetitions}, {self.warmup}")
        if not self.clients or min(self.clients) < 1:
            raise ConfigurationError(f"clients must be positive counts, got {self.clients}")
        self.models = tuple(self.models)
        self.modes = tuple(mode for mode in MODES if mode in self.modes)

    # -- per-model views ---------------------------------------------------------------------
    def chunk_rows_for(self, model: str) -> int:
        """Rows per chunk (one client call) for ``model``."""
        return int(self.chunk_rows_per_model.get(model, self.chunk_rows))

    def batch_sizes_for(self, model: str) -> tuple[int, ...]:
        """Batch sizes swept for ``model``: within its max_batch_size and its chunk."""
        sizes = self.batch_sizes_per_model.get(model, self.batch_sizes)
        limit = min(zoo.spec(model).max_batch_size, self.chunk_rows_for(model))
        return tuple(sorted({min(int(size), limit) for size in sizes}))

    def batch_sweep_for(self, model: str) -> tuple[int, ...]:
        """Batch sizes of the batch sweep: 0 (each tool's default) first when included."""
        sizes = self.batch_sizes_for(model)
        return ((0,) + sizes) if self.include_default_batch else sizes

    def reference_batch(self, model: str) -> int:
        """Batch size of the in-flight and clients sweeps (default: the largest swept)."""
        if model in self.reference_batch_per_model:
            return int(self.reference_batch_per_model[model])
        return self.batch_sizes_for(model)[-1]

    def events_per_row(self, model: str) -> float:
        return 1.0 / float(self.rows_per_event.get(model, 1.0))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # -- presets -----------------------------------------------------------------------------
    @classmethod
    def quick(cls, **overrides) -> "BenchConfig":
        """Small sweeps that finish in well under 3 minutes on a 2-core machine."""
        return PRESETS["quick"](**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "BenchConfig":
        """The smallest meaningful run (tests): every mode, two batch sizes, 1-2 clients."""
        return PRESETS["tiny"](**overrides)


_PRESET_SETTINGS: dict[str, dict] = {
    "quick": dict(models=("jet_tagger",), batch_sizes=(256, 1024, 4096), in_flight=(1, 2, 4),
                  clients=(1, 2, 3), chunk_rows=16384, repetitions=5, warmup=1,
                  e2e_events=8000, e2e_workers=(1, 2)),
    # the default sweeps over jet_tagger and emtrk_cnn (minutes on a workstation)
    "full": dict(models=("jet_tagger", "emtrk_cnn"),
                 batch_sizes_per_model={"emtrk_cnn": (64, 256, 1024)},
                 chunk_rows_per_model={"emtrk_cnn": 1024},
                 reference_batch_per_model={"jet_tagger": 4096, "emtrk_cnn": 256},
                 e2e_events=20000, e2e_workers=(1, 2)),
    # sized for a GPU node with 16 cores (the H100 machine of RESULTS.md), < 7 min
    "gpu": dict(models=("jet_tagger", "emtrk_cnn"),
                batch_sizes_per_model={"jet_tagger": (4096, 16384, 65536),
                                       "emtrk_cnn": (256, 2048)},
                chunk_rows_per_model={"jet_tagger": 131072, "emtrk_cnn": 8192},
                reference_batch_per_model={"jet_tagger": 16384, "emtrk_cnn": 2048},
                in_flight=(1, 2, 4, 8), clients=(1, 2, 4, 8, 12, 16),
                client_modes=("remote", "local-gpu"), repetitions=5),
    "tiny": dict(models=("jet_tagger",), batch_sizes=(128, 512), in_flight=(2,), clients=(1, 2),
                 chunk_rows=1024, repetitions=2, warmup=1, link_gbps=(10.0,)),
}

#: ``--preset NAME``: the config of those settings, ``overrides`` applied on top.
PRESETS = {name: partial(BenchConfig, **settings, preset=name)
           for name, settings in _PRESET_SETTINGS.items()}
