"""Search tool: a pluggable retriever (local BM25 or an HTTP service) and the tool-result text.

docs/method.md §1.3: a search returns the top-3 passages, each cut to ≤ 600 characters, and the whole
tool result is capped at 2,000 characters. The HTTP JSON API is documented in
docs/executors.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import requests

from evosteer_core.infra.redact import redact_text, redact_url

TOP_K = 3
PASSAGE_CHARS = 600
RESULT_CHARS = 2000


@dataclass(frozen=True)
class Passage:
    """One retrieved passage and its retriever score (higher is better)."""

    doc_id: str
    text: str
    score: float


class RetrieverError(RuntimeError):
    """The retriever could not answer (service down, malformed reply)."""


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns the ``k`` best passages for a query, best first."""

    def search(self, query: str, k: int) -> list[Passage]: ...


class BM25Retriever:
    """Okapi BM25 (``bm25s``) over an in-memory corpus of ``(doc_id, text)`` pairs.

    Passages with score 0 (no query term in common) are not returned.
    """

    def __init__(self, docs: Iterable[tuple[str, str]]) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        pairs = list(docs)
        if not pairs:
            raise ValueError("BM25Retriever: the corpus is empty")
        ids = [doc_id for doc_id, _ in pairs]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"BM25Retriever: duplicate doc_id(s) {dupes[:5]}")
        self._ids = ids
        self._texts = [text for _, text in pairs]
        self._tokenizer = Tokenizer(stopwords="en")
        corpus_tokens = self._tokenizer.tokenize(self._texts, return_as="ids", show_progress=False)
        self._index = bm25s.BM25()
        self._index.index(corpus_tokens, show_progress=False)

    @classmethod
    def from_jsonl(
        cls, path: Path, id_field: str = "doc_id", text_field: str = "text"
    ) -> BM25Retriever:
        """Load a corpus from JSONL, one ``{id_field: ..., text_field: ...}`` object per line."""
        docs: list[tuple[str, str]] = []
        with Path(path).open() as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    docs.append((str(row[id_field]), str(row[text_field])))
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ValueError(
                        f"{path}:{line_no}: expected a JSON object with string fields "
                        f"{id_field!r} and {text_field!r} ({exc})"
                    ) from exc
        return cls(docs)

    def __len__(self) -> int:
        return len(self._ids)

    def search(self, query: str, k: int) -> list[Passage]:
        if k <= 0:
            return []
        query_tokens = self._tokenizer.tokenize(
            [query], update_vocab=False, return_as="ids", show_progress=False
        )
        docs, scores = self._index.retrieve(
            query_tokens, k=min(k, len(self._ids)), show_progress=False
        )
        return [
            Passage(self._ids[int(i)], self._texts[int(i)], float(s))
            for i, s in zip(docs[0], scores[0], strict=True)
            if s > 0
        ]


class HTTPRetriever:
    """A retrieval service: ``POST url`` with ``{"query": str, "k": int}`` answering
    ``{"passages": [{"doc_id": str, "text": str, "score": float}, ...]}`` (best first)."""

    def __init__(self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"HTTPRetriever: url must start with http:// or https://, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})

    def search(self, query: str, k: int) -> list[Passage]:
        try:
            reply = requests.post(
                self.url,
                json={"query": query, "k": k},
                headers=self.headers,
                timeout=self.timeout_s,
            )
        except requests.RequestException as exc:
            raise RetrieverError(
                redact_text(f"search service {self.url} unreachable: {exc}")
            ) from exc
        if reply.status_code != 200:
            raise RetrieverError(
                f"search service {redact_url(self.url)} answered HTTP {reply.status_code}: "
                f"{reply.text[:200]}"
            )
        try:
            rows = reply.json()["passages"]
            return [_passage_from_json(row) for row in rows][:k]
        except (ValueError, KeyError, TypeError) as exc:
            raise RetrieverError(
                f"search service {redact_url(self.url)}: malformed reply, expected "
                f'{{"passages": [{{"doc_id", "text", "score"}}, ...]}} ({exc})'
            ) from exc


def _passage_from_json(row: Any) -> Passage:
    score = float(row["score"])
    if not math.isfinite(score):
        raise ValueError(f"non-finite score {row['score']!r}")
    return Passage(doc_id=str(row["doc_id"]), text=str(row["text"]), score=score)


def format_passages(
    passages: Sequence[Passage],
    *,
    k: int = TOP_K,
    passage_chars: int = PASSAGE_CHARS,
    result_chars: int = RESULT_CHARS,
) -> str:
    """The search tool's result text: the first ``k`` passages, each cut to ``passage_chars``,
    the whole cut to ``result_chars``."""
    if not passages:
        return "No results."
    blocks = []
    for rank, p in enumerate(passages[:k], start=1):
        text = " ".join(p.text.split())
        if len(text) > passage_chars:
            text = text[: passage_chars - 1] + "…"
        blocks.append(f"[{rank}] ({p.doc_id}) {text}")
    return "\n".join(blocks)[:result_chars]
