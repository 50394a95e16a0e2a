"""On a GPU machine: does a request whose inputs arrive in CUDA shared memory use Triton's
response cache? Sends the same emtrk_cnn rows three times with ``transport="cuda"`` (demanded)
and three times with ``transport="auto"`` (which, for a model with the response cache on, picks
system shared memory) to one embedded GPU server with ``response_cache``; prints and writes (to
``$OUT/response_cache_cuda.json``) executions, cache hits and misses per transport.

    python3 -m coffea_sonic.bench.gpu.response_cache_cuda   # after triton-gpu-env.sh
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from coffea_sonic import zoo
from coffea_sonic.model import TritonModel
from coffea_sonic.routing import clear_routers
from coffea_sonic.server import LocalTritonServer


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    results = {}
    with LocalTritonServer(models=["emtrk_cnn"], device="gpu", response_cache="1GB") as server:
        for seed, transport in enumerate(("cuda", "auto")):
            clear_routers()
            model = TritonModel(server.url("emtrk_cnn"), transport=transport)
            inputs = zoo.example_inputs("emtrk_cnn", 512, seed=seed)
            kind = model.transport_kind
            before = model.server_statistics()
            answers = [model(inputs) for _ in range(3)]
            time.sleep(1.0)  # Triton counts a request's execution just after answering it
            delta = model.server_statistics() - before
            same = all((a[name] == answers[0][name]).all() for a in answers for name in a)
            results[transport] = {
                "transport_used": kind, "requests": delta.success_count,
                "executions": delta.execution_count, "cache_hits": delta.cache_hit_count,
                "cache_misses": delta.cache_miss_count, "identical_outputs": bool(same),
                "response_cache_in_config": model.info.response_cache}
    print(json.dumps(results, indent=2))
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "response_cache_cuda.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    main()
