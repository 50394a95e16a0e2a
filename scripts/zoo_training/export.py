"""Re-export the shipped zoo ONNX files: ``python -m zoo_training.export [NAME ...]`` (from
``scripts/``).

``jet_tagger`` is trained first (:mod:`zoo_training.train`), ``particlenet`` and ``deepmet`` too
(:mod:`zoo_training.physics`); the others use deterministic weights.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from coffea_sonic import zoo
from coffea_sonic.zoo import MODEL_SPECS, export_onnx

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="models to export (default: all shipped ones)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    wanted = args.names or [name for name, s in MODEL_SPECS.items() if s.shipped]
    here = Path(zoo.__file__).parent
    for name in wanted:
        module = None
        if name == "jet_tagger":
            from .train import train_jet_tagger

            module = train_jet_tagger()
        elif name == "particlenet":
            from .physics import train_particlenet

            module, _ = train_particlenet()
        elif name == "deepmet":
            from .physics import train_deepmet

            module, _, _ = train_deepmet()
            module = module.double()  # see DeepMET.forward: batch-independent served output
        logger.info("wrote %s", export_onnx(name, here / f"{name}.onnx", module=module))


if __name__ == "__main__":
    main()
