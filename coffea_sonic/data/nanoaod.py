"""The NanoAOD branches coffea-sonic reads and writes, declared once (NanoAOD v9+, PFNano layout).

The layout, with an example: docs/internals/examples.md, "NanoAOD branches".
"""

from __future__ import annotations

from .hits import HIT_BRANCH_DTYPES

#: Event-level branches (one value per event) and their dtypes.
EVENT_BRANCH_DTYPES: dict[str, str] = {
    "run": "uint32",
    "luminosityBlock": "uint32",
    "event": "uint64",
    "genWeight": "float32",  # absent in collision data
    "GenMET_pt": "float32",  # absent in collision data
    "GenMET_phi": "float32",
    "MET_pt": "float32",  # PF MET: minus the vector sum of all PF candidates
    "MET_phi": "float32",
}

#: ``Jet_<field>`` branches and their dtypes (as in NanoAOD v12).
JET_BRANCH_DTYPES: dict[str, str] = {
    "pt": "float32",
    "eta": "float32",
    "phi": "float32",
    "mass": "float32",
    "btagDeepFlavB": "float32",
    "nConstituents": "uint8",
    "hadronFlavour": "uint8",  # simulation only
    "partonFlavour": "int16",  # simulation only
    "area": "float32",
}

#: ``PFCands_<field>`` branches (PFNano) and their dtypes.
PFCANDS_BRANCH_DTYPES: dict[str, str] = {
    "pt": "float32",
    "eta": "float32",
    "phi": "float32",
    "mass": "float32",
    "charge": "int32",
    "pdgId": "int32",
    "fromPV": "uint8",  # 0 not associated to the primary vertex, 1 loose (all neutrals), 3 used in fit
}

#: ``JetPFCands_<field>`` branches (PFNano jet -> candidate links) and their dtypes.
JETPFCANDS_BRANCH_DTYPES: dict[str, str] = {
    "jetIdx": "int32",
    "pFCandsIdx": "int32",
}

#: Collection name -> its per-object fields and dtypes.
COLLECTIONS: dict[str, dict[str, str]] = {
    "Jet": JET_BRANCH_DTYPES,
    "PFCands": PFCANDS_BRANCH_DTYPES,
    "JetPFCands": JETPFCANDS_BRANCH_DTYPES,
    "Hit": HIT_BRANCH_DTYPES,
}

#: PF-candidate fields :func:`coffea_sonic.columns.jet_constituents` gathers by default.
CONSTITUENT_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass", "charge")

#: ``Jet_hadronFlavour`` values: b, c, and light (udsg or unmatched).
HADRON_FLAVOUR_B, HADRON_FLAVOUR_C, HADRON_FLAVOUR_LIGHT = 5, 4, 0

#: Name of the event tree.
TREE_NAME = "Events"


def branch(collection: str, field: str) -> str:
    """The flat ROOT branch name of ``collection``'s ``field``.

    >>> branch("JetPFCands", "pFCandsIdx")
    'JetPFCands_pFCandsIdx'
    """
    return f"{collection}_{field}"


def counter(collection: str) -> str:
    """The ROOT branch counting ``collection``'s objects per event.

    >>> counter("PFCands")
    'nPFCands'
    """
    return f"n{collection}"


def all_branches() -> list[str]:
    """Every branch a synthetic sample file holds, event-level first.

    >>> "JetPFCands_jetIdx" in all_branches() and "nJetPFCands" in all_branches()
    True
    """
    names = list(EVENT_BRANCH_DTYPES)
    for collection, fields in COLLECTIONS.items():
        names.append(counter(collection))
        names.extend(branch(collection, field) for field in fields)
    return names
