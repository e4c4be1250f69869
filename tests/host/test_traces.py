"""The pipeline trace viewer (``/ui/traces``): a real trace, written by ``timebound pipeline run
--json`` on the showcase's ranking plan, uploaded in headless Chromium; hostile and broken files
over HTTP against the real host."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .browser import DOCS_IMG, browser, page, pixels, screenshots_wanted
from .conftest import ROOT, Server, csrf_of

__all__ = ["browser", "page"]  # fixtures, used by name

PLAN = ROOT / "examples" / "one_deadline" / "ranking.py"
CANDIDATES = [{"id": 101, "popularity": 3.0}, {"id": 102, "popularity": 9.0}]
CRITICAL_BACKGROUND = (0xFD, 0xE4, 0xEE)  # .lane.critical in host.css
TIMED_OUT = (0xE8, 0x89, 0x0C)  # .bar.timed_out
DOC_SCREENSHOT = DOCS_IMG / "host-trace.png"


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``timebound pipeline run --json`` output of the ranking plan, whose timeout_wrapper region
    (5 ms + 100 us per row) fires against its 120 ms feature store and falls back."""
    tmp = tmp_path_factory.mktemp("trace")
    rows = tmp / "rows.json"
    rows.write_text("".join(json.dumps(r) + "\n" for r in CANDIDATES))
    argv = [sys.executable, "-m", "timebound", "pipeline", "run", f"{PLAN}:plan"]
    done = subprocess.run(
        [*argv, "--rows", str(rows), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp,
    )
    assert done.returncode == 0, done.stderr
    out = tmp / "trace.json"
    out.write_text(done.stdout)
    return out


def _trace(path: Path) -> dict[str, Any]:
    trace: dict[str, Any] = json.loads(path.read_text())["trace"]
    return trace


def test_uploaded_trace_shows_spans_wrapper_and_critical_path(
    host: Server, page: Any, trace_file: Path, tmp_path: Path
) -> None:
    """Every span gets a lane; the lanes of the critical path (the one the pipeline computed
    when it wrote the file) are highlighted and listed in order; the wrapper's row says its
    budget, rows, that it fired and the fallback it chose."""
    trace = _trace(trace_file)
    page.goto(host.url + "/ui/traces")
    page.set_input_files("#trace_file", str(trace_file))
    page.click("button:has-text('Show trace')")
    page.wait_for_selector("#trace-timeline")
    labels = page.locator("#trace-timeline .label").evaluate_all(
        "els => els.map(e => e.firstChild.textContent)"
    )
    assert sorted(labels) == sorted(s["node_id"] for s in trace["spans"])
    critical = page.locator("#trace-timeline .lane.critical .label").evaluate_all(
        "els => els.map(e => e.firstChild.textContent)"
    )
    assert set(critical) == set(trace["critical_path"])
    assert page.locator("#critical-path a").all_inner_texts() == trace["critical_path"]
    assert trace["critical_path"][:2] == ["timeout_wrapper", "timeout_wrapper/fail/fill_defaults"]
    # The success branch's cut task is drawn but is not on the path.
    cut = page.locator("#trace-timeline .lane:not(.critical) .bar.timed_out")
    assert cut.count() == 1
    cells = page.locator("#wrappers tbody tr").first.locator("td").all_inner_texts()
    wrapper = trace["wrappers"]["timeout_wrapper"]
    assert cells[:5] == [
        "timeout_wrapper",
        f"{wrapper['timeout_ms']:.3f} ms",
        "2",
        "fired",
        "fail",
    ]
    assert page.inner_text("#fired") == "1 of 1"
    png = page.locator("#trace-timeline").screenshot(path=str(tmp_path / "trace.png"))
    colours = set(pixels(png))
    assert CRITICAL_BACKGROUND in colours and TIMED_OUT in colours
    if screenshots_wanted():
        page.screenshot(path=str(DOC_SCREENSHOT), full_page=True)


def test_the_trace_form_and_the_critical_path_work_by_keyboard(
    host: Server, page: Any, trace_file: Path
) -> None:
    """Tab reaches the paste box; the pasted trace is sent with Enter on the button; a critical
    path entry, reached with Tab and opened with Enter, jumps to its highlighted lane."""
    page.goto(host.url + "/ui/traces")
    for _ in range(15):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == "trace_text":
            break
    else:
        raise AssertionError("the paste box is not reachable by keyboard")
    page.keyboard.insert_text(trace_file.read_text())
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Show trace"
    page.keyboard.press("Enter")
    page.wait_for_selector("#critical-path")
    first = _trace(trace_file)["critical_path"][0]
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.closest('#critical-path') !== null"):
            break
    else:
        raise AssertionError("no critical path entry reachable by keyboard")
    assert page.evaluate("document.activeElement.textContent") == first
    page.keyboard.press("Enter")
    target = page.locator(".lane:target")
    assert target.count() == 1
    assert "critical" in (target.get_attribute("class") or "")
    assert target.locator(".label").evaluate("e => e.firstChild.textContent") == first


# Over HTTP: what a hostile or broken file gets -----------------------------------------------


@contextmanager
def _session(server: Server) -> Iterator[tuple[httpx.Client, str]]:
    """A client holding the UI's CSRF cookie, and the token its forms repeat."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        page = client.get("/ui/traces")
        assert page.status_code == 200
        token = csrf_of(page.text)
        yield client, token


def _upload(server: Server, data: bytes) -> httpx.Response:
    with _session(server) as (client, token):
        return client.post(
            "/ui/traces",
            data={"csrf": token},
            files={"trace_file": ("trace.json", data, "application/json")},
        )


def _error(response: httpx.Response) -> str:
    """The page's error message, unescaped once (as a browser shows it)."""
    text = response.text
    start = text.index('id="trace-error">') + len('id="trace-error">')
    message = text[start : text.index("</p>", start)]
    return (
        message.replace("&#39;", "'").replace("&#34;", '"').replace("&lt;", "<")
        .replace("&gt;", ">").replace("&amp;", "&")
    )  # fmt: skip


def _span(node_id: str, start: float = 0.0, end: float = 1.0, **more: Any) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "op": "task",
        "name": node_id,
        "parent": None,
        "deps": [],
        "ready_ms": start,
        "start_ms": start,
        "end_ms": end,
        "outcome": "ok",
        **more,
    }


HOSTILE = "<script>alert(1)</script>"
ATTRIBUTE = '" onmouseover="alert(2)'


def test_hostile_strings_are_rendered_escaped(host: Server) -> None:
    """Markup in every string a trace carries (ids, ops, outcomes, wrapper fields, digest) comes
    out as text: no tag, no attribute break-out."""
    wrapper_id = f"w{HOSTILE}"
    trace = {
        "plan_digest": HOSTILE,
        "spans": [
            _span(wrapper_id, 0, 5, op="timeout_wrapper", outcome=ATTRIBUTE),
            _span(f"{wrapper_id}/fail/{HOSTILE}", 1, 4, parent=wrapper_id, op=HOSTILE),
            _span(ATTRIBUTE, 5, 6, deps=[wrapper_id], outcome=HOSTILE),
        ],
        "wrappers": {
            wrapper_id: {
                "timeout_ms": 1,
                "nrows": 1,
                "timed_out": True,
                "chosen_branch": HOSTILE,
                "override_applied": True,
                "override_origin": HOSTILE,
                "w_success": [HOSTILE],
                "success_elapsed_ms": 1,
                "fail_elapsed_ms": None,
            }
        },
    }
    r = _upload(host, json.dumps(trace).encode())
    assert r.status_code == 200, r.text
    assert "<script>alert" not in r.text
    assert 'onmouseover="alert' not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
    assert r.text.count('id="span-') == 3
    # An outcome is never a class name: an unknown one is drawn as "other".
    assert r.text.count('class="bar other"') == 2
    assert r.headers["content-security-policy"].startswith("default-src 'self'")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"spans": [', "the file is not JSON: Expecting value at line 1 column 12"),
        (b'{"spans": [NaN]}', "the file is not JSON: NaN is not JSON"),
        (b"\xff\xfe{}", "the file is not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "the file is not a trace: its JSON is nested too deeply"),
        (b"[]", "the file: expected a JSON object, got []"),
        (b'{"rows": []}', "the file: no 'spans'; expected a pipeline trace"),
        (b'{"trace": {"wrappers": {}}}', "trace: no 'spans'"),
        (b'{"spans": {"a": 1}}', 'spans: expected a list, got {"a": 1}'),
        (
            json.dumps({"spans": [_span("a"), _span("b", end="x")]}).encode(),
            "spans[1].end_ms: expected a number of milliseconds, got 'x'",
        ),
        (
            json.dumps({"spans": [_span("a", start=5, end=2)]}).encode(),
            "spans[0]: end_ms (2.0) is before start_ms (5.0)",
        ),
        (
            json.dumps({"spans": [{"node_id": "a"}]}).encode(),
            "spans[0]: missing field(s) ['op', 'start_ms', 'end_ms', 'outcome', 'parent']",
        ),
        (
            json.dumps({"spans": [_span("a"), _span("a")]}).encode(),
            "spans[1].node_id: 'a' appears twice",
        ),
        (
            json.dumps({"spans": [_span("a", end=True)]}).encode(),
            "spans[0].end_ms: expected a number of milliseconds, got true",
        ),
        (
            json.dumps({"trace": {"spans": [_span(HOSTILE * 5, deps=[7])]}}).encode(),
            "trace.spans[0].deps[0]: expected a string, got 7",
        ),
        (
            json.dumps({"spans": [], "wrappers": {"w": {"timeout_ms": 1}}}).encode(),
            "wrappers['w']: missing field(s) ['timed_out', 'chosen_branch']",
        ),
        (
            json.dumps(
                {
                    "spans": [],
                    "wrappers": {"w": {"timeout_ms": 1, "timed_out": "yes", "chosen_branch": None}},
                }
            ).encode(),
            "wrappers['w'].timed_out: expected true or false, got 'yes'",
        ),
        (
            json.dumps({"spans": [_span(str(i)) for i in range(2_001)]}).encode(),
            "spans: 2001 spans, more than the 2000 shown",
        ),
    ],
)
def test_a_broken_trace_gets_a_message_naming_what_was_wrong(
    host: Server, body: bytes, message: str
) -> None:
    """A 422 page whose alert names the field and the fault (never a 500)."""
    r = _upload(host, body)
    assert r.status_code == 422, r.text[:500]
    assert _error(r).startswith(message), _error(r)


def test_a_hostile_value_in_an_error_message_is_escaped_and_cut_short(host: Server) -> None:
    """The value an error quotes comes from the file: it is escaped and cut to 60 characters."""
    r = _upload(host, json.dumps({"spans": HOSTILE * 10}).encode())
    assert r.status_code == 422
    assert "<script>" not in r.text
    assert _error(r) == f"spans: expected a list, got {HOSTILE * 10!r}"[:85] + "..."


def test_a_looping_trace_still_gets_its_critical_path(host: Server) -> None:
    """Hand-made deps that loop cannot hang the page: the path stops where it comes back."""
    spans = [_span("a", 0, 2, deps=["b"]), _span("b", 0, 1, deps=["a"])]
    r = _upload(host, json.dumps({"spans": spans}).encode())
    assert r.status_code == 200
    path = r.text[r.text.index('id="critical-path"') :]
    assert path.index(">b</a>") < path.index(">a</a>")


def test_pasted_json_and_empty_or_double_input(host: Server, trace_file: Path) -> None:
    """Pasted text works like a file; nothing at all, or both at once, is a clear 422."""
    with _session(host) as (client, token):
        pasted = client.post(
            "/ui/traces", data={"csrf": token, "trace_text": trace_file.read_text()}
        )
        assert pasted.status_code == 200
        assert 'id="critical-path"' in pasted.text
        empty = client.post("/ui/traces", data={"csrf": token, "trace_text": "  "})
        assert empty.status_code == 422
        assert _error(empty) == "choose a trace file or paste a trace's JSON"
        both = client.post(
            "/ui/traces",
            data={"csrf": token, "trace_text": "{}"},
            files={"trace_file": ("t.json", b"{}", "application/json")},
        )
        assert both.status_code == 422
        assert _error(both) == "give either a trace file or pasted JSON, not both"


def test_the_form_needs_its_csrf_token(host: Server, trace_file: Path) -> None:
    """Without the cookie's token in the form, the upload is refused (403)."""
    with _session(host) as (client, _):
        r = client.post(
            "/ui/traces",
            data={"csrf": "forged"},
            files={"trace_file": ("t.json", trace_file.read_bytes(), "application/json")},
        )
    assert r.status_code == 403
    assert "CSRF" in r.json()["detail"]


def test_a_file_over_the_body_limit_is_refused_even_without_a_length(host: Server) -> None:
    """Past max_body_bytes (1 MiB) the page says so (413), whether the request declares its
    length or streams it in chunks without one."""
    big = json.dumps({"spans": [], "padding": "x" * 1_100_000}).encode()
    declared = _upload(host, big)
    assert declared.status_code == 413
    assert _error(declared) == "the form is larger than the limit of 1048576 bytes"
    boundary = "tbboundary"

    def chunks(token: str) -> Any:
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n{token}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="trace_file"; '
            'filename="t.json"\r\nContent-Type: application/json\r\n\r\n'
        ).encode()
        yield head
        for i in range(0, len(big), 65_536):
            yield big[i : i + 65_536]
        yield f"\r\n--{boundary}--\r\n".encode()

    with _session(host) as (client, token):
        streamed = client.post(
            "/ui/traces",
            content=chunks(token),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
    assert "content-length" not in streamed.request.headers
    assert streamed.status_code == 413
    assert "Traceback" not in "".join(host.output)


def test_with_a_token_the_viewer_needs_a_session(secured: Server) -> None:
    """On a host with a token, the trace page and its form are behind the sign-in like every
    other page of the UI."""
    with httpx.Client(base_url=secured.url, timeout=30) as client:
        for method in ("GET", "POST"):
            r = client.request(method, "/ui/traces", data={"csrf": "x", "trace_text": "{}"})
            assert (r.status_code, r.headers["location"]) == (303, "/ui/login")


@pytest.mark.parametrize(
    ("content_type", "body", "detail"),
    [
        ("multipart/form-data", b"garbage", "Missing boundary in multipart."),
        ("multipart/form-data; boundary=x", b"--x\r\nnonsense\r\n\r\n--x--\r\n", "Invalid"),
    ],
)
def test_a_malformed_upload_is_a_400_not_a_500(
    host: Server, content_type: str, body: bytes, detail: str
) -> None:
    """A body that is not a form at all is refused with the parser's reason."""
    with _session(host) as (client, _):
        r = client.post("/ui/traces", content=body, headers={"content-type": content_type})
    assert r.status_code == 400
    assert r.json()["detail"].startswith(detail)


def test_more_files_than_the_form_has_are_refused(host: Server) -> None:
    """The form has one file field; an upload of three files is a 400 naming the limit."""
    files = {f"f{i}": ("t.json", b"{}", "application/json") for i in range(3)}
    with _session(host) as (client, token):
        r = client.post("/ui/traces", data={"csrf": token}, files=files)
    assert r.status_code == 400
    assert r.json()["detail"] == "Too many files. Maximum number of files is 2."


def test_a_span_starting_before_the_run_is_drawn_from_the_timelines_start() -> None:
    """A skipped span with a negative start (traces recorded before skipped spans got sane starts)
    is drawn from the timeline's start, not over the label column (left < 0)."""
    from timebound.host._traces import trace_view

    span = {"parent": None, "deps": [], "name": "t", "ready_ms": 0.0}
    trace = {
        "plan_digest": "d",
        "late_discarded": 0,
        "wrappers": {},
        "spans": [
            {
                **span,
                "node_id": "task:a",
                "op": "task",
                "start_ms": 0.0,
                "end_ms": 5.0,
                "outcome": "ok",
            },
            {
                **span,
                "node_id": "task:b",
                "op": "task",
                "start_ms": -589839.0,
                "end_ms": 5.0,
                "outcome": "skipped",
                "deps": ["task:a"],
            },
        ],
    }
    bars = {b["label"]: b for b in trace_view(trace)["bars"]}
    skipped = bars["task:b"]
    assert skipped["left"] >= 0 and skipped["offset_ms"] >= 0
    assert skipped["left"] + skipped["width"] <= 100.5
