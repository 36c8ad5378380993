"""The repository stands alone and its documentation follows the policy registry.

A user who clones simlab has only the tracked files: nothing may point at notes or papers kept
beside the repository, or at a path of the machine a file was made on. Every registered policy
has a page under docs/policies/ that names it, cites its paper (or says why no arXiv id is
given) and lists its parameters with the defaults the code declares.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from simlab.policies import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
POLICY_DOCS = ROOT / "docs" / "policies"

# Written so that this file does not match itself.
OUTSIDE_REFERENCES = re.compile(
    r"\.\./shared|shared/+papers|shared\s+folder|DESIGN\.md|baselines\.md|papers/[\w-]+\.md"
    r"|(?<![\w.~])/(?:root|work)\b"
)
ARXIV_ID = re.compile(r"arXiv:\d{4}\.\d{4,5}")
NO_ARXIV = re.compile(r"no arXiv identifier", re.IGNORECASE)
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """The file's text, or None for binary files (Parquet, images) and files not checked out."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def outside_references(text: str) -> list[str]:
    return [m.group(0) for m in OUTSIDE_REFERENCES.finditer(text)]


def test_the_reference_pattern_catches_what_a_clone_lacks():
    # (assembled from pieces, so that this file holds none of them)
    leaks = ["see " + "/".join(["..", "shared", "papers", "spide.md"]), "DESIGN" + ".md, §2",
             "baselines" + ".md §4", "(papers" + "/pacer.md)", "the shared" + " folder",
             '"trace": "/' + 'root/.cache/simlab/x"', "cd /" + "work/main &&"]
    assert all(outside_references(text) for text in leaks)
    fine = ["docs/policies/spide.md", "~/.cache/simlab/live-traces", "a framework/worker split",
            "https://huggingface.co/papers/2405.19715", "SPIDE §3.2"]
    assert not any(outside_references(text) for text in fine)


def test_no_tracked_file_points_outside_the_repository():
    found = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {hit}" for hit in outside_references(line)]
    assert not found, "files a clone does not have, or machine paths:\n" + "\n".join(found)


def pages() -> dict[Path, str]:
    return {page: page.read_text(encoding="utf-8") for page in sorted(POLICY_DOCS.glob("*.md"))}


def page_of(name: str, docs: dict[Path, str]) -> tuple[Path, str]:
    """The docs/policies page that names policy ``name`` in its title (the first line)."""
    found = [(page, text) for page, text in docs.items() if f"`{name}`" in text.splitlines()[0]]
    assert len(found) == 1, f"policy {name!r} needs exactly one docs/policies page titled with `{name}`, got " \
                            f"{[p.name for p, _ in found]}"
    return found[0]


def default_text(value) -> str:
    """A default as the pages (and `simlab policies`) print it."""
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_policy_has_a_page_with_its_paper_and_parameters(name):
    page, text = page_of(name, pages())
    assert ARXIV_ID.search(text) or NO_ARXIV.search(text), f"{page.name} cites no arXiv id and does not say why"
    assert "\n## Parameters" in text and "\n## Choices" in text, f"{page.name} lacks its parameters or its choices"
    for param in REGISTRY[name].params:
        row = f"`{param.name}` | {default_text(param.default)} |"
        assert row in text, f"{page.name} must list {name}'s parameter as '{row}' (the code's default)"


def test_every_policy_page_belongs_to_a_registered_policy():
    docs = pages()
    titled = {page for name in REGISTRY for page in [page_of(name, docs)[0]]}
    assert set(docs) == titled, f"pages for no registered policy: {sorted(p.name for p in set(docs) - titled)}"


def test_relative_links_in_the_documentation_resolve():
    broken = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in MARKDOWN_LINK.findall(path.read_text(encoding="utf-8")):
            target = target.split("#", 1)[0]
            if not target or "://" in target:
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
