"""Search: BM25 ranking, the HTTP retriever against a local service, and result caps."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

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
    """A tiny retrieval service on 127.0.0.1 that answers with BM25 over CORPUS, or with a
    scripted failure."""

    def __init__(self) -> None:
        self.index = BM25Retriever(CORPUS)
        self.mode = "ok"
        self.requests: list[dict] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                if service.mode == "error":
                    self._send(500, b'{"detail": "index offline"}')
                elif service.mode == "malformed":
                    self._send(200, b'{"results": []}')
                else:
                    hits = service.index.search(body["query"], body["k"])
                    rows = [{"doc_id": p.doc_id, "text": p.text, "score": p.score} for p in hits]
                    self._send(200, json.dumps({"passages": rows}).encode())

            def _send(self, code: int, payload: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/search"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)


@pytest.fixture
def service() -> Iterator[_SearchService]:
    svc = _SearchService()
    svc.thread.start()
    yield svc
    svc.server.shutdown()
    svc.server.server_close()
    svc.thread.join()


def test_http_retriever_posts_query_and_reads_passages(service):
    r = HTTPRetriever(service.url, timeout_s=5)
    hits = r.search("capital of Germany", 2)
    assert service.requests == [{"query": "capital of Germany", "k": 2}]
    assert hits[0] == Passage("berlin", CORPUS[1][1], pytest.approx(hits[0].score))
    assert len(hits) <= 2 and hits[0].score > 0


def test_http_retriever_failures_raise_retriever_error(service):
    r = HTTPRetriever(service.url, timeout_s=5)
    service.mode = "error"
    with pytest.raises(RetrieverError, match="HTTP 500"):
        r.search("x", 3)
    service.mode = "malformed"
    with pytest.raises(RetrieverError, match="malformed reply"):
        r.search("x", 3)
    port = service.server.server_address[1]
    service.server.shutdown()
    service.server.server_close()
    with pytest.raises(RetrieverError, match="unreachable"):
        HTTPRetriever(f"http://127.0.0.1:{port}/search", timeout_s=2).search("x", 3)
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
