"""The ProtoDUNE SONIC scaling model, fitted to measured runs, and the network bound.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from ..errors import ConfigurationError


@dataclass(frozen=True)
class ScalingModel:
    """Parameters of the SONIC scaling model (seconds per event; ``p`` in [0, 1])."""

    t_gpu: float
    t_latency: float = 0.0
    p: float = 1.0
    t_cpu: float = 0.0
    n_gpu: int = 1
    #: None: ``(1-p)·t_cpu + t_gpu + t_latency`` (docs/internals/bench.md)
    t_ideal_override: float | None = None

    @property
    def t_client(self) -> float:
        """Work a client does itself per event: ``(1 - p)·t_cpu``."""
        return (1.0 - self.p) * self.t_cpu

    @property
    def t_ideal(self) -> float:
        if self.t_ideal_override is not None:
            return self.t_ideal_override
        return self.t_client + self.t_gpu + self.t_latency

    def time_per_event(self, n_cpu: float) -> float:
        """t_SONIC: seconds per event per client with ``n_cpu`` clients."""
        excess = max(0.0, n_cpu / self.n_gpu - self.t_ideal / self.t_gpu)
        return self.t_client + self.t_gpu * (1.0 + excess) + self.t_latency

    def throughput(self, n_cpu: float) -> float:
        """Aggregate events/s of ``n_cpu`` clients."""
        return n_cpu / self.time_per_event(n_cpu)

    def saturation_clients(self) -> float:
        """Clients at which the GPUs become the bottleneck: ``N_gpu · t_ideal / t_gpu``."""
        return self.n_gpu * self.t_ideal / self.t_gpu

    def recommended_cpu_per_gpu(self) -> int:
        """CPU processes per GPU that just saturate it (more only wait; fewer leave it idle)."""
        return max(1, math.floor(self.saturation_clients() / self.n_gpu + 1e-9))

    def speedup_over_cpu(self, n_cpu: float) -> float | None:
        """``t_cpu / t_SONIC``: how much faster a client runs than the all-CPU job (t_cpu > 0)."""
        return self.t_cpu / self.time_per_event(n_cpu) if self.t_cpu > 0 else None

    def network_bound_clients(self, link_gbps: float, bytes_per_event: float,
                              n_cpu: float = 1.0) -> float:
        """Clients a ``link_gbps`` Gbit/s link carries when each moves ``bytes_per_event``."""
        per_client_bytes_per_s = bytes_per_event / self.time_per_event(n_cpu)
        return link_gbps * 1e9 / 8.0 / per_client_bytes_per_s

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(t_ideal=self.t_ideal, saturation_clients=self.saturation_clients(),
                   recommended_cpu_per_gpu=self.recommended_cpu_per_gpu())
        return out


@dataclass(frozen=True)
class ScalingFit:
    """A fitted model, what it was fitted to, and how well it describes it."""

    model: ScalingModel
    clients: tuple[float, ...]
    measured_events_per_s: tuple[float, ...]
    predicted_events_per_s: tuple[float, ...]
    rms_relative_error: float
    #: True when no measured point is past the fitted saturation (t_gpu then only bounded)
    saturation_observed: bool

    def to_dict(self) -> dict:
        return {"model": self.model.to_dict(), "clients": list(self.clients),
                "measured_events_per_s": list(self.measured_events_per_s),
                "predicted_events_per_s": list(self.predicted_events_per_s),
                "rms_relative_error": self.rms_relative_error,
                "saturation_observed": self.saturation_observed}


#: Fits whose mean squared log error is within this of the best are "as good" (about 1 % rms,
#: below the repetition spread of any real measurement); among them the server hint decides.
NEAR_OPTIMAL_LOSS = 1e-4


def _log_grid(low: float, high: float, points: int) -> np.ndarray:
    return np.exp(np.linspace(math.log(low), math.log(high), points))


def fit_scaling_model(clients: Sequence[float], events_per_s: Sequence[float], *, p: float = 1.0,
                      t_cpu: float = 0.0, n_gpu: int = 1,
                      t_gpu_hint: float | None = None) -> ScalingFit:
    """Fit ``t_gpu`` and ``t_latency`` to aggregate throughput measured at several client counts.
    Design notes: docs/internals/bench.md.

    >>> truth = ScalingModel(t_gpu=0.004, t_latency=0.006)
    >>> n = [1, 2, 4, 8]
    >>> fit = fit_scaling_model(n, [truth.throughput(k) for k in n])
    >>> round(fit.model.t_gpu, 4), round(fit.model.t_latency, 4), fit.rms_relative_error < 0.01
    (0.004, 0.006, True)
    """
    n = np.asarray(clients, dtype=float)
    rate = np.asarray(events_per_s, dtype=float)
    if n.size == 0 or n.shape != rate.shape or np.any(rate <= 0) or np.any(n <= 0):
        raise ConfigurationError(
            f"need positive client counts and throughputs of equal length, got {list(n)} and "
            f"{list(rate)}")
    observed = n / rate                      # seconds per event per client
    client_part = (1.0 - p) * t_cpu
    # the GPU can't need more than the slowest per-client time times the clients it served
    upper = float(np.max(observed * n / n_gpu)) * 2.0
    lower = max(float(np.min(observed)) * 1e-4, 1e-12)
    best = None
    span = (lower, upper, lower, upper)
    for points in (240, 120, 120):
        t_gpu = _log_grid(span[0], span[1], points)[:, None]
        t_lat = np.concatenate([[0.0], _log_grid(span[2], span[3], points - 1)])[None, :]
        ideal = client_part + t_gpu + t_lat
        excess = np.maximum(0.0, n[None, None, :] / n_gpu - (ideal / t_gpu)[..., None])
        predicted = client_part + t_gpu[..., None] * (1.0 + excess) + t_lat[..., None]
        loss = np.mean(np.log(predicted / observed) ** 2, axis=-1)
        flat = int(np.argmin(loss))
        i, j = np.unravel_index(flat, loss.shape)
        if t_gpu_hint is not None:
            near = loss <= loss[i, j] + NEAR_OPTIMAL_LOSS
            candidates = np.argwhere(near)
            distance = np.abs(np.log(t_gpu[candidates[:, 0], 0] / t_gpu_hint))
            i, j = candidates[int(np.argmin(distance))]
        best = (float(t_gpu[i, 0]), float(t_lat[0, j]))
        # zoom: a factor 1.5 around the best on each axis
        span = (best[0] / 1.5, best[0] * 1.5,
                max(best[1] / 1.5, 1e-12), max(best[1] * 1.5, lower))
    model = ScalingModel(t_gpu=best[0], t_latency=best[1], p=p, t_cpu=t_cpu, n_gpu=n_gpu)
    predicted = np.array([model.throughput(k) for k in n])
    rms = float(np.sqrt(np.mean(((predicted - rate) / rate) ** 2)))
    return ScalingFit(model=model, clients=tuple(float(k) for k in n),
                      measured_events_per_s=tuple(float(r) for r in rate),
                      predicted_events_per_s=tuple(float(r) for r in predicted),
                      rms_relative_error=rms,
                      saturation_observed=bool(np.max(n) > model.saturation_clients()))
