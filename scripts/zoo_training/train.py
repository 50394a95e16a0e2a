"""Train the zoo ``jet_tagger`` on synthetic jets (CPU, seconds, fixed seeds).

Jets come from :func:`coffea_sonic.data.synthetic.draw_labelled_jets`, i.e. the distributions of
the synthetic NanoAOD sample; labels are ``Jet_hadronFlavour`` mapped to the class order of
:data:`~coffea_sonic.zoo.spec.JET_CLASSES` (b, c, light). The shipped ``jet_tagger.onnx`` is made
by ``python -m zoo_training.export jet_tagger`` (from ``scripts/``), which calls :func:`train_jet_tagger`.

The metric helpers need only numpy:

>>> import numpy as np
>>> roc_auc(np.array([0.9, 0.8, 0.3, 0.1]), np.array([True, False, True, False]))
0.75
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from coffea_sonic.errors import InputValidationError, require
from coffea_sonic.zoo.spec import JET_CLASSES

logger = logging.getLogger(__name__)

#: ``Jet_hadronFlavour`` -> class index of the tagger's ``probs`` output.
FLAVOUR_TO_CLASS: dict[int, int] = {5: JET_CLASSES.index("b"), 4: JET_CLASSES.index("c"),
                                    0: JET_CLASSES.index("light")}
#: Seed offset of the validation jets, so they never repeat training jets.
_VALIDATION_SEED_OFFSET = 1_000_003


def roc_auc(scores: np.ndarray, is_signal: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for ``is_signal`` (ties count one half).

    >>> roc_auc(np.array([1.0, 1.0]), np.array([True, False]))
    0.5
    """
    scores = np.asarray(scores, dtype=np.float64)
    is_signal = np.asarray(is_signal, dtype=bool)
    n_signal = int(is_signal.sum())
    n_background = len(is_signal) - n_signal
    if scores.shape != is_signal.shape or n_signal == 0 or n_background == 0:
        raise InputValidationError(
            f"roc_auc needs matching 1-d scores and labels with both classes present, got "
            f"{scores.shape} scores, {n_signal} signal and {n_background} background entries")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(1, len(scores) + 1)
    # Average the ranks of tied scores (Mann-Whitney U with ties).
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mean_rank = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, counts)
    return float((ranks[is_signal].sum() - n_signal * (n_signal + 1) / 2.0)
                 / (n_signal * n_background))


def b_vs_light_auc(probs: np.ndarray, hadron_flavour: np.ndarray) -> float:
    """ROC AUC of the b probability, b jets (flavour 5) against light jets (flavour 0).

    >>> probs = np.array([[0.9, 0.05, 0.05], [0.2, 0.1, 0.7], [0.5, 0.5, 0.0]])
    >>> b_vs_light_auc(probs, np.array([5, 0, 4]))
    1.0
    """
    hadron_flavour = np.asarray(hadron_flavour)
    b_or_light = (hadron_flavour == 5) | (hadron_flavour == 0)
    b_score = np.asarray(probs)[b_or_light, JET_CLASSES.index("b")]
    return roc_auc(b_score, hadron_flavour[b_or_light] == 5)


def train_jet_tagger(n_jets: int = 60_000, seed: int = 0, epochs: int = 10,
                     batch_size: int = 1024, learning_rate: float = 3e-3,
                     n_validation: int = 40_000):
    """Train a :class:`~coffea_sonic.zoo.torch_models.JetTagger` and return it in eval mode.

    Starts from the zoo's deterministic weights, draws ``n_jets`` synthetic jets (b, c, light in
    equal shares) with ``seed``, and runs Adam with cross-entropy on ``JetTagger.logits`` and a
    cosine learning-rate decay; batches are shuffled by a seeded torch generator, so a seed gives
    the same weights on a given machine. Logs the b-vs-light ROC AUC on ``n_validation`` fresh
    jets next to that of ``btagDeepFlavB`` alone.

    >>> import torch
    >>> tagger = train_jet_tagger(n_jets=3000, epochs=1, n_validation=2000)
    >>> tagger(torch.zeros(1, 6)).shape
    torch.Size([1, 3])
    """
    torch = require("torch", "training the jet tagger")
    from coffea_sonic.data.synthetic import draw_labelled_jets
    from coffea_sonic.zoo import torch_models
    from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES

    if n_jets < batch_size or epochs < 1:
        raise InputValidationError(
            f"need n_jets >= batch_size and epochs >= 1, got n_jets={n_jets}, "
            f"batch_size={batch_size}, epochs={epochs}")
    started = time.perf_counter()
    torch.manual_seed(seed)
    features, flavour = draw_labelled_jets(n_jets, seed=seed)
    labels = np.vectorize(FLAVOUR_TO_CLASS.__getitem__, otypes=[np.int64])(flavour)
    inputs, targets = torch.from_numpy(features), torch.from_numpy(labels)

    model = torch_models.build("jet_tagger").train()
    loss_function = torch.nn.CrossEntropyLoss()
    fit(model, lambda batch: loss_function(model.logits(inputs[batch]), targets[batch]), n_jets,
        epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
        name="jet_tagger")

    validation_features, validation_flavour = draw_labelled_jets(
        n_validation, seed=seed + _VALIDATION_SEED_OFFSET)
    with torch.no_grad():
        probs = model(torch.from_numpy(validation_features)).numpy()
    btag_only = np.zeros_like(probs)
    btag_only[:, JET_CLASSES.index("b")] = validation_features[
        :, JET_TAGGER_FEATURES.index("btagDeepFlavB")]
    logger.info(
        "trained jet_tagger on %d jets, %d epochs in %.1f s: b-vs-light ROC AUC %.4f "
        "(btagDeepFlavB alone: %.4f) on %d validation jets", n_jets, epochs,
        time.perf_counter() - started, b_vs_light_auc(probs, validation_flavour),
        b_vs_light_auc(btag_only, validation_flavour), n_validation)
    return model


def fit(model: Any, loss_of: Callable[[Any], Any], rows: int, *, epochs: int, batch_size: int,
        learning_rate: float, seed: int, name: str) -> Any:
    """Train ``model`` in place: Adam, cosine-annealed learning rate, ``epochs`` passes over
    ``rows`` rows in seeded random batches; ``loss_of(batch_indices)`` gives a batch's loss.

    The one training loop of the zoo's models (the same order of operations every time, so a
    seed reproduces the shipped weights exactly). Returns the model in eval mode.
    """
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    steps = rows // batch_size
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps)
    shuffler = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        permutation = torch.randperm(rows, generator=shuffler)
        total = 0.0
        for step in range(steps):
            batch = permutation[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = loss_of(batch)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item()
        logger.debug("%s epoch %d: mean loss %.4f", name, epoch, total / steps)
    return model.eval()
