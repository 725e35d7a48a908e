"""A fourth backend is one file and one registration (docs/architecture.md): an installed
package names it in the ``areal_watchdog.backends`` entry points, and ``areal-launch`` offers
it with its own options, its plan printed by ``--dry-run``; nothing of ours is edited."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from areal_watchdog.cli import main
from conftest import REPO
from testkit.launcher import DEMO_CONFIG

EXAMPLE = REPO / "examples" / "backend_plugin" / "nice_backend.py"


def install(site: Path) -> None:
    """What ``pip install`` of a package holding ``nice_backend.py`` would leave on sys.path."""
    shutil.copy(EXAMPLE, site)
    dist = site / "nice_backend-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nice-backend\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[areal_watchdog.backends]\nnice = nice_backend:NiceBackend\n"
    )


def test_an_installed_backend_is_offered_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["nice", str(DEMO_CONFIG)])
    assert "invalid choice: 'nice'" in capsys.readouterr().err
    install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["nice", str(DEMO_CONFIG), f"cluster.fileroot={tmp_path}", "--niceness", "7"]
    assert main(["--watchdog", *argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "backend:   nice" in plan and "nice -n 7 " in plan
    assert "areal_watchdog.watch.sidecar" in plan  # the local launch's sidecar, unchanged
    assert not (tmp_path / "hang-demo").exists()  # a dry run creates nothing


def test_the_architecture_doc_shows_the_example_as_it_is() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = r"```python\n# examples/backend_plugin/nice_backend.py\n(.*?)```"
    (shown,) = re.findall(block, doc, re.S)
    assert shown == EXAMPLE.read_text()
