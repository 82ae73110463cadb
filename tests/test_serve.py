"""`gravityocr serve`: real HTTP to a real Ray Serve app on a local Ray cluster."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import re
import time
from pathlib import Path
from urllib.parse import unquote

import httpx
import pyarrow.parquet as pq
import pytest
import torch

from gravityocr.model.decode.settings import DecodeSettings
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.corpus import synthetic_pages
from gravityocr.pipelines import ocr_cli
from gravityocr.model.evaluation.scores import parse_table
from gravityocr.pipelines.assembly import PageResult, document_markdown
from gravityocr.pipelines.batch_job import BatchJobConfig, run_batch_job
from gravityocr.pipelines.documents import load_pages
from gravityocr.pipelines.page_ocr import PageOcr, PageOcrConfig
from gravityocr.pipelines.recognizer import CropRecognizer, RecognizerConfig
from gravityocr.serve.app import build_app
from gravityocr.serve.settings import ServeSettings

from conftest import OVERFIT_TEXTS, make_tiny_model, random_image
from s3_endpoint import CREDENTIALS
from ports import free_port

pytestmark = pytest.mark.timeout(600)
TOKEN = "serve-test-token-7f3a"
SMALL_UPLOAD = 40_000


@pytest.fixture(scope="module")
def served(ray_cluster, s3_endpoint, trained_tiny_model, processor, tmp_path_factory):
    from ray import serve

    model_dir = tmp_path_factory.mktemp("serve-model")
    save_recognizer(Recognizer(trained_tiny_model.to(torch.float32), processor), model_dir)
    trained_tiny_model.to(torch.float64)
    token_file = tmp_path_factory.mktemp("secret") / "token"
    token_file.write_text(TOKEN)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    options = {"ray_actor_options": {"num_cpus": 0.25, "runtime_env": {"env_vars": CREDENTIALS}}}
    common = dict(model=str(model_dir), max_new_tokens=120, s3_endpoint_url=s3_endpoint.url)
    serve.run(build_app(ServeSettings(**common, allowed_buckets=["inbox"]), options), name="open", route_prefix="/")
    # The secured app decodes with settings of its own: blocks of 16, speculating at every batch size.
    serve.run(build_app(ServeSettings(**common, api_token_file=str(token_file),
                                      decode=DecodeSettings(block_size=16, speculative_max_batch=0)),
                        options),
              name="secured", route_prefix="/secured")
    serve.run(build_app(ServeSettings(**common, max_concurrent_requests=1, max_upload_bytes=SMALL_UPLOAD, max_pages=1,
                                      request_timeout_s=20), options), name="strict", route_prefix="/strict")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "model_dir": str(model_dir)}
    finally:
        serve.shutdown()


def _png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(_png_bytes(image)).decode()


def _chat(url, image, prompt="Text Recognition:", headers=None):
    body = {"model": "gravityocr", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(image)}}, {"type": "text", "text": prompt}]}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}, timeout=120)


def _in_process_markdown(model_dir, name, data):
    reader = PageOcr(CropRecognizer(load_recognizer(model_dir), RecognizerConfig().capped(120)), PageOcrConfig())
    return [page.to_dict()["regions"] for page in reader.read_pages(load_pages(name, data))]


def test_health_readiness_and_openapi(served):
    assert httpx.get(f"{served['url']}/healthz", timeout=30).json() == {"status": "ok"}
    assert httpx.get(f"{served['url']}/readyz", timeout=30).json()["status"] == "ready"
    paths = httpx.get(f"{served['url']}/openapi.json", timeout=30).json()["paths"]
    assert {"/v1/ocr", "/v1/chat/completions", "/healthz", "/readyz"} <= set(paths)
    chat = paths["/v1/chat/completions"]["post"]
    assert {"application/json", "text/event-stream"} <= set(chat["responses"]["200"]["content"])


def test_png_and_two_page_pdf_round_trip_as_the_library_reads_them(served):
    png = _png_bytes(synthetic_pages.sample_pages(1, seed=7)[0].image)
    response = httpx.post(f"{served['url']}/v1/ocr", files={"file": ("page.png", png, "image/png")}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["page_count"] == 1 and body["pages"][0]["result"]["regions"]
    assert [p["result"]["regions"] for p in body["pages"]] == _in_process_markdown(served["model_dir"], "page.png", png)

    pdf = synthetic_pages.pdf_bytes(synthetic_pages.sample_pages(2, seed=8))
    response = httpx.post(f"{served['url']}/v1/ocr", json={"document": base64.b64encode(pdf).decode(),
                                                             "filename": "two.pdf"}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [p["page_number"] for p in body["pages"]] == [1, 2]
    assert body["markdown"].index("<!-- page 1 -->") < body["markdown"].index("<!-- page 2 -->")
    assert [p["result"]["regions"] for p in body["pages"]] == _in_process_markdown(served["model_dir"], "two.pdf", pdf)
    assert body["stats"]["forward_passes"] > 0
    # token and pass counts are integers in the JSON (not 12.0), the ratio a float
    assert isinstance(body["stats"]["committed_tokens"], int) and isinstance(body["stats"]["forward_passes"], int)
    assert isinstance(body["stats"]["tokens_per_forward"], float)
    region_stats = [r["stats"] for p in body["pages"] for r in p["result"]["regions"] if r.get("stats")]
    assert region_stats and all(isinstance(s[k], int) for s in region_stats
                                for k in ("committed_tokens", "forward_passes"))


REPORT = Path(__file__).resolve().parents[1] / "samples" / "report.pdf"
FIGURE_LINK = re.compile(r"\n\n!\[figure\]\(([^)]*)\)")


def _untimed(document: dict) -> dict:
    """A document record without its wall-clock timings, which differ from run to run."""
    return {**document, "pages": [{k: v for k, v in page.items() if k != "seconds"} for page in document["pages"]]}


def test_one_document_one_markdown_from_ocr_batch_and_serve(served, tmp_path, monkeypatch, capsys):
    """samples/report.pdf (two pages, a title on each, a figure on page 2) through `gravityocr
    ocr` (stdout, --format json, --out), `gravityocr batch` and /v1/ocr, one model and token
    cap: the same markdown bytes and the same document JSON from the one assembly. Figures are
    linked only where they were written (batch, ocr --out: the same file names, each link to a
    file that exists), left out where nothing is written (stdout, serve), their boxes in the JSON."""
    data = REPORT.read_bytes()
    response = httpx.post(f"{served['url']}/v1/ocr", files={"file": ("report.pdf", data, "application/pdf")},
                          timeout=120)
    assert response.status_code == 200, response.text
    served_body = response.json()

    source = tmp_path / "in"
    source.mkdir()
    (source / "report.pdf").write_bytes(data)
    ocr_out = tmp_path / "ocr"

    def ocr(*options) -> str:
        assert ocr_cli.main(["report.pdf", "--model", served["model_dir"], "--max-new-tokens", "120",
                             "--no-progress", *options]) == 0
        return capsys.readouterr().out

    with monkeypatch.context() as context:
        context.chdir(source)  # the document id is "report.pdf", as serve's and the batch job's
        stdout_markdown = ocr()
        stdout_json = json.loads(ocr("--format", "json"))
        ocr("--out", str(ocr_out))
    batch_out = tmp_path / "batch"
    summary = run_batch_job(BatchJobConfig(str(source), str(batch_out), model=served["model_dir"], max_new_tokens=120,
                                           min_actors=1, max_actors=1))
    assert (summary.documents, summary.documents_failed, summary.pages, summary.page_errors) == (1, 0, 2, 0)

    # Without an output folder: no figure link, the same bytes from ocr and serve, and serve's
    # pages are the pieces of that markdown (page 2's title is `##` after page 1's `#`).
    assert stdout_markdown == served_body["markdown"]
    assert "![figure]" not in stdout_markdown and "_figures/" not in stdout_markdown
    pieces = [page["markdown"] for page in served_body["pages"]]
    assert served_body["markdown"] == "".join(f"<!-- page {n} -->\n\n{piece}\n\n"
                                              for n, piece in enumerate(pieces, 1)).strip() + "\n"
    headings = [line for line in stdout_markdown.splitlines() if line.startswith("#")]
    assert len(headings) == 2 and headings[0].startswith("# ") and headings[1].startswith("## ")
    assert pieces[1].startswith("## ")

    # With one: the figure crops beside the markdown, each link naming a file that exists;
    # ocr --out names its files as batch does (the input's name, extension kept): the same bytes.
    assert sorted(p.name for p in ocr_out.iterdir()) == ["report.pdf.md", "report.pdf_figures"]
    batch_markdown = (batch_out / "markdown" / "report.pdf.md").read_text()
    ocr_markdown = (ocr_out / "report.pdf.md").read_text()
    for markdown_file, markdown in ((batch_out / "markdown" / "report.pdf.md", batch_markdown),
                                    (ocr_out / "report.pdf.md", ocr_markdown)):
        links = FIGURE_LINK.findall(markdown)
        assert links and all(link.rsplit("/", 1)[1].startswith("p2-r") for link in links)
        assert all((markdown_file.parent / unquote(link)).is_file() for link in links)
    assert batch_markdown == ocr_markdown
    assert FIGURE_LINK.sub("", batch_markdown) == stdout_markdown
    figures = sorted(p.name for p in (ocr_out / "report.pdf_figures").iterdir())
    assert figures == sorted(p.name for p in (batch_out / "markdown" / "report.pdf_figures").iterdir())
    assert all((ocr_out / "report.pdf_figures" / name).read_bytes()
               == (batch_out / "markdown" / "report.pdf_figures" / name).read_bytes() for name in figures)
    served_pages = [PageResult.from_dict(page) for page in served_body["document"]["pages"]]
    assert document_markdown(served_pages, figure_prefix="report.pdf_figures/") == batch_markdown

    # The same document JSON: ocr's and serve's (the figure's box in it), and the batch job's
    # pages from its Parquet rows.
    assert _untimed(served_body["document"]) == _untimed(stdout_json)
    assert [page["result"] for page in served_body["pages"]] == served_body["document"]["pages"]
    assert any(region["type"] == "figure" for region in stdout_json["pages"][1]["regions"])
    rows = [row for path in sorted((batch_out / "pages").rglob("*.parquet")) for row in pq.read_table(path).to_pylist()]
    batch_pages = [PageResult.from_dict(json.loads(row["regions_json"])).to_dict() for row in rows]
    assert _untimed({"pages": batch_pages}) == _untimed({"pages": stdout_json["pages"]})


def test_s3_uri_only_from_allowed_buckets(served, s3_endpoint):
    client = s3_endpoint.client()
    client.create_bucket(Bucket="inbox")
    client.create_bucket(Bucket="private")
    png = _png_bytes(synthetic_pages.sample_pages(1, seed=9)[0].image)
    client.put_object(Bucket="inbox", Key="scan.png", Body=png)
    client.put_object(Bucket="private", Key="scan.png", Body=png)
    url = f"{served['url']}/v1/ocr"
    assert httpx.post(url, json={"uri": "s3://inbox/scan.png"}, timeout=120).status_code == 200
    assert httpx.post(url, json={"uri": "s3://private/scan.png"}, timeout=60).status_code == 403
    assert httpx.post(url, json={"uri": "s3://inbox/missing.png"}, timeout=60).status_code == 404
    for uri in ("file:///etc/passwd", "http://127.0.0.1:1/x.png", "/etc/passwd"):
        response = httpx.post(url, json={"uri": uri}, timeout=60)
        assert response.status_code == 400 and "s3://" in response.json()["error"]["message"]


def test_openai_client_reads_a_memorised_crop(served, tokenizer):
    from openai import OpenAI

    client = OpenAI(base_url=f"{served['url']}/v1", api_key="unused")
    for index, (text, prompt) in enumerate(zip(OVERFIT_TEXTS, ["Text Recognition:", "Table Recognition:",
                                                               "Formula Recognition:"])):
        image = random_image(100 + index, 84 + 28 * index, 56)
        reply = client.chat.completions.create(model="gravityocr", max_tokens=120, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _data_url(image)}}, {"type": "text", "text": prompt}]}])
        assert reply.choices[0].message.content == text
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens == len(tokenizer.encode(text, add_special_tokens=False)) + 1  # + eos


def test_32_concurrent_requests_share_engine_batches(served):
    images = [(random_image(100 + i % 3, 84 + 28 * (i % 3), 56), i % 3) for i in range(32)]
    prompts = ["Text Recognition:", "Table Recognition:", "Formula Recognition:"]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(lambda item: _chat(served["url"], item[0], prompts[item[1]]), images))
    assert [r.status_code for r in replies] == [200] * 32
    assert [r.json()["choices"][0]["message"]["content"] for r in replies] == [OVERFIT_TEXTS[k] for _, k in images]
    stats = httpx.get(f"{served['url']}/v1/engine/stats", timeout=30).json()
    assert stats["peak_batch_size"] > 1
    # the product's default speculates at every batch size
    assert stats["speculative_max_batch"] == 0
    assert sum(stats["rounds_by_kind"].values()) == stats["rounds"] and stats["rounds_by_kind"]["speculative"] > 0
    assert stats["rounds_by_kind"]["ar"] == 0


def test_overload_answers_503_with_retry_after_then_serves_again(served):
    png = _png_bytes(random_image(100, 84, 56))  # under the strict app's upload limit
    url = f"{served['url']}/strict/v1/ocr"

    def post(_):
        return httpx.post(url, files={"file": ("p.png", png, "image/png")}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(post, range(12)))
    codes = [r.status_code for r in replies]
    assert 503 in codes and 200 in codes, codes
    assert set(codes) <= {200, 503}
    assert all(r.headers.get("retry-after") for r in replies if r.status_code == 503)
    assert post(0).status_code == 200


def test_auth_on_and_off(served):
    image = random_image(100, 84, 56)
    secured = served["url"] + "/secured"
    assert _chat(secured, image).status_code == 401
    assert _chat(secured, image, headers={"Authorization": "Bearer wrong"}).status_code == 401
    reply = _chat(secured, image, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == OVERFIT_TEXTS[0]
    assert reply.json()["gravityocr"]["tokens_per_forward"] > 1  # drafting ahead, still the memorised text
    assert _chat(served["url"], image).status_code == 200  # the open app needs none
    assert httpx.get(f"{secured}/healthz", timeout=30).status_code == 200  # probes stay open


BAD_REQUESTS = [
    # (route, kwargs for httpx.post, status, words the message must contain)
    ("/strict/v1/ocr", {"files": {"file": ("big.png", b"\x89PNG" + b"0" * (SMALL_UPLOAD + 10), "image/png")}}, 413,
     f"the upload is {SMALL_UPLOAD + 14} bytes; the limit is {SMALL_UPLOAD} bytes (serve setting max_upload_bytes)"),
    ("/strict/v1/ocr", {"content": json.dumps({"document": base64.b64encode(b"x" * (SMALL_UPLOAD + 10)).decode()}),
                        "headers": {"content-type": "application/json"}}, 413,
     f"the document is {SMALL_UPLOAD + 10} bytes; the limit is {SMALL_UPLOAD} bytes (serve setting max_upload_bytes)"),
    ("/strict/v1/ocr", {"content": b"x" * (SMALL_UPLOAD * 2), "headers": {"content-type": "application/json"}}, 413,
     f"the request body is {SMALL_UPLOAD * 2} bytes; the limit is {SMALL_UPLOAD * 4 // 3 + 4096} bytes "
     "(serve setting max_upload_bytes, plus a third for base64)"),
    ("/v1/ocr", {"content": b"hello", "headers": {"content-type": "text/plain"}}, 415, "content type"),
    ("/v1/ocr", {"files": {"file": ("notes.png", b"just some text, not a picture", "image/png")}}, 415, "unsupported_format"),
    ("/v1/ocr", {"files": {"file": ("empty.pdf", b"", "application/pdf")}}, 400, "empty"),
    ("/v1/ocr", {"files": {"file": ("cut.pdf", b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog", "application/pdf")}}, 422, "corrupt"),
    ("/v1/ocr", {"json": {"document": "not base64!!"}}, 400, "base64"),
    ("/v1/ocr", {"json": {"filename": "x"}}, 422, "exactly one"),
    ("/v1/ocr", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "not valid JSON"),
    ("/v1/ocr", {"files": {"other": (None, "field")}}, 422, "'file'"),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "read this"}]}}, 422, "image_url"),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/a.png"}}]}]}}, 400, "data: URLs"),
    ("/v1/chat/completions", {"json": {"messages": []}}, 422, "messages"),
]


@pytest.mark.parametrize("route,request_kwargs,status,words", BAD_REQUESTS)
def test_bad_requests_get_their_status_and_the_server_keeps_serving(served, route, request_kwargs, status, words):
    response = httpx.post(served["url"] + route, timeout=60, **request_kwargs)
    assert response.status_code == status, response.text
    assert words.lower() in response.text.lower()
    assert httpx.get(f"{served['url']}/readyz", timeout=30).status_code == 200
    assert _chat(served["url"], random_image(100, 84, 56)).status_code == 200


# Bodies sent as application/json that are not JSON (400) or not the endpoint's request (422).
MALFORMED_JSON = [(b"{not json", 400), (b'{"document": "abc"', 400), (b"", 400), (b"\xff\xfe{}", 400),
                  (b"[1, 2]", 422), (b'{"messages": "hello", "document": 3}', 422)]


@pytest.mark.parametrize("route", ["/v1/ocr", "/v1/chat/completions"])
def test_malformed_json_bodies_answer_in_the_api_problem_format(served, route):
    """The same error shape as every other error, a one-line message naming the fault, never
    pydantic's own dump (which echoes the body and links pydantic's docs)."""
    for body, status in MALFORMED_JSON:
        response = httpx.post(served["url"] + route, content=body, headers={"content-type": "application/json"},
                              timeout=60)
        assert response.status_code == status, (body, response.text)
        problem = response.json()
        message = problem["error"]["message"]
        assert problem == {"error": {"message": message, "status": status}}
        assert len(message.splitlines()) == 1 and "pydantic" not in message and "input_value" not in message
        assert ("not valid JSON" in message) == (status == 400), message
    assert "invalid chat completion request: messages: Input should be a valid array" in message \
        if route == "/v1/chat/completions" else "document: Input should be a valid string" in message


def test_a_table_cut_at_its_budget_answers_one_closed_table_streamed_or_not(served, tokenizer):
    """The memorised table at budgets that end it mid-cell and between rows: the answer is the
    model's text with every element it opened closed (serve/table_answer.py), the finish
    reason says it was cut, and a stream's chunks join into the same string."""
    from gravityocr.serve.table_answer import closed_table

    table = OVERFIT_TEXTS[1]
    tokens = tokenizer.encode(table, add_special_tokens=False)
    for budget in (4, 6, 9):
        cut = tokenizer.decode(tokens[:budget])
        body = {"max_tokens": budget, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _data_url(random_image(101, 112, 56))}},
            {"type": "text", "text": "Table Recognition:"}]}]}
        answer = httpx.post(f"{served['url']}/v1/chat/completions", json=body, timeout=120).json()
        content = answer["choices"][0]["message"]["content"]
        assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == budget
        assert content == closed_table(cut) != cut and content.startswith(cut) and content.endswith("</table>")
        assert parse_table(content) is not None
        with httpx.stream("POST", f"{served['url']}/v1/chat/completions", json={**body, "stream": True},
                          timeout=120) as response:
            events = _sse_events(response)
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == content


def test_page_count_limit(served):
    buffer = io.BytesIO()
    random_image(1, 84, 56).save(buffer, "PDF", save_all=True, append_images=[random_image(2, 84, 56)])
    pdf = buffer.getvalue()  # two small pages, under the strict app's upload limit
    response = httpx.post(f"{served['url']}/strict/v1/ocr", files={"file": ("two.pdf", pdf, "application/pdf")},
                          timeout=60)
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "the document is 2 pages; the limit is 1 page (serve setting max_pages)"


LONG_DECODE = 4000  # new tokens per crop: seconds of decoding for the tiny model (5-7 s measured here)


@pytest.fixture(scope="module")
def never_ending_model(tokenizer, processor, tmp_path_factory) -> str:
    """A random model that never writes eos (its eos logit is pinned at 0, below the best of
    170 random logits), so a table crop decodes to its budget (a text crop may stop sooner,
    in a repetition loop)."""
    model = make_tiny_model(tokenizer, seed=5, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = 0
    model_dir = tmp_path_factory.mktemp("never-ending-model")
    save_recognizer(Recognizer(model, processor), model_dir)
    return str(model_dir)


@pytest.fixture(scope="module")
def never_ending(served, never_ending_model):
    """Apps on that model: one with a 1 s request timeout, one that waits long enough for
    its client to give up first."""
    from ray import serve

    options = {"ray_actor_options": {"num_cpus": 0.25}}
    common = dict(model=never_ending_model, max_new_tokens=LONG_DECODE, max_seq_len=4096)
    serve.run(build_app(ServeSettings(**common, request_timeout_s=1), options), name="hasty", route_prefix="/hasty")
    serve.run(build_app(ServeSettings(**common, request_timeout_s=600), options), name="patient",
              route_prefix="/patient")
    return {"hasty": served["url"] + "/hasty", "patient": served["url"] + "/patient"}


def _engine_when_idle(url: str) -> dict:
    for _ in range(600):
        stats = httpx.get(f"{url}/v1/engine/stats", timeout=30).json()
        if stats["batch_size"] == 0 and stats["waiting"] == 0:
            return stats
        time.sleep(0.2)
    raise AssertionError(f"the engine never went idle: {stats}")


def test_a_timed_out_request_leaves_the_engine(never_ending):
    """After a 504 the request's engine work is withdrawn, not decoded to its end."""
    url = never_ending["hasty"]
    response = _chat(url, random_image(7, 84, 56))
    assert response.status_code == 504, response.text
    stats = _engine_when_idle(url)
    assert (stats["aborted_requests"], stats["finished_requests"]) == (1, 0), stats


def test_a_request_whose_client_goes_away_leaves_the_engine(never_ending):
    """Serve cancels the handler of a request whose client disconnected; its engine work
    goes with it (this app's timeout is far off)."""
    url = never_ending["patient"]
    body = {"messages": [{"role": "user", "content": [  # a table: its output is never cut as a loop
        {"type": "image_url", "image_url": {"url": _data_url(random_image(9, 84, 56))}},
        {"type": "text", "text": "Table Recognition:"}]}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.5)
    stats = _engine_when_idle(url)
    assert (stats["aborted_requests"], stats["finished_requests"]) == (1, 0), stats
    assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200


def test_abandoned_page_crops_come_back_as_errors_and_leave_the_engine(never_ending_model):
    """The document route's crops: abandoning the HTTP request withdraws the crops being
    decoded, and the page reader's thread ends with an error per crop instead of decoding."""
    import threading

    from gravityocr.pipelines.recognizer import CropRecognizer
    from gravityocr.serve.engine_requests import EngineRequests, RequestAbandoned

    config = RecognizerConfig(max_new_tokens={"text": LONG_DECODE, "table": LONG_DECODE, "formula": LONG_DECODE},
                              max_batch_size=4, max_seq_len=4096)
    crops = CropRecognizer(load_recognizer(never_ending_model), config)
    loop = crops.loop
    try:
        engine_requests = EngineRequests(loop)
        results = []
        reader = threading.Thread(target=lambda: results.extend(
            # tables: their output is never cut as a loop (model/decode/stopping.py), so each decodes on
            crops.recognize([(random_image(20 + i, 336, 224), "table") for i in range(3)],
                            submit=engine_requests.submit_all)))
        reader.start()
        for _ in range(600):
            if loop.stats().batch_size == 3:
                break
            time.sleep(0.05)
        assert engine_requests.abandon() == 3
        reader.join(60)
        assert not reader.is_alive()
        assert [r.error for r in results] == ["the request was abandoned"] * 3
        with pytest.raises(RequestAbandoned):
            engine_requests.submit(None)
        for _ in range(600):
            stats = loop.stats()
            if stats.batch_size == 0:
                break
            time.sleep(0.05)
        assert (stats.aborted_requests, stats.finished_requests, stats.waiting) == (3, 0, 0)
    finally:
        crops.close()


def _sse_events(response) -> list:
    """The JSON payloads of a server-sent event stream, "[DONE]" kept as a string."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_openai_client_streams_a_memorised_crop_round_by_round(served):
    from openai import OpenAI

    client = OpenAI(base_url=f"{served['url']}/v1", api_key="unused")
    for index, (text, prompt) in enumerate(zip(OVERFIT_TEXTS, ["Text Recognition:", "Table Recognition:",
                                                               "Formula Recognition:"])):
        image = random_image(100 + index, 84 + 28 * index, 56)
        chunks = list(client.chat.completions.create(model="gravityocr", max_tokens=120, stream=True, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(image)}},
                                         {"type": "text", "text": prompt}]}]))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == text
        assert chunks[-1].choices[0].finish_reason == "stop"
        if index == 0:
            assert len(pieces) >= 2  # several rounds, each sent as it is committed


def test_stream_with_usage_ends_with_done_and_counts_tokens(served, tokenizer):
    body = {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 120, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(random_image(100, 84, 56))}},
                                     {"type": "text", "text": "Text Recognition:"}]}]}
    with httpx.stream("POST", f"{served['url']}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(response)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == len(tokenizer.encode(OVERFIT_TEXTS[0], add_special_tokens=False)) + 1
    assert events[-3]["choices"][0]["finish_reason"] == "stop" and events[-3]["gravityocr"]["tokens_per_forward"] > 1
    assert {e["id"] for e in events[:-1]} == {events[0]["id"]}


def _stream_chat(url, image, client_timeout=120):
    body = {"stream": True, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(image)}}]}]}
    return httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=client_timeout)


def test_a_stream_whose_client_goes_away_leaves_the_engine(never_ending):
    url = never_ending["patient"]
    before = _engine_when_idle(url)
    with _stream_chat(url, random_image(10, 84, 56)) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the stream is under way; now the client hangs up
    stats = _engine_when_idle(url)
    assert stats["aborted_requests"] == before["aborted_requests"] + 1, stats
    assert stats["finished_requests"] == before["finished_requests"], stats


def test_a_stream_past_the_timeout_ends_with_an_error_event(never_ending):
    url = never_ending["hasty"]
    before = _engine_when_idle(url)
    with _stream_chat(url, random_image(11, 84, 56)) as response:
        assert response.status_code == 200
        events = _sse_events(response)
    assert events[-1] == "[DONE]" and events[-2]["error"]["status"] == 504, events[-2:]
    assert any(e["choices"][0]["delta"].get("content") for e in events[:-2])  # tokens came before the timeout
    stats = _engine_when_idle(url)
    assert stats["aborted_requests"] == before["aborted_requests"] + 1, stats
    assert stats["finished_requests"] == before["finished_requests"], stats


def test_finished_streams_give_their_concurrency_slot_back(served):
    """The strict app admits one request at a time: after each stream ends, the next is served."""
    url = served["url"] + "/strict"
    for seed in (100, 101):
        with _stream_chat(url, random_image(seed, 84, 56)) as response:
            assert response.status_code == 200 and _sse_events(response)[-1] == "[DONE]"
    for _ in range(100):  # the slot is given back on the event loop once the engine request settles
        reply = _chat(url, random_image(100, 84, 56))
        if reply.status_code != 503:
            break
        time.sleep(0.1)
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("stream", [False, True])
def test_bench_serve_load_level_counts_answers_and_first_text(served, stream):
    """`gravityocr bench serve`'s load loop against the running app (figures are not judged,
    only that they are read right: every answer counted, first text never after the whole)."""
    from gravityocr.bench.serve import load_level

    body = {"model": "gravityocr", "max_tokens": 120, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _data_url(random_image(100, 84, 56))}},
        {"type": "text", "text": "Text Recognition:"}]}]}
    row = load_level(served["url"], [body], concurrency=2, requests=4, max_seconds=120, stream=stream)
    assert (row["requests"], row["ok"]) == (4, 4)
    assert 0 < row["p50_s"] <= row["p99_s"]
    if stream:
        assert 0 < row["first_text_p50_s"] <= row["p99_s"]
    else:
        assert "first_text_p50_s" not in row
