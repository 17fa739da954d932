"""docs/using.md's option reference is the magic's own help (regenerate: python tests/test_docs.py)."""

from __future__ import annotations

import os
import re
import sys

USING = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "using.md")
BLOCK = re.compile(r"(<!-- options:start -->\n```\n)(.*?)(```\n<!-- options:end -->)", re.DOTALL)


def option_help() -> str:
    """The parser's help at a fixed width, so the text does not depend on the terminal."""
    from mpi_magic.magic import MpiMagics

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        return MpiMagics.mpirun_remote.parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def test_the_option_reference_in_docs_matches_the_magics_help():
    with open(USING, encoding="utf-8") as f:
        match = BLOCK.search(f.read())
    assert match, "docs/using.md lost its options block"
    assert match.group(2) == option_help(), "docs/using.md is out of date: run python tests/test_docs.py"


if __name__ == "__main__":
    with open(USING, encoding="utf-8") as f:
        text = f.read()
    with open(USING, "w", encoding="utf-8") as f:
        f.write(BLOCK.sub(lambda m: m.group(1) + option_help() + m.group(3), text))
    sys.exit(0)
