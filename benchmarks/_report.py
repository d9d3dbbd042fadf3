"""Writing a benchmark's results: its rows as JSON under results/ and a
markdown table beside it, each file written whole or not at all.

    write_report(output, "weak_scaling", rows, intro, columns, quick=False)
    # -> output/results/weak_scaling.json, output/WEAK_SCALING.md
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Sequence


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it onto
    `path`: a reader sees the old file or the new one, never half of one."""
    path = pathlib.Path(path)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def markdown_table(columns: Sequence[tuple[str, Callable[[dict], str]]], rows: Sequence[dict]) -> list[str]:
    """`columns` is (heading, cell function of a row) pairs; one line a row."""
    lines = [
        "| " + " | ".join(heading for heading, _ in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(cell(row) for _, cell in columns) + " |" for row in rows]
    return lines


def write_report(
    output: pathlib.Path,
    name: str,
    rows: Sequence[dict],
    intro: Sequence[str],
    columns: Sequence[tuple[str, Callable[[dict], str]]],
    quick: bool,
) -> str:
    """Writes `output/results/<name>[.quick].json` (the rows) and
    `output/<NAME>[.quick].md` (`intro` lines, a blank line, the table);
    prints the markdown and returns it."""
    suffix = ".quick" if quick else ""
    output = pathlib.Path(output)
    # Both texts first: a row that cannot be written changes neither file.
    rows_json = json.dumps(list(rows), indent=2)
    markdown = "\n".join([*intro, "", *markdown_table(columns, rows)]) + "\n"
    (output / "results").mkdir(parents=True, exist_ok=True)
    write_atomically(output / "results" / f"{name}{suffix}.json", rows_json)
    write_atomically(output / f"{name.upper()}{suffix}.md", markdown)
    print(markdown, end="")
    return markdown
