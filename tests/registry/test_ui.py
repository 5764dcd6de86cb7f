"""`archspec ui` (issue 28): every page and JSON endpoint over a fixture registry (SQLite, and PostgreSQL in CI),
errors (a bad filter: 400 with the caret; an unknown run: 404), hostile stored values inert, nothing from another
origin, nothing written; and a real headless Chromium against a live server."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from archspec.cli import main  # noqa: E402
from archspec.registry import Registry  # noqa: E402
from archspec.ui.app import create_app  # noqa: E402

from .helpers import make_info, make_spec, populate, record_run  # noqa: E402

SERVED = "http://127.0.0.1"  # the default bind's own name: the Host allow-list answers nothing else (not testserver)
SCRIPT = "<script>alert('pwned')</script>"
IMG = '"><img src=x onerror=alert(1)>'


@pytest.fixture
def fixture(registry):
    ids = populate(registry)
    hostile = make_info(make_spec("hostile"), seed=3, sweep=SCRIPT, tags={"note": IMG, "who": SCRIPT})
    ids["hostile"] = record_run(registry, hostile, {"val_loss": [(0, 5.0), (10, 4.0)], SCRIPT: [(0, 1.0)]},
                                status="FAILED", summary={"val_loss": 4.0})
    return registry, ids, TestClient(create_app(registry.url), base_url=SERVED)


def _pages(ids) -> list[str]:
    a, b, c = ids["llama0"], ids["gpt0"], ids.get("hostile", ids["wide0"])
    return ["/", "/?where=status%20%3D%20%27FINISHED%27&sort=-metrics.val_loss&columns=metrics.val_loss,tags.note",
            f"/runs/{a}", f"/runs/{c}", f"/compare?ids={a},{b}", f"/compare?ids={a},{c}", "/sweeps", "/sweeps/s1"]


def test_every_page_and_endpoint_answers(fixture):
    registry, ids, client = fixture
    for path in _pages(ids):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:500])
        assert response.headers["content-type"].startswith("text/html")
    runs = client.get("/api/runs").json()["runs"]
    assert {r["id"] for r in runs} == set(ids.values())
    narrowed = client.get("/api/runs", params={"where": "params.model.norm.kind = 'layernorm'"}).json()["runs"]
    assert [r["id"] for r in narrowed] == [ids["gpt0"]]
    ordered = client.get("/api/runs", params={"where": "metrics.val_loss < 10", "sort": "metrics.val_loss",
                                              "columns": "metrics.val_loss"}).json()["runs"]
    values = [r["columns"]["metrics.val_loss"] for r in ordered]
    assert values == sorted(values) and len(values) == 4
    one = client.get(f"/api/runs/{ids['llama0']}").json()
    assert one["spec"]["model"]["d_model"] == 64 and one["metric_keys"] == ["train_loss", "val_loss"]
    curve = client.get(f"/api/runs/{ids['llama0']}/metrics/val_loss").json()
    assert curve["step"] == [0, 100] and curve["value"] == [4.0, 3.0]
    assert curve["tokens"][1] == 100 * one["recipe"]["batch_size"] * one["recipe"]["seq_len"]
    assert curve["flops"][1] == curve["tokens"][1] * one["accounting"]["flops_per_token"]["train"]
    sweep = client.get("/api/sweeps/s1").json()
    assert sweep["sweep"] == "s1" and sweep["rows"] and {r["run"] for r in sweep["runs"]} == {ids["llama0"], ids["llama1"]}
    assert client.get(f"/runs/{ids['llama0']}/spec.yaml").text.startswith("name: llama\n")


def test_the_run_page_shows_what_archspec_knows(fixture):
    _, ids, client = fixture
    page = client.get(f"/runs/{ids['llama0']}").text
    for needle in ("class Model(nn.Module)", "flops_per_token.train", "d_model: 64", "testhost", "spec.yaml",
                   "archspec train llama.yaml"):
        assert needle in page, needle


def test_compare_highlights_what_differs_and_diffs_the_generated_files(fixture):
    _, ids, client = fixture
    page = client.get(f"/compare?ids={ids['llama0']},{ids['gpt0']}").text
    differing = re.findall(r'<tr class="differs"><th>([^<]+)</th>', page)
    assert "model.d_model" in differing and "model.vocab_size" not in differing
    assert '<span class="add">+D_MODEL = 512' in page and '<span class="del">-D_MODEL = 64' in page


def test_a_bad_filter_is_400_with_the_caret_and_unknown_things_are_404(fixture):
    _, ids, client = fixture
    response = client.get("/api/runs", params={"where": "metrics.val_loss <"})
    assert response.status_code == 400 and "invalid filter at column" in response.json()["error"]
    assert "^" in response.json()["error"]
    page = client.get("/", params={"where": "nope.field = 1"})
    assert page.status_code == 400 and 'id="filter-error"' in page.text and "^" in page.text
    for path in ("/api/runs/doesnotexist", "/runs/doesnotexist", "/api/sweeps/nope", "/sweeps/nope",
                 "/api/runs/doesnotexist/metrics/val_loss"):
        assert client.get(path).status_code == 404, path
    assert client.get("/api/runs", params={"limit": "0"}).status_code == 400
    assert client.get("/compare", params={"ids": ids["llama0"]}).status_code == 400
    assert client.get("/api/runs", params={"columns": "bogus.col"}).status_code == 400


def test_hostile_stored_values_come_back_inert(fixture):
    _, ids, client = fixture
    bodies = [client.get(p).text for p in _pages(ids)]
    bodies += [client.get("/", params={"columns": "tags.note,tags.who"}).text, client.get("/sweeps").text]
    for body in bodies:
        assert SCRIPT not in body and "<img src=x" not in body
    page = client.get("/", params={"columns": "tags.note,tags.who"}).text
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in page and "&#34;&gt;&lt;img src=x" in page
    assert "&#39;; DROP TABLE runs; --" in client.get("/sweeps").text  # INJECTION, shown as text
    api = client.get(f"/api/runs/{ids['hostile']}").json()
    assert api["tags"]["who"] == SCRIPT  # JSON carries the value as it is; it is data (application/json)
    assert client.get(f"/api/runs/{ids['hostile']}").headers["content-type"] == "application/json"


def test_no_page_loads_anything_from_another_origin(fixture):
    _, ids, client = fixture
    for path in _pages(ids):
        response = client.get(path)
        for url in re.findall(r'(?:src|href|action)="([^"]*)"', response.text):
            assert url.startswith(("/", "#", "?")) and not url.startswith("//"), (path, url)
        assert "default-src 'none'" in response.headers["content-security-policy"]
    for name in ("app.js", "style.css"):
        text = client.get(f"/static/{name}").text
        assert "http://" not in text and "https://" not in text and ".innerHTML" not in text


def test_nothing_writes_to_the_registry(registry, tmp_path):
    ids = populate(registry)
    before = _rows(registry)
    client = TestClient(create_app(registry.url), base_url=SERVED)
    for path in _pages(ids) + ["/api/runs", f"/api/runs/{ids['llama0']}", "/api/sweeps/s1",
                               f"/api/runs/{ids['llama0']}/metrics/val_loss"]:
        client.get(path)
    assert _rows(registry) == before


def _rows(registry) -> dict:
    from sqlalchemy import inspect, text

    with registry.engine.connect() as conn:
        tables = inspect(conn).get_table_names()
        return {t: sorted(map(repr, conn.execute(text(f'SELECT * FROM "{t}"')).fetchall())) for t in tables}


def test_an_empty_or_missing_registry_is_read_not_created(tmp_path):
    url = f"sqlite:///{tmp_path}/none.db"
    client = TestClient(create_app(url), base_url=SERVED)
    assert client.get("/").status_code == 200 and client.get("/api/runs").json()["runs"] == []
    assert client.get("/sweeps").status_code == 200
    assert not (tmp_path / "none.db").exists()


def test_the_command_checks_its_options(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/r.db"
    # The default port is read off the option, not bound: 8765 may be taken on a shared machine.
    from archspec.cli.ui import ui_cmd

    assert {p.name: p.default for p in ui_cmd.params}["port"] == 8765
    free = _free_port()
    assert main(["ui", "--registry", url, "--check", "--port", str(free)]) == 0
    assert f"at http://127.0.0.1:{free}/" in capsys.readouterr().err
    assert main(["ui", "--registry", url, "--check", "--host", "0.0.0.0", "--port", str(_free_port())]) == 0
    assert "the app has no authentication" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", "--registry", url, "--check", "--port", str(port)]) == 2
    assert f"--port {port}: cannot listen there" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ── a real browser ────────────────────────────────────────────────────────────────────────────────────────────────

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _dom(url: str, budget_ms: int = 6000) -> str:
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs Debian's chromium)")
def test_a_real_browser_shows_runs_filters_them_draws_a_chart_and_compares(tmp_path):
    url = f"sqlite:///{tmp_path}/ui.db"
    with Registry(url) as reg:
        ids = populate(reg)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "archspec.entry", "ui", "--registry", url, "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        dom = _dom(base + "/")
        assert all(f'data-run="{i}"' in dom for i in ids.values())
        narrowed = _dom(base + "/?where=" + "params.model.norm.kind%20%3D%20%27layernorm%27")
        assert f'data-run="{ids["gpt0"]}"' in narrowed and f'data-run="{ids["llama0"]}"' not in narrowed
        run = _dom(f"{base}/runs/{ids['llama0']}")
        chart = re.search(r'<div id="chart" class="chart"([^>]*)>', run).group(1)
        # one panel per metric the run has (val_loss: 2 points, train_loss: 1), each drawn by uPlot on a canvas
        assert 'data-series="2" data-points="3"' in chart, chart
        assert run.count('class="panel"') == 2 and run.count("<canvas") >= 2
        compare = _dom(f"{base}/compare?ids={ids['llama0']},{ids['gpt0']}")
        # the compare page's panels (val_loss, train_loss): llama0 has both, gpt0 val_loss only
        assert '<tr class="differs"><th>model.d_model</th>' in compare and 'data-series="3" data-points="5"' in compare
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_review_findings_stay_fixed(fixture):
    """A run id prefix shows the run's own data; '²' is no limit; a sweep name with a quote is a 404, not a 500;
    the reproduce command quotes what it took from the registry; a Host header of another name is refused (DNS
    rebinding)."""
    registry, ids, client = fixture
    prefix = ids["llama0"][:6]
    data = client.get(f"/api/runs/{prefix}").json()
    assert data["id"] == ids["llama0"] and data["metric_keys"] == ["train_loss", "val_loss"]
    assert client.get(f"/api/runs/{prefix}/metrics/val_loss").json()["value"] == [4.0, 3.0]
    assert client.get("/api/runs", params={"limit": "²"}).status_code == 400
    assert client.get('/sweeps/a"b').status_code == 404 and client.get('/api/sweeps/a"b\\c').status_code == 404
    assert client.get(f"/sweeps/{SCRIPT}").status_code == 200  # its own link works: the filter literal is quoted
    page = client.get(f"/runs/{ids['llama0']}").text
    assert "curl -s http://127.0.0.1/runs/" in page and "&gt; llama.yaml &amp;&amp; archspec train llama.yaml" in page
    assert client.get("/api/runs", headers={"Host": "evil.example:1"}).status_code == 400
    assert client.get("/compare", params={"ids": ",".join([ids["llama0"]] * 9)}).status_code == 400


def test_the_reproduce_command_quotes_a_hostile_name():
    from archspec.ui.app import _reproduce

    run = type("R", (), {"id": "ab12", "name": "x; touch /tmp/pwned #"})()
    command = _reproduce(run, "http://h/")
    assert "'x; touch /tmp/pwned #.yaml'" in command and "> x;" not in command


def test_the_run_page_shows_the_note_and_the_display_name_escaped(fixture):
    registry, ids, client = fixture
    registry.add_note(ids["llama0"], "lr too high " + SCRIPT)
    registry.rename_run(ids["llama0"], "llama-first")
    page = client.get(f"/runs/{ids['llama0']}").text
    assert "lr too high" in page and SCRIPT not in page and "llama-first" in page and "spec name" in page
    assert client.get(f"/runs/{ids['llama0']}/spec.yaml").text.startswith("name: llama\n")  # the spec's own name


# ── issue 42: the Host allow-list is exactly the hosts served; control and bidi characters shown, not obeyed ────────

BIDI = "safe\u202etxt.exe\u2066x\u2069\x1b[2J\x07\u200bend"


def test_the_host_allow_list_is_exactly_the_hosts_served(registry):
    from archspec.ui.app import served_hosts

    app = create_app(registry.url)  # bound to 127.0.0.1 (the default)
    for host, code in (("127.0.0.1", 200), ("localhost", 200), ("testserver", 400), ("[::1]", 400),
                       ("evil.example", 400), ("127.0.0.1.nip.io", 400)):
        assert TestClient(app, base_url=f"http://{host}").get("/api/runs").status_code == code, host
    assert served_hosts("::1") == ("::1", "[::1]", "localhost")
    assert served_hosts("10.1.2.3") == ("10.1.2.3",) and served_hosts("0.0.0.0") == ("*",)
    remote = create_app(registry.url, served_hosts("10.1.2.3"))
    assert TestClient(remote, base_url="http://10.1.2.3").get("/api/runs").status_code == 200
    assert TestClient(remote, base_url="http://localhost").get("/api/runs").status_code == 400  # not served there


def test_control_and_bidi_characters_of_registry_text_are_shown_escaped_in_html_and_json(registry):
    ids = populate(registry)
    info = make_info(make_spec("bidi"), seed=4, sweep="s" + BIDI, tags={"note": BIDI})
    run = record_run(registry, info, {"val_loss": [(0, 5.0)]}, status="FINISHED", summary={"val_loss": 5.0})
    client = TestClient(create_app(registry.url), base_url=SERVED)
    bodies = [client.get(p).text for p in ("/", f"/runs/{run}", "/sweeps", f"/api/runs/{run}",
                                           f"/compare?ids={run},{ids['llama0']}")]
    bodies.append(client.get("/", params={"columns": "tags.note"}).text)
    bodies.append(client.get("/api/runs", params={"columns": "tags.note"}).text)
    for body in bodies:
        for c in ("\u202e", "\u2066", "\u2069", "\x1b", "\x07", "\u200b"):
            assert c not in body
    page = client.get(f"/runs/{run}").text
    assert "safe\\u202etxt.exe" in page and "\\x1b[2J" in page
    assert client.get(f"/api/runs/{run}").json()["tags"]["note"].startswith("safe\\u202etxt.exe\\u2066x")
