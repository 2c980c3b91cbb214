"""The one list of Debian packages (hack/system-packages.txt): its installer, its users, its docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIST = REPO / "hack" / "system-packages.txt"
INSTALLER = REPO / "hack" / "system-packages.sh"
DOCS = REPO / "docs" / "development.md"


def groups() -> dict[str, list[str]]:
    rows = [line.split() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {row[0]: row[1:] for row in rows}


def scripts() -> list[Path]:
    found = [REPO / ".ci" / "run"]
    for folder in ("hack", "benchmarks"):
        found += [p for p in (REPO / folder).rglob("*") if p.suffix in {".sh", ".py"} and p != INSTALLER]
    return found


def test_every_group_has_packages_and_the_installer_lists_them() -> None:
    for group, packages in groups().items():
        assert packages, f"group {group} lists no package"
        listed = subprocess.run([str(INSTALLER), "--list", group], capture_output=True, text=True, check=True).stdout.split()
        assert listed == packages


def test_an_unknown_group_is_refused_by_name() -> None:
    done = subprocess.run([str(INSTALLER), "--list", "no-such-group"], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "no group 'no-such-group'" in done.stderr


def test_only_the_installer_calls_apt_get_and_every_group_called_exists() -> None:
    known = set(groups())
    called: set[str] = set()
    # `system-packages.sh tools cgo`, `"system-packages.sh"), "bench"]`: the words after the name.
    call = re.compile(r"""system-packages\.sh["')\],\t ]*((?:[a-z]+["'\]]*[\t ]*)+)""")
    for script in scripts():
        text = script.read_text()
        assert "apt-get install" not in text, f"{script.relative_to(REPO)} installs packages itself: use hack/system-packages.sh"
        for match in call.finditer(text):
            called.update(re.findall(r"[a-z]+", match.group(1)))
    assert called, "no script calls hack/system-packages.sh"
    assert called <= known | {"all"}, f"groups called but not in {LIST.name}: {called - known}"
    assert known <= called, f"groups in {LIST.name} no script installs: {known - called}"


def test_the_development_docs_state_the_list() -> None:
    text = DOCS.read_text()
    table = text.split("<!-- system-packages", 1)[1].split("<!-- /system-packages -->", 1)[0]
    stated = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            stated[cells[0].strip("`")] = cells[1].split()
    assert stated == groups()
