"""The doc tests' reading of Markdown fences (tests/fixtures/doc_blocks.py), and every page of
the checkout classified: each fence runs, is data, or says why it does not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.doc_blocks import UnmarkedBlock, blocks

ROOT = Path(__file__).resolve().parents[2]


def _page(tmp_path: Path, text: str) -> Path:
    (tmp_path / "page.md").write_text(text)
    return Path("page.md")


def test_blocks_their_languages_and_markers(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "intro\n```bash\necho hi\n```\n<!-- not run: needs\na cluster -->\n\n"
        "```python\nif x:\n    y = 1\n```\n"
        "- item\n\n  ```sh\n  ls\n  ```\n```text\noutput\n```\n",
    )
    found = blocks(tmp_path, page)
    assert [(b.line, b.language, b.runner, b.not_run) for b in found] == [
        (2, "bash", "shell", None),
        (8, "python", None, "needs a cluster"),
        (14, "sh", "shell", None),
        (17, "text", None, None),
    ]
    assert found[1].text == "if x:\n    y = 1\n" and found[2].text == "ls\n"
    assert found[0].where == "page.md:2"


def test_a_fence_without_a_language_fails_naming_its_line(tmp_path: Path) -> None:
    page = _page(tmp_path, "a\n\n```\nsomething\n```\n```rust\nfn main() {}\n```\n")
    with pytest.raises(UnmarkedBlock) as failed:
        blocks(tmp_path, page)
    assert "page.md:3: a fence without a language" in str(failed.value)
    assert "page.md:6: ```rust is neither run nor known" in str(failed.value)


@pytest.mark.parametrize(
    "page",
    [Path("README.md"), *sorted(p.relative_to(ROOT) for p in ROOT.glob("docs/*.md"))],
    ids=str,
)
def test_every_fence_of_the_docs_is_classified(page: Path) -> None:
    blocks(ROOT, page)
