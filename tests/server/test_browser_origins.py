"""What a browser can make the server do: the Host rule, the same-origin rule, the page's headers.

The attack these guard against: a user opens the map page of a server reached over plain http
by a LAN name (Chromium then sends no Fetch-Metadata), types the key once, then visits another
site, whose page makes the browser post to the server with the remembered key. The browser test
runs real Chromium with both names mapped to 127.0.0.1 (``--host-resolver-rules``).
"""

from __future__ import annotations

import base64
import http.server
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from geoserve.server.origins import HostRule
from tests.conftest import LAKE, write_geotiff
from tests.server.conftest import free_port, running_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
KEY = "browser-key-77"
NAME = "geoserve.test"  # the server's LAN name (not a trustworthy origin for Chromium)
EVIL = "elsewhere.test"  # another site the user visits afterwards

ATTACK = """<!doctype html><html><body>
<form id="text" method="POST" action="{target}/v1/images" enctype="text/plain" target="_blank">
<input name='{{"data": "' value='x", "data_format": "b64_json"}}'></form>
<form id="multi" method="POST" action="{target}/v1/scenes" enctype="multipart/form-data"
 target="b"><input type="file" name="file" id="f"></form>
<form id="top" method="POST" action="{target}/v1/scenes" enctype="multipart/form-data"
 target="_self"><input type="file" name="file" id="g"></form>
<iframe name="b"></iframe>
<script>
const bytes = Uint8Array.from(atob("{tif}"), (c) => c.charCodeAt(0));
const dt = new DataTransfer();
dt.items.add(new File([bytes], "x.tif", {{ type: "image/tiff" }}));
document.getElementById("f").files = dt.files;
document.getElementById("g").files = dt.files;
document.getElementById("text").submit();
document.getElementById("multi").submit();
const form = new FormData();
form.append("file", new Blob([bytes]), "y.tif");
fetch("{target}/v1/scenes", {{ method: "POST", mode: "no-cors", credentials: "include",
  body: form }});
fetch("{target}/v1/scenes/predict-me/predict", {{ method: "POST", mode: "no-cors",
  credentials: "include" }});
// last, a top-level navigation: the browser's remembered key for the server applies to it
setTimeout(() => document.getElementById("top").submit(), 500);
</script></body></html>"""


@contextmanager
def serve_page(html: str) -> Iterator[int]:
    """Another site: one HTML page on a free loopback port; yields the port."""
    body = html.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def small_scene(tmp_path: Path) -> bytes:
    rng = np.random.default_rng(3)
    return write_geotiff(
        tmp_path / "small.tif", rng.integers(0, 3000, (13, 64, 64)).astype(np.uint16)
    ).read_bytes()


def test_another_sites_page_cannot_use_the_remembered_key(tmp_path):
    """The page works under a LAN name; another site's forms and fetches are all refused."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "the browser test needs Debian's chromium"
    out = tmp_path / "out"
    tif = base64.b64encode(small_scene(tmp_path)).decode()
    with running_server(
        model="demo-water", output_dir=out, ui=True, api_key=KEY, allowed_hosts=[NAME]
    ) as url:
        port = url.rsplit(":", 1)[1]
        target = f"http://{NAME}:{port}"
        rules = f"--host-resolver-rules=MAP {NAME} 127.0.0.1, MAP {EVIL} 127.0.0.1"
        with sync_playwright() as pw, serve_page(ATTACK.format(target=target, tif=tif)) as evil:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", rules])
            context = browser.new_context(
                http_credentials={"username": "me", "password": KEY, "origin": target}
            )
            page = context.new_page()
            posts: list[tuple[str, int]] = []
            csp: list[str] = []
            page.on("console", lambda m: csp.append(m.text) if "Content Security" in m.text else 0)
            context.on(
                "response",
                lambda r: posts.append((r.url, r.status)) if r.request.method == "POST" else 0,
            )
            page.goto(target + "/")
            page.set_input_files("#file", str(LAKE))
            shown = "() => document.getElementById('status').textContent.startsWith('Prediction')"
            page.wait_for_function(shown, timeout=120_000)
            own, violations = list(posts), list(csp)
            posts.clear()
            page.goto(f"http://{EVIL}:{evil}/")
            page.wait_for_timeout(500)
            deadline = 100
            while len(posts) < 5 and deadline:
                page.wait_for_timeout(100)
                deadline -= 1
            browser.close()
        scenes = [p for p in (out / "scenes").glob("*") if p.suffix == ".tif"]
    assert [s for _, s in own] == [201], own  # the page's own upload, with the key
    assert not violations, violations  # the page runs under its Content-Security-Policy
    assert sorted(posts) == sorted(
        [
            (f"{target}/v1/images", 403),
            (f"{target}/v1/scenes", 403),
            (f"{target}/v1/scenes", 403),
            (f"{target}/v1/scenes", 403),
            (f"{target}/v1/scenes/predict-me/predict", 403),
        ]
    ), posts
    assert len(scenes) == 1, scenes  # only the user's own scene was stored


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("out")
    with running_server(model="demo-water", output_dir=out, ui=True) as url:
        yield url


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("out")
    with running_server(
        model="demo-water", output_dir=out, ui=True, api_key=KEY, allowed_hosts=["geoserve.lan"]
    ) as url:
        yield url


def test_a_keyless_server_refuses_cross_site_writes(keyless, tmp_path):
    tif = small_scene(tmp_path)
    for headers in (
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        {"Origin": "null"},
        {"Referer": "https://evil.example/page.html"},
    ):
        resp = httpx.post(f"{keyless}/v1/scenes", content=tif, headers=headers)
        assert resp.status_code == 403, (headers, resp.text)
        assert "cross-site request refused" in resp.json()["message"]
    own = keyless.replace("http://", "")
    same = httpx.post(f"{keyless}/v1/scenes", content=tif, headers={"Origin": f"http://{own}"})
    assert same.status_code == 201, same.text
    assert httpx.post(f"{keyless}/v1/scenes", content=tif).status_code == 201  # curl, Python
    # reading stays open to other sites' pages (they cannot read the answer without CORS)
    assert httpx.get(f"{keyless}/v1/models", headers={"Origin": "https://x.example"}).is_success


def test_the_host_header_must_name_the_server(keyless, keyed):
    port = keyless.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "geoserve.lan", "a b", ""):
        resp = httpx.get(f"{keyless}/v1/models", headers={"Host": host})
        assert resp.status_code == 400, (host, resp.text)
        assert "--allowed-host" in resp.json()["message"]
    tile = f"{keyless}/v1/tiles/12/2190/1342.png"
    assert httpx.get(tile, headers={"Host": "attacker.example"}).status_code == 400
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        assert httpx.get(f"{keyless}/v1/models", headers={"Host": host}).status_code == 200, host
    lan = httpx.get(
        f"{keyed}/v1/models",
        headers={"Host": "geoserve.lan:80", "Authorization": f"Bearer {KEY}"},
    )
    assert lan.status_code == 200, lan.text
    # health probes answer whatever the Host (a load balancer's own name)
    assert httpx.get(f"{keyless}/health/live", headers={"Host": "lb.internal"}).is_success


def test_host_rule_for_every_interface():
    rule = HostRule.for_server("0.0.0.0", ["geoserve.lan"])
    assert rule.allows("192.168.1.5:8000")
    assert rule.allows("[fe80::1]:8000")
    assert rule.allows("geoserve.lan:8000")
    assert rule.allows("localhost")
    assert not rule.allows("rebind.attacker.example:8000")
    assert not HostRule.for_server("127.0.0.1", []).allows("192.168.1.5")
    assert HostRule.for_server("127.0.0.1", ["*"]).allows("anything.example")


def test_basic_credentials_change_state_only_from_the_page(keyed, tmp_path):
    tif = small_scene(tmp_path)
    own = keyed.replace("http://", "")
    page = {"Origin": f"http://{own}", "X-Geoserve-Page": "1"}
    basic = ("me", KEY)
    for headers in ({}, {"Origin": f"http://{own}"}, {"X-Geoserve-Page": "1"}):
        resp = httpx.post(f"{keyed}/v1/scenes", content=tif, auth=basic, headers=headers)
        assert resp.status_code == 403, (headers, resp.text)
        assert "Bearer" in resp.json()["message"]
    assert (
        httpx.post(f"{keyed}/v1/scenes", content=tif, auth=basic, headers=page).status_code == 201
    )
    # the proxy case: TLS ended in front, the Host without a port, the Origin https
    proxied = {**page, "Origin": "https://geoserve.lan", "Host": "geoserve.lan"}
    resp = httpx.post(f"{keyed}/v1/scenes", content=tif, auth=basic, headers=proxied)
    assert resp.status_code == 201, resp.text
    bearer = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{keyed}/v1/scenes", content=tif, headers=bearer).status_code == 201
    # reading with Basic is fine (the page's tiles are <img> requests, with no Origin)
    assert httpx.get(f"{keyed}/ui/config.json", auth=basic).status_code == 200
    cross = httpx.get(
        f"{keyed}/ui/config.json", auth=basic, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert cross.status_code == 403


def test_json_routes_read_only_json(keyless):
    body = '{"data": "eA==", "data_format": "b64_json"}'
    for route in ("/v1/images", "/pooling"):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": ctype} if ctype else {}
            resp = httpx.post(f"{keyless}{route}", content=body, headers=headers)
            assert resp.status_code == 415, (route, ctype, resp.text)
            assert "application/json" in resp.json()["message"]
        ok = httpx.post(
            f"{keyless}{route}", content=body, headers={"Content-Type": "application/json"}
        )
        assert ok.status_code != 415


def test_every_answer_carries_the_security_headers(keyless):
    page = httpx.get(f"{keyless}/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    for resp in (page, httpx.get(f"{keyless}/v1/models")):
        assert resp.headers["x-frame-options"] == "DENY"
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["referrer-policy"] == "same-origin"
    assert (
        "default-src 'none'" in httpx.get(f"{keyless}/v1/models").headers["content-security-policy"]
    )
