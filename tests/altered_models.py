"""Servers whose models were altered the way wrong conversions alter them, with the same names,
signatures and versions: every float weight multiplied by 1.01, or rounded to fp16 (a model
converted to half precision behind fp32 inputs and outputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coffea_sonic.server.pipelines import write_models


def altered_repository(root: Path, models: list[str], how: str) -> Path:
    """The zoo's ``models`` in a repository under ``root``, each model.onnx altered by ``how``
    (``"scaled"``: weights x 1.01; ``"fp16"``: weights rounded to float16)."""
    import onnx
    from onnx import numpy_helper

    repository = write_models(root, models)
    for path in repository.glob("*/1/model.onnx"):
        model = onnx.load(str(path))
        for index, tensor in enumerate(model.graph.initializer):
            values = numpy_helper.to_array(tensor)
            if values.dtype != np.float32:
                continue
            changed = values * np.float32(1.01) if how == "scaled" else \
                values.astype(np.float16).astype(np.float32)
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(changed, tensor.name))
        onnx.save(model, str(path))
    return repository
