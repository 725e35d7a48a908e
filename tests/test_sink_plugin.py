"""A seventh sink is one file and one registration (docs/architecture.md): an installed
package names it in the ``areal_watchdog.sinks`` entry points, a config names its type, and
``notify-test`` (and a watched job) delivers through it with our spool, retries and redaction;
nothing of ours is edited."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from conftest import REPO
from testkit.launcher import DEMO_CONFIG
from testkit.receiver import Receiver

EXAMPLE = REPO / "examples" / "sink_plugin" / "ntfy_sink.py"
TOKEN = "tk_ntfy0accesstoken0123456789"


def install(site: Path) -> None:
    """What ``pip install`` of a package holding ``ntfy_sink.py`` would leave on sys.path."""
    shutil.copy(EXAMPLE, site)
    dist = site / "ntfy_sink-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ntfy-sink\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[areal_watchdog.sinks]\nntfy = ntfy_sink:NtfySink\n")


def test_an_installed_sink_is_configured_and_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    receiver = Receiver()
    monkeypatch.setenv("NTFY_URL", receiver.url("/"))
    monkeypatch.setenv("NTFY_TOKEN", TOKEN)
    sink = "+watchdog.notify=[{type: ntfy, url_env: NTFY_URL, token_env: NTFY_TOKEN, topic: gpu}]"
    try:
        assert main(["notify-test", str(DEMO_CONFIG), sink]) == 2
        refusal = capsys.readouterr().err
        assert "`watchdog.notify[0].type`: no sink type 'ntfy' (installed: slack," in refusal
        install(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        assert main(["notify-test", str(DEMO_CONFIG), sink]) == 0
    finally:
        receiver.close()
    out = capsys.readouterr().out
    assert "ntfy-0 (ntfy): delivered (HTTP 200, 1 attempt(s)" in out and TOKEN not in out
    (request,) = receiver.requests
    message = json.loads(request.body)
    assert message["topic"] == "gpu" and "collective_mismatch in " in message["title"]
    assert "culprit ranks 3" in message["message"]
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["webhook-id"].startswith("msg_")  # the common delivery id


def test_the_architecture_doc_shows_the_example_as_it_is() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = r"```python\n# examples/sink_plugin/ntfy_sink.py\n(.*?)```"
    (shown,) = re.findall(block, doc, re.S)
    assert shown == EXAMPLE.read_text()
