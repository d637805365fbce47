"""The web UI in a real browser: Debian's chromium, headless, through chromedriver (nothing
downloads a browser), against ``metricvault serve`` and ``metricvault ui`` on a vault filled
by the simulator. Every page is opened and its content checked against the Python API; a
screenshot of each page is saved under the test's tmp dir (docs/images/ui-*.png come from
there). One browser session for the module; credentials are sent as an Authorization header
set through the DevTools protocol, so each tenant is one header away."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metricvault.archive.compare import curves, history, summarise
from metricvault.credentials import hash_secret
from metricvault.demo import register_jobs
from metricvault.durations import now_ms
from metricvault.sim import ClusterSpec, generate
from metricvault.store.vault import Vault
from tests.e2e.conftest import free_port, stop_process, wait_http_ok

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("needs Debian's chromium and chromium-driver (make test installs them)",
                allow_module_level=True)  # fmt: skip
webdriver = pytest.importorskip("selenium.webdriver")
# data up to the last whole hour: within the raw retention, and where Explore's ranges look
END_MS = now_ms() // 3_600_000 * 3_600_000
ADMIN, TOKEN_A, TOKEN_B = "ui-admin-token", "ui-token-team-a", "ui-token-team-b"
WAIT_S = 30


def _config(path: Path) -> Path:
    rows = [(ADMIN, ""), (TOKEN_A, "team-a"), (TOKEN_B, "team-b")]
    path.write_text(
        "".join(
            f'[[auth_bearer_tokens]]\nsha256 = "{hash_secret(t)}"\ntenant = "{n}"\n\n'
            for t, n in rows
        )
    )
    return path


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("ui")
    spec = ClusterSpec.ending_at(END_MS, 0.1, nodes=2, gpus_per_node=8, seed=0)
    with Vault.open_local(str(root / "vault")) as vault:
        for chunk in generate(spec):
            vault.write(chunk)
        vault.maintain()
        ids = register_jobs(vault, spec)
    return root, ids


@pytest.fixture(scope="module")
def archiving(filled: tuple[Path, list[str]]) -> Iterator[Any]:
    """The first run archived (the others not) in a thread, while the gateway starts; the
    test that looks at it waits for it (``archiving()`` re-raises what it raised)."""
    root, ids = filled
    failed: list[BaseException] = []

    def work() -> None:
        try:
            with Vault.open_local(str(root / "vault")) as vault:
                _archive(vault, root / "paper", ids[0])
        except BaseException as exc:  # handed to the waiting test
            failed.append(exc)

    thread = threading.Thread(target=work, name="archive", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join(timeout=300)
        assert not thread.is_alive(), "archiving the first run took over 300 s"
        if failed:
            raise failed[0]

    yield wait
    thread.join(timeout=300)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return done.stdout.decode().strip()


def _archive(vault: Vault, repo: Path, exp_id: str) -> None:
    """`metricvault archive export <id> --dvc` into a git + DVC repository with a local
    remote (docs/archive.md), through the same functions the command calls."""
    from metricvault.archive.repository import publish
    from metricvault.archive.snapshot_export import export_snapshot

    dvc = Path(sys.executable).with_name("dvc")
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "researcher@example.org")
    _git(repo, "config", "user.name", "Researcher")
    (repo / "README.md").write_text("paper\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-q", "-m", "paper")
    subprocess.run([str(dvc), "init", "-q"], cwd=repo, check=True, capture_output=True)
    remote = repo.parent / "remote"
    with open(repo / ".dvc" / "config", "a") as config:  # = `dvc remote add -d store DIR`
        config.write(f"[core]\n    remote = store\n['remote \"store\"']\n    url = {remote}\n")
    info = export_snapshot(vault, exp_id, repo / "artifacts" / "metrics", tier="1m")
    publish(info, repo)


def _server(root: Path, command: str, log_name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "metricvault.cli", command, "--data", str(root / "vault")]
    cmd += ["--listen", f"127.0.0.1:{port}", "--config", str(_config(root / "auth.toml"))]
    cmd += ["--set", f"archive_dir={root / 'paper' / 'artifacts' / 'metrics'}"]
    if command == "serve":
        cmd += ["--set", "gateway_maintain=false"]
    log = open(root / log_name, "wb")  # noqa: SIM115 - the server's whole life
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/-/healthy", proc, root / log_name, f"metricvault {command}")
    return proc, url


@pytest.fixture(scope="module")
def served(filled: tuple[Path, list[str]], archiving: Any) -> Iterator[tuple[str, list[str], Path]]:
    root, ids = filled
    proc, url = _server(root, "serve", "serve.log")
    try:
        yield url, ids, root
    finally:
        stop_process(proc, 15)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                 "--disable-dev-shm-usage", "--no-first-run"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.execute_cdp_cmd("Network.enable", {})
    try:
        yield driver
    finally:
        driver.quit()


def as_token(driver: Any, token: str) -> None:
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {token}"}}
    )


def open_page(driver: Any, url: str) -> None:
    driver.get(url)
    wait_ready(driver)


def wait_ready(driver: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not driver.execute_script("return window.mvReady === true"):
        assert time.monotonic() < deadline, f"{driver.current_url} never became ready"
        time.sleep(0.05)


def shot(driver: Any, tmp: Path, name: str) -> Path:
    path = tmp / f"ui-{name}.png"
    driver.save_screenshot(str(path))
    return path


def error_text(driver: Any) -> str:
    return str(
        driver.execute_script(
            "const e=document.getElementById('error'); return e.hidden ? '' : e.textContent"
        )
    )


def test_every_page_against_the_python_api(served, archiving, browser, tmp_path):
    url, ids, root = served
    as_token(browser, ADMIN)
    shots = []
    # Experiments: the table's numbers are summarise()'s
    open_page(browser, f"{url}/")
    assert "/ui/experiments?" in browser.current_url
    assert error_text(browser) == ""
    with Vault.open_local(str(root / "vault")) as vault:
        expected = {i: summarise(vault, vault.experiments.get(i)) for i in ids}
        curves = {i: history(vault, i, ["train_loss"]) for i in ids}
    for exp_id in ids:
        cells = browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll("
            f"'tr[data-id=\"{exp_id}\"] td[data-col]')].map(c => [c.dataset.col, c.textContent]))"
        )
        assert cells["gpus"] == str(expected[exp_id].gpus)
        assert cells["final_loss"] == f"{expected[exp_id].final_loss:.3f}"
        assert cells["gpu_hours"] == f"{expected[exp_id].gpu_hours:,.1f}"
    shots.append(shot(browser, tmp_path, "experiments"))

    # search narrows the table on the server
    box = browser.find_element("id", "q")
    box.send_keys(ids[1])
    browser.execute_script("window.mvReady = false")
    browser.find_element("css selector", "#filters button[type=submit]").click()
    wait_ready(browser)
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#experiments tbody tr')].map(r => r.dataset.id)"
    )
    assert shown == [ids[1]]

    # Experiment: the loss chart's points are history()'s (2 points per pixel column at most)
    archiving()  # the first run's snapshot exported and tagged meanwhile
    open_page(browser, f"{url}/ui/experiments/{ids[0]}")
    drawn = browser.execute_script("return window.mvCharts.train_loss")
    steps = curves[ids[0]].index.tolist()
    losses = dict(zip(steps, curves[ids[0]]["train_loss"].tolist(), strict=True))
    assert drawn["x"] and set(drawn["x"]) <= set(steps)
    for x, y in zip(drawn["x"], drawn["lines"][0]["y"], strict=True):
        assert y == pytest.approx(losses[int(x)], rel=1e-9)
    assert drawn["x"][0] == steps[0] and drawn["x"][-1] == steps[-1]
    # the archive state: the DVC tag and the content hash the snapshot itself records
    from metricvault.archive.snapshot_format import read_info

    info = read_info(root / "paper" / "artifacts" / "metrics" / f"{ids[0]}.parquet")
    state = browser.execute_script("return window.mvCharts.archive")
    assert state["state"] == "archived" and state["tag"] == f"metrics/{ids[0]}"
    assert state["commit"] == _git(root / "paper", "rev-parse", f"metrics/{ids[0]}^{{commit}}")

    def field(name: str) -> str:
        return str(
            browser.find_element("css selector", f'#archive-state tr[data-field="{name}"] td').text
        )

    assert field("content_hash") == info.content_hash and field("pushed") == "yes"
    assert field("rows") == f"{info.rows:,}" and field("tier") == "1m"
    shots.append(shot(browser, tmp_path, "experiment"))
    open_page(browser, f"{url}/ui/experiments/{ids[1]}")
    empty_state = browser.find_element("id", "archive-empty").text
    assert empty_state.startswith("Not archived yet: metricvault archive export " + ids[1])

    # Compare: selected from the table, both runs overlaid, params differences highlighted
    open_page(browser, f"{url}/ui/experiments")
    for exp_id in ids:
        browser.find_element("css selector", f'input.pick[value="{exp_id}"]').click()
    browser.find_element("id", "compare-selected").click()
    wait_ready(browser)
    assert "/ui/compare?ids=" in browser.current_url
    drawn = browser.execute_script("return window.mvCharts.compare")
    assert sorted(line["label"] for line in drawn["lines"]) == sorted(ids)
    differs = browser.execute_script(
        "return [...document.querySelectorAll('#param-table tr.differs')].map(r => r.dataset.param)"
    )
    assert "tokens_per_second_per_gpu" in differs and "seed" not in differs
    shots.append(shot(browser, tmp_path, "compare"))

    # Explore: the PromQL box over the simulated data's window
    spec_end_s = END_MS // 1000
    open_page(browser, f"{url}/ui/explore")
    answer = browser.execute_async_script(
        "const done = arguments[0];"
        f"fetch('/api/v1/query_range?query=count(DCGM_FI_DEV_GPU_UTIL)&start={spec_end_s - 3600}"
        f"&end={spec_end_s}&step=60').then(r => r.json()).then(done)"
    )
    assert answer["status"] == "success"
    assert {v[1] for v in answer["data"]["result"][0]["values"]} == {"16"}
    browser.find_element("id", "expr").send_keys("count(DCGM_FI_DEV_GPU_UTIL)")
    browser.execute_script("window.mvReady = false")
    browser.find_element("css selector", "#explore-form button[type=submit]").click()
    wait_ready(browser)
    info = browser.find_element("id", "query-info").text + error_text(browser)
    assert "step" in info or "no series" in browser.page_source  # data ends before "now"
    shots.append(shot(browser, tmp_path, "explore"))

    # Vault: tiers' rows are stats()'
    open_page(browser, f"{url}/ui/vault")
    with Vault.open_local(str(root / "vault")) as vault:
        stats = vault.stats()
    raw_rows = browser.find_element("css selector", 'tr[data-tier="raw"] td[data-col="rows"]').text
    assert raw_rows == f"{stats['tiers']['raw']['rows']:,}"
    shots.append(shot(browser, tmp_path, "vault"))

    open_page(browser, f"{url}/ui/alerts")
    assert "rules" in browser.find_element("id", "main").text.lower()
    shots.append(shot(browser, tmp_path, "alerts"))
    assert all(p.stat().st_size > 1000 for p in shots)
    docs_images = Path(__file__).resolve().parents[2] / "docs" / "images"
    if docs_images.is_dir() and not (docs_images / "ui-experiments.png").exists():
        for p in shots:  # once: the docs' screenshots (docs/ui.md)
            shutil.copy(p, docs_images / p.name)


def test_tenants_see_only_their_own_experiments_through_the_ui(served, browser):
    url, _, _ = served
    import httpx

    for token, exp_id in ((TOKEN_A, "run-of-a"), (TOKEN_B, "run-of-b")):
        body = {"id": exp_id, "selector": '{job="x"}', "start": END_MS - 3_600_000, "end": END_MS}
        answer = httpx.post(f"{url}/api/v1/experiments", json=body,
                            headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert answer.status_code == 201, answer.text
    as_token(browser, TOKEN_A)
    open_page(browser, f"{url}/ui/experiments")
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#experiments tbody tr')].map(r => r.dataset.id)"
    )
    assert shown == ["run-of-a"]
    browser.get(f"{url}/ui/experiments/run-of-b")
    # answered exactly as an unknown id: 404 in words, listing only tenant A's ids
    text = browser.find_element("tag name", "body").text
    assert text.startswith("no experiment 'run-of-b'") and "run-of-a" in text
    open_page(browser, f"{url}/ui/vault")
    assert "administrator credential only" in browser.find_element("id", "summary").text
    as_token(browser, "wrong-token")
    browser.get(f"{url}/ui/experiments")
    assert "unknown bearer token" in browser.find_element("tag name", "body").text
    as_token(browser, ADMIN)


def test_metricvault_ui_serves_read_only(filled, browser):
    root, ids = filled
    proc, url = _server(root, "ui", "ui.log")
    try:
        as_token(browser, ADMIN)
        open_page(browser, f"{url}/ui/experiments")
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#experiments tbody tr')].map(r => r.dataset.id)"
        )
        assert set(ids) <= set(shown)
        import httpx

        auth = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.post(f"{url}/api/v1/write", content=b"", headers=auth).status_code == 404
        body = {"id": "new", "selector": "m"}
        assert httpx.post(f"{url}/api/v1/experiments", json=body, headers=auth).status_code == 405
    finally:
        stop_process(proc, 15)
    assert f"open {url}/" in (root / "ui.log").read_text()


def wait_for(driver: Any, script: str) -> Any:
    """The script's value once it is truthy (the UI's state, not a fixed sleep)."""
    deadline = time.monotonic() + WAIT_S
    while not (value := driver.execute_script(script)):
        assert time.monotonic() < deadline, f"never true on {driver.current_url}: {script}"
        time.sleep(0.05)
    return value


def suggestions(driver: Any, kind: str) -> list[str]:
    return list(
        wait_for(
            driver,
            "const l = document.getElementById('suggest');"
            f"return !l.hidden && l.dataset.kind === '{kind}' && l.children.length"
            " && [...l.children].map(li => li.dataset.value)",
        )
    )


def test_explore_completes_label_names_and_values_and_says_which_tier_answered(served, browser):
    url, _, _ = served
    import httpx
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    auth = {"Authorization": f"Bearer {ADMIN}"}
    metric = "DCGM_FI_DEV_GPU_UTIL"
    names = httpx.get(f"{url}/api/v1/labels", params={"match[]": metric}, headers=auth).json()
    as_token(browser, ADMIN)
    open_page(browser, f"{url}/ui/explore")
    box = browser.find_element("id", "expr")
    box.send_keys(f"max_over_time({metric}{{")
    # after `{`: the metric's label names, as /api/v1/labels answers them
    assert suggestions(browser, "name") == [n for n in names["data"] if n != "__name__"][:50]
    box.send_keys("gp")
    assert suggestions(browser, "name") == [n for n in names["data"] if n.startswith("gp")]
    browser.find_element("css selector", '#suggest li[data-value="gpu"]').click()
    assert box.get_attribute("value") == f'max_over_time({metric}{{gpu="'
    # after `gpu="`: its values for this metric; Enter takes the first (keyboard reachable)
    values = httpx.get(
        f"{url}/api/v1/label/gpu/values", params={"match[]": metric}, headers=auth
    ).json()["data"]
    assert suggestions(browser, "value") == values[:50]
    box.send_keys(Keys.ENTER)
    assert box.get_attribute("value") == f'max_over_time({metric}{{gpu="{values[0]}"'
    box.send_keys("}[1h])")
    # over a day the step is whole minutes: the 1m rollup rows answer, and the page says so
    cases = [("1d", "1m", "Answered from the 1m rollup tier"), ("15m", "raw", "Answered from raw")]
    for span, tier, words in cases:
        Select(browser.find_element("id", "range")).select_by_value(span)
        browser.execute_script("window.mvReady = false")
        browser.find_element("css selector", "#explore-form button[type=submit]").click()
        wait_ready(browser)
        assert error_text(browser) == ""
        served_by = browser.find_element("id", "served-by")
        assert served_by.get_attribute("data-tiers") == tier
        assert served_by.text.startswith(words)
        # what the page shows is what query_range answers for the query it sent
        sent = browser.execute_script("return window.mvCharts.exploreQuery")
        answer = httpx.get(f"{url}/api/v1/query_range", params=sent, headers=auth).json()
        assert ",".join(answer.get("servedBy", ["raw"])) == tier
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#warnings li')].map(li => li.textContent)"
        )
        assert shown == answer.get("warnings", [])
    assert "range=15m" in browser.current_url and "expr=" in browser.current_url


def test_compare_aligns_by_elapsed_or_wall_time_and_keeps_it_in_the_url(served, browser):
    url, ids, root = served
    from selenium.webdriver.support.ui import Select

    with Vault.open_local(str(root / "vault")) as vault:
        want = {a: curves(vault, ids, "train_loss", align=a) for a in ("elapsed", "time")}
    as_token(browser, ADMIN)
    open_page(browser, f"{url}/ui/compare?ids={','.join(ids)}&metric=train_loss&align=elapsed")
    for align in ("elapsed", "time"):
        if align == "time":  # switched on the page: fetched again, and the URL follows
            browser.execute_script("window.mvReady = false")
            Select(browser.find_element("id", "align")).select_by_value("time")
            wait_ready(browser)
        assert error_text(browser) == ""
        drawn = browser.execute_script("return window.mvCharts.compare")
        assert drawn["align"] == align and f"align={align}" in browser.current_url
        for line in drawn["lines"]:
            frame = want[align][want[align]["experiment"] == line["label"]]
            xs = frame["x"].tolist()
            if align == "time":  # to the millisecond (Unix seconds on the chart)
                xs = [round(t.timestamp() * 1000) for t in xs]
            expected = dict(zip(xs, frame["value"].tolist(), strict=True))
            at = (lambda x: round(x * 1000)) if align == "time" else (lambda x: x)
            got = {at(x): y for x, y in zip(drawn["x"], line["y"], strict=True) if y is not None}
            assert got and set(got) <= set(expected)  # at most 2 points per pixel column
            for x, y in got.items():
                assert y == pytest.approx(expected[x], rel=1e-9)
    # EMA smoothing: drawn smoothed (TensorBoard's debiased EMA), kept in the shareable link
    browser.execute_script(
        "const s = document.getElementById('smoothing'); s.value = '0.6';"
        "s.dispatchEvent(new Event('input'))"
    )
    wait_for(browser, "return window.mvCharts.compare.smoothing === 0.6")
    smoothed = browser.execute_script("return window.mvCharts.compare")
    for before, after in zip(drawn["lines"], smoothed["lines"], strict=True):
        last, n, want_y = 0.0, 0, []
        for y in before["y"]:
            if y is not None:
                last, n = last * 0.6 + 0.4 * y, n + 1
            want_y.append(None if y is None else last / (1 - 0.6**n))
        assert after["y"] == [None if w is None else pytest.approx(w) for w in want_y]
    link = browser.find_element("id", "share-link").get_attribute("href")
    assert "align=time" in link and "smoothing=0.6" in link
    open_page(browser, link)
    assert browser.find_element("id", "align").get_attribute("value") == "time"
    assert browser.execute_script("return window.mvCharts.compare.smoothing") == 0.6


def test_the_experiment_page_draws_each_gpu_over_the_run(served, browser):
    url, ids, root = served
    from metricvault.archive.compare import restrict
    from metricvault.server.ui_api import GPU_METRICS, gpu_line_name

    with Vault.open_local(str(root / "vault")) as vault:
        exp = vault.experiments.get(ids[0])
        start, end = exp.window()
        gpus = summarise(vault, exp).gpus
        raw = {m: vault.query(restrict(exp.selector, m), start, end) for m, _ in GPU_METRICS}
    as_token(browser, ADMIN)
    open_page(browser, f"{url}/ui/experiments/{ids[0]}")
    assert error_text(browser) == ""
    for metric, unit in GPU_METRICS:
        drawn = browser.execute_script(f"return window.mvCharts['{metric}']")
        frame = raw[metric]
        keys = [c for c in frame.columns if c not in ("timestamp", "metric", "value")]
        by_line: dict[str, dict[int, float]] = {}
        for row in frame.itertuples(index=False):
            labels = {k: getattr(row, k) for k in keys if isinstance(getattr(row, k), str)}
            ms = round(row.timestamp.timestamp() * 1000)
            by_line.setdefault(gpu_line_name(labels), {})[ms] = row.value
        assert len(drawn["lines"]) == len(by_line) == gpus, metric
        for line in drawn["lines"]:
            points = [(round(x * 1000), y) for x, y in zip(drawn["x"], line["y"], strict=True)]
            shown = [(x, y) for x, y in points if y is not None]
            assert shown, (metric, line["label"])
            for x, y in shown:
                assert y == pytest.approx(by_line[line["label"]][x], rel=1e-9)
        title = browser.find_element("id", f"chart-{metric}").text
        assert unit in title


def test_the_vault_page_shows_retention_ingest_and_label_cardinality(served, browser):
    url, _, root = served
    import httpx

    from metricvault.config import Settings

    as_token(browser, ADMIN)
    open_page(browser, f"{url}/ui/vault")
    assert error_text(browser) == ""
    defaults = Settings.load(env={})
    for tier, kept in (("raw", defaults.retention_raw), ("1h", defaults.retention_1h)):
        cell = browser.find_element(
            "css selector", f'#retention tr[data-tier="{tier}"] td[data-col="retention"]'
        )
        assert cell.text == kept
    # series per label and the top label values: the vault's series listing, counted
    with Vault.open_local(str(root / "vault")) as vault:
        frame = vault.series(None, output="pandas")
    gpus = int(frame["gpu"].notna().sum())
    row = browser.find_element("css selector", '#label-cardinality tr[data-label="gpu"]')
    cells = row.find_elements("css selector", "td")
    assert cells[1].text == f"{gpus:,}"
    assert cells[2].text == str(frame["gpu"].dropna().nunique())
    # a write to the gateway shows in its ingest counters and rate
    before = int(wait_for(browser, "return document.getElementById('ingest-rate').dataset.stored"))
    lines = "\n".join(f"ui_ingest_probe,n={i} v={i} {END_MS + i}" for i in range(25))
    auth = {"Authorization": f"Bearer {ADMIN}"}
    answer = httpx.post(f"{url}/write?precision=ms", content=lines, headers=auth)
    assert answer.status_code == 204, answer.text
    wait_for(
        browser,
        f"return Number(document.getElementById('ingest-rate').dataset.stored) >= {before + 25}",
    )
    assert "samples/s" in browser.find_element("id", "ingest-rate").text
    stored = browser.find_element("css selector", '#ingest tr[data-by="influx"]').text
    assert "samples stored" in stored


def test_the_experiment_page_draws_its_curves_by_step_or_by_time(served, browser):
    url, ids, root = served
    from selenium.webdriver.support.ui import Select

    with Vault.open_local(str(root / "vault")) as vault:
        want = {a: curves(vault, [ids[0]], "train_loss", align=a) for a in ("elapsed", "time")}
    as_token(browser, ADMIN)
    open_page(browser, f"{url}/ui/experiments/{ids[0]}?align=elapsed")
    for align in ("elapsed", "time"):
        if align == "time":
            browser.execute_script("window.mvReady = false")
            Select(browser.find_element("id", "curve-align")).select_by_value("time")
            wait_ready(browser)
        assert error_text(browser) == "" and f"align={align}" in browser.current_url
        drawn = browser.execute_script("return window.mvCharts.train_loss")
        assert drawn["align"] == align
        xs = want[align]["x"].tolist()
        if align == "time":
            xs = [round(t.timestamp() * 1000) / 1000 for t in xs]
        expected = dict(zip(xs, want[align]["value"].tolist(), strict=True))
        assert drawn["x"] and set(drawn["x"]) <= set(expected)
        for x, y in zip(drawn["x"], drawn["lines"][0]["y"], strict=True):
            assert y == pytest.approx(expected[x], rel=1e-9)


def test_logging_in_through_the_form_scopes_the_session_to_the_tenant(served, browser, tmp_path):
    url, _, _ = served
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
    browser.delete_all_cookies()
    try:
        browser.get(f"{url}/ui/vault")  # no credential: the login form, at the page's address
        assert browser.find_element("id", "login-form").is_displayed()
        shot(browser, tmp_path, "login")
        browser.find_element("id", "token").send_keys(TOKEN_A)
        browser.find_element("id", "login").click()
        wait_ready(browser)
        assert browser.current_url == f"{url}/ui/vault" and error_text(browser) == ""
        assert "of tenant team-a" in browser.find_element("id", "summary").text
        cookies = {c["name"]: c for c in browser.get_cookies()}
        assert cookies["mv_session"]["httpOnly"] and cookies["mv_session"]["sameSite"] == "Strict"
        assert "mv_session" not in browser.execute_script("return document.cookie")
        # logging out (a POST with the CSRF token) ends the session
        browser.find_element("css selector", "#logout button").click()
        wait_for(browser, "return location.pathname === '/ui/login'")
        assert "mv_session" not in {c["name"] for c in browser.get_cookies()}
        browser.get(f"{url}/api/v1/vault/stats")
        assert "authentication required" in browser.find_element("tag name", "body").text
    finally:
        browser.delete_all_cookies()
        as_token(browser, ADMIN)


def test_the_vault_page_lists_an_agent_pushing_to_the_gateway(served, browser, tmp_path):
    url, _, _ = served
    import httpx

    token = tmp_path / "token"
    token.write_text(ADMIN + "\n")
    instance = "ui-probe-host:9400"
    cmd = [sys.executable, "-m", "metricvault.cli", "agent", "--profile", "edge", "--push", url,
           "--push-bearer-token-file", str(token), "--push-interval", "1s",
           "--sample-interval", "1s", "--gpu", "none", "--hostname", "ui-probe-host",
           "--instance", instance, "--state-dir", str(tmp_path / "agent")]  # fmt: skip
    log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - the agent's whole life
    agent = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # a push that counts an earlier one stored (the agent's own series)
            seen = httpx.get(f"{url}/api/v1/vault/stats", headers=auth).json()["agents"]
            if any(a["instance"] == instance and a["sent_requests"] for a in seen):
                break
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, "the agent's push never showed"
            time.sleep(0.2)
        as_token(browser, ADMIN)
        open_page(browser, f"{url}/ui/vault")
        row = f'#agents tr[data-instance="{instance}"]'
        cells = {
            c.get_attribute("data-col"): c.text
            for c in browser.find_elements("css selector", f"{row} td[data-col]")
        }
        assert cells["hostname"] == "ui-probe-host" and cells["profile"] == "edge"
        assert cells["mode"] == "pushes" and cells["age"].endswith("s ago")
        assert int(cells["sent"].replace(",", "")) >= 1
        shot(browser, tmp_path, "vault")
    finally:
        stop_process(agent, 15)


def test_the_alerts_page_groups_under_the_root_cause_and_charts_anomalies(
    served, browser, tmp_path
):
    url, _, root = served
    import json

    import httpx

    auth = {"Authorization": f"Bearer {ADMIN}"}
    series = httpx.get(f"{url}/api/v1/series", params={"match[]": "DCGM_FI_DEV_GPU_TEMP"},
                       headers=auth).json()["data"][0]  # fmt: skip
    labels = {k: v for k, v in series.items() if k != "__name__"}

    def esc(v: str) -> str:  # a line-protocol tag value
        return v.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")

    def tags(extra: dict[str, str]) -> str:
        return ",".join(f"{k}={esc(v)}" for k, v in sorted({**labels, **extra}.items()))

    score_tags = tags({"source_metric": "DCGM_FI_DEV_GPU_TEMP", "detector": "novelty"})
    lines = []
    for i in range(90):
        score = 0.97 if i == 30 else 0.1
        lines.append(f"metricvault_anomaly,{score_tags} score={score} {END_MS - (90 - i) * 60_000}")
    for stat, value in (("mean", 61.5), ("p95", 70.0), ("p99", 75.0)):
        stat_tags = tags({"source_metric": "DCGM_FI_DEV_GPU_TEMP", "stat": stat})
        lines.append(f"metricvault,{stat_tags} baseline={value} {END_MS - 3_600_000}")
    answer = httpx.post(f"{url}/write?precision=ms", content="\n".join(lines), headers=auth)
    assert answer.status_code == 204, answer.text
    deadline = time.monotonic() + WAIT_S
    while True:  # every gateway worker reads them (the one that took the write flushed it)
        got = httpx.get(f"{url}/api/v1/ui/anomalies", params={"range": "6h"}, headers=auth)
        if got.json()["top"]:
            break
        assert time.monotonic() < deadline, "the anomaly scores written never showed"
        time.sleep(0.2)
    # what the rule evaluator and the alert delivery write after a round (rules-status.json,
    # rules-incidents.json): two alerts about node01, converged on a GPU fault, and one other
    with Vault.open_local(str(root / "vault")) as vault:
        state = Path(vault.state_dir)
    xid = {"alertname": "XidErrors", "Hostname": "node01", "severity": "critical"}
    util = {"alertname": "GpuUtilLow", "Hostname": "node01", "severity": "warning"}
    disk = {"alertname": "DiskFilling", "Hostname": "node02", "severity": "warning"}
    since = "2026-01-01T00:00:00Z"
    alerts = [
        {"labels": x, "annotations": {}, "state": s, "activeAt": since, "value": "1e+00"}
        for x, s in ((xid, "firing"), (util, "firing"), (disk, "pending"))
    ]
    cause = {"alertname": "RootCause", "root_cause": "true", "incident": "node01"}
    cause |= {"cause": "gpu_fault", "severity": "critical", "scope": "incident"}
    cause |= {"Hostname": "node01"}
    incident = {"labels": cause, "annotations": {"description": "A GPU of node01 failed."},
                "opened_at_ms": END_MS, "members": [xid, util]}  # fmt: skip
    rules = [{"name": "XidErrors", "type": "alerting", "health": "ok", "lastError": ""}]
    (state / "rules-status.json").write_text(
        json.dumps({"groups": [{"name": "gpu", "file": "r.yml", "rules": rules}], "alerts": alerts})
    )
    (state / "rules-incidents.json").write_text(json.dumps({"incidents": [incident]}))
    try:
        as_token(browser, ADMIN)
        open_page(browser, f"{url}/ui/alerts?range=6h")
        assert error_text(browser) == ""
        section = browser.find_element("css selector", '.incident[data-incident="node01"]')
        rows = section.find_elements("css selector", "tr[data-alert]")
        assert [r.get_attribute("data-alert") for r in rows] == [
            "RootCause",
            "GpuUtilLow",
            "XidErrors",
        ]
        assert "root-cause" in rows[0].get_attribute("class")
        assert "gpu fault" in section.find_element("tag name", "h3").text
        loose = browser.find_elements("css selector", "#alerts tr[data-alert]")
        assert [r.get_attribute("data-alert") for r in loose] == ["DiskFilling"]
        # anomalies over the picked range: the score series, its source and its baseline
        drawn = browser.execute_script("return window.mvCharts.anomalies")
        top = drawn["top"][0]
        assert top["max_score"] == 0.97 and top["baseline"] == {
            "mean": 61.5,
            "p95": 70.0,
            "p99": 75.0,
        }
        row = browser.find_element("css selector", "#anomaly-table tr[data-series]")
        assert row.find_element("css selector", 'td[data-col="max_score"]').text == "0.970"
        assert row.find_element("css selector", 'td[data-col="p99"]').text == "75"
        chart = browser.execute_script("return window.mvCharts.anomaly_0")
        by_label = {line["label"]: line["y"] for line in chart["lines"]}
        assert set(by_label["baseline p99"]) == {75.0}
        assert any(y is not None for y in by_label["DCGM_FI_DEV_GPU_TEMP"])
        assert "range=6h" in browser.current_url
        browser.set_window_size(1280, 1900)  # the picture shows the anomalies too
        try:
            shot(browser, tmp_path, "alerts")
        finally:
            browser.set_window_size(1280, 800)
    finally:
        (state / "rules-status.json").unlink(missing_ok=True)
        (state / "rules-incidents.json").unlink(missing_ok=True)


def test_the_experiments_table_scrolls_to_the_last_of_many_rows_rendering_few(tmp_path, browser):
    """600 experiments: the table is virtualised (far fewer rows in the DOM than the total);
    scrolled to the bottom it shows the last experiment of the Python API's order; the arrow
    keys move between rows and a ticked box survives the rows coming and going."""
    total = 600
    with Vault.open_local(str(tmp_path / "vault")) as vault:
        for i in range(total):
            exp_id = f"many-{i:04d}"
            start = END_MS - (i + 1) * 3_600_000
            vault.experiments.create(
                exp_id, f'{{experiment="{exp_id}"}}', start=start, end=start + 1_800_000
            )
        exps = vault.experiments.list()
    # the table's default order (start, newest first): its last row is the oldest run
    newest = max(exps, key=lambda e: (e.start_ms, e.id)).id
    oldest = min(exps, key=lambda e: (e.start_ms, e.id)).id
    proc, url = _server(tmp_path, "ui", "ui.log")
    try:
        as_token(browser, ADMIN)
        open_page(browser, f"{url}/ui/experiments")
        rows = "document.querySelectorAll('#experiments tbody tr[data-id]')"
        first = wait_for(browser, f"const r = {rows}; return r.length && r[0].dataset.id")
        assert first == newest
        assert browser.execute_script(f"return {rows}.length") < total / 4
        browser.find_element("css selector", f'tr[data-id="{newest}"] input.pick').click()
        browser.execute_script(
            "const b = document.getElementById('table-scroll'); b.scrollTop = b.scrollHeight"
        )
        last = wait_for(
            browser,
            f"const r = {rows}; const l = r[r.length - 1];"
            f"return l && l.dataset.id === {oldest!r} && l.dataset.id",
        )
        assert last == oldest
        shown = browser.execute_script(
            f"const b = document.getElementById('table-scroll').getBoundingClientRect();"
            f"const r = document.querySelector('tr[data-id=\"{oldest}\"]').getBoundingClientRect();"
            "return r.top >= b.top && r.bottom <= b.bottom + 1"
        )
        assert shown, "the last row is not within the scroll box"
        assert browser.execute_script(f"return {rows}.length") < total / 4
        assert browser.find_element("id", "count").text.startswith(f"{total} experiment(s)")
        # keyboard: Home goes back to the first row, ArrowDown to the second
        from selenium.webdriver.common.keys import Keys

        browser.find_element("id", "table-scroll").send_keys(Keys.HOME)
        wait_for(
            browser,
            f"return document.activeElement.value === {newest!r}",
        )
        browser.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
        second = sorted(exps, key=lambda e: (e.start_ms, e.id), reverse=True)[1].id
        wait_for(browser, f"return document.activeElement.value === {second!r}")
        assert browser.execute_script(
            f"return document.querySelector('tr[data-id=\"{newest}\"] input.pick').checked"
        ), "the tick was lost when its row was rendered again"
    finally:
        stop_process(proc, 15)
