"""NNI's real WebUI (from the installed nni package) in headless Chromium, against a real
experiment run by `nni-manager run` on the local platform: what a person sees."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.webui.fixtures import get_json, needs_nni
from tests.support.webui.experiments import RunningExperiment

pytestmark = needs_nni

# non-transparent pixels of the most drawn canvas on the page (echarts draws on canvas)
_DRAWN = """() => Math.max(0, ...[...document.querySelectorAll('canvas')].map(c => {
    const ctx = c.getContext('2d'); if (!ctx || !c.width || !c.height) return 0;
    const d = ctx.getImageData(0, 0, c.width, c.height).data; let n = 0;
    for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }))"""


def _drawn(page: Any) -> int:
    return int(page.evaluate(_DRAWN))


def test_webui_shows_the_experiment(tmp_path: Path, home: Path, browser: Any, artifacts: Path) -> None:
    exp = RunningExperiment(tmp_path, home, "curve.py", maxTrialNumber=5,
                            searchSpace={"x": {"_type": "choice", "_value": [0, 1, 2, 3, 4]}})
    try:
        exp.wait_status("DONE")
        jobs = get_json(exp.api + "/trial-jobs")
        ids = [j["trialJobId"] for j in jobs]
        assert sorted(j["status"] for j in jobs) == ["FAILED"] + ["SUCCEEDED"] * 4
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        page.goto(exp.url + "oview")
        page.get_by_text("Best metric").wait_for(timeout=30_000)
        body = page.inner_text("body")
        assert "webui-test" in body and "4.000000" in body  # experiment name, best final metric
        assert "DONE" in body and "local" in body and "GridSearch" in body
        page.get_by_text(ids[-1]).first.wait_for(timeout=10_000)  # the top-trials table
        page.screenshot(path=str(artifacts / "overview.png"), full_page=True)

        page.goto(exp.url + "detail")
        for trial_id in ids:
            page.get_by_text(trial_id, exact=True).first.wait_for(timeout=30_000)
        rows = page.locator("[role=row]")
        table = page.locator(".ms-DetailsList").inner_text()
        assert table.count("SUCCEEDED") == 4 and table.count("FAILED") == 1
        assert "4 (FINAL)" in table and rows.count() >= 6  # header + 5 trials
        page.wait_for_timeout(500)
        assert _drawn(page) > 500, "the default-metric chart is empty"
        page.screenshot(path=str(artifacts / "detail-default-metric.png"), full_page=True)

        page.get_by_text("Hyper-parameter", exact=True).first.click()
        page.wait_for_timeout(1500)
        assert page.locator("svg path").count() > 0 or _drawn(page) > 500, "no hyper-parameter chart"
        page.screenshot(path=str(artifacts / "detail-hyper-parameter.png"), full_page=True)

        page.get_by_text("Intermediate result", exact=True).first.click()
        page.wait_for_timeout(1500)
        assert _drawn(page) > 500, "the intermediate-result chart is empty"
        page.screenshot(path=str(artifacts / "detail-intermediate.png"), full_page=True)

        succeeded = next(j["trialJobId"] for j in jobs if j["status"] == "SUCCEEDED")
        row = page.locator("[role=row]", has_text=succeeded).first
        row.locator("[data-automation-key=_expand] i").click()
        page.get_by_text("Log", exact=True).first.click()
        page.get_by_text("View trial stdout").wait_for(timeout=10_000)
        page.screenshot(path=str(artifacts / "detail-log.png"), full_page=True)
        with browser.expect_page() as opened:
            page.get_by_text("View trial stdout").click()
        log_page = opened.value
        log_page.wait_for_load_state()
        assert "/trial-file/" in log_page.url
        assert "trial log line for x =" in log_page.inner_text("body")
        assert not errors, errors  # no uncaught exception in the WebUI
    finally:
        exp.close()
