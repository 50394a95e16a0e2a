"""Synthetic NanoAOD-like samples: ROOT files coffea reads with ``NanoAODSchema``; labelled jets.

The two datasets and how they are simulated: docs/internals/examples.md, "The synthetic sample".
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import awkward as ak
import numpy as np

from ..errors import ConfigurationError
from ..zoo.spec import JET_TAGGER_FEATURES
from . import nanoaod
from .hits import hit_collection

logger = logging.getLogger(__name__)

#: The datasets :func:`write_sample` can write.
DATASETS: tuple[str, ...] = ("ttbar", "qcd_light")
#: Defaults of :func:`write_sample` and the ``coffea-sonic sample`` command.
DEFAULT_EVENTS_PER_DATASET = 20_000
DEFAULT_FILES_PER_DATASET = 2
#: Events per ``TTree.extend`` call, i.e. per ROOT basket (readers chunk on these boundaries).
EVENTS_PER_BASKET = 10_000
#: Largest constituent count a jet gets (``Jet_nConstituents`` is an unsigned char in NanoAOD).
MAX_CONSTITUENTS_PER_JET = 60
MIN_CONSTITUENTS_PER_JET = 2

#: Factor on the momentum share of charged constituents of b jets (before renormalisation).
B_CHARGED_HARDENING = 4.0
#: Probability that an unclustered PF candidate comes from a pileup vertex.
PILEUP_FRACTION = 0.5
#: Mean PF response of neutral hadrons (``pdgId`` 130): PF pt / true pt.
NEUTRAL_HADRON_RESPONSE = 0.8
#: ``PFCands_fromPV`` values (CMS ``pat::PackedCandidate::PVAssoc``): no PV, loose, used in fit.
FROM_PV_NONE, FROM_PV_LOOSE, FROM_PV_USED_IN_FIT = 0, 1, 3

_PION_MASS, _ELECTRON_MASS, _MUON_MASS = 0.13957, 0.000511, 0.10566


def _mixture_beta(rng: np.random.Generator, n: int, weight_first: float,
                  first: tuple[float, float], second: tuple[float, float]) -> np.ndarray:
    """Draws from ``weight_first * Beta(*first) + (1 - weight_first) * Beta(*second)``."""
    pick_first = rng.random(n) < weight_first
    return np.where(pick_first, rng.beta(*first, size=n), rng.beta(*second, size=n))


def _draw_btag(rng: np.random.Generator, flavour: np.ndarray) -> np.ndarray:
    n = len(flavour)
    # The low-scoring third of b jets and the high tail of light jets keep the task non-trivial.
    b_score = _mixture_beta(rng, n, 0.65, (5.0, 1.5), (1.1, 4.0))
    c_score = _mixture_beta(rng, n, 0.70, (1.2, 6.0), (2.5, 2.5))
    light_score = _mixture_beta(rng, n, 0.85, (0.8, 10.0), (1.2, 3.0))
    return np.select([flavour == nanoaod.HADRON_FLAVOUR_B, flavour == nanoaod.HADRON_FLAVOUR_C],
                     [b_score, c_score], light_score)


def _draw_parton_flavour(rng: np.random.Generator, flavour: np.ndarray) -> np.ndarray:
    n = len(flavour)
    sign = rng.choice(np.array([-1, 1]), size=n)
    # Heavy-flavour jets from gluon splitting carry partonFlavour 21; unmatched light jets carry 0.
    gluon_split = rng.random(n) < 0.12
    light_choices = np.array([1, -1, 2, -2, 3, -3, 21, 21, 21, 0])
    light = light_choices[rng.integers(0, len(light_choices), n)]
    return np.select(
        [flavour == nanoaod.HADRON_FLAVOUR_B, flavour == nanoaod.HADRON_FLAVOUR_C],
        [np.where(gluon_split, 21, 5 * sign), np.where(gluon_split, 21, 4 * sign)], light)


def draw_jets(flavour: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Draw one jet per entry of ``flavour`` (``Jet_hadronFlavour`` values 5, 4 or 0).

    Returns every ``Jet`` field of :data:`nanoaod.JET_BRANCH_DTYPES`, with those dtypes; the
    sample files and :func:`draw_labelled_jets` both draw their jets here.

    >>> jets = draw_jets(np.array([5, 0, 4]), np.random.default_rng(0))
    >>> jets["hadronFlavour"].tolist(), jets["nConstituents"].dtype
    ([5, 0, 4], dtype('uint8'))
    """
    flavour = np.asarray(flavour)
    n = len(flavour)
    is_b = flavour == nanoaod.HADRON_FLAVOUR_B
    is_c = flavour == nanoaod.HADRON_FLAVOUR_C
    pt = 20.0 + rng.exponential(np.select([is_b, is_c], [45.0, 35.0], 30.0), n)
    # Heavy flavour is more central (top decays); out-of-acceptance draws are redrawn flat.
    eta = rng.normal(0.0, np.where(is_b, 1.0, 1.3), n)
    outside = np.abs(eta) > 2.5
    eta[outside] = rng.uniform(-2.5, 2.5, int(outside.sum()))
    phi = rng.uniform(-math.pi, math.pi, n)
    mass_over_pt = rng.lognormal(np.log(np.select([is_b, is_c], [0.16, 0.135], 0.12)),
                                 np.where(is_b, 0.30, 0.35), n)
    mass = np.maximum(pt * mass_over_pt, 0.5)
    multiplicity_scale = np.select([is_b, is_c], [1.35, 1.15], 1.0)
    mean_constituents = (8.0 + 5.5 * np.log(pt / 20.0 + 1.0)) * multiplicity_scale
    n_constituents = np.clip(MIN_CONSTITUENTS_PER_JET + rng.poisson(mean_constituents),
                             MIN_CONSTITUENTS_PER_JET, MAX_CONSTITUENTS_PER_JET)
    columns = {
        "pt": pt,
        "eta": eta,
        "phi": phi,
        "mass": mass,
        "btagDeepFlavB": _draw_btag(rng, flavour),
        "nConstituents": n_constituents,
        "hadronFlavour": flavour,
        "partonFlavour": _draw_parton_flavour(rng, flavour),
        "area": np.clip(rng.normal(0.50, 0.03, n), 0.3, 0.7),
    }
    return {name: np.asarray(values).astype(nanoaod.JET_BRANCH_DTYPES[name])
            for name, values in columns.items()}


def draw_labelled_jets(
    n: int, seed: int = 0, fractions: Mapping[int, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` labelled jets for training: features ``[n, F]`` float32 and ``hadronFlavour`` ``[n]``.

    Features are in :data:`coffea_sonic.zoo.spec.JET_TAGGER_FEATURES` order, drawn from the same
    distributions as the jets of the sample files (and rounded to float32 like them).
    ``fractions`` maps hadron flavour (5, 4, 0) to its share; default: b, c, light equally.

    >>> features, flavour = draw_labelled_jets(6, seed=3)
    >>> features.shape, features.dtype, sorted(set(flavour.tolist())) <= [0, 4, 5]
    ((6, 6), dtype('float32'), True)
    """
    if n < 0:
        raise ConfigurationError(f"draw_labelled_jets needs n >= 0 jets, got {n}")
    shares = dict(fractions) if fractions is not None else {5: 1.0, 4: 1.0, 0: 1.0}
    unknown = sorted(set(shares) - {nanoaod.HADRON_FLAVOUR_B, nanoaod.HADRON_FLAVOUR_C,
                                    nanoaod.HADRON_FLAVOUR_LIGHT})
    if unknown or any(share < 0 for share in shares.values()) or sum(shares.values()) <= 0:
        raise ConfigurationError(
            f"fractions must map hadron flavours 5, 4, 0 to non-negative shares, got {shares}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1ABE1]))
    flavours = np.array(list(shares), dtype=np.int64)
    probabilities = np.array(list(shares.values()), dtype=float)
    flavour = rng.choice(flavours, size=n, p=probabilities / probabilities.sum())
    jets = draw_jets(flavour, rng)
    features = np.stack([jets[name].astype(np.float32) for name in JET_TAGGER_FEATURES], axis=1)
    return features.reshape(n, len(JET_TAGGER_FEATURES)), jets["hadronFlavour"].astype(np.int32)


def _jet_flavours_per_event(rng: np.random.Generator, process: str,
                            n_events: int) -> tuple[np.ndarray, np.ndarray]:
    """Jet multiplicity per event and the flavour of every jet, event-major."""
    if process == "ttbar":
        n_b = rng.binomial(2, 0.8, n_events)
        n_c = rng.binomial(1, 0.35, n_events)
        n_light = rng.poisson(2.8, n_events)
    elif process == "qcd_light":
        # A Poisson with a fluctuating mean gives both empty events and a long multiplicity tail.
        n_total = rng.poisson(0.3 + rng.exponential(3.0, n_events))
        n_b = np.zeros(n_events, dtype=np.int64)
        n_c = rng.binomial(n_total, 0.08)
        n_light = n_total - n_c
    else:
        raise ConfigurationError(f"unknown process {process!r}; choose from {list(DATASETS)}")
    n_jets = n_b + n_c + n_light
    position = np.arange(n_jets.sum()) - np.repeat(np.cumsum(n_jets) - n_jets, n_jets)
    flavour = np.where(position < np.repeat(n_b, n_jets), nanoaod.HADRON_FLAVOUR_B,
                       np.where(position < np.repeat(n_b + n_c, n_jets),
                                nanoaod.HADRON_FLAVOUR_C, nanoaod.HADRON_FLAVOUR_LIGHT))
    return n_jets, flavour


def _draw_constituents(rng: np.random.Generator, jets: Mapping[str, np.ndarray]
                       ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """PF candidates of every jet, jet-major: (jet index of each candidate, candidate fields)."""
    n_constituents = jets["nConstituents"].astype(np.int64)
    jet_of = np.repeat(np.arange(len(n_constituents)), n_constituents)
    share = rng.gamma(0.6, 1.0, len(jet_of))
    share /= np.bincount(jet_of, weights=share, minlength=len(n_constituents))[jet_of]
    jet_pt = jets["pt"].astype(np.float64)[jet_of]
    is_b = (jets["hadronFlavour"] == nanoaod.HADRON_FLAVOUR_B)[jet_of]
    # Harder jets are narrower; soft constituents spread wider; b jets are a bit broader.
    width = (0.06 + 2.0 / jet_pt) * np.where(is_b, 1.2, 1.0) / np.sqrt(np.clip(share * 8, 0.2, 4.0))
    deta = np.clip(rng.normal(0.0, width), -0.4, 0.4)
    dphi = np.clip(rng.normal(0.0, width), -0.4, 0.4)
    charged = rng.random(len(jet_of)) < 0.65
    charge = np.where(charged, rng.choice(np.array([-1, 1]), len(jet_of)), 0)
    # B-hadron decay products: the charged constituents of b jets carry more of the jet momentum
    # (a hard fragmentation); shares are renormalised, so the jet's pt is unchanged.
    share = np.where(is_b & charged, share * B_CHARGED_HARDENING, share)
    share /= np.bincount(jet_of, weights=share, minlength=len(n_constituents))[jet_of]
    lepton_draw = rng.random(len(jet_of))
    lepton_rate = np.where(is_b, 0.15, 0.04)
    is_electron = charged & (lepton_draw < 0.4 * lepton_rate)
    is_muon = charged & ~is_electron & (lepton_draw < lepton_rate)
    photon = rng.random(len(jet_of)) < 0.6
    pdg_id = np.select([is_electron, is_muon, charged, photon],
                       [-11 * charge, -13 * charge, 211 * charge, np.full_like(charge, 22)], 130)
    mass = np.select([is_electron, is_muon, charged], [_ELECTRON_MASS, _MUON_MASS, _PION_MASS], 0.0)
    fields = {
        "pt": share * jet_pt,
        "eta": jets["eta"].astype(np.float64)[jet_of] + deta,
        "phi": _wrap_phi(jets["phi"].astype(np.float64)[jet_of] + dphi),
        "mass": mass,
        "charge": charge,
        "pdgId": pdg_id,
    }
    return jet_of, fields


def _draw_unclustered(rng: np.random.Generator, n_events: int
                      ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Soft PF candidates outside jets: (event of each candidate, candidate fields)."""
    per_event = rng.poisson(8.0, n_events)
    event_of = np.repeat(np.arange(n_events), per_event)
    n = len(event_of)
    charged = rng.random(n) < 0.6
    charge = np.where(charged, rng.choice(np.array([-1, 1]), n), 0)
    fields = {
        "pt": 0.3 + rng.exponential(1.0, n),
        "eta": rng.uniform(-2.5, 2.5, n),
        "phi": rng.uniform(-math.pi, math.pi, n),
        "mass": np.where(charged, _PION_MASS, 0.0),
        "charge": charge,
        "pdgId": np.where(charged, 211 * charge, 22),
    }
    return event_of, fields


def _pileup_and_met(rng: np.random.Generator, candidates: Mapping[str, np.ndarray],
                    event_of: np.ndarray, unclustered: np.ndarray, n_events: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fromPV, GenMET (px, py), PF MET (px, py))`` of the (shuffled) candidates."""
    n = len(event_of)
    pileup = unclustered & (rng.random(n) < PILEUP_FRACTION)
    response = rng.lognormal(np.log(NEUTRAL_HADRON_RESPONSE), 0.2, n)
    charged = candidates["charge"] != 0
    from_pv = np.where(charged, np.where(pileup, FROM_PV_NONE, FROM_PV_USED_IN_FIT), FROM_PV_LOOSE)
    px = candidates["pt"] * np.cos(candidates["phi"])
    py = candidates["pt"] * np.sin(candidates["phi"])
    true_scale = np.where(pileup, 0.0,
                          np.where(np.abs(candidates["pdgId"]) == 130, 1.0 / response, 1.0))
    gen_met = -np.stack([np.bincount(event_of, weights=px * true_scale, minlength=n_events),
                         np.bincount(event_of, weights=py * true_scale, minlength=n_events)])
    pf_met = -np.stack([np.bincount(event_of, weights=px, minlength=n_events),
                        np.bincount(event_of, weights=py, minlength=n_events)])
    return from_pv, gen_met, pf_met


def _wrap_phi(phi: np.ndarray) -> np.ndarray:
    return (phi + math.pi) % (2 * math.pi) - math.pi


def _typed(fields: Mapping[str, np.ndarray], dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    return {name: np.asarray(fields[name]).astype(dtype) for name, dtype in dtypes.items()}


def generate_events(process: str, n_events: int, seed: int = 0,
                    first_event: int = 1) -> dict[str, np.ndarray | ak.Array]:
    """One file's worth of events of ``process``, as the branches :func:`write_sample` writes.

    Returns event-level numpy columns (``run``, ``luminosityBlock``, ``event``, ``genWeight``,
    ``GenMET_pt/phi``, ``MET_pt/phi``) and jagged awkward records ``Jet``, ``PFCands``,
    ``JetPFCands`` and ``Hit`` (tracker hits, :mod:`coffea_sonic.data.hits`) (uproot writes these as
    ``n<Collection>`` counters and ``<Collection>_<field>`` branches). Jets are sorted by
    descending pt in each event, as in NanoAOD.

    >>> events = generate_events("ttbar", 5, seed=2)
    >>> len(events["Jet"]), events["event"].tolist()
    (5, [1, 2, 3, 4, 5])
    """
    if process not in DATASETS:
        raise ConfigurationError(f"unknown process {process!r}; choose from {list(DATASETS)}")
    if n_events < 0 or first_event < 0:
        raise ConfigurationError(
            f"need n_events >= 0 and first_event >= 0, got {n_events} and {first_event}")
    rng = np.random.default_rng(
        np.random.SeedSequence([seed, DATASETS.index(process), first_event]))
    n_jets, flavour = _jet_flavours_per_event(rng, process, n_events)
    jets = draw_jets(flavour, rng)
    event_of_jet = np.repeat(np.arange(n_events), n_jets)
    by_pt = np.lexsort((-jets["pt"], event_of_jet))
    jets = {name: values[by_pt] for name, values in jets.items()}
    candidates, links, event_of_candidate, shuffled, n_clustered = _candidates_and_links(
        rng, jets, n_jets, event_of_jet, n_events)
    n_candidates = np.bincount(event_of_candidate, minlength=n_events)
    n_links = np.bincount(event_of_jet[links.pop("jet")], minlength=n_events)

    event = np.arange(first_event, first_event + n_events)
    if process == "ttbar":
        gen_weight = np.where(rng.random(n_events) < 0.004, -1.0, 1.0)
    else:
        gen_weight = rng.lognormal(0.0, 0.3, n_events)
    # Drawn last so that every branch above keeps the values of earlier sample versions.
    candidates["fromPV"], gen_met, pf_met = _pileup_and_met(
        rng, candidates, event_of_candidate[shuffled], n_clustered <= shuffled, n_events)
    columns = _typed({"run": np.ones(n_events), "luminosityBlock": 1 + event // 500,
                      "event": event, "genWeight": gen_weight,
                      "GenMET_pt": np.hypot(*gen_met), "GenMET_phi": np.arctan2(gen_met[1], gen_met[0]),
                      "MET_pt": np.hypot(*pf_met), "MET_phi": np.arctan2(pf_met[1], pf_met[0])},
                     nanoaod.EVENT_BRANCH_DTYPES)
    return {
        **columns,
        "Jet": ak.unflatten(ak.zip(_typed(jets, nanoaod.JET_BRANCH_DTYPES)), n_jets),
        "PFCands": ak.unflatten(ak.zip(_typed(candidates, nanoaod.PFCANDS_BRANCH_DTYPES)),
                                n_candidates),
        "JetPFCands": ak.unflatten(ak.zip(_typed(links, nanoaod.JETPFCANDS_BRANCH_DTYPES)),
                                   n_links),
        # tracker hits from their own random stream: the branches above are unchanged by them
        "Hit": hit_collection(n_events, seed, (DATASETS.index(process), first_event)),
    }


def _candidates_and_links(rng: np.random.Generator, jets: dict[str, np.ndarray],
                          n_jets: np.ndarray, event_of_jet: np.ndarray, n_events: int
                          ) -> tuple[dict, dict, np.ndarray, np.ndarray, int]:
    """PF candidates (jets' constituents and unclustered ones, shuffled inside each event) and
    the jet -> candidate links; also each candidate's event before the shuffle, the shuffle, and
    how many candidates are clustered (``links["jet"]``: each link's jet, for the caller)."""
    jet_starts = np.cumsum(n_jets) - n_jets
    jet_of_constituent, clustered = _draw_constituents(rng, jets)
    event_of_unclustered, unclustered = _draw_unclustered(rng, n_events)
    n_clustered = len(jet_of_constituent)
    event_of_candidate = np.concatenate([event_of_jet[jet_of_constituent], event_of_unclustered])
    candidates = {name: np.concatenate([clustered[name], unclustered[name]]) for name in clustered}
    # Shuffle candidates inside each event so the jet links are really needed to find constituents.
    shuffled = np.lexsort((rng.random(len(event_of_candidate)), event_of_candidate))
    new_position = np.empty_like(shuffled)
    new_position[shuffled] = np.arange(len(shuffled))
    candidates = {name: values[shuffled] for name, values in candidates.items()}
    n_candidates = np.bincount(event_of_candidate, minlength=n_events)
    candidate_starts = np.cumsum(n_candidates) - n_candidates
    event_of_link = event_of_jet[jet_of_constituent]
    links = {
        "jetIdx": jet_of_constituent - jet_starts[event_of_link],
        "pFCandsIdx": new_position[:n_clustered] - candidate_starts[event_of_link],
        "jet": jet_of_constituent,
    }
    return candidates, links, event_of_candidate, shuffled, n_clustered


def _write_file(path: Path, events: Mapping[str, np.ndarray | ak.Array]) -> None:
    import uproot

    n_events = len(events["event"])
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with uproot.recreate(scratch) as root_file:
            branch_types = {name: (values.dtype if isinstance(values, np.ndarray)
                                   else values.type.content)
                            for name, values in events.items()}
            tree = root_file.mktree(nanoaod.TREE_NAME, branch_types)
            for start in range(0, n_events, EVENTS_PER_BASKET):
                tree.extend({name: values[start:start + EVENTS_PER_BASKET]
                             for name, values in events.items()})
        os.replace(scratch, path)  # readers never see half a file
    finally:
        scratch.unlink(missing_ok=True)


def write_sample(
    outdir: str | os.PathLike,
    events: int = DEFAULT_EVENTS_PER_DATASET,
    files: int = DEFAULT_FILES_PER_DATASET,
    seed: int = 0,
    datasets: Iterable[str] = DATASETS,
) -> dict[str, list[str]]:
    """Write ``events`` events per dataset, split over ``files`` NanoAOD-like ROOT files each.

    Files are ``<outdir>/<dataset>_<i>.root`` with an ``Events`` tree; the returned coffea fileset
    (dataset -> absolute file paths) is also written to ``<outdir>/fileset.json``. The content is
    a function of (``seed``, dataset, file position) only. A file may hold 0 events when
    ``events < files``.

    >>> import tempfile, uproot
    >>> fileset = write_sample(tempfile.mkdtemp(), events=50, files=2, datasets=["qcd_light"])
    >>> sum(uproot.open(p)["Events"].num_entries for p in fileset["qcd_light"])
    50
    """
    wanted = list(datasets)
    unknown = [name for name in wanted if name not in DATASETS]
    if unknown:
        raise ConfigurationError(f"unknown datasets {unknown}; choose from {list(DATASETS)}")
    if events < 0 or files < 1:
        raise ConfigurationError(
            f"need events >= 0 and files >= 1 per dataset, got events={events}, files={files}")
    directory = Path(outdir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    fileset: dict[str, list[str]] = {}
    for dataset in wanted:
        per_file = [events // files + (1 if index < events % files else 0)
                    for index in range(files)]
        first_event = 1
        paths = []
        for index, n_events in enumerate(per_file):
            path = directory / f"{dataset}_{index}.root"
            content = generate_events(dataset, n_events, seed=seed, first_event=first_event)
            _write_file(path, content)
            logger.info("wrote %s: %d events, %d jets, %d PF candidates", path, n_events,
                        len(ak.flatten(content["Jet"], axis=1)),
                        len(ak.flatten(content["PFCands"], axis=1)))
            paths.append(str(path))
            first_event += n_events
        fileset[dataset] = paths
    fileset_path = directory / "fileset.json"
    fileset_path.write_text(json.dumps(fileset, indent=2) + "\n")
    logger.info("wrote fileset %s", fileset_path)
    return fileset


def dataset_tools_fileset(fileset: Mapping[str, Iterable[str]],
                          treename: str = nanoaod.TREE_NAME) -> dict[str, dict]:
    """The fileset in the form of ``coffea.dataset_tools.preprocess``: dataset -> {"files": ...}.

    >>> dataset_tools_fileset({"ttbar": ["/data/ttbar_0.root"]})
    {'ttbar': {'files': {'/data/ttbar_0.root': 'Events'}}}
    """
    return {dataset: {"files": {str(path): treename for path in paths}}
            for dataset, paths in fileset.items()}
