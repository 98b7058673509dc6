"""The validation suite's loader, runner, outputs, and the one-calibration-per-family rule."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
import yaml

from simulator.cli.validate import main as cli_main
from simulator.engine import compute as compute_mod
from simulator.scenario.loading import load_scenario
from simulator.studies import validate as v

# Three tiny validation-style cases: two on A100s (one pipelined), one on H100s.
_GPT = {"preset": "megatron-gpt-1.7b", "layers": 4, "vocab": 1024}


def _case(name, cluster, devices, parallel, schedule="1f1b", metric="step_time_s", value=0.1, gbs=8):
    return {
        "name": name,
        "published": {"metric": metric, "value": value, "unit": "s", "source": "synthetic test case"},
        "assumptions": ["a made-up figure for testing"],
        "model": _GPT,
        "cluster": {"preset": cluster, "devices": devices},
        "parallel": parallel,
        "schedule": schedule,
        "training": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": gbs, "recompute": "full"},
    }


TINY = [
    _case("tiny-a100-dp", "dgx-a100", 8, {"tp": 2, "pp": 1, "dp": 4}),
    _case(
        "tiny-a100-pp",
        "dgx-a100",
        8,
        {"tp": 2, "pp": 2, "dp": 2, "vpp": 2},
        "interleaved-1f1b",
        metric="hw_tflops_per_device",
        value=150.0,
    ),
    _case("tiny-h100", "dgx-h100", 8, {"tp": 4, "pp": 1, "dp": 2}, metric="mfu", value=0.5),
]


@pytest.fixture
def suite(tmp_path):
    for c in TINY:
        (tmp_path / "synthetic").mkdir(exist_ok=True)
        (tmp_path / "synthetic" / f"{c['name']}.yaml").write_text(yaml.safe_dump(c))
    return tmp_path


def test_case_keys_are_stripped_before_the_scenario_loader():
    case = v.load_case(TINY[0])
    assert "published" not in case.scenario and "assumptions" not in case.scenario
    assert case.metric == "step_time_s" and case.published == 0.1
    load_scenario(case.scenario)  # the loader forbids unknown keys: this must pass


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"published": None}, "published"),
        ({"published": {"metric": "speed", "value": 1, "source": "x"}}, "published.metric"),
        ({"published": {"metric": "mfu", "value": -1, "source": "x"}}, "published.value"),
        ({"published": {"metric": "mfu", "value": 0.5}}, "published.source"),
    ],
)
def test_bad_cases_are_refused_with_the_key(bad, message):
    with pytest.raises(v.ValidationError, match=message):
        v.load_case({**TINY[0], **bad})


def test_every_suite_case_is_valid_sourced_and_has_no_per_case_calibration():
    cases = v.discover()
    assert len(cases) >= 20
    groups = {c.path.parent.name for c in cases}
    assert {"narayanan2021", "korthikanti2022", "megascale2024", "dgxc"} <= groups
    assert sum(c.path.parent.name == "narayanan2021" for c in cases) == 10
    for c in cases:
        sc = load_scenario(c.scenario)
        assert c.source and c.metric in v.METRICS
        # One calibration per chip family: a case may not carry its own knobs.
        assert "compute" not in c.scenario, c.name
        assert sc.cluster.chip.family in ("ampere", "hopper", "blackwell", "tpu")


def test_glob_selects_by_name_or_folder():
    assert [c.name for c in v.discover(["narayanan21-1.7b"])] == ["narayanan21-1.7b"]
    assert len(v.discover(["korthikanti2022/*"])) == 4
    with pytest.raises(v.ValidationError, match="matches no case"):
        v.discover(["no-such-case"])


def test_a_family_parameter_moves_every_case_of_that_family(monkeypatch):
    cases = [v.load_case(c) for c in TINY]
    base = {r.case.name: r.simulated for r in v.run_suite(cases)}
    ampere = compute_mod.DEFAULT_COMPUTE_CALIBRATION["ampere"]
    table = dict(compute_mod.DEFAULT_COMPUTE_CALIBRATION)
    table["ampere"] = dataclasses.replace(ampere, gemm_efficiency=ampere.gemm_efficiency * 0.8)
    monkeypatch.setattr(compute_mod, "DEFAULT_COMPUTE_CALIBRATION", table)
    slower = {r.case.name: r.simulated for r in v.run_suite(cases)}
    # Slower GEMMs: longer steps, lower FLOP rates, on both A100 cases; H100 untouched.
    assert slower["tiny-a100-dp"] > base["tiny-a100-dp"] * 1.05
    assert slower["tiny-a100-pp"] < base["tiny-a100-pp"] / 1.05
    assert slower["tiny-h100"] == base["tiny-h100"]


def test_compute_overrides_apply_to_every_case_alike():
    cases = [v.load_case(c) for c in TINY]
    hi = v.run_suite(cases, compute={"gemm_efficiency": 0.9})
    lo = v.run_suite(cases, compute={"gemm_efficiency": 0.6})
    for a, b in zip(hi, lo):
        assert a.error != b.error, a.case.name


@pytest.mark.slow
def test_validate_command_writes_table_csv_and_plot(suite, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli_main(["validate", "--suite", str(suite), "--out", str(out), "--jobs", "1", "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "median |error|" in text and "worst |error|" in text and "tiny-h100" in text
    rows = list(csv.DictReader((out / "validation.csv").open()))
    assert list(rows[0]) == [
        "case",
        "metric",
        "published",
        "simulated",
        "error",
        "source",
        "peak_memory_bytes",
        "oom",
        "family",
        "kind",
        "speed_error",
    ]
    assert len(rows) == 3
    for r in rows:
        assert float(r["error"]) == pytest.approx(float(r["simulated"]) / float(r["published"]) - 1)
        assert r["family"] in ("ampere", "hopper", "blackwell", "tpu")
        assert r["kind"] == "dense"  # the tiny models have no experts
        sign = -1 if r["metric"] == "step_time_s" else 1
        assert float(r["speed_error"]) == pytest.approx(sign * float(r["error"]))
    # one line per chip family under the table, with its median over the speed cases
    fams = {r["family"] for r in rows}
    for fam in fams:
        assert f"  {fam}: " in text
    assert (out / "parity.png").stat().st_size > 1000


def test_family_stats_are_medians_over_each_familys_speed_cases():
    case = v.load_case(TINY[0])

    def res(name, fam, metric, published, simulated):
        c = v.Case(name, None, case.scenario, metric, published, "", "")
        return v.CaseResult(c, simulated, 0.0, {"chip_family": fam})

    rs = [
        res("a", "hopper", "step_time_s", 1.0, 1.10),
        res("b", "hopper", "step_time_s", 1.0, 0.98),
        res("c", "hopper", "mfu", 0.5, 0.45),
        res("d", "tpu", "step_time_s", 2.0, 2.2),
        res("m", "hopper", "oom", 1.0, 1.0),
        res("z", "hopper", "model_state_bytes", 10.0, 10.0),
    ]
    st = v.family_stats(rs)
    assert list(st) == ["hopper", "tpu"]  # FAMILY_ORDER
    n, med, worst, name = st["hopper"]
    assert n == 3 and med == pytest.approx(0.10) and worst == pytest.approx(0.10) and name == "a"
    assert st["tpu"][:3] == (1, pytest.approx(0.10), pytest.approx(0.10))
    assert v.family_stats(rs, timing_only=False)["hopper"][0] == 5


def test_kind_stats_sign_errors_by_speed_over_each_kinds_speed_cases():
    case = v.load_case(TINY[0])

    def res(name, moe, metric, published, simulated):
        c = v.Case(name, None, case.scenario, metric, published, "", "")
        return v.CaseResult(c, simulated, 0.0, {"chip_family": "hopper", "moe": moe})

    rs = [
        res("t-fast", True, "step_time_s", 10.0, 9.0),  # 10 % too short: faster, +10 %
        res("t-slow", True, "step_time_s", 10.0, 10.4),  # 4 % too long: slower, -4 %
        res("x-fast", True, "tokens_per_s", 100.0, 106.0),  # 6 % too many tokens: faster, +6 %
        res("m", True, "peak_memory_bytes", 10.0, 20.0),  # not a speed: left out
        res("o", True, "oom", 1.0, 0.0),
        res("d", False, "mfu", 0.5, 0.49),  # dense, 2 % slower
    ]
    assert [r.speed_error for r in rs[:3]] == [pytest.approx(0.10), pytest.approx(-0.04), pytest.approx(0.06)]
    assert math.isnan(rs[3].speed_error) and [r.kind for r in rs] == ["moe"] * 5 + ["dense"]
    st = v.kind_stats(rs)
    assert list(st) == ["moe", "dense"]
    assert st["moe"] == (3, pytest.approx(0.06), pytest.approx(0.06))
    assert st["dense"] == (1, pytest.approx(0.02), pytest.approx(-0.02))
    text = v.format_table(rs)
    assert "  moe: 3 speed cases; median |error| 6.0%; median speed-signed error +6.0%" in text
    assert "  dense: 1 speed cases; median |error| 2.0%; median speed-signed error -2.0%" in text
    assert "moe" not in v.kind_stats(rs[3:5])


def test_validate_subset_and_max_error_exit_code(suite):
    assert cli_main(["validate", "--suite", str(suite), "--cases", "tiny-h100", "--quiet", "--max-error", "1e-9"]) == 3
    assert cli_main(["validate", "--suite", str(suite), "--cases", "nothing*", "--quiet"]) == 2


@pytest.mark.slow
def test_a_failing_case_is_counted_the_others_reported_and_the_exit_code_is_4(suite, tmp_path, capsys):
    broken = _case("tiny-broken", "dgx-a100", 8, {"tp": 3, "pp": 1})  # tp 3 does not divide 8 devices
    (suite / "synthetic" / "tiny-broken.yaml").write_text(yaml.safe_dump(broken))
    out = tmp_path / "out"
    # Two worker processes: failures come back from the pool too.
    rc = cli_main(["validate", "--suite", str(suite), "--out", str(out), "--jobs", "2", "--quiet"])
    assert rc == 4
    cap = capsys.readouterr()
    assert "1 of 4 cases failed" in cap.err and "tiny-broken.yaml" in cap.err and "parallel" in cap.err
    assert "3 cases; median |error|" in cap.out
    assert len(list(csv.DictReader((out / "validation.csv").open()))) == 3
    # The library call still raises unless asked to collect.
    cases = v.discover(["tiny-broken"], root=suite)
    with pytest.raises(v.ValidationError, match="tiny-broken.yaml"):
        v.run_suite(cases)
    failures = []
    assert v.run_suite(cases, failures=failures) == [] and [f.case.name for f in failures] == ["tiny-broken"]


def test_the_built_in_suite_is_found_in_a_checkout():
    # A checkout has the cases in validation/; an installed wheel in simulator/validation_cases/
    # (tests/test_packaging.py checks that one).
    import pathlib

    assert pathlib.Path(v.__file__).resolve().parents[3] / "validation" == v.SUITE_DIR
    assert [c.name for c in v.discover(["korthikanti2022/*"])] == [
        "korthikanti22-175b",
        "korthikanti22-1t",
        "korthikanti22-22b",
        "korthikanti22-530b",
    ]


def test_suite_spans_four_chip_families_and_six_moe_cases():
    # Issue 15 item 3: TPU, Blackwell and mixture-of-experts cases beside the A100/H100
    # dense ones. Counted from the case files, not from a list kept here.
    cases = v.discover()
    scenarios = {c.name: load_scenario(c.scenario) for c in cases}
    families = {sc.cluster.chip.family for sc in scenarios.values()}
    assert {"ampere", "hopper", "blackwell", "tpu"} <= families
    assert sum(sc.model.moe is not None for sc in scenarios.values()) >= 6
    by_family = {f: sum(sc.cluster.chip.family == f for sc in scenarios.values()) for f in families}
    assert by_family["tpu"] >= 4 and by_family["blackwell"] >= 4, by_family


NEW_FOLDERS = ("maxtext", "nemo-perf")
NEW_DGXC = ("dgxc-grok1-512xh100",)


def test_issue15_cases_carry_source_metric_and_assumptions():
    new = [c for c in v.discover() if c.path.parent.name in NEW_FOLDERS or c.name in NEW_DGXC]
    assert len(new) >= 13
    for c in new:
        assert c.metric in v.METRICS and c.published > 0, c.name
        # A source names the repository or page and the table/row the figure comes from.
        assert len(c.source) > 40 and ("table" in c.source.lower() or "row" in c.source.lower()), c.name
        assert c.unit, c.name
        assert len(c.assumptions) >= 3, c.name


# The authors' own reproduction script for Narayanan et al. 2021 Table 1:
# examples/sc21/run_table_1.sh in NVIDIA/Megatron-LM (commit de7dc40, 2021-08-10, "scripts
# for sc21"): micro-batch size, --DDP-impl (torch: PyTorch DDP, whose bucketed all-reduce
# overlaps the backward pass; local: Megatron's DDP, reduced after it) and
# --num-layers-per-virtual-pipeline-stage (absent: non-interleaved 1F1B).
_SC21_TABLE1 = {  # case: (micro-batch, DDP impl, layers per virtual stage)
    "narayanan21-1.7b": (16, "torch", None),
    "narayanan21-3.6b": (16, "torch", None),
    "narayanan21-7.5b": (16, "torch", None),
    "narayanan21-18.4b": (8, "torch", None),
    "narayanan21-39.1b": (4, "local", None),
    "narayanan21-76.1b": (2, "local", 5),
    "narayanan21-145.6b": (2, "local", 5),
    "narayanan21-310.1b": (1, "local", 3),
    "narayanan21-529.6b": (1, "local", 1),
    "narayanan21-1008b": (1, "local", None),
}


def test_narayanan_cases_follow_the_authors_table1_script():
    cases = {c.name: c for c in v.discover(["narayanan2021/*"])}
    assert set(cases) == set(_SC21_TABLE1)
    for name, (mbs, ddp, per_virtual) in _SC21_TABLE1.items():
        sc = load_scenario(cases[name].scenario_with())
        assert sc.training.micro_batch_size == mbs, name
        assert sc.training.overlap_grad_reduce == (ddp == "torch"), name
        per_stage = sc.model.layers // sc.layout.pp
        vpp = per_stage // per_virtual if per_virtual else 1
        assert sc.layout.vpp == vpp, name
        assert sc.schedule == ("interleaved-1f1b" if vpp > 1 else "1f1b"), name


@pytest.mark.slow
def test_narayanan_small_rows_within_five_percent():
    # Narayanan et al. 2021 Table 1: 137 / 138 TFLOP/s per GPU for 1.7B (t=1) and 3.6B (t=2).
    # With micro-batch 1 (not the script's 16) and 26 B per score element in the unfused
    # attention backward (not 17) these rows were 11-12% slow.
    for name, published in (("narayanan21-1.7b", 137.0), ("narayanan21-3.6b", 138.0)):
        (case,) = v.discover([name])
        assert case.published == published
        assert v.run_case(case).simulated == pytest.approx(published, rel=0.05), name


def test_maxtext_tpu_cases_fit_the_memory_xla_lets_them_allocate():
    """Every MaxText case ran (AI-Hypercomputer/maxtext MaxText/configs/v5e/README.md and
    v5p/README.md, sources in each case file), so it fits: the 64B model on 256 v5e chips
    (15.75 GiB each, the limit XLA's out-of-memory report gives)
    peaked at 17.2 GB while its ZeRO-3 gradient buffer held a whole layer in FP32; GSPMD
    reduce-scatters one weight array at a time (grad_reduce_granularity tensor)."""
    results = v.run_suite(v.discover(["maxtext/*"]), jobs=1)
    assert len(results) == 6
    for r in results:
        assert r.summary["oom"] is False, (r.case.name, r.summary["peak_memory_bytes"])
    (v5e64,) = [r for r in results if r.case.name == "maxtext-64b-256xv5e"]
    assert 14e9 < v5e64.summary["peak_memory_bytes"] < 15e9


@pytest.mark.slow
def test_hopper_bf16_gemm_refit_puts_the_dense_dgx_cloud_rows_within_five_percent():
    """The Hopper BF16 GEMM efficiency (0.64, simulator/engine/compute.py) against the dense
    NeMo DGX Cloud rows on H100 (NVIDIA dgxc-benchmarking READMEs, sources in each case file:
    GPT-3 175B on 128 / 2,048, Llama 3.1 70B on 64 / 2,048, Nemotron-4 340B on 128 / 2,048
    GPUs). At the previous 0.68 the GPT-3 rows were 8.6 / 9.7 % fast. 0.64 was chosen while the
    sequence-parallel backward's reduce-scatter ran exposed; with it beside the weight gradients
    and the recipes' TP-communication overlap with their SM counts (2026-12-07) the rows are
    -6.5 / -7.7 % (GPT-3: its bulk overlaps share the GEMMs' SMs, whose extra wave is not
    modelled, docs/limits.md), -1.7 / -3.3 % (Llama 3.1 70B), +1.4 / -3.2 % (Nemotron-4) in
    step time."""
    names = [
        "dgxc-gpt3-175b-128xh100",
        "dgxc-gpt3-175b-2048xh100",
        "dgxc-llama31-70b-64xh100",
        "dgxc-llama31-70b-2048xh100",
        "dgxc-nemotron4-340b-128xh100",
        "dgxc-nemotron4-340b-2048xh100",
    ]
    results = v.run_suite(v.discover(names), jobs=1)
    assert len(results) == 6
    for r in results:
        assert abs(r.error) <= 0.08, (r.case.name, r.error)
    assert sum(sorted(abs(r.error) for r in results)[2:4]) / 2 <= 0.05  # the median


# The MoE cases' recipe settings that stepsim models (issue 40), from each case's recipe; the
# sources are in the case files' assumptions. A setting dropped or changed fails here.
#: What Megatron-Bridge 26.04.01's MXFP8 recipes set (bf16_with_mxfp8_mixed, BF16 gradients and dispatch).
_MXFP8 = {"fp8_recipe": "mxfp8", "fp8_params": True, "grad_dtype": "bf16", "moe_dispatch_dtype": "bf16"}

_MOE_RECIPE_SETTINGS = {
    "dgxc-deepseek-v3-512xh100": {
        "moe_router_dtype": "fp32",
        "moe_shared_expert_overlap": True,
        "moe_host_sync": False,
        "pad_to_capacity": True,
    },
    "dgxc-deepseek-v3-128xgb200": {
        "moe_router_dtype": "fp32",
        "moe_shared_expert_overlap": True,
        "moe_host_sync": False,
        "pad_to_capacity": True,
    },
    "dgxc-grok1-512xh100": {"tp_comm_overlap": True, "moe_host_sync": False, "pad_to_capacity": True},
    "mbridge-deepseek-v3-256xgb200-bf16": {"moe_router_dtype": "fp32", "cuda_graphs": "per-layer"},
    "mbridge-qwen3-235b-256xgb200-bf16": {"grad_dtype": "bf16", "cuda_graphs": "per-layer"},
    "mbridge-qwen3-235b-256xh100-fp8": {
        "grad_dtype": "bf16",
        "overlap_moe_expert_parallel_comm": True,
        "moe_dispatch_dtype": "bf16",
    },
    "mbridge-qwen3-30b-16xh100-fp8": {"grad_dtype": "bf16", "moe_dispatch_dtype": "bf16"},
    # Megatron-Bridge 26.04.01 (v0.4.2): MXFP8 on Blackwell, FP8 parameters, BF16 dispatch
    "mbridge-qwen3-30b-8xb200-mxfp8": {**_MXFP8, "moe_token_dispatcher": "flex", "cuda_graphs": "per-layer"},
    # the MXFP8 preset graphs the router alone
    "mbridge-qwen3-30b-8xgb200-mxfp8": {**_MXFP8, "moe_token_dispatcher": "flex", "cuda_graphs": "none"},
    "mbridge-qwen3-235b-256xgb200-mxfp8": {**_MXFP8, "moe_token_dispatcher": "flex", "cuda_graphs": "per-layer"},
    "mbridge-qwen3-235b-256xb200-mxfp8": {**_MXFP8, "moe_token_dispatcher": "alltoall"},
    "mbridge-qwen3-235b-256xh100-fp8-gbs8192": {
        "fp8_params": True,
        "grad_dtype": "bf16",
        "overlap_moe_expert_parallel_comm": True,
        "moe_dispatch_dtype": "bf16",
    },
    "mbridge-deepseek-v3-256xgb200-mxfp8": {
        **_MXFP8,
        "moe_router_dtype": "fp32",
        "moe_token_dispatcher": "flex",
        "cuda_graphs": "per-layer",
    },
    "mbridge-deepseek-v3-256xb200-mxfp8": {
        **_MXFP8,
        "moe_router_dtype": "fp32",
        "moe_token_dispatcher": "flex",
        "cuda_graphs": "per-layer",
        "overlap_moe_expert_parallel_comm": True,
    },
    # Megatron-Bridge 26.08 (v0.6.0): the same layouts as three 26.04.01 rows, with the release's full-iteration
    # CUDA graph, sync-free HybridEP budget, batch-level all-to-all overlap and fused grouped MLP
    **{
        name: {
            **_MXFP8,
            "moe_token_dispatcher": "flex",
            "cuda_graphs": "full",
            "moe_host_sync": False,
            "overlap_moe_expert_parallel_comm": True,
            "moe_expert_gemm": "fused-mlp",
        }
        for name in (
            "mbridge-qwen3-30b-8xgb200-mxfp8-2608",
            "mbridge-qwen3-235b-256xgb200-mxfp8-2608",
            "mbridge-deepseek-v3-256xgb200-mxfp8-2608",
            # the table's GB300 rows of the same models (the gb300 preset)
            "mbridge-qwen3-30b-8xgb300-mxfp8-2608",
            "mbridge-qwen3-235b-256xgb300-mxfp8-2608",
            "mbridge-deepseek-v3-256xgb300-mxfp8-2608",
        )
    },
    "nemo-mixtral-8x7b-64xb200-fp8": {
        "fp8_recipe": "delayed",  # NeMo 25.02's bf16_with_fp8_mixed(); core_r0.11.0 has no other
        "fp8_params": True,
        "grad_dtype": "bf16",
        "moe_dispatch_dtype": "bf16",
        "cuda_graphs": "per-layer",
        "moe_host_sync": False,
        "pad_to_capacity": True,
    },
    "nemo-mixtral-8x7b-64xgb200-fp8": {
        "fp8_recipe": "tensorwise",  # NeMo 25.04's bf16_with_fp8_current_scaling_mixed()
        "fp8_params": True,
        "grad_dtype": "bf16",
        "moe_dispatch_dtype": "bf16",
        "cuda_graphs": "per-layer",
        "moe_host_sync": False,
        "pad_to_capacity": True,
    },
}


def test_moe_cases_carry_their_recipes_settings_each_with_its_source():
    cases = {c.name: c for c in v.discover() if load_scenario(c.scenario_with()).model.is_moe}
    assert set(cases) == set(_MOE_RECIPE_SETTINGS)
    for name, want in _MOE_RECIPE_SETTINGS.items():
        case = cases[name]
        tr = load_scenario(case.scenario_with()).training
        for key, value in want.items():
            if key == "pad_to_capacity":
                load = case.scenario["training"]["expert_load"]
                assert load["pad_to_capacity"] is True and load["capacity_factor"] == 1.0, name
            else:
                assert getattr(tr, key) == value, (name, key)
            # the setting's source is written down beside it
            said = "expert_load" if key == "pad_to_capacity" else key
            assert any(a.startswith(said) or f" {said} " in a for a in case.assumptions), (name, key)


def test_cases_are_found_by_name_path_and_path_without_suffix():
    for pattern in ("dgxc-grok1-512xh100", "dgxc/dgxc-grok1-512xh100", "dgxc/dgxc-grok1-512xh100.yaml", "dgxc/*grok*"):
        assert [c.name for c in v.discover([pattern])] == ["dgxc-grok1-512xh100"], pattern
    with pytest.raises(v.ValidationError, match="matches no case"):
        v.discover(["dgxc/grok1"])
