"""Search: BM25 ranking, the HTTP retriever against a local service, and result caps."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from json_server import JSONServer

from evosteer_core.tools.search import (
    BM25Retriever,
    HTTPRetriever,
    Passage,
    Retriever,
    RetrieverError,
    format_passages,
)

CORPUS = [
    ("paris", "Paris is the capital and most populous city of France."),
    ("berlin", "Berlin is the capital of Germany and its largest city."),
    ("eiffel", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    ("banana", "Bananas are elongated edible fruits, usually yellow when ripe."),
    ("danube", "The Danube flows through Vienna, Budapest and Belgrade."),
]


def test_bm25_ranks_the_matching_document_first():
    r = BM25Retriever(CORPUS)
    assert isinstance(r, Retriever)
    assert r.search("capital of Germany", 3)[0].doc_id == "berlin"
    assert r.search("wrought-iron lattice tower", 3)[0].doc_id == "eiffel"
    hits = r.search("Which river flows through Budapest?", 3)
    assert [p.doc_id for p in hits] == ["danube"]  # documents sharing no term are dropped
    scores = [p.score for p in r.search("capital city France", 5)]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


def test_bm25_edge_cases():
    r = BM25Retriever(CORPUS)
    assert r.search("zzzz qqqq", 3) == []
    assert r.search("capital", 0) == []
    assert len(r.search("capital city", 50)) <= len(CORPUS)
    with pytest.raises(ValueError, match="duplicate doc_id"):
        BM25Retriever([("a", "x y"), ("a", "z w")])
    with pytest.raises(ValueError, match="empty"):
        BM25Retriever([])


def test_bm25_from_jsonl_and_its_errors(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"doc_id": i, "text": t}) for i, t in CORPUS) + "\n")
    assert BM25Retriever.from_jsonl(path).search("yellow fruits", 1)[0].doc_id == "banana"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"doc_id": "a", "text": "ok"}) + "\n" + '{"doc_id": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*'text'"):
        BM25Retriever.from_jsonl(bad)


class _SearchService:
    """A tiny retrieval service that answers with BM25 over CORPUS, or with a scripted
    failure."""

    def __init__(self) -> None:
        self.index = BM25Retriever(CORPUS)
        self.mode = "ok"
        self.requests: list[dict] = []

    def respond(self, path: str, body: dict, headers: dict[str, str]) -> tuple[int, object]:
        self.requests.append(body)
        if self.mode == "error":
            return 500, {"detail": "index offline"}
        if self.mode == "malformed":
            return 200, {"results": []}
        hits = self.index.search(body["query"], body["k"])
        rows = [{"doc_id": p.doc_id, "text": p.text, "score": p.score} for p in hits]
        return 200, {"passages": rows}


@pytest.fixture
def service() -> Iterator[tuple[_SearchService, JSONServer]]:
    svc = _SearchService()
    with JSONServer(svc.respond) as http:
        yield svc, http


def test_http_retriever_posts_query_and_reads_passages(service):
    service, http = service
    r = HTTPRetriever(f"{http.root}/search", timeout_s=5)
    hits = r.search("capital of Germany", 2)
    assert service.requests == [{"query": "capital of Germany", "k": 2}]
    assert hits[0] == Passage("berlin", CORPUS[1][1], pytest.approx(hits[0].score))
    assert len(hits) <= 2 and hits[0].score > 0


def test_http_retriever_failures_raise_retriever_error(service):
    service, http = service
    r = HTTPRetriever(f"{http.root}/search", timeout_s=5)
    service.mode = "error"
    with pytest.raises(RetrieverError, match="HTTP 500"):
        r.search("x", 3)
    service.mode = "malformed"
    with pytest.raises(RetrieverError, match="malformed reply"):
        r.search("x", 3)
    http.close()
    with pytest.raises(RetrieverError, match="unreachable"):
        HTTPRetriever(f"{http.root}/search", timeout_s=2).search("x", 3)
    with pytest.raises(ValueError, match="http"):
        HTTPRetriever("ftp://example/search")


def test_format_passages_caps_passages_and_total():
    long = [Passage(f"d{i}", "word " * 400, 1.0 / (i + 1)) for i in range(6)]
    text = format_passages(long)
    assert len(text) <= 2000
    blocks = text.split("\n")
    assert [b.split(" ")[1] for b in blocks] == ["(d0)", "(d1)", "(d2)"]  # top-3 only
    for b in blocks:
        passage = b.split(") ", 1)[1]
        assert len(passage) <= 600
    assert format_passages([]) == "No results."
    short = format_passages([Passage("a", "Paris  is\nthe capital.", 2.0)])
    assert short == "[1] (a) Paris is the capital."
