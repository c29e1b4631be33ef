"""Rewrite a committed report folder's ``summary.json`` without the copy of each study's summary that
``NN_*.summary.json`` beside it already holds, losing nothing a reader uses.

    python scripts/slim_index.py reports/cpu-tiny [reports/h200 ...]

``summary.json`` (the runner's index, :func:`fp8lab.report.run_profile`) repeats every study's summary under
``notebooks.<stem>.summary``: about 180 KB per report folder, of a tracked tree held under 32 MiB. Its readers:
the claims audit reads ``ran_on`` and ``parameters`` (:func:`fp8lab.audit.load_report`, kept); a later run into
the same folder keeps the other studies' entries (:func:`fp8lab.report.run.read_index` takes an entry's missing
summary from its ``NN_*.summary.json``), so the index it writes shows the same numbers. An entry is slimmed only
where its file holds exactly the same summary; anything else is left as it is. The runner writes the index so itself
since 2026-12-03: this script is for folders written before.

Idempotent; writes compact JSON, sorted keys, as the runner does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def slim(folder: Path) -> tuple[int, int]:
    """``folder/summary.json`` as the runner now writes it (:func:`fp8lab.report.run.slim_index`: each entry whose
    file holds its summary names that file instead); returns ``(bytes before, bytes after)``."""
    from fp8lab.report.run import read_index, slim_index

    path = folder / "summary.json"
    before = len(path.read_bytes())
    out = json.dumps(slim_index(folder, read_index(folder)), sort_keys=True)
    path.write_text(out)
    return before, len(out.encode())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    for folder in ap.parse_args(argv).folders:
        before, after = slim(folder)
        print(f"{folder / 'summary.json'}: {before:,} -> {after:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
