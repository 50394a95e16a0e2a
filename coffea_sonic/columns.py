"""Awkward <-> numpy conversion of analysis columns into model inputs and back.

Eager arrays, NanoEvents and dask-awkward partitions alike: docs/internals/client.md; examples
in docs/user/processor.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Union

import awkward as ak
import numpy as np

from .errors import InputValidationError

logger = logging.getLogger(__name__)

#: Counts of one jagged level (numpy, per outer entry), of several levels (tuple, outermost
#: first), or an awkward typetracer during dask-awkward's meta pass.
Counts = Union[np.ndarray, tuple[np.ndarray, ...], ak.Array]

#: PF-candidate fields :func:`jet_constituents` reads by default (four-vector and charge).
CONSTITUENT_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass", "charge")
#: Jet fields :func:`jet_features` reads by default: four-vector, DeepFlavour b-tag score and
#: constituent count, in the order the zoo's ``jet_tagger`` reads them
#: (``coffea_sonic.zoo.spec.JET_TAGGER_FEATURES``; tests/test_house_rules.py keeps them equal).
DEFAULT_JET_FIELDS: tuple[str, ...] = ("pt", "eta", "phi", "mass", "btagDeepFlavB",
                                       "nConstituents")

__all__ = [
    "CONSTITUENT_FIELDS", "Counts", "DEFAULT_JET_FIELDS", "flatten", "is_typetracer",
    "jagged_counts", "jet_constituents", "jet_features", "unflatten",
    # building blocks of column recipes (the zoo's model inputs, your own)
    "as_awkward", "field_rows", "n_objects", "to_numpy", "touch", "var_depth",
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


def as_awkward(array: Any, what: str) -> ak.Array:
    """``array`` as an awkward array (``what`` names it in the error if it cannot be one).

    >>> as_awkward([[1, 2], []], "counts").tolist()
    [[1, 2], []]
    """
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


def var_depth(layout: ak.contents.Content) -> int:
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


def to_numpy(array: ak.Array, what: str) -> np.ndarray:
    """A flat awkward array's values as numpy; missing values raise, naming ``what``."""
    try:
        return np.asarray(ak.to_numpy(array, allow_missing=False))
    except ValueError as exc:
        raise InputValidationError(
            f"{what} contains missing values (None); fill them with ak.fill_none or drop them "
            "with ak.drop_none before converting") from exc


def touch(*arrays: Any) -> None:
    """Mark typetracer ``arrays`` as read, so dask-awkward's column projection loads them."""
    for array in arrays:
        ak.typetracer.touch_data(array)


def _flatten_levels(array: ak.Array) -> tuple[ak.Array, list[Any]]:
    """Strip the leading variable-length axes: (flat awkward array, counts per level)."""
    levels = []
    for _ in range(var_depth(array.layout)):
        levels.append(ak.num(array, axis=1))
        array = ak.flatten(array, axis=1)
    return array, levels


def _levels_to_counts(levels: list[Any], what: str) -> Counts:
    if any(is_typetracer(level) for level in levels):
        return levels[0] if len(levels) == 1 else tuple(levels)
    numpy_levels = tuple(to_numpy(level, f"the list lengths of {what}").astype(np.int64)
                         for level in levels)
    return numpy_levels[0] if len(numpy_levels) == 1 else numpy_levels


def jagged_counts(array: Any) -> Counts:
    """Counts of every variable-length axis of ``array`` (records allowed), like :func:`flatten`.

    >>> jagged_counts(ak.Array([[{"pt": 1.0}], [], [{"pt": 2.0}, {"pt": 3.0}]])).tolist()
    [1, 0, 2]
    """
    array = as_awkward(array, "array")
    # Counts come from ak.num alone, so only offsets are read, never the records' fields.
    levels = []
    for depth in range(1, var_depth(array.layout) + 1):
        level = ak.num(array, axis=depth)
        for _ in range(depth - 1):
            level = ak.flatten(level, axis=1)
        levels.append(level)
    if not levels:
        return ()
    if is_typetracer(array):
        touch(*levels)
    return _levels_to_counts(levels, "array")


def n_objects(array: ak.Array) -> int:
    """Number of innermost objects of a jagged (record) array, from its offsets only."""
    depth = var_depth(array.layout)
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
    array = as_awkward(jagged, "the jagged column")
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
    return to_numpy(flat, "the jagged column"), _levels_to_counts(levels, "the jagged column")


def _unflatten_one(rows: np.ndarray, counts: Counts, name: str) -> ak.Array:
    levels = list(counts) if isinstance(counts, tuple) else [counts]
    rows = np.asarray(rows)
    if any(is_typetracer(level) for level in levels):
        touch(*(level for level in levels if is_typetracer(level)))
        return _typetracer_like(ak.from_numpy(rows[:0], regulararray=False), len(levels))
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


def field_rows(objects: ak.Array, field: str, collection: str, defaults: Mapping[str, float],
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
        touch(flat)
        return np.empty(0, dtype=dtype or native)
    rows = to_numpy(flat, f"{collection} field {field!r}")
    return rows if dtype is None else rows.astype(dtype, copy=False)


def jet_features(jets: Any, fields: Sequence[str] = DEFAULT_JET_FIELDS, *,
                 defaults: Mapping[str, float] | None = None,
                 dtype: np.dtype | type = np.float32) -> np.ndarray:
    """Per-jet feature rows ``[n_jets_total, len(fields)]`` (default :data:`DEFAULT_JET_FIELDS`:
    the zoo's ``jet_tagger`` input).

    ``jets`` is a jagged record array (``events.Jet``, any nesting; rows follow the flattened
    order, so ``unflatten(outputs, jagged_counts(jets))`` realigns them). A field missing from
    ``jets`` raises :class:`~coffea_sonic.errors.InputValidationError` naming the branch, unless
    ``defaults`` gives it a constant. Integer fields (``nConstituents`` is ``UChar_t``) are cast.

    >>> jets = ak.Array([[{"pt": 50.0, "btagDeepFlavB": 0.9}], []])
    >>> jet_features(jets, ["pt", "btagDeepFlavB", "hadronFlavour"], defaults={"hadronFlavour": 0})
    array([[50. ,  0.9,  0. ]], dtype=float32)
    """
    jets = as_awkward(jets, "jets")
    defaults = dict(defaults or {})
    dtype = np.dtype(dtype)
    if is_typetracer(jets):
        for name in fields:
            field_rows(jets, name, "Jet", defaults, 0, dtype)
        return np.empty((0, len(fields)), dtype=dtype)
    n_rows = n_objects(jets) if any(name not in ak.fields(jets) for name in fields) else None
    columns = [field_rows(jets, name, "Jet", defaults, n_rows, dtype) for name in fields]
    lengths = {len(column) for column in columns}
    if len(lengths) > 1:
        raise InputValidationError(
            f"jet fields {list(fields)} have different numbers of entries {sorted(lengths)}; "
            "they must come from the same jet collection")
    rows = np.empty((lengths.pop() if lengths else 0, len(fields)), dtype=dtype)
    for index, column in enumerate(columns):
        rows[:, index] = column
    return rows


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
    events = as_awkward(events, "events")
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
    jet_index = field_rows(link_collection, "jetIdx", links, {}, None, int64)
    candidate_index = field_rows(link_collection, "pFCandsIdx", links, {}, None, int64)
    candidate_columns = {name: field_rows(candidate_collection, name, candidates, {},
                                           None, None) for name in fields}
    if is_typetracer(events):
        touch(jets_per_event, candidates_per_event, links_per_event)
        empty = ak.zip({name: column[:0] for name, column in candidate_columns.items()})
        return _typetracer_like(empty, depth=2)

    n_jets = to_numpy(jets_per_event, f"n{jets}").astype(np.int64)
    n_candidates = to_numpy(candidates_per_event, f"n{candidates}").astype(np.int64)
    n_links = to_numpy(links_per_event, f"n{links}").astype(np.int64)
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


def _typetracer_like(empty: ak.Array, depth: int) -> ak.Array:
    """An output typetracer of unknown length: ``depth`` var axes over ``empty``'s rows."""
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
