"""What a person sees: the four notebooks run top to bottom in JupyterLab, in a real Chromium (Debian's package, driven
by Playwright), with the tiny model on docs/own-bundle.md's desk, a bundle of two toolsets and two-turn tasks that no
GridSim code touches, with that page's parameters. It checks the screen while notebook 03 trains (the live plot is
a widget that changes) and each notebook as saved and reopened with its kernel gone (the plots are plain images):
every code cell ran, none shows an error, none writes to stderr beyond ``KEPT_STDERR``. What a person reads is
checked too: a long eval shows how far it got and the time left while it runs, tables are rounded, no caption names
a machine's path. Screenshots of each notebook are left in the test's temporary folder. nbval runs the same notebooks
on GridSim's tiny bundle without a browser (``.ci/run``), failing on an error or stderr too: what is shown is the same
code whatever the bundle, so one browser run covers it."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from .conftest import STARTED_WITH, free_port, stderr_lines
from .desk import check_desk_run, desk_parameters, write_desk

from agentenv_nb.notebook.params import QUICK, TINY, use_tiny_defaults
from agentenv_nb.settings import PREFIX

pytestmark = pytest.mark.slow
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "agentenv-nb-browser-test"
KEPT_STDERR: list[str] = []  # regexes of stderr lines a healthy run may show; none so far
LIVE_PLOT = ".jp-OutputArea .widget-output img"  # an image inside an ipywidgets Output
PLOT = ".jp-OutputArea-output.jp-RenderedImage"  # a plain image output
CELL_TIMEOUT_S = 900


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab over copies of the notebooks (the committed ones stay without outputs), every cell rendered (no
    windowing) and no news pop-up; its kernels get the tiny defaults on desk in their fewer steps, and a run folder of
    their own."""
    root = tmp_path_factory.mktemp("lab")
    chosen = desk_parameters(*write_desk(root / "desk"))
    for path in NOTEBOOKS:
        shutil.copy(path, root)
    settings = root / ".settings"
    for name, value in {"notebook-extension/tracker": {"windowingMode": "none"},
                        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False}}.items():
        (settings / f"@jupyterlab/{name}.jupyterlab-settings").parent.mkdir(parents=True, exist_ok=True)
        (settings / f"@jupyterlab/{name}.jupyterlab-settings").write_text(json.dumps(value))
    with pytest.MonkeyPatch.context() as env:
        for name in set(os.environ) - set(STARTED_WITH):  # what earlier tests' imports set, as Unsloth's
            env.delenv(name)
        # the tiny defaults for this lab alone: each variable they set is recorded first (set, then deleted), so the
        # context puts it back as it was, and a run of its own, even beside nbval's in one pytest call
        for name in [*(PREFIX + name for name in (*TINY, *QUICK, *chosen, "RUN_DIR", "BUNDLES_DIR")), "XDG_STATE_HOME"]:
            env.setenv(name, "")
            env.delenv(name)
        for name, value in chosen.items():
            env.setenv(PREFIX + name, value)
        use_tiny_defaults(root / "run", quick=True)
        env.setenv("JUPYTERLAB_SETTINGS_DIR", str(settings))
        env.setenv("JUPYTERLAB_WORKSPACES_DIR", str(root / ".workspaces"))
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
             f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
             "--KernelManager.transport=ipc"],  # as the README starts it: no kernel traffic in plain text over TCP
            cwd=root, stdout=open(root / "lab.log", "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                _get(f"{url}/api/status?token={TOKEN}")
                break
            except OSError:
                assert server.poll() is None, (root / "lab.log").read_text()
                time.sleep(0.5)
        yield root, url
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="module")
def page(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def _prompts(page) -> list[str]:
    return page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()


def _open(page, url: str, name: str) -> None:
    page.goto(f"{url}/lab/tree/{name}?token={TOKEN}&reset")  # a fresh workspace: this notebook alone
    page.locator(".jp-Notebook .jp-CodeCell").first.wait_for()
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)


def _run_all(page, watch=None) -> list:
    """Run > Run All Cells, then wait until no cell waits or runs; ``watch(page)`` is called about once a second
    meanwhile, and its results are returned."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
    seen, deadline = [], time.monotonic() + CELL_TIMEOUT_S * len(_prompts(page))
    while time.monotonic() < deadline:
        if watch:
            seen.append(watch(page))
        prompts = _prompts(page)
        if not any("*" in p for p in prompts) and any(re.search(r"\d", p) for p in prompts):
            return seen
        time.sleep(1)
    raise AssertionError(f"the notebook still runs after {CELL_TIMEOUT_S} s a cell")


def _save_and_close(page, lab, name: str) -> nbformat.NotebookNode:
    """Save the notebook, shut its kernel down (no widget model lives on), and read back what was saved."""
    root, url = lab
    page.keyboard.press("Control+s")
    page.locator(".jp-mod-dirty").wait_for(state="detached")
    for session in _get(f"{url}/api/sessions?token={TOKEN}"):
        request = urllib.request.Request(f"{url}/api/sessions/{session['id']}?token={TOKEN}", method="DELETE")
        urllib.request.urlopen(request, timeout=30)
    return nbformat.read(root / name, as_version=4)


def _scroll_through(page) -> tuple[int, int, str]:
    """Scroll the notebook top to bottom, as JupyterLab renders only the cells near the view: the plain images and
    the widgets seen, and the text shown."""
    images, widgets, text = 0, 0, ""
    for _ in range(200):
        images = max(images, page.locator(f"{PLOT} img").count())
        widgets = max(widgets, page.locator(".jp-OutputArea .jupyter-widgets").count())
        text += page.locator(".jp-Notebook").inner_text()
        at_end = page.evaluate("""() => { const s = document.querySelector('.jp-WindowedPanel-outer');
            const end = s.scrollTop + s.clientHeight >= s.scrollHeight - 2; s.scrollTop += s.clientHeight / 2;
            return end; }""")
        if at_end:
            break
        page.wait_for_timeout(200)
    return images, widgets, text


def _progress(page) -> list[str]:
    """The progress lines of the evals shown now: "played 8 of 32 tasks · 0:05 · about 0:15 left"."""
    return re.findall(r"played \d+ of \d+ tasks[^\n]*", page.locator(".jp-Notebook").inner_text())


# Four or more significant decimals: 0.300946, not 0.301, a learning rate of 0.0003, nor a version like 2026.10.9
LONG_DECIMAL = re.compile(r"(?<![\d.])\d+\.0*[1-9]\d{3,}(?![\d.])")


def _live_image(page) -> str | None:
    # one read in the page: the widget redraws its image, and at train end leaves a plain one in its place, so an
    # image counted a moment before may be gone when its src is asked for
    return page.evaluate("(selector) => document.querySelector(selector)?.getAttribute('src') ?? null", LIVE_PLOT)


def test_the_four_notebooks_as_a_person_sees_them(lab, page):
    root, url = lab
    saved_notebooks = []
    for path in NOTEBOOKS:
        _open(page, url, path.name)
        watch = {"02": _progress, "03": _live_image}.get(path.stem[:2])
        watched = _run_all(page, watch)
        page.screenshot(path=root / f"{path.stem}-run.png", full_page=True)
        saved = _save_and_close(page, lab, path.name)
        saved_notebooks.append(saved)

        code = [cell for cell in saved.cells if cell.cell_type == "code"]
        assert all(cell.execution_count for cell in code), f"{path.stem}: a cell did not run"
        errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.stem}: {errors[0].ename}: {errors[0].evalue}"
        noise = [line for line in stderr_lines(saved) if not any(re.search(kept, line) for kept in KEPT_STDERR)]
        assert not noise, f"{path.stem} writes to stderr:\n" + "\n".join(noise[:20])

        if path.stem.startswith("02"):  # its evals and self-distillation's rollouts say how far they got
            seen = {line for lines in watched for line in lines}
            assert any(" left" in line for line in seen), f"no progress with the time left while 02 played: {seen}"
            shown = [o.data["text/plain"] for cell in code for o in cell.outputs if "text/plain" in o.get("data", {})]
            assert any(re.fullmatch(r"played (\d+) of \1 tasks · \d+:\d\d", text) for text in shown), shown
        if path.stem.startswith("03"):
            frames = {src for src in watched if src}
            assert len(frames) >= 2, "the live plot did not render as a widget that changes while training"
            [train_cell] = [cell for cell in code if "live_plot(" in cell.source]
            images = [o for o in train_cell.outputs if "image/png" in o.get("data", {})]
            widgets = [o for o in train_cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
            assert images and not widgets, "the saved notebook keeps a widget, not the final plot as an image"
        _open(page, url, path.name)  # reopened: its kernel is gone, so only what was saved shows
        page.screenshot(path=root / f"{path.stem}-reopened.png", full_page=True)
        images, widgets, text = _scroll_through(page)
        tables = page.locator(".jp-OutputArea-output table").all_inner_texts()
        unrounded = [number for table in tables for number in LONG_DECIMAL.findall(table)]
        assert not unrounded, f"{path.stem} shows unrounded numbers: {unrounded[:5]}"
        captions = page.locator(".jp-OutputArea-output table caption").all_inner_texts()
        assert not [c for c in captions if re.search(r"(^|[\s@])/[\w.-]+/", c)], f"{path.stem}: a path in {captions}"
        assert "Error displaying widget" not in text and not widgets, f"{path.stem} saved a widget"
        # 02's loss and rewards, 03's live plot, 04's curve (01 draws a day only for a bundle whose task adapter can)
        assert images or path.stem.startswith("01"), f"{path.stem}: no plot shows once reopened"
    check_desk_run(root / "run", saved_notebooks)
    log = (root / "lab.log").read_text()  # the server's terminal, where the kernels' own warnings go too
    assert "Kernel is running over TCP without encryption" not in log and "No such comm" not in log, log[-3000:]
