"""The public Python API: one door to an index, in the spirit of sentence-transformers' ``encode()``
and sqlite-utils' ``Database``.

    from mgeo_index import AddressIndex, parse

    with AddressIndex.open("idx") as idx:                     # or AddressIndex.build("catalog.csv", "idx")
        idx.resolve("北京朝阳建国路88号", top_k=5)              # str -> list[Match]; list[str] -> list[list[Match]]
        idx.match("北京朝阳建国路88号", "北京市朝阳区建国路88号")  # -> MatchResult
        df = idx.normalize(frame, address_column="addr")      # pandas in, pandas out
    parse("北京朝阳建国路八十八号")                              # -> Parse

Every CLI command and the HTTP service call these; models are loaded in one place
(:mod:`mgeo_index.model.loading`: the model that built the index, its fingerprint check, the device and
the inference backend).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from mgeo_index import settings
from mgeo_index.query.results import Element, Match, MatchResult, Parse

if TYPE_CHECKING:  # heavy imports only when used
    import pandas as pd

    from mgeo_index.catalog.build import BuildResult
    from mgeo_index.query.resolver import Resolver

__all__ = ["AddressIndex", "parse", "match_pairs"]


@overload
def parse(text: str) -> Parse: ...
@overload
def parse(text: Sequence[str]) -> list[Parse]: ...
def parse(text):
    """Split addresses into elements and standardize their admin levels (no index or encoder needed).

    >>> parse("北京朝阳建国路88号").admin["district"]
    '朝阳区'
    """
    from mgeo_index.text.parser import parse as parse_texts

    texts = [text] if isinstance(text, str) else list(text)
    out = [Parse(input=p["input"], text=p["text"], elements=tuple(Element(**e) for e in p["elements"]), admin=p["admin"])
           for p in parse_texts(texts)]
    return out[0] if isinstance(text, str) else out


def match_pairs(cross, pairs: Sequence[tuple[str, str]], *, device: str | None = None,
                explain: bool = False, grouped: bool = False, numbers: str | None = None) -> list[MatchResult]:
    """Score (a, b) address pairs with a loaded cross-encoder (as ``mgeo-index match`` and ``/v1/match``);
    ``grouped``: consecutive pairs sharing ``a`` are one query's candidates, labelled together (as ``match``
    does with a file); ``numbers``: ``strict`` (two addresses writing different numbers for the same element are
    never ``exact_match``) or ``loose`` (the scorer alone) [``MGEO_INDEX_NUMBERS``, else strict]."""
    from mgeo_index.query.match import score_sides
    from mgeo_index.text import model_text, printable

    a, b = [model_text(x) for x, _ in pairs], [model_text(y) for _, y in pairs]
    probs, decided, explained = score_sides(cross, a, b, device=device, explain=explain, grouped=grouped,
                                            numbers=settings.numbers(numbers))
    labels = cross.labels
    out = []
    for i, ((raw_a, raw_b), p) in enumerate(zip(pairs, probs)):
        best = int(decided[i])
        out.append(MatchResult(
            a=printable(raw_a), b=printable(raw_b),  # a lone surrogate ("\ud800") cannot be encoded back
            label=labels[best], probability=round(float(p[best]), 6),
            probabilities={label: round(float(v), 6) for label, v in zip(labels, p)},
            explain=explained[i] if explain else None,
        ))
    return out


class AddressIndex:
    """An index directory opened for queries: its current generation's FAISS and n-gram files, its store,
    and the two models (the bi-encoder that built it, the cross-encoder that reranks).

    Use :meth:`open` or :meth:`build`; close it (or use ``with``) to release the database connections.
    """

    def __init__(self, resolver: "Resolver", index_dir: Path, db: str | None = None):
        self._resolver = resolver
        self.index_dir = Path(index_dir)
        self.db = db
        self.build_result: "BuildResult | None" = None  # set by AddressIndex.build

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, index_dir: str | Path = "mgeo-index", *, db: str | None = None, model: str | Path | None = None,
             cross_model: str | Path | None = None, device: str | None = None, backend: str | None = None,
             rerank: bool = True, numbers: str | None = None, profile: str | None = None) -> "AddressIndex":
        """Open an index directory built by :meth:`build` or ``mgeo-index build``.

        ``db``: SQLAlchemy URL (default: ``MGEO_INDEX_DB`` or the directory's SQLite file); ``model`` /
        ``cross_model``: model directories (default: the model that built the index / the bundled
        cross-encoder); ``backend``: ``torch`` / ``bf16`` / ``compile`` / ``int8`` / ``onnx`` / ``numpy`` (CPU;
        default: :func:`mgeo_index.runtime.plan.plan`'s, by the CPU's instructions); ``rerank=False`` loads no
        cross-encoder (retrieval only, no :meth:`match`); ``numbers``:
        ``strict`` / ``loose``, the number policy of its answers (default: the one the index was built with, else
        ``MGEO_INDEX_NUMBERS``, else strict; :mod:`mgeo_index.model.numbers`); ``profile``: ``default`` or
        ``accurate``, which bundled cross-encoder reranks (default: ``MGEO_INDEX_PROFILE``, the index's, accurate on
        a CUDA device, else default).
        """
        from mgeo_index.query.resolver import open_resolver

        resolver = open_resolver(index_dir, db=db, model=model, cross_model=cross_model, device=device,
                                 rerank=rerank, backend=backend, numbers=numbers, profile=profile)
        return cls(resolver, Path(index_dir), db)

    @classmethod
    def build(cls, catalog: str | Path, index_dir: str | Path = "mgeo-index", *, db: str | None = None,
              catalog_name: str = settings.DEFAULT_CATALOG, address_column: str | None = None,
              id_column: str | None = None, index: str = settings.DEFAULT_INDEX_FACTORY,
              model: str | Path | None = None, cross_model: str | Path | None = None, device: str | None = None,
              backend: str | None = None, on_progress: Callable[[str, int, int | None], None] | None = None,
              numbers: str | None = None, force: bool = False, profile: str | None = None) -> "AddressIndex":
        """Build (or update: only new and changed rows are embedded) an index from a CSV/TSV catalog,
        then open it. ``index`` is a FAISS factory string (``Flat``, ``HNSW32``, ``IVF4096,PQ32``…);
        ``numbers``: the number policy recorded with the catalog (``strict`` / ``loose``; None keeps the
        catalog's); ``profile``: the profile recorded with the catalog (None keeps the catalog's); ``force``: build
        into a directory holding files mgeo-index did not write; the build's summary is ``.build_result``."""
        from mgeo_index.catalog.build import build

        result = build(catalog, index_dir, db=db, catalog=catalog_name, address_column=address_column,
                       id_column=id_column, factory=index, model=model, device=device, backend=backend,
                       on_progress=on_progress, numbers=numbers, force=force, profile=profile)
        opened = cls.open(index_dir, db=db, model=model, cross_model=cross_model, device=device, backend=backend)
        opened.build_result = result
        return opened

    def close(self) -> None:
        """Release the store's connections (the models and index are freed with the object)."""
        self._resolver.engine.dispose()

    def __enter__(self) -> "AddressIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AddressIndex({str(self.index_dir)!r}, entries={len(self)}, build={self.descriptor.get('build_id')})"

    def __len__(self) -> int:
        return int(self._resolver.index.ntotal)

    @property
    def descriptor(self) -> dict:
        """The loaded generation: build id, FAISS and n-gram files, model fingerprint and path."""
        return dict(self._resolver.descriptor)

    @property
    def resolver(self) -> "Resolver":
        """The underlying batched resolver (for the service and evaluation)."""
        return self._resolver

    @property
    def cross_encoder(self):
        return self._resolver.cross

    # ------------------------------------------------------------------ queries

    @overload
    def resolve(self, queries: str, **options) -> list[Match]: ...
    @overload
    def resolve(self, queries: Sequence[str], **options) -> list[list[Match]]: ...
    def resolve(self, queries, *, top_k: int = settings.DEFAULT_TOP_K, rerank: bool = True, explain: bool = False,
                retrieval: str = "hybrid", admin_filter: bool = False, rerank_depth: int | None = None,
                batch_size: int = 256, numbers: str | None = None, names=None):
        """Catalog entries for each query, best first (a list for one query, a list of lists for many).

        ``retrieval``: ``hybrid`` (default), ``dense`` or ``sparse``; ``rerank=False``: retrieval order
        only; ``explain``: per-element agreement on each match; ``admin_filter``: drop candidates whose
        city or district code contradicts the query's; ``numbers``: ``strict`` / ``loose`` for this call (default:
        the index's, see :meth:`open`); ``names``: the place name of each query kept as name + address (a str for
        one query, a list beside a list; None or "" where a query has none): matched with the address and compared
        with each entry's name (``build --name-column``, or the name its address writes).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        texts = [queries] if isinstance(queries, str) else list(queries)
        given = None if names is None else [names] if isinstance(names, str) else list(names)
        if given is not None and len(given) != len(texts):
            raise ValueError(f"{len(texts)} queries but {len(given)} names")
        out: list[list[Match]] = []
        for start in range(0, len(texts), batch_size):
            batch = self._resolver.resolve(texts[start : start + batch_size], top_k=top_k, rerank=rerank,
                                           explain=explain, retrieval=retrieval, admin_filter=admin_filter,
                                           rerank_depth=rerank_depth, numbers=numbers,
                                           names=None if given is None else given[start : start + batch_size])
            out.extend([Match.from_dict(m) for m in matches] for matches in batch)
        return out[0] if isinstance(queries, str) else out

    @overload
    def match(self, a: str, b: str, *, explain: bool = False) -> MatchResult: ...
    @overload
    def match(self, a: Sequence[tuple[str, str]], b: None = None, *, explain: bool = False,
              grouped: bool = False) -> list[MatchResult]: ...
    def match(self, a, b=None, *, explain: bool = False, grouped: bool = False):
        """Label one pair (``match(a, b)``) or many (``match([(a, b), …])``): exact / partial / not match.
        ``grouped``: consecutive pairs sharing ``a`` are one query's candidates, labelled together."""
        if self._resolver.cross is None:
            raise ValueError("this index was opened with rerank=False: no cross-encoder to score pairs")
        if isinstance(a, str):
            if not isinstance(b, str):
                raise TypeError("match(a, b) takes two addresses, or match([(a, b), ...]) a list of pairs")
            return match_pairs(self._resolver.cross, [(a, b)], device=self._resolver.device, explain=explain,
                               numbers=self._resolver.numbers)[0]
        return match_pairs(self._resolver.cross, list(a), device=self._resolver.device, explain=explain, grouped=grouped,
                           numbers=self._resolver.numbers)

    def normalize(self, frame: "pd.DataFrame", *, address_column: str, min_probability: float | None = None,
                  margin: float | None = None, top_k: int | None = None, batch_size: int = 256,
                  name_column: str | None = None, explain: bool = False,
                  catalog_columns: str | Sequence[str] | None = None, coordinates: bool = False) -> "pd.DataFrame":
        """A copy of ``frame`` with the columns a ``normalize`` job writes (``status`` matched / ambiguous /
        unmatched / rejected, ``match_id``, ``match_address``, ``label``, ``probability``,
        ``alternatives``, ``reason``, ``admin_*``; prefixed ``mgeo_`` where ``frame`` has that column
        already). Each distinct query (address, and name where ``name_column`` names each row's place) is resolved
        once; ``catalog_columns`` (names, or ``"all"``) adds the matched entry's own catalog columns as
        ``match_<column>``; ``coordinates`` adds ``lon``, ``lat`` and ``coordinates_precision`` (the entry's, or an
        admin centre's); ``explain`` adds a last column, ``explain``: the best candidate compared element by
        element (JSON).
        Needs pandas (``pip install 'mgeo-index[pandas]'``)."""
        from mgeo_index.jobs import frame as normalize_frame

        return normalize_frame.normalize_frame(self._resolver, frame, address_column=address_column,
                                               min_probability=min_probability, margin=margin, top_k=top_k,
                                               batch_size=batch_size, name_column=name_column, explain=explain,
                                               catalog_columns=catalog_columns, coordinates=coordinates)

    # ------------------------------------------------------------------ updates

    def add(self, catalog: str | Path, **options: Any) -> "BuildResult":
        """Apply a delta file (new and changed rows) and reopen on the new generation."""
        from mgeo_index.catalog import update

        options.setdefault("model", self._resolver.bi)  # embed with the loaded model that built the index
        result = update.add(catalog, self.index_dir, db=self.db, **options)
        self._reopen()
        return result

    def remove(self, ids: Sequence[str], **options: Any):
        """Retire entries by their catalog id and reopen on the new generation."""
        from mgeo_index.catalog import update

        options.setdefault("model", self._resolver.bi)
        result = update.remove(list(ids), self.index_dir, db=self.db, **options)
        self._reopen()
        return result

    def check(self):
        """Verify the store and the index files agree (``mgeo-index check``)."""
        from mgeo_index.catalog import update

        return update.check(self.index_dir, db=self.db)

    def _reopen(self) -> None:
        from mgeo_index.query.resolver import reopen

        self._resolver = reopen(self._resolver, self.index_dir, db=self.db)
