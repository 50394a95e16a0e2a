"""Awkward <-> numpy conversion of analysis columns into model inputs and back.

Models take dense numpy rows; analyses hold jagged awkward columns (events -> jets -> ...). This
module flattens jagged columns into rows, turns outputs back into the jagged structure of the
input (``ak.num(out) == ak.num(in)``), builds per-jet feature matrices and padded constituent
tensors, and follows PFNano jet -> PF-candidate links. Everything is vectorised (no Python loop
over events or jets) and works on

* eager awkward arrays and coffea NanoEvents (virtual or eager mode), and
* the concrete partitions inside ``dask_awkward.map_partitions``. During dask-awkward's
  typetracer (meta) pass the functions *touch* the columns they read, so column projection loads
  them, and return zero-row numpy arrays of the right trailing shape and dtype;
  :func:`unflatten` then gives an output typetracer. Use :func:`is_typetracer` to skip the
  actual inference in that pass.

Missing values (``None``) are refused with :class:`~coffea_sonic.errors.InputValidationError`:
fill them (``ak.fill_none``) or drop them (``ak.drop_none``) first.

>>> import awkward as ak
>>> from coffea_sonic.columns import flatten, unflatten
>>> pt = ak.Array([[40.0, 25.0], [], [60.0]])
>>> rows, counts = flatten(pt)
>>> rows.tolist(), counts.tolist()
([40.0, 25.0, 60.0], [2, 0, 1])
>>> unflatten(rows * 2, counts).tolist()
[[80.0, 50.0], [], [120.0]]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Union

import awkward as ak
import numpy as np

from .errors import InputValidationError
from .zoo.spec import JET_TAGGER_FEATURES, PARTICLENET_FEATURES, PARTICLENET_MAX_CONSTITUENTS

logger = logging.getLogger(__name__)

#: Counts of one jagged level (numpy, per outer entry), of several levels (tuple, outermost
#: first), or an awkward typetracer during dask-awkward's meta pass.
Counts = Union[np.ndarray, tuple[np.ndarray, ...], ak.Array]

#: PF-candidate fields :func:`pad_constituents` and :func:`jet_constituents` need by default.
CONSTITUENT_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass", "charge")
#: Jet fields :func:`pad_constituents` takes the jet axis and energy from.
JET_AXIS_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass")
#: Floor under arguments of logarithms, so empty or zero-momentum entries stay finite.
_LOG_FLOOR = 1e-12

__all__ = [
    "CONSTITUENT_FIELDS", "Counts", "JET_AXIS_FIELDS", "flatten", "is_typetracer",
    "jagged_counts", "jet_constituents", "jet_features", "pad_constituents", "unflatten",
]


def is_typetracer(array: Any) -> bool:
    """True for awkward typetracers, i.e. inside dask-awkward's meta pass (no data to infer on).

    >>> is_typetracer(ak.Array([[1.0]])), is_typetracer(ak.Array([[1.0]]).layout.to_typetracer())
    (False, True)
    """
    if isinstance(array, np.ndarray):
        return False
    try:
        return ak.backend(array) == "typetracer"
    except (TypeError, ValueError):
        return False


def _as_awkward(array: Any, what: str) -> ak.Array:
    if type(array).__module__.split(".")[0] == "dask_awkward":
        raise InputValidationError(
            f"{what} is a lazy dask-awkward array; call this function on each partition with "
            "dask_awkward.map_partitions (it receives concrete arrays there)")
    if isinstance(array, ak.Array):
        return array
    try:
        return ak.Array(ak.to_layout(array))
    except TypeError as exc:
        raise InputValidationError(
            f"{what} must be an awkward array (or convertible), got {type(array).__name__}"
        ) from exc


def _var_depth(layout: ak.contents.Content) -> int:
    """How many variable-length axes the array has right below axis 0 (options looked through)."""
    depth = 0
    while True:
        if layout.is_option or layout.is_indexed:
            layout = layout.content
        elif layout.is_list and not layout.is_regular:
            depth += 1
            layout = layout.content
        else:
            return depth


def _trailing_shape_and_dtype(layout: ak.contents.Content,
                              what: str) -> tuple[tuple[int, ...], np.dtype]:
    """Regular dims and dtype of a flattened (no var axis left) numeric layout."""
    shape: list[int] = []
    while True:
        if layout.is_option or layout.is_indexed:
            layout = layout.content
        elif layout.is_list and layout.is_regular:
            shape.append(layout.size)
            layout = layout.content
        elif layout.is_numpy:
            return tuple(shape) + tuple(layout.inner_shape), np.dtype(layout.dtype)
        else:
            raise InputValidationError(
                f"{what} must hold numbers (with optional fixed-size trailing dims) in its "
                f"innermost lists, got {layout.form.type}; select one numeric field first")


def _to_numpy(array: ak.Array, what: str) -> np.ndarray:
    try:
        return np.asarray(ak.to_numpy(array, allow_missing=False))
    except ValueError as exc:
        raise InputValidationError(
            f"{what} contains missing values (None); fill them with ak.fill_none or drop them "
            "with ak.drop_none before converting") from exc


def _touch(*arrays: Any) -> None:
    for array in arrays:
        ak.typetracer.touch_data(array)


def _flatten_levels(array: ak.Array) -> tuple[ak.Array, list[Any]]:
    """Strip the leading variable-length axes: (flat awkward array, counts per level)."""
    levels = []
    for _ in range(_var_depth(array.layout)):
        levels.append(ak.num(array, axis=1))
        array = ak.flatten(array, axis=1)
    return array, levels


def _levels_to_counts(levels: list[Any], what: str) -> Counts:
    if any(is_typetracer(level) for level in levels):
        return levels[0] if len(levels) == 1 else tuple(levels)
    numpy_levels = tuple(_to_numpy(level, f"the list lengths of {what}").astype(np.int64)
                         for level in levels)
    return numpy_levels[0] if len(numpy_levels) == 1 else numpy_levels


def jagged_counts(array: Any) -> Counts:
    """Counts of every variable-length axis of ``array`` (records allowed), like :func:`flatten`.

    >>> jagged_counts(ak.Array([[{"pt": 1.0}], [], [{"pt": 2.0}, {"pt": 3.0}]])).tolist()
    [1, 0, 2]
    """
    array = _as_awkward(array, "array")
    # Counts come from ak.num alone, so only offsets are read, never the records' fields.
    levels = []
    for depth in range(1, _var_depth(array.layout) + 1):
        level = ak.num(array, axis=depth)
        for _ in range(depth - 1):
            level = ak.flatten(level, axis=1)
        levels.append(level)
    if not levels:
        return ()
    if is_typetracer(array):
        _touch(*levels)
    return _levels_to_counts(levels, "array")


def _n_objects(array: ak.Array) -> int:
    """Number of innermost objects of a jagged (record) array, from its offsets only."""
    depth = _var_depth(array.layout)
    if depth == 0:
        return len(array)
    return int(ak.sum(ak.num(array, axis=depth), axis=None))


def flatten(jagged: Any) -> tuple[np.ndarray, Counts]:
    """Rows of a jagged numeric column and the counts to undo it with :func:`unflatten`.

    Every variable-length axis is flattened; fixed-size trailing dims stay (``[events][jets][3]``
    gives rows ``[n_jets, 3]``). ``counts`` is a numpy array for one jagged level, a tuple of
    them (outermost first) for several, ``()`` for an already flat column.

    >>> rows, counts = flatten(ak.Array([[[1, 2], [3]], [[4]]]))
    >>> rows.tolist(), [c.tolist() for c in counts]
    ([1, 2, 3, 4], [[2, 1], [2, 1, 1]])
    """
    array = _as_awkward(jagged, "the jagged column")
    if ak.fields(array):
        raise InputValidationError(
            f"flatten takes one numeric column, got records with fields {ak.fields(array)}; "
            "select a field (jets.pt) or use jet_features for several")
    flat, levels = _flatten_levels(array)
    if is_typetracer(flat):
        shape, dtype = _trailing_shape_and_dtype(flat.layout, "the jagged column")
        ak.typetracer.touch_data(flat)
        return np.empty((0, *shape), dtype=dtype), _levels_to_counts(levels, "the jagged column")
    _trailing_shape_and_dtype(flat.layout, "the jagged column")  # refuses non-numeric content
    return _to_numpy(flat, "the jagged column"), _levels_to_counts(levels, "the jagged column")


def _typetracer_like(flat_example: np.ndarray, depth: int) -> ak.Array:
    """An output typetracer of unknown length: ``depth`` var axes over ``flat_example``'s rows."""
    empty = ak.from_numpy(flat_example[:0], regulararray=False)
    for _ in range(depth):
        empty = ak.unflatten(empty, np.zeros(0, dtype=np.int64))
    return ak.Array(empty.layout.to_typetracer(forget_length=True))


def _unflatten_one(rows: np.ndarray, counts: Counts, name: str) -> ak.Array:
    levels = list(counts) if isinstance(counts, tuple) else [counts]
    rows = np.asarray(rows)
    if any(is_typetracer(level) for level in levels):
        _touch(*(level for level in levels if is_typetracer(level)))
        return _typetracer_like(rows, len(levels))
    numpy_levels = [np.asarray(level, dtype=np.int64) for level in levels]
    expected = int(numpy_levels[-1].sum()) if numpy_levels else len(rows)
    if len(rows) != expected:
        raise InputValidationError(
            f"output {name!r} has {len(rows)} rows but the counts describe {expected} objects; "
            "pass the counts returned by flatten/jagged_counts for the same input")
    result = ak.from_numpy(rows, regulararray=False)
    for level in reversed(numpy_levels):
        result = ak.unflatten(result, level)
    return result


def unflatten(flat_outputs: np.ndarray | Mapping[str, np.ndarray],
              counts: Counts) -> ak.Array | dict[str, ak.Array]:
    """Give model outputs (rows, or a dict name -> rows) the jagged structure ``counts`` describes.

    Trailing dims are kept: rows ``[n_jets, 3]`` become ``[events][jets][3]``. With a typetracer
    ``counts`` (dask-awkward meta pass) the result is a typetracer of the same type.

    >>> counts = np.array([2, 0, 1])
    >>> probs = np.arange(9, dtype=np.float32).reshape(3, 3)
    >>> out = unflatten({"probs": probs}, counts)
    >>> ak.num(out["probs"]).tolist(), str(out["probs"].type)
    ([2, 0, 1], '3 * var * 3 * float32')
    """
    if isinstance(flat_outputs, Mapping):
        return {name: _unflatten_one(rows, counts, name) for name, rows in flat_outputs.items()}
    return _unflatten_one(flat_outputs, counts, "output")


def _field_rows(objects: ak.Array, field: str, collection: str, defaults: Mapping[str, float],
                n_rows: int | None, dtype: np.dtype | None) -> np.ndarray:
    """One scalar-per-object field as flat rows (cast to ``dtype`` unless None), or its default
    when the field is absent."""
    if field not in ak.fields(objects):
        if field in defaults:
            return np.full(n_rows or 0, defaults[field], dtype=dtype or np.float64)
        available = sorted(ak.fields(objects))
        raise InputValidationError(
            f"{collection} objects have no field {field!r} (NanoAOD branch {collection}_{field}); "
            f"available: {available[:40]}{' ...' if len(available) > 40 else ''}. Pass "
            f"defaults={{{field!r}: <value>}} to fill it with a constant (e.g. for collision data, "
            "which lacks simulation-only branches)")
    flat, _ = _flatten_levels(objects[field])
    shape, native = _trailing_shape_and_dtype(flat.layout, f"{collection} field {field!r}")
    if shape:
        raise InputValidationError(
            f"{collection} field {field!r} has {shape} values per object; expected one number")
    if is_typetracer(flat):
        _touch(flat)
        return np.empty(0, dtype=dtype or native)
    rows = _to_numpy(flat, f"{collection} field {field!r}")
    return rows if dtype is None else rows.astype(dtype, copy=False)


def jet_features(jets: Any, fields: Sequence[str] = JET_TAGGER_FEATURES, *,
                 defaults: Mapping[str, float] | None = None,
                 dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Per-jet feature rows ``[n_jets_total, len(fields)]`` (default: the ``jet_tagger`` input).

    ``jets`` is a jagged record array (``events.Jet``, any nesting; rows follow the flattened
    order, so ``unflatten(outputs, jagged_counts(jets))`` realigns them). A field missing from
    ``jets`` raises :class:`~coffea_sonic.errors.InputValidationError` naming the branch, unless
    ``defaults`` gives it a constant. Integer fields (``nConstituents`` is ``UChar_t``) are cast.

    >>> jets = ak.Array([[{"pt": 50.0, "btagDeepFlavB": 0.9}], []])
    >>> jet_features(jets, ["pt", "btagDeepFlavB", "hadronFlavour"], defaults={"hadronFlavour": 0})
    array([[50. ,  0.9,  0. ]], dtype=float32)
    """
    jets = _as_awkward(jets, "jets")
    defaults = dict(defaults or {})
    dtype = np.dtype(dtype)
    if is_typetracer(jets):
        for name in fields:
            _field_rows(jets, name, "Jet", defaults, 0, dtype)
        return np.empty((0, len(fields)), dtype=dtype)
    n_rows = _n_objects(jets) if any(name not in ak.fields(jets) for name in fields) else None
    columns = [_field_rows(jets, name, "Jet", defaults, n_rows, dtype) for name in fields]
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise InputValidationError(
            f"jet fields {list(fields)} have different numbers of entries {sorted(lengths)}; "
            "they must come from the same jet collection")
    rows = np.empty((lengths.pop() if lengths else 0, len(fields)), dtype=dtype)
    for index, column in enumerate(columns):
        rows[:, index] = column
    return rows


def _wrap_phi(phi: np.ndarray) -> np.ndarray:
    return (phi + math.pi) % (2 * math.pi) - math.pi


def _energy(pt: np.ndarray, eta: np.ndarray, mass: np.ndarray) -> np.ndarray:
    momentum = pt * np.cosh(eta)
    return np.sqrt(momentum * momentum + mass * mass)


def _safe_log(values: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(values, _LOG_FLOOR))


def _empty_particlenet_inputs(n_jets: int, size: int) -> dict[str, np.ndarray]:
    return {
        "pf_points": np.zeros((n_jets, 2, size), dtype=np.float32),
        "pf_features": np.zeros((n_jets, len(PARTICLENET_FEATURES), size), dtype=np.float32),
        "pf_mask": np.zeros((n_jets, 1, size), dtype=np.float32),
    }


def pad_constituents(constituents: Any, jets: Any = None, *,
                     max_constituents: int = PARTICLENET_MAX_CONSTITUENTS,
                     defaults: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """``particlenet_lite`` inputs per jet from its constituents: points, features, mask.

    ``constituents`` is jagged ``[..., jets][constituents]`` with fields ``pt, eta, phi, mass,
    charge`` (e.g. from :func:`jet_constituents`); ``jets``, if given, is ``[..., jets]`` with
    ``pt, eta, phi, mass`` and supplies the jet axis and energy, else the constituents' four-vector
    sum does. Returns float32 ``pf_points [N, 2, P]`` (deta, dphi), ``pf_features [N, 7, P]`` in
    :data:`~coffea_sonic.zoo.spec.PARTICLENET_FEATURES` order (log_pt, log_e, log_pt_rel,
    log_e_rel, deta, dphi, charge) and ``pf_mask [N, 1, P]``, with ``N`` jets in flattened order
    and ``P = max_constituents``. Jets with more constituents keep their ``P`` highest-pt ones
    (constituents are sorted by descending pt); shorter jets are zero-padded with mask 0.
    ``deta = eta - jet_eta`` and ``dphi`` is wrapped into [-pi, pi).

    >>> jet = [[{"pt": 30.0, "eta": 0.1, "phi": 0.0, "mass": 0.1, "charge": 1},
    ...         {"pt": 10.0, "eta": -0.1, "phi": 0.2, "mass": 0.0, "charge": 0}]]
    >>> inputs = pad_constituents(ak.Array([jet]))  # one event with one two-constituent jet
    >>> inputs["pf_features"].shape, inputs["pf_mask"][0, 0, :3].tolist()
    ((1, 7, 32), [1.0, 1.0, 0.0])
    """
    if max_constituents < 1:
        raise InputValidationError(f"max_constituents must be >= 1, got {max_constituents}")
    constituents = _as_awkward(constituents, "constituents")
    defaults = dict(defaults or {})
    depth = _var_depth(constituents.layout)
    if depth < 1:
        raise InputValidationError(
            "constituents must be jagged per jet ([jets][constituents] or "
            f"[events][jets][constituents]), got type {constituents.type}")
    typetracer = is_typetracer(constituents) or (jets is not None and is_typetracer(jets))
    # Per-jet lists: flatten every jagged level above the constituent axis.
    per_jet = constituents
    for _ in range(depth - 1):
        per_jet = ak.flatten(per_jet, axis=1)
    candidate_counts = ak.num(per_jet, axis=1)
    n_rows = (_n_objects(per_jet) if not typetracer
              and any(name not in ak.fields(per_jet) for name in CONSTITUENT_FIELDS) else None)
    columns = {name: _field_rows(per_jet, name, "PFCands", defaults, n_rows,
                                 np.dtype(np.float64)) for name in CONSTITUENT_FIELDS}
    jet_columns = None
    if jets is not None:
        jets = _as_awkward(jets, "jets")
        jet_columns = {name: _field_rows(jets, name, "Jet", {}, None,
                                         np.dtype(np.float64)) for name in JET_AXIS_FIELDS}
    if typetracer:
        _touch(candidate_counts)
        return _empty_particlenet_inputs(0, max_constituents)

    counts = _to_numpy(candidate_counts, "constituent counts").astype(np.int64)
    n_jets = len(counts)
    if jet_columns is not None and len(jet_columns["pt"]) != n_jets:
        raise InputValidationError(
            f"jets has {len(jet_columns['pt'])} jets but constituents are grouped into {n_jets} "
            "jets; pass the jets the constituents were taken from")
    jet_of = np.repeat(np.arange(n_jets), counts)
    order = np.lexsort((-columns["pt"], jet_of))
    jet_of = jet_of[order]
    columns = {name: values[order] for name, values in columns.items()}
    position = np.arange(len(jet_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    kept = position < max_constituents
    jet_of, position = jet_of[kept], position[kept]
    pt, eta, phi, mass, charge = (columns[name][kept] for name in CONSTITUENT_FIELDS)
    energy = _energy(pt, eta, mass)

    if jet_columns is not None:
        jet_pt, jet_eta, jet_phi = jet_columns["pt"], jet_columns["eta"], jet_columns["phi"]
        jet_energy = _energy(jet_pt, jet_eta, jet_columns["mass"])
    else:
        # The axis comes from all constituents, before truncation, like a clustered jet's.
        all_pt, all_eta, all_phi = columns["pt"], columns["eta"], columns["phi"]
        all_jets = np.repeat(np.arange(n_jets), counts)
        px = np.bincount(all_jets, weights=all_pt * np.cos(all_phi), minlength=n_jets)
        py = np.bincount(all_jets, weights=all_pt * np.sin(all_phi), minlength=n_jets)
        pz = np.bincount(all_jets, weights=all_pt * np.sinh(all_eta), minlength=n_jets)
        jet_energy = np.bincount(all_jets, weights=_energy(all_pt, all_eta, columns["mass"]),
                                 minlength=n_jets)
        jet_pt = np.hypot(px, py)
        jet_eta = np.arcsinh(pz / np.maximum(jet_pt, _LOG_FLOOR))
        jet_phi = np.arctan2(py, px)

    deta = eta - jet_eta[jet_of]
    dphi = _wrap_phi(phi - jet_phi[jet_of])
    per_constituent = np.stack([
        _safe_log(pt), _safe_log(energy),
        _safe_log(pt / np.maximum(jet_pt[jet_of], _LOG_FLOOR)),
        _safe_log(energy / np.maximum(jet_energy[jet_of], _LOG_FLOOR)),
        deta, dphi, charge,
    ])
    inputs = _empty_particlenet_inputs(n_jets, max_constituents)
    inputs["pf_features"][jet_of, :, position] = per_constituent.T
    inputs["pf_points"][jet_of, :, position] = np.stack([deta, dphi]).T
    inputs["pf_mask"][jet_of, 0, position] = 1.0
    return inputs


def _collection(events: ak.Array, name: str) -> ak.Array:
    if name not in ak.fields(events):
        raise InputValidationError(
            f"events have no {name!r} collection (NanoAOD branches n{name}, {name}_*); jet "
            "constituents need the PFNano layout with Jet, PFCands and JetPFCands")
    return events[name]


def jet_constituents(events: Any, fields: Sequence[str] = CONSTITUENT_FIELDS, *,
                     jets: str = "Jet", candidates: str = "PFCands",
                     links: str = "JetPFCands") -> ak.Array:
    """Each jet's PF candidates as ``[events][jets][constituents]`` records of ``fields``.

    Follows the PFNano links: ``JetPFCands_jetIdx`` (jet in its event) and
    ``JetPFCands_pFCandsIdx`` (candidate in its event). Links may come in any order; jets without
    links get no constituents; out-of-range indices raise
    :class:`~coffea_sonic.errors.InputValidationError`. Works with any schema (only local indices
    are used) and on plain awkward records holding the three collections.

    >>> events = ak.Array([{
    ...     "Jet": [{"pt": 40.0}, {"pt": 20.0}],
    ...     "PFCands": [{"pt": 5.0}, {"pt": 30.0}, {"pt": 15.0}],
    ...     "JetPFCands": [{"jetIdx": 0, "pFCandsIdx": 1}, {"jetIdx": 1, "pFCandsIdx": 2},
    ...                    {"jetIdx": 0, "pFCandsIdx": 0}]}])
    >>> jet_constituents(events, ["pt"]).pt.tolist()
    [[[30.0, 5.0], [15.0]]]
    """
    events = _as_awkward(events, "events")
    jet_collection = _collection(events, jets)
    candidate_collection = _collection(events, candidates)
    link_collection = _collection(events, links)
    for field in ("jetIdx", "pFCandsIdx"):
        if field not in ak.fields(link_collection):
            raise InputValidationError(
                f"{links} has no field {field!r} (branch {links}_{field}); "
                f"available: {sorted(ak.fields(link_collection))}")
    jets_per_event = ak.num(jet_collection, axis=1)
    candidates_per_event = ak.num(candidate_collection, axis=1)
    links_per_event = ak.num(link_collection, axis=1)
    int64 = np.dtype(np.int64)
    jet_index = _field_rows(link_collection, "jetIdx", links, {}, None, int64)
    candidate_index = _field_rows(link_collection, "pFCandsIdx", links, {}, None, int64)
    candidate_columns = {name: _field_rows(candidate_collection, name, candidates, {},
                                           None, None) for name in fields}
    if is_typetracer(events):
        _touch(jets_per_event, candidates_per_event, links_per_event)
        empty = ak.zip({name: column[:0] for name, column in candidate_columns.items()})
        return _typetracer_like_records(empty, depth=2)

    n_jets = _to_numpy(jets_per_event, f"n{jets}").astype(np.int64)
    n_candidates = _to_numpy(candidates_per_event, f"n{candidates}").astype(np.int64)
    n_links = _to_numpy(links_per_event, f"n{links}").astype(np.int64)
    event_of_link = np.repeat(np.arange(len(n_links)), n_links)
    _check_local_index(jet_index, n_jets[event_of_link], f"{links}_jetIdx", f"n{jets}",
                       event_of_link)
    _check_local_index(candidate_index, n_candidates[event_of_link], f"{links}_pFCandsIdx",
                       f"n{candidates}", event_of_link)
    global_jet = jet_index + (np.cumsum(n_jets) - n_jets)[event_of_link]
    global_candidate = candidate_index + (np.cumsum(n_candidates) - n_candidates)[event_of_link]
    if np.any(np.diff(global_jet) < 0):  # PFNano writes links jet by jet; others might not
        by_jet = np.argsort(global_jet, kind="stable")
        global_jet, global_candidate = global_jet[by_jet], global_candidate[by_jet]
    per_jet = np.bincount(global_jet, minlength=int(n_jets.sum()))
    flat = ak.zip({name: column[global_candidate] for name, column in candidate_columns.items()})
    return ak.unflatten(ak.unflatten(flat, per_jet), n_jets)


def _typetracer_like_records(flat_records: ak.Array, depth: int) -> ak.Array:
    empty = flat_records
    for _ in range(depth):
        empty = ak.unflatten(empty, np.zeros(0, dtype=np.int64))
    return ak.Array(empty.layout.to_typetracer(forget_length=True))


def _check_local_index(index: np.ndarray, size: np.ndarray, branch: str, counter: str,
                       event_of: np.ndarray) -> None:
    bad = (index < 0) | (index >= size)
    if np.any(bad):
        first = int(np.argmax(bad))
        raise InputValidationError(
            f"{branch} = {int(index[first])} is out of range in event {int(event_of[first])} "
            f"of this chunk, which has {counter} = {int(size[first])}; {np.count_nonzero(bad)} "
            "links are invalid. Is the file PFNano-formatted and unskimmed?")
