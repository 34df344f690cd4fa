"""The documentation: the site builds with ``mkdocs build --strict`` (broken links, missing anchors and pages left
out of the nav fail it), the README stays short and its links resolve, and the docs pages the code names exist."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def nav_pages(nav: list) -> list[str]:
    """Every page a mkdocs nav names, in order."""
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links in ``text`` that point into the repository (no URL, no bare anchor)."""
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t.split("#")[0] for t in targets if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def test_relative_links_finds_files_and_skips_urls_and_anchors():
    text = "[a](guide/a.md#x) [b](https://x.org/y.md) [c](#top) ![d](img/p.png) [e](mailto:me@x.org)"
    assert relative_links(text) == ["guide/a.md", "img/p.png"]


def test_nav_pages_flattens_sections():
    nav = [{"Home": "index.md"}, {"Guides": [{"A": "guides/a.md"}, {"B": [{"C": "c.md"}]}]}, "d.md"]
    assert nav_pages(nav) == ["index.md", "guides/a.md", "c.md", "d.md"]


def test_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300, "the README is an overview: move reference material into docs/"
    links = relative_links(text)
    assert len(links) >= 10
    missing = sorted({t for t in links if not (ROOT / t).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config.get("strict") is True
    pages = nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), "a page appears twice in the nav"
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not set(pages) - on_disk, f"nav pages missing from docs/: {sorted(set(pages) - on_disk)}"
    assert not on_disk - set(pages), f"docs pages not in the nav of mkdocs.yml: {sorted(on_disk - set(pages))}"


def test_docs_pages_named_in_code_exist():
    named = set()
    for folder in ("src", "tests", "benchmarks", "scripts", "sweeps"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".yaml"} and path.is_file() and path != Path(__file__).resolve():
                named |= set(re.findall(r"\bdocs/[\w/.-]+?\.md\b", path.read_text(encoding="utf-8", errors="replace")))
    named |= set(re.findall(r"\bdocs/[\w/.-]+?\.md\b", (ROOT / "Makefile").read_text(encoding="utf-8")))
    assert "docs/design.md" in named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"the code names docs pages that do not exist: {missing}"


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers")),
                    reason="the docs extra is not installed (pip install -e '.[docs]'; make setup installs it)")
def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="teachkit.api.distill"' in api, "the API page was not generated from the docstrings"
