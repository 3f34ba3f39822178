"""What a normalize job decides for each row, and the options it decides with.

Decisions (see README): the best candidate (``resolve``'s first match) is *matched* when its label is
not ``not_match`` and its probability is at least ``min_probability``; *ambiguous* when its label is not
``not_match`` but its probability is under ``min_probability``, or the runner-up's relevance (P(exact) +
½·P(partial)) is within ``margin`` of the best's, or above it; *unmatched* when it is labelled ``not_match``
(or there is no candidate). So the status never contradicts the label: matched and ambiguous rows are labelled
a match, unmatched rows not. Rows that fail validation are *rejected* with the reason.

The ``DEFAULT_*`` constants are the options' defaults for the Python API and the CLI alike.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from mgeo_index import settings
from mgeo_index.catalog.coordinates import coordinate, coordinate_names

STATUSES = ("matched", "ambiguous", "unmatched", "rejected")
#: the input address's standardized admin levels (mgeo_index.text.parser), inferred levels included
ADMIN_COLUMNS = tuple(f"admin_{level}{suffix}" for level in ("province", "city", "district") for suffix in ("", "_code"))
RESULT_COLUMNS = ("status", "match_id", "match_address", "label", "probability", "alternatives", "reason") + ADMIN_COLUMNS
#: with ``explain``, a last column: the best candidate's comparison, element by element, with both values (JSON)
EXPLAIN_COLUMN = "explain"
MATCH_PREFIX = "match_"  # + a catalog column (--catalog-columns): the matched entry's value
#: with ``coordinates``: where the row's place is, and how precisely (entry, town, district, city, province)
COORDINATE_COLUMNS = ("lon", "lat", "coordinates_precision")
DEFAULT_MIN_PROBABILITY = 0.5
#: ambiguous when the runner-up's relevance (P(exact) + ½·P(partial)) is within this of the best's
DEFAULT_MARGIN = 0.1
DEFAULT_TOP_K = settings.DEFAULT_TOP_K
DEFAULT_CHUNK_SIZE = 8192
DEFAULT_BATCH_SIZE = 1024
ALTERNATIVES = 3


class JobError(Exception):
    """A job cannot start or resume as asked (changed input/index/model, already running, …)."""


@dataclass(frozen=True)
class Policy:
    min_probability: float = DEFAULT_MIN_PROBABILITY
    margin: float = DEFAULT_MARGIN
    top_k: int = DEFAULT_TOP_K
    numbers: str | None = None  # strict / loose (mgeo_index.model.numbers); None: the resolver's
    explain: bool = False  # add EXPLAIN_COLUMN
    catalog_columns: tuple[str, ...] = ()  # the matched entry's catalog columns to add, as match_<column>
    coordinates: bool = False  # add COORDINATE_COLUMNS
    coordinate_columns: tuple = (None, None)  # the catalog's (longitude, latitude) columns when build named them


def result_columns(explain: bool = False, catalog_columns: Sequence[str] = (), coordinates: bool = False
                   ) -> tuple[str, ...]:
    """The columns a job adds to each input row: :data:`RESULT_COLUMNS`, ``match_<column>`` for each of
    ``catalog_columns``, :data:`COORDINATE_COLUMNS` with ``coordinates``, then :data:`EXPLAIN_COLUMN` with
    ``explain``."""
    return (RESULT_COLUMNS + tuple(MATCH_PREFIX + c for c in catalog_columns) + (COORDINATE_COLUMNS if coordinates else ())
            + ((EXPLAIN_COLUMN,) if explain else ()))


def coordinates_of(outcome: dict, best: dict | None, parsed: dict, policy: Policy) -> dict[str, Any]:
    """:data:`COORDINATE_COLUMNS` of a resolved row: the matched entry's own coordinates (precision ``entry``) when
    the row is matched and the catalog gives them (in the columns ``build`` named, else those named so,
    :mod:`mgeo_index.catalog.coordinates`); else the centre of the deepest admin level the row's address
    resolves to that has one (precision ``town`` … ``province``, as ``parse`` gives it); else none (all "")."""
    if outcome["status"] == "matched" and best is not None:
        fields = best.get("fields") or {}
        lon_name, lat_name = coordinate_names(list(fields)) if not any(policy.coordinate_columns) \
            else policy.coordinate_columns
        try:
            lon = coordinate(fields.get(lon_name), -180, 180) if lon_name else None
            lat = coordinate(fields.get(lat_name), -90, 90) if lat_name else None
        except ValueError:  # a catalog built before coordinates were checked
            lon = lat = None
        if lon is not None and lat is not None:
            return {"lon": lon, "lat": lat, "coordinates_precision": "entry"}
    admin = parsed["admin"]
    if admin.get("lon") is not None and admin.get("lat") is not None:
        return {"lon": admin["lon"], "lat": admin["lat"], "coordinates_precision": admin.get("coordinates_level") or ""}
    return {"lon": "", "lat": "", "coordinates_precision": ""}


def choose_catalog_columns(wanted: str | Sequence[str] | None, available: Sequence[str]) -> tuple[str, ...]:
    """The catalog columns a job adds (``--catalog-columns``): ``"all"``, names (a list or comma-separated), or
    none; a name the catalog does not have is refused, naming those it has."""
    if not wanted:
        return ()
    names = [c.strip() for c in wanted.split(",")] if isinstance(wanted, str) else [str(c).strip() for c in wanted]
    if names == ["all"]:
        return tuple(available)
    unknown = [c for c in names if c not in available]
    if unknown or not all(names):
        raise JobError(f"--catalog-columns: {', '.join(map(repr, unknown)) or 'an empty name'} is not a column of the "
                       f"catalog; it has {', '.join(map(repr, available)) or 'no columns but its address and id'} "
                       "(or give all)")
    return tuple(dict.fromkeys(names))


def relevance(match: dict) -> float:
    """Expected relevance for the ambiguity margin: P(exact) + ½·P(partial) (retrieval score without a reranker)."""
    p = match.get("probabilities")
    if not p:
        return float(match.get("score") or 0.0)
    return float(p.get("exact_match", 0.0)) + 0.5 * float(p.get("partial_match", 0.0))


def admin_columns(parsed: dict | None) -> dict[str, str]:
    """The ``admin_*`` columns of a row from its address's :func:`~mgeo_index.text.parser.parse` ("" where a
    level is unknown; all "" for None: a rejected row)."""
    admin = parsed["admin"] if parsed is not None else {}
    return {column: admin.get(column.removeprefix("admin_")) or "" for column in ADMIN_COLUMNS}


def rejected(reason: str) -> dict[str, Any]:
    """The output fields of a row that failed validation."""
    return {"status": "rejected", "match_id": "", "match_address": "", "label": "", "probability": None,
            "alternatives": "", "reason": reason, **admin_columns(None)}


def _public_id(match: dict) -> str:
    return str(match["source_id"]) if match.get("source_id") not in (None, "") else str(match["id"])


def decide(matches: Sequence[dict], policy: Policy) -> dict[str, Any]:
    """The output fields of one resolved row from its ranked matches (best first); a field a row has no value for
    (a ``match_<column>`` of a row tied to no entry, the explanation of a row without candidates) is absent, written
    empty."""
    alternatives = [
        {
            "id": _public_id(m),
            "entry_id": m["id"],
            "address": m["address"],
            **({"name": m["name"]} if m.get("name") else {}),  # an index built with --name-column
            "label": m.get("label"),
            "probability": m.get("probability"),
            "score": m.get("score"),
        }
        for m in matches[:ALTERNATIVES]
    ]
    out: dict[str, Any] = {
        "status": "unmatched", "match_id": "", "match_address": "", "label": "", "probability": None,
        "alternatives": json.dumps(alternatives, ensure_ascii=False), "reason": "",
    }
    if not matches:
        return out
    best = matches[0]
    if "explain" in best:  # the API's objects: {element: {state, query, candidate, text}}
        out[EXPLAIN_COLUMN] = json.dumps(best["explain"], ensure_ascii=False)
    out["label"] = best.get("label", "")
    out["probability"] = best.get("probability")
    if best.get("label") == "not_match":
        return out
    unsure = (best.get("probability") or 0.0) < policy.min_probability
    close = len(matches) > 1 and relevance(best) - relevance(matches[1]) < policy.margin
    out.update(status="ambiguous" if unsure or close else "matched", match_id=_public_id(best),
               match_address=best["address"])
    for column in policy.catalog_columns:
        out[MATCH_PREFIX + column] = (best.get("fields") or {}).get(column, "")
    return out


# Answers a job keeps for repeated addresses (each about 1 KB): order files repeat a store's address many times.
MEMO_LIMIT = 100_000


def resolve_outcomes(resolver, addresses: Sequence[str], policy: Policy, batch_size: int = DEFAULT_BATCH_SIZE,
                     memo: dict[str, dict] | None = None, names: Sequence[str] | None = None) -> list[dict]:
    """``decide`` and the ``admin_*`` columns for each address (``names``: each row's place name, "" where it has
    none, for inputs kept as name + address). Each distinct query (:func:`~mgeo_index.text.query_key`) is parsed and resolved once,
    in micro-batches of ``batch_size`` (its one parse serves both), and its answer given to every row that has it;
    ``memo`` (kept by the job's resolving task for a whole job) carries answers to later chunks. Results do not depend on what
    an address is batched with (the default backend is batch-independent), so the same rows get the same answers
    either way."""
    from mgeo_index.text import model_text, query_key, with_name
    from mgeo_index.text.parser import parse

    memo = {} if memo is None else memo
    names = [n or "" for n in names] if names is not None else [""] * len(addresses)
    keys = [query_key(a, n) for a, n in zip(addresses, names)]
    todo = list({k: (a, n) for k, a, n in zip(keys, addresses, names) if k not in memo}.items())
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        texts = [model_text(with_name(a, n)) for _, (a, n) in batch]  # as the resolver reads them
        parses = parse(texts)
        answers = resolver.resolve(texts, top_k=policy.top_k, rerank=True, parses=parses, numbers=policy.numbers,
                                   names=[n for _, (_, n) in batch], explain=policy.explain)
        for (key, _), matches, parsed in zip(batch, answers, parses):
            outcome = decide(matches, policy) | admin_columns(parsed)
            if policy.coordinates:
                outcome |= coordinates_of(outcome, matches[0] if matches else None, parsed, policy)
            memo[key] = outcome
    out = [dict(memo[k]) for k in keys]
    forget_oldest(memo)
    return out


def forget_oldest(memo: dict[str, dict], keep: Collection[str] = ()) -> None:
    """Keep ``memo`` to ``MEMO_LIMIT`` answers: the oldest go first (dicts keep insertion order), none in
    ``keep``."""
    if len(memo) > MEMO_LIMIT:
        for key in [k for k in memo if k not in keep][: len(memo) - MEMO_LIMIT]:
            del memo[key]
