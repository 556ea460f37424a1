"""The name pystrom installs under is the one everything tells users to install.

The distribution is pyproject.toml's ``[project] name`` (the import name stays ``pystrom``). Every
``pip install`` line and install hint in the README, the docs, the notebooks, ``./dev``, CI and the
messages in ``src/`` must name it, with extras that pyproject.toml defines.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest

from pystrom._dist import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _project_name() -> str:
    (name,) = re.findall(r'^name = "([^"]+)"', PYPROJECT, flags=re.M)
    return name


def _extras() -> dict[str, str]:
    section = PYPROJECT.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r"^([\w-]+) = (\[.*\])", section, flags=re.M))


def _user_facing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "dev", ROOT / ".ci" / "run", ROOT / "pyproject.toml"]
    files += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "docs").rglob("*.rst"))
    files += sorted((ROOT / "examples").rglob("*.ipynb"))
    files += sorted((ROOT / "src" / "pystrom").rglob("*.py"))
    return [f for f in files if "_build" not in f.parts]


def test_the_distribution_name_is_pyprojects_and_free_of_the_unrelated_pystrom():
    assert _project_name() == DISTRIBUTION
    assert DISTRIBUTION != "pystrom"  # "pystrom" on the package index is somebody else's project
    # the installed metadata (the editable install of this checkout) says the same, and puts the command in place
    scripts = {ep.name: ep.value for ep in md.distribution(DISTRIBUTION).entry_points if ep.group == "console_scripts"}
    assert scripts == {"pystrom": "pystrom.cli:main"}


def test_extras_are_named_for_what_they_bring():
    extras = _extras()
    for name in ("cuda13", "cuda12", "postgres", "demo"):
        assert name in extras, name
    assert "psycopg" in extras["postgres"]
    assert "psycopg" in extras["demo"] and "pgserver" in extras["demo"]  # the demo runs from a plain install + [demo]
    assert "cupy-cuda13x" in extras["cuda13"] and "cupy-cuda12x" in extras["cuda12"]
    for name, deps in extras.items():  # extras that pull in others name this distribution
        for own in re.findall(r'"([\w.-]+)\[', deps):
            assert not own.startswith("pystrom") or own == DISTRIBUTION, (name, own)


def test_readme_docs_and_messages_name_the_distribution():
    extras = set(_extras())
    wrong, unknown, installs = [], [], 0
    for path in _user_facing_files():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        # `pystrom[...]` or `pip install pystrom` would install (or fail to find) the wrong project
        for m in re.finditer(r"(?<![\w/.-])pystrom\[|pip install ['\"]?pystrom(?![\w-])", text):
            wrong.append(f"{rel}: {text[max(0, m.start() - 30) : m.end() + 20]!r}")
        for m in re.finditer(re.escape(DISTRIBUTION) + r"\[([\w,-]+)\]", text):
            installs += 1
            unknown += [f"{rel}: [{e}]" for e in m.group(1).split(",") if e not in extras]
        for m in re.finditer(r"install_hint\(([^)]*)\)", text):
            unknown += [f"{rel}: install_hint({e})" for e in re.findall(r"'([^']+)'", m.group(1)) if e not in extras]
    assert not wrong, "install lines naming another project:\n" + "\n".join(wrong)
    assert not unknown, "extras pyproject.toml does not define:\n" + "\n".join(unknown)
    assert installs >= 10  # README, getting started, the CLI's and the loaders' hints


@pytest.mark.parametrize(
    "extras,hint",
    [
        (("demo",), f"pip install '{DISTRIBUTION}[demo]'"),
        (("cuda13", "cuda12"), f"pip install '{DISTRIBUTION}[cuda13]' or '{DISTRIBUTION}[cuda12]'"),
    ],
)
def test_install_hint(extras, hint):
    assert install_hint(*extras) == hint


def test_the_readme_names_every_extra_and_the_user_functions():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(re.escape(DISTRIBUTION) + r"\[([\w-]+)\]", readme)) | set(
        re.findall(r"`\[([\w-]+)\]`", readme)
    )
    assert set(_extras()) <= named, f"extras the README does not name: {sorted(set(_extras()) - named)}"
    for name in ("@pystrom.udf", "@pystrom.kernel", "pystrom.reduce", "pystrom.MissingDependencyError"):
        assert name in readme, name


def test_the_project_has_urls():
    urls = dict(
        re.findall(r'^(\w+) = "(https://[^"]+)"', PYPROJECT.split("[project.urls]\n", 1)[1].split("\n[", 1)[0], re.M)
    )
    assert set(urls) >= {"Homepage", "Documentation", "Source", "Issues"}, urls
