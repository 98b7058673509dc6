"""How far one configuration's published throughput moves between framework releases.

    python docs/results/moe/release_spread.py PERFORMANCE_SUMMARY.md [...]  # a table per kind

Reads Megatron-Bridge's performance summaries (``docs/performance-summary.md`` and
``docs/performance-summary-archive.md`` of NVIDIA-NeMo/Megatron-Bridge) and prints every
pre-training configuration published in two or more releases with the same system, GPU count,
precision, batch, sequence length and layout (FSDP, TP, PP, CP, VP, EP), with its tokens/s/GPU
in each release and the spread (largest over smallest), MoE models and dense ones apart. A
cell written ``a (b)`` is two configurations (the table's second quantisation granularity);
tables without a precision column (25.09) are left out, since their rows cannot be matched; a
table without the FSDP column (26.06 on) matches on the columns it has (:func:`spreads`).
Where a release's table was revised, the file's own (latest) figure is the one read.

The spread bounds how closely any simulator can match rows taken from different releases: the
same configuration on the same hardware moved by as much between releases
(``docs/results/moe/release_spread.md``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from statistics import median

#: Columns that make two rows the same configuration (besides model and system).
KEY_COLUMNS = ("#-GPUs", "Precision", "GBS", "MBS", "Sequence Length", "FSDP", "TP", "PP", "CP", "VP", "EP")
THROUGHPUT = "Tokens / sec / GPU"
#: Model names (as the tables write them) of mixture-of-experts models.
MOE_PATTERN = re.compile(r"deepseek|qwen3_(30b|235b)|gpt.?oss|mixtral|kimi|nemotron_3|grok", re.IGNORECASE)
_CELL = re.compile(r"^\s*([^()]*?)\s*(?:\(([^()]*)\))?\s*$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _variants(cell: str) -> tuple[str, str]:
    """``'4 (8)'`` -> ``('4', '8')``; ``'4'`` -> ``('4', '4')``."""
    m = _CELL.match(cell)
    if m is None:
        return cell, cell
    first = m.group(1)
    return first, m.group(2).strip() if m.group(2) else first


def _normal(column: str, value: str) -> str:
    """One spelling per meaning: no interleaving and no expert parallelism are ``1``."""
    v = value.replace(" ", "")
    if column in ("VP", "EP") and v.lower() in ("n/a", "na", "-", ""):
        return "1"
    return v


def parse(text: str) -> list[dict]:
    """Every pre-training row of a performance summary: ``{release, model, system, key, tokens}``
    (``key`` the configuration columns, ``None`` where the table has no such column)."""
    rows: list[dict] = []
    release = section = context_kind = context = None
    header: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.match(r"##\s+(\S+)\s+NeMo Container", line)
            release = m.group(1) if m else None
            header = None
        elif line.startswith("### "):
            section = line[4:].strip()
            header = None
        elif line.startswith("#### "):
            head = line[5:].strip()
            context_kind, _, context = head.partition(":")
            context_kind, context = context_kind.strip().lower(), context.strip()
            header = None
        elif line.startswith("|"):
            cells = _cells(line)
            if header is None:
                header = cells
                continue
            if set("".join(cells)) <= set("-: "):
                continue
            if release is None or section != "Pre-Training Performance" or len(cells) != len(header):
                continue
            row = dict(zip(header, cells))
            if "Precision" not in row or THROUGHPUT not in row:
                continue
            for v in (0, 1):
                pick = {c: _normal(c, _variants(x)[v]) for c, x in row.items()}
                model = pick.get("Model", context if context_kind == "model" else None)
                system = pick.get("System", context if context_kind == "system" else None)
                try:
                    tokens = float(pick[THROUGHPUT])
                except ValueError:
                    continue
                key = tuple(pick.get(c) for c in KEY_COLUMNS)
                rows.append({"release": release, "model": model, "system": system, "key": key, "tokens": tokens})
                if all(_variants(x)[0] == _variants(x)[1] for x in row.values()):
                    break  # no second configuration in this row
    return rows


def _agree(a: tuple, b: tuple) -> bool:
    """Keys that name the same configuration where a column one table lacks (``None``) may hold
    any value."""
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def spreads(rows: list[dict]) -> list[dict]:
    """Configurations published in two or more releases: ``{model, system, key, by_release,
    spread}`` (``by_release``: release -> tokens/s/GPU; ``spread``: largest / smallest). Rows of a
    table without one of the key columns (the FSDP column is gone from 26.06 on) join the one
    configuration of a fuller table their other columns agree with, and stay apart where they agree
    with several."""
    groups: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        groups[(r["model"], r["system"], r["key"])].setdefault(r["release"], r["tokens"])
    full = [g for g in groups if None not in g[2]]
    for g in [g for g in groups if None in g[2]]:
        match = [f for f in full if f[:2] == g[:2] and _agree(f[2], g[2])]
        if len(match) == 1:
            for release, tokens in groups.pop(g).items():
                groups[match[0]].setdefault(release, tokens)
    out = []
    for (model, system, key), by_release in groups.items():
        if len(by_release) >= 2:
            vals = list(by_release.values())
            out.append({"model": model, "system": system, "key": key, "by_release": by_release,
                        "spread": max(vals) / min(vals)})  # fmt: skip
    return sorted(out, key=lambda g: (not MOE_PATTERN.search(g["model"] or ""), -g["spread"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="Megatron-Bridge performance-summary markdown files")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                rows += parse(f.read())
        except OSError as err:
            print(f"release_spread: {path}: {err.strerror}", file=sys.stderr)
            return 2
    groups = spreads(rows)
    if not groups:
        print("release_spread: no configuration appears in two releases", file=sys.stderr)
        return 2
    cols = " ".join(c.split()[0] for c in KEY_COLUMNS)
    for kind, is_moe in (("MoE", True), ("dense", False)):
        mine = [g for g in groups if bool(MOE_PATTERN.search(g["model"] or "")) == is_moe]
        print(f"{kind}: {len(mine)} configurations in 2+ releases; median spread "
              f"{median(g['spread'] for g in mine) if mine else float('nan'):.2f}x")  # fmt: skip
        print(f"  model | system | {cols} | tokens/s/GPU by release | spread")
        for g in mine:
            rel = ", ".join(f"{r}: {t:g}" for r, t in g["by_release"].items())
            print(f"  {g['model']} | {g['system']} | {' '.join(str(k) for k in g['key'])} | {rel} | {g['spread']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
