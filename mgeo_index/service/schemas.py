"""The request bodies of the ``/v1`` endpoints (pydantic models; unknown fields are refused)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: StrictStr | None = Field(None, description="One address (answer: one object).")
    queries: list[StrictStr] | None = Field(None, description="Several addresses (answer: {'results': [...]}).")
    name: StrictStr | None = Field(None, description="The place's name, with 'query' (a shop kept as name + address): "
                                   "matched with the address and compared with each entry's name.")
    names: list[StrictStr | None] | None = Field(None, description="Each query's place name, with 'queries' (null or "
                                                 "\"\" where one has none).")
    top_k: int = Field(10, ge=1, description="Matches per query (at most --max-top-k).")
    rerank: bool = True
    explain: bool = False
    retrieval: Literal["hybrid", "dense", "sparse"] = "hybrid"
    priority: Literal["interactive", "bulk"] | None = Field(None, description="Lane; also the X-Priority header.")


class PairIn(BaseModel):
    # One address pair of a /v1/match request. PairIn in the code (training.data.Pair is another thing);
    # the OpenAPI schema keeps its published name and title "Pair" (the schema's key comes from
    # __qualname__, its title from the config). A comment, not a docstring: that would become its description.
    __qualname__ = "Pair"
    model_config = ConfigDict(extra="forbid", title="Pair")
    a: StrictStr
    b: StrictStr


class MatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pairs: list[PairIn]
    explain: bool = False
    priority: Literal["interactive", "bulk"] | None = None
