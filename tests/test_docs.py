"""The user-facing pages: the README stays a short manual, and every relative link in it, in docs/ and in
benchmarks/README.md names a file that exists."""

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "CHANGELOG.md", "DEVELOPERS.md", "benchmarks/README.md"] + \
    sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))


def test_the_readme_is_a_short_manual():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 250
    # no lab notebook on the first page: commit hashes, dated runs, errata
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", text), re.findall(r"\b[0-9a-f]{7,40}\b", text)
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert "erratum" not in text.lower() and "What the issue asks" not in text


def test_every_relative_link_of_the_pages_exists():
    missing = []
    for page in PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            if not os.path.exists(os.path.join(REPO, os.path.dirname(page), target)):
                missing.append(f"{page}: {target}")
    assert not missing, missing
