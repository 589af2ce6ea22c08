"""JupyterLab on the notebooks as a server other code drives: ``LabServer`` (a private
JupyterLab on a free port), Debian's chromium through Playwright, and running a notebook in
that browser (the browser tests and the screenshots use them; ``workbench lab`` is
``commands/lab.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: the checkout's notebooks (the package is installed editable from the checkout)
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
FIRST = "00_tour.ipynb"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LabServer:
    """``with LabServer(folder) as lab:`` JupyterLab serving ``folder`` at ``lab.url`` until the
    block ends. Settings, workspaces and runtime files live in a private folder, so the user's
    JupyterLab state is neither read nor changed; notebooks render every cell (no windowing) and
    the app is exposed as ``window.jupyterapp`` for the driver."""

    def __init__(self, root: str | Path, port: int | None = None, start_timeout: float = 60.0) -> None:
        import secrets
        import tempfile

        self.root = Path(root).resolve()
        self.port = port or free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout = start_timeout
        self._home = Path(tempfile.mkdtemp(prefix="workbench-lab-"))
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LabServer:
        import json
        import time
        import urllib.request

        settings = self._home / "settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        labconfig = self._home / "config" / "labconfig"
        labconfig.mkdir(parents=True)
        (labconfig / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(self._home / "config"),
                   JUPYTER_RUNTIME_DIR=str(self._home / "runtime"), JUPYTER_DATA_DIR=str(self._home / "data"),
                   JUPYTERLAB_SETTINGS_DIR=str(self._home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self._home / "workspaces"))
        env.pop("JUPYTER_PATH", None)
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}", "--LabApp.expose_app_in_browser=True",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly", "--allow-root"]
        self._log = open(self._home / "server.log", "wb")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError(f"JupyterLab did not answer on {self.url} within {self.start_timeout:.0f} s")

    def log(self) -> str:
        return (self._home / "server.log").read_text(errors="replace")

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"

    def __exit__(self, *exc: object) -> None:
        import shutil

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self._home, ignore_errors=True)


def launch_chromium(playwright, executable: str = "/usr/bin/chromium"):
    """Debian's chromium under Playwright (never a downloaded browser build)."""
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)


#: JavaScript: true once the open notebook's kernel is idle and every code cell has run
_ALL_RAN = """() => {
  const app = window.jupyterapp; const nb = app && app.shell.currentWidget;
  if (!nb || !nb.content || !nb.sessionContext || !nb.sessionContext.session) { return false; }
  const kernel = nb.sessionContext.session.kernel;
  if (!kernel || kernel.status !== 'idle') { return false; }
  const code = nb.content.widgets.filter(c => c.model.type === 'code');
  const failed = code.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'));
  return failed || code.every(c => c.model.executionCount !== null);
}"""

_ERRORS = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .filter(c => c.model.type === 'code')
  .flatMap(c => c.model.outputs.toJSON().filter(o => o.output_type === 'error')
  .map(o => o.ename + ': ' + o.evalue + '\\n' + (o.traceback || []).join('\\n')))"""


def run_notebook_in_browser(page, lab: LabServer, name: str, timeout_s: float = 180.0) -> None:
    """Open ``name`` in the lab, wait for its kernel, run all cells, wait until all ran;
    raises with the notebook's error output when a cell failed."""
    page.goto(lab.notebook_url(name))
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                           timeout=timeout_s * 1000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(_ALL_RAN, timeout=timeout_s * 1000, polling=500)
    errors = page.evaluate(_ERRORS)
    if errors:
        raise RuntimeError(f"{name}: a cell failed in the browser:\n" + "\n".join(errors)[-3000:])
