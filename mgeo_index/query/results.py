"""Typed results of the public API (:mod:`mgeo_index.api`): what ``resolve``, ``match`` and ``parse``
return. Each has ``to_dict()`` giving exactly the JSON the CLI (``--json``) and the service answer with,
and ``from_dict()`` reading it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Match:
    """One catalog entry proposed for a query, best first in a ranked list.

    ``id`` is the store's entry id (FAISS id), ``source_id`` the catalog's own id column (or None),
    ``score`` the dense cosine of query and entry (None where the index cannot reconstruct vectors).
    A reranked match has ``label`` (``exact_match`` / ``partial_match`` / ``not_match``, the calibrated
    decision), ``probability`` (of that label) and ``probabilities`` (all three); an explained one has
    ``explain`` ({element: {"state": agree | differ | only_a | only_b, "a": …, "b": …}}). ``source`` is
    ``"confirmed"`` for an entry a reviewer confirmed as this query's place (``mgeo-index review``), else None.
    ``name`` is the entry's name, from an index built with ``--name-column`` (None otherwise, or where its cell is
    empty); ``fields`` the entry's other catalog columns, as the catalog wrote them (``{"lon": "114.05", "category":
    "餐饮"}``: every column but the address and id ones).
    """

    id: int
    address: str
    source_id: str | None = None
    score: float | None = None
    label: str | None = None
    probability: float | None = None
    probabilities: dict[str, float] | None = None
    explain: dict[str, dict] | None = None
    source: str | None = None
    name: str | None = None
    fields: dict[str, str] | None = None

    @property
    def reranked(self) -> bool:
        return self.label is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "source_id": self.source_id, "address": self.address, "score": self.score}
        if self.name is not None:
            out["name"] = self.name
        if self.fields is not None:
            out["fields"] = dict(self.fields)
        if self.label is not None:
            out.update(label=self.label, probability=self.probability, probabilities=dict(self.probabilities or {}))
        if self.explain is not None:
            out["explain"] = self.explain
        if self.source is not None:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Match":
        return cls(id=int(data["id"]), address=data["address"], source_id=data.get("source_id"), score=data.get("score"),
                   label=data.get("label"), probability=data.get("probability"),
                   probabilities=data.get("probabilities"), explain=data.get("explain"), source=data.get("source"),
                   name=data.get("name"), fields=data.get("fields"))


@dataclass(frozen=True)
class MatchResult:
    """A scored address pair: the cross-encoder's calibrated decision and probabilities."""

    a: str
    b: str
    label: str
    probability: float
    probabilities: dict[str, float]
    explain: dict[str, dict] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": self.a, "b": self.b, "label": self.label, "probability": self.probability,
                               "probabilities": dict(self.probabilities)}
        if self.explain is not None:
            out["explain"] = self.explain
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MatchResult":
        return cls(a=data["a"], b=data["b"], label=data["label"], probability=data["probability"],
                   probabilities=data["probabilities"], explain=data.get("explain"))


@dataclass(frozen=True)
class Element:
    """One tagged span of a parsed address: ``text[start:end]`` of the normalized text."""

    label: str
    text: str
    start: int
    end: int
    display: str | None = None  # the span with the letters as the input wrote them, when that is not ``text``

    def to_dict(self) -> dict[str, Any]:
        out = {"label": self.label, "text": self.text, "start": self.start, "end": self.end}
        return out | ({"display": self.display} if self.display is not None else {})


@dataclass(frozen=True)
class Parse:
    """An address split into elements, with province / city / district / town standardized.

    ``input`` is the text given, ``text`` its normalized form (element spans index into it), ``admin``
    the standardized levels with official codes (``province``, ``province_code``, … ``town_code``,
    ``inferred``, ``ambiguous``; ``lon`` / ``lat`` of the deepest level with a known centre, which
    ``coordinates_level`` names — see ``mgeo-index parse --json``). An element's ``display`` is its span with the
    letters as the input wrote them (B栋), when that is not ``text`` (b栋).
    """

    input: str
    text: str
    elements: tuple[Element, ...] = field(default_factory=tuple)
    admin: dict[str, Any] = field(default_factory=dict)

    def get(self, label: str) -> list[str]:
        """The texts of the elements with this label (``road``, ``poi``, ``roadno``…), in order."""
        return [e.text for e in self.elements if e.label == label]

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "text": self.text, "elements": [e.to_dict() for e in self.elements],
                "admin": self.admin}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Parse":
        return cls(input=data["input"], text=data["text"], elements=tuple(Element(**e) for e in data["elements"]),
                   admin=data["admin"])
