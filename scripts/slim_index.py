"""Rewrite a committed report folder's ``summary.json`` without the copy of each study's summary that
``NN_*.summary.json`` beside it already holds, losing nothing a reader uses.

    python scripts/slim_index.py reports/cpu-tiny [reports/h200 ...]

``summary.json`` (the runner's index, :func:`fp8lab.report.run_profile`) repeats every study's summary under
``notebooks.<stem>.summary``: about 180 KB per report folder, of a tracked tree held under 32 MiB. Its readers:
the claims audit reads ``ran_on`` and ``parameters`` (:func:`fp8lab.audit.load_report`, kept); a later run into
the same folder keeps the other studies' entries (:func:`fp8lab.report.previous_entries`, which takes an entry's
missing summary from its ``NN_*.summary.json``), so the index it writes shows the same numbers. An entry is
slimmed only where its file holds exactly the same summary; anything else is left as it is.

Idempotent; writes compact JSON, sorted keys, as the runner does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def slim(folder: Path) -> tuple[int, int]:
    """Drop each entry's duplicate summary from ``folder/summary.json``; returns ``(bytes before, bytes after)``."""
    path = folder / "summary.json"
    text = path.read_text()
    index = json.loads(text)
    for stem, entry in (index.get("notebooks") or {}).items():
        f = folder / f"{stem}.summary.json"
        if "summary" in entry and f.is_file() and json.loads(f.read_text()) == entry["summary"]:
            del entry["summary"]
    out = json.dumps(index, sort_keys=True)
    path.write_text(out)
    return len(text.encode()), len(out.encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    for folder in ap.parse_args(argv).folders:
        before, after = slim(folder)
        print(f"{folder / 'summary.json'}: {before:,} -> {after:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
