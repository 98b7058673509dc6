"""docs/results/moe/release_spread.py: configurations matched across Megatron-Bridge releases.

The fixture mimics the summary's two table shapes (a table per model with a System column, and a
table per system with a Model column, as 25.11 writes them) and their quirks: ``a (b)`` cells for a
second quantisation granularity, ``n/a`` for no interleaving, SFT tables and tables without a
precision column (25.09), which must not be matched.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rs():
    spec = importlib.util.spec_from_file_location("release_spread", ROOT / "docs/results/moe/release_spread.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SUMMARY = """
## 26.04 NeMo Container

### Pre-Training Performance

#### Model: Qwen3_30B_a3B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 2 | 1 | 12 | 8 | 9000 | 200 |
| DGX-B200 | 8 | MXFP8 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 8 | 27000 | 600 |

### SFT Performance

#### Model: Qwen3_30B_a3B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 2 | 1 | 12 | 8 | 1 | 1 |

## 26.02 NeMo Container

### Pre-Training Performance

#### System: DGX-H100

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| Qwen3_30B_a3B | 16 | FP8 | 1024 | 1 | 4096 | 0 | 1 | 2 | 1 | 12 | 8 | 64 | 5000 | 110 |
| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 300 (290) | 1 |

#### System: DGX-B200

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| Qwen3_30B_a3B | 8 | MXFP8 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 16 | 26000 | 590 |

## 25.11 NeMo Container

### Pre-Training Performance

#### System: DGX-H100

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| LLAMA3_8B | 8 | FP8-MX | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 310 | 1 |

## 25.09 NeMo Container

### Pre-Training Performance

#### System: DGX-H100

| Model | #-GPUs | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| Qwen3_30B_a3B | 16 | 1024 | 1 | 4096 | 0 | 1 | 2 | 1 | 12 | 8 | 64 | 12000 | 250 |
"""


def test_rows_parsed_from_both_table_shapes(rs):
    rows = rs.parse(SUMMARY)
    releases = sorted({r["release"] for r in rows})
    assert releases == ["25.11", "26.02", "26.04"]  # 25.09 has no precision column: left out
    assert all(r["tokens"] > 5 for r in rows)  # the SFT table's rows are not read
    h100 = [r for r in rows if r["model"] == "Qwen3_30B_a3B" and r["system"] == "DGX-H100"]
    assert sorted(r["tokens"] for r in h100) == [5000, 9000]


def test_a_parenthesised_cell_is_a_second_configuration(rs):
    llama = [r for r in rs.parse(SUMMARY) if r["model"] == "LLAMA3_8B"]
    by = {(r["release"], r["key"][1]): r["tokens"] for r in llama}
    assert by == {("26.02", "FP8-CS"): 300, ("26.02", "FP8-MX"): 290, ("25.11", "FP8-MX"): 310}


def test_spreads_match_equal_configurations_only(rs):
    groups = {(g["model"], g["system"]): g for g in rs.spreads(rs.parse(SUMMARY))}
    # the same H100 layout in 26.04 and 26.02: 9000 / 5000
    h100 = groups[("Qwen3_30B_a3B", "DGX-H100")]
    assert h100["by_release"] == {"26.04": 9000, "26.02": 5000}
    assert h100["spread"] == pytest.approx(1.8)
    # "n/a" and "1" both mean no interleaving
    assert groups[("Qwen3_30B_a3B", "DGX-B200")]["spread"] == pytest.approx(27000 / 26000)
    # the FP8-MX variant of 26.02 and 25.11's FP8-MX row are one configuration; FP8-CS has no partner
    assert groups[("LLAMA3_8B", "DGX-H100")]["by_release"] == {"26.02": 290, "25.11": 310}
    assert len(groups) == 3


def test_command_line(rs, tmp_path, capsys):
    f = tmp_path / "summary.md"
    f.write_text(SUMMARY)
    assert rs.main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "MoE: 2 configurations in 2+ releases; median spread 1.42x" in out
    assert "26.04: 9000, 26.02: 5000 | 1.80x" in out
    assert rs.main([str(tmp_path / "missing.md")]) == 2


LATER = """
## 26.06 NeMo Container

### Pre-Training Performance

#### Model: Qwen3_30B_a3B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-B200 | 8 | MXFP8 | 512 | 4 | 4096 | 1 | 1 | 1 | n/a | 8 | 40000 | 900 |

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 64 | FP8 | 256 | 2 | 8192 | 1 | 1 | 1 | n/a | n/a | 4000 | 1 |

## 26.04 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-H100 | 64 | FP8 | 256 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | n/a | 3000 | 1 |
| DGX-H100 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 3500 | 1 |
"""


def test_a_table_without_the_fsdp_column_matches_on_the_columns_it_has(rs):
    """From 26.06 on the tables have no FSDP column: their rows join the one configuration of an
    older table the other columns agree with (the B200 row of 26.04 and 26.02, FSDP 0), and stay
    apart where two agree (Llama 3 70B with FSDP 0 and 64: which one ran is not written)."""
    groups = rs.spreads(rs.parse(LATER + SUMMARY))
    b200 = [g for g in groups if g["system"] == "DGX-B200"]
    assert len(b200) == 1 and b200[0]["by_release"] == {"26.06": 40000, "26.04": 27000, "26.02": 26000}
    assert b200[0]["spread"] == pytest.approx(40000 / 26000)
    assert not [g for g in groups if g["model"] == "LLAMA3_70B"]  # ambiguous: no pair made
