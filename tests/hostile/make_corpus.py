"""Writes the hostile-input corpus: tests/hostile/files/* and tests/hostile/cases.yaml.

    PYTHONPATH=. python tests/hostile/make_corpus.py

Each case is an input a user could give by mistake or on purpose, run through the
command line by tests/test_hostile_inputs.py. Expected outcome of every case: exit 2
and a one-line message containing each of ``msg`` (the field or the file at fault);
never a traceback, a hang or more than 2 GB. ``args`` is the command line, with
``{file}`` the case's file, ``{dir}`` the files folder and ``{out}`` a fresh folder.
``subprocess: true`` cases also run in a child process under a 2 GB address-space
limit and a time limit.
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
FILES = HERE / "files"

TINY_MODEL = {"name": "tiny", "layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 512, "vocab": 1000}
BASE = {
    "model": dict(TINY_MODEL),
    "cluster": {"preset": "dgx-h100", "devices": 8},
    "parallel": {"tp": 2, "pp": 2},
    "training": {"seq_len": 128, "global_batch_size": 4},
}
BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False)

cases: dict[str, dict] = {}


def case(name: str, content, msg, args=None, ext=".yaml", subprocess=False, binary=False):
    """Register a case; ``content`` is text, bytes, a mapping (dumped as YAML) or None (no file)."""
    fname = None
    if content is not None:
        fname = name + ext
        p = FILES / fname
        if isinstance(content, (dict, list)):
            content = yaml.safe_dump(content, sort_keys=False)
        if isinstance(content, str):
            content = content.encode()
        if ext.endswith(".gz") and not binary:
            content = gzip.compress(content, mtime=0)
        p.write_bytes(content)
    entry = {"exit": 2, "msg": [msg] if isinstance(msg, str) else list(msg)}
    if fname:
        entry["file"] = fname
    if args:
        entry["args"] = args
    if subprocess:
        entry["subprocess"] = True
    cases[name] = entry


def sc(**changes):
    """BASE with dotted changes; a value of ... deletes the key."""
    d = copy.deepcopy(BASE)
    for key, value in changes.items():
        parts = key.split("__")
        node = d
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if value is ...:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return d


def moe(**changes):
    return sc(model__moe={"experts": 4, "top_k": 2, "expert_ffn_hidden": 256}, **changes)


def main() -> None:
    FILES.mkdir(exist_ok=True)
    for old in FILES.iterdir():
        if old.is_dir() and not old.is_symlink():  # a Chakra trace folder
            shutil.rmtree(old)
        else:
            old.unlink()
    (FILES / "base.yaml").write_text(BASE_TEXT)

    # ---- the reader: size, encoding, YAML syntax and structure -----------------------------
    case("dup_model_key", BASE_TEXT + "model: llama3-8b\n", ["duplicate key 'model'", "dup_model_key.yaml:"])
    case("dup_nested_key", BASE_TEXT.replace("  tp: 2\n", "  tp: 2\n  tp: 4\n"), ["duplicate key 'tp'", "line"])
    case(
        "dup_key_json",
        '{"model": "llama3-8b", "model": "llama3-70b"}',
        ["duplicate key 'model'", "dup_key_json.json"],
        ext=".json",
    )
    case(
        "syntax_unclosed_flow",
        "model: llama3-8b\ncluster: {preset: dgx-h100\n",
        ["syntax_unclosed_flow.yaml:", "not valid YAML"],
    )
    case("syntax_bad_indent", "model: llama3-8b\n  cluster: x\n  : y\n", ["syntax_bad_indent.yaml:", "not valid YAML"])
    case("syntax_tab_indent", "model: llama3-8b\nparallel:\n\ttp: 2\n", ["syntax_tab_indent.yaml:3:", "not valid YAML"])
    case(
        "syntax_unclosed_quote",
        'model: "llama3-8b\ncluster: dgx-h100\n',
        ["syntax_unclosed_quote.yaml:", "not valid YAML"],
    )
    case("syntax_two_documents", BASE_TEXT + "---\n" + BASE_TEXT, ["syntax_two_documents.yaml:", "another document"])
    case(
        "deep_nesting_list",
        "model: " + "[" * 300 + "]" * 300 + "\n",
        ["deep_nesting_list.yaml", "nested deeper"],
        subprocess=True,
    )
    case(
        "deep_nesting_map",
        "model:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 120)) + "  " * 120 + "x: 1\n",
        ["deep_nesting_map.yaml", "nested deeper"],
    )
    case(
        "deep_nesting_json",
        '{"model": ' + "[" * 5000 + "]" * 5000 + "}",
        ["deep_nesting_json.json", "nested too deeply"],
        ext=".json",
    )
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    case("alias_bomb_scenario", bomb + BASE_TEXT, ["alias_bomb_scenario.yaml", "alias"], subprocess=True)
    case("alias_recursive", "model: &m [*m]\n", ["alias_recursive.yaml", "recursive alias"])
    case("binary_nul", b"\x00\x01\x02model: x\n" + bytes(range(256)), ["binary_nul.yaml", "binary data"])
    case("binary_latin1", "model: llama3-8b  # caf\xe9\n".encode("latin-1"), ["binary_latin1.yaml", "not UTF-8"])
    case("control_character", "model: llama3-8b\x07\n", ["control_character.yaml", "not allowed"])
    case("png_renamed", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64), ["png_renamed.yaml", "binary data"])
    case("empty_file", "", ["empty_file.yaml", "a scenario is a mapping"])
    case("only_comment", "# nothing here\n", ["only_comment.yaml", "a scenario is a mapping"])
    case("top_level_list", "- model: llama3-8b\n", ["top_level_list.yaml", "got list"])
    case("top_level_scalar", "llama3-8b\n", ["top_level_scalar.yaml", "got str"])
    case("json_invalid", '{"model": "llama3-8b",}', ["json_invalid.json:1:", "not valid JSON"], ext=".json")
    case("json_top_level_number", "42", ["json_top_level_number.json", "got int"], ext=".json")
    case("dev_zero_scenario", None, ["/dev/zero", "regular file"], args=["run", "/dev/zero"], subprocess=True)
    case("directory_scenario", None, ["directory"], args=["run", "{dir}"])
    case("missing_scenario", None, ["no file"], args=["run", "{dir}/no-such-file.yaml"])

    # ---- scenario fields: types and ranges ---------------------------------------------------
    case("ep_true", sc(parallel__ep=True), "parallel.ep")
    case("tp_float", sc(parallel__tp=2.5), "parallel.tp")
    case("tp_whole_float", sc(parallel__tp=2.0), "parallel.tp")
    case("tp_string", sc(parallel__tp="2"), "parallel.tp")
    case("tp_zero", sc(parallel__tp=0), "parallel.tp")
    case("tp_negative", sc(parallel__tp=-2), "parallel.tp")
    case("tp_list", sc(parallel__tp=[2]), "parallel.tp")
    case("pp_huge", sc(parallel__pp=10**12), "parallel")
    case("dp_mismatch", sc(parallel__dp=3), "parallel")
    case("zero_4", sc(parallel__zero=4), "parallel.zero")
    case("zero_true", sc(parallel__zero=True), "parallel.zero")
    case("vpp_null_string", sc(parallel__vpp="null"), "parallel.vpp")
    case("order_incomplete", sc(parallel__order="tp-pp"), "parallel.order")
    case("pipeline_layers_sum", sc(parallel__pipeline_layers=[1, 5]), "parallel.pipeline_layers")
    case("sequence_parallel_maybe", sc(parallel__sequence_parallel="maybe"), "parallel.sequence_parallel")
    case("ep_on_dense", sc(parallel__ep=2), ["parallel.ep", "dense"])
    case("etp_on_dense", sc(parallel__etp=2), ["parallel.etp", "dense"])
    case("balance_on_dense", sc(training__balance="aux-loss-global"), ["training.balance", "dense"])
    case("expert_load_on_dense", sc(training__expert_load={"distribution": "zipf"}), ["training.expert_load", "dense"])
    case(
        "layers_40000",
        sc(model__layers=40000, training__global_batch_size=16),
        ["model.layers", "operations"],
        subprocess=True,
    )
    case("layers_1e9", BASE_TEXT.replace("layers: 2", "layers: 1e9"), ["model.layers", "integer"])
    case("layers_billion_int", sc(model__layers=10**9), ["model.layers", "operations"])
    case("layers_string", sc(model__layers="80"), "model.layers")
    case("layers_zero", sc(model__layers=0), "model.layers")
    case("layers_true", sc(model__layers=True), "model.layers")
    case("global_batch_billion", sc(training__global_batch_size=10**9), ["training.global_batch_size", "operations"])
    case("global_batch_indivisible", sc(training__global_batch_size=3), "training.global_batch_size")
    case("global_batch_missing", sc(training__global_batch_size=...), "training.global_batch_size")
    case("seq_len_negative", sc(training__seq_len=-1), "training.seq_len")
    case("seq_len_5e9_string", BASE_TEXT.replace("seq_len: 128", "seq_len: '5e9'"), "training.seq_len")
    case("dtype_fp16", sc(training__dtype="fp16"), "training.dtype")
    case("recompute_partial", sc(training__recompute="partial"), "training.recompute")
    case("schedule_unknown", sc(schedule="2f2b"), "schedule")
    case("schedule_list", sc(schedule=["1f1b"]), "schedule")
    case("unknown_top_key", sc(modle="llama3-8b"), "modle")
    case("unknown_parallel_key", sc(parallel__tpp=2), "parallel.tpp")
    case("unknown_training_key", sc(training__lr=3e-4), "training.lr")
    case("model_missing", sc(model=...), "model")
    case("model_preset_unknown", sc(model="llama9-8b"), "model")
    case("model_number", sc(model=8), "model")
    case("model_hidden_missing", sc(model__hidden=...), "model.hidden")
    case("model_kv_heads_indivisible", sc(model__kv_heads=3), "model.kv_heads")
    case("model_ffn_unknown", sc(model__ffn="relu"), "model.ffn")
    case("moe_top_k_over_experts", moe(model__moe__top_k=8), "model.moe.top_k")
    case("moe_experts_true", moe(model__moe__experts=True), "model.moe.experts")
    case("moe_unknown_key", moe(model__moe__expert=4), "model.moe.expert")
    case(
        "moe_ep_not_dividing_experts",
        moe(parallel={"tp": 1, "pp": 1, "ep": 8}, training__global_batch_size=8),
        "parallel.ep",
    )
    # Megatron-Core's allgather dispatcher with what it does not run (simulator.scenario.checks)
    for name, key, value in (
        ("moe_allgather_with_shared_overlap", "moe_shared_expert_overlap", True),
        ("moe_allgather_without_host_sync", "moe_host_sync", False),
    ):
        allgather = {"parallel": {"tp": 1, "pp": 1, "ep": 4}, "training__global_batch_size": 8}
        allgather.update(training__moe_token_dispatcher="allgather", **{f"training__{key}": value})
        case(name, moe(**allgather), ["training.moe_token_dispatcher", "allgather", key])
    case("mla_negative_rank", sc(model__attention={"kind": "mla", "kv_lora_rank": -1}), "model.attention.kv_lora_rank")
    case(
        "hf_config_dev_zero",
        sc(model={"hf_config": "/dev/zero"}),
        ["model.hf_config", "/dev/zero", "regular file"],
        subprocess=True,
    )
    case(
        "hf_config_missing_file",
        sc(model={"hf_config": "no-such-config.json"}),
        ["model.hf_config", "no-such-config.json"],
    )
    (FILES / "hf_binary.json").write_bytes(bytes(range(256)) * 4)
    case("hf_config_binary", sc(model={"hf_config": "hf_binary.json"}), ["model.hf_config", "hf_binary.json", "binary"])
    (FILES / "hf_not_json.json").write_text("model_type: llama\n")
    case("hf_config_not_json", sc(model={"hf_config": "hf_not_json.json"}), ["model.hf_config", "hf_not_json.json:1:"])
    (FILES / "hf_list.json").write_text("[1, 2]")
    case("hf_config_list", sc(model={"hf_config": "hf_list.json"}), ["model.hf_config", "JSON object"])
    (FILES / "hf_unknown_type.json").write_text('{"model_type": "bert"}')
    case("hf_config_unknown_type", sc(model={"hf_config": "hf_unknown_type.json"}), "hf_config.model_type")
    (FILES / "hf_layers_true.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": True,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 512,
                "vocab_size": 1000,
            }
        )
    )
    case("hf_config_layers_true", sc(model={"hf_config": "hf_layers_true.json"}), "hf_config.num_hidden_layers")
    case("hf_config_number", sc(model={"hf_config": 5}), "model.hf_config")
    case("hf_config_directory", sc(model={"hf_config": "."}), ["model.hf_config", "directory"])

    # ---- clusters --------------------------------------------------------------------------
    case("cluster_preset_unknown", sc(cluster={"preset": "dgx-h1000"}), "cluster.preset")
    case("cluster_devices_true", sc(cluster__devices=True), "cluster.devices")
    case("cluster_devices_zero", sc(cluster__devices=0), "cluster.devices")
    case("cluster_devices_billion", sc(cluster__devices=10**9), "cluster.devices")
    case("cluster_devices_float", BASE_TEXT.replace("devices: 8", "devices: 8e0"), "cluster.devices")
    case(
        "nvl72_146_devices",
        sc(cluster={"preset": "gb200-nvl72", "devices": 146}, parallel={"tp": 2}),
        ["cluster.devices", "devices_per_domain"],
    )
    case(
        "devices_per_domain_over_rack",
        sc(cluster={"preset": "gb200-nvl72", "devices": 160, "devices_per_domain": 80}),
        ["cluster.devices_per_domain", "72"],
    )
    case(
        "devices_per_domain_uneven",
        sc(cluster={"preset": "gb200-nvl72", "devices": 128, "devices_per_domain": 48}),
        "cluster.devices_per_domain",
    )
    case(
        "devices_per_domain_on_tpu",
        sc(cluster={"preset": "tpu-v5p", "devices": 64, "devices_per_domain": 8}),
        "cluster.devices_per_domain",
    )
    case(
        "devices_per_domain_string",
        sc(cluster={"preset": "gb200-nvl72", "devices": 128, "devices_per_domain": "64"}),
        "cluster.devices_per_domain",
    )
    case("nic_bw_negative", sc(cluster__network={"nic_bw_bytes_per_s": -5e9}), "cluster.network.nic_bw_bytes_per_s")
    case(
        "nic_bw_nan",
        BASE_TEXT.replace("devices: 8", "devices: 8\n  network: {nic_bw_bytes_per_s: .nan}"),
        "cluster.network.nic_bw_bytes_per_s",
    )
    case(
        "nic_bw_inf",
        BASE_TEXT.replace("devices: 8", "devices: 8\n  network: {nic_bw_bytes_per_s: .inf}"),
        "cluster.network.nic_bw_bytes_per_s",
    )
    case("nic_bw_words", sc(cluster__network={"nic_bw_bytes_per_s": "fast"}), "cluster.network.nic_bw_bytes_per_s")
    case("network_unknown_key", sc(cluster__network={"nic_gbps": 400}), "cluster.network.nic_gbps")
    case(
        "network_kind_mesh",
        sc(cluster={"devices": 8, "chip": "h100", "network": {"kind": "mesh"}}),
        "cluster.network.kind",
    )
    case("network_not_mapping", sc(cluster={"devices": 8, "chip": "h100", "network": "fast"}), "cluster.network")
    case("chip_unknown", sc(cluster__chip="h1000"), "cluster.chip")
    case(
        "chip_without_bf16",
        sc(cluster__chip={"peak_flops_per_s": {"fp8": 1e15}, "hbm_bytes": 8e10, "hbm_bw_bytes_per_s": 3e12}),
        "cluster.chip.peak_flops_per_s",
    )
    case("pods_count_zero", sc(cluster__pods={"count": 0, "dcn_bw_bytes_per_s": 1e9}), "cluster.pods")
    case(
        "torus_zero_axis",
        sc(
            cluster={
                "devices": 8,
                "chip": "tpu-v5p",
                "network": {"kind": "torus", "shape": [4, 0], "link_bw_bytes_per_s": 9e10},
            }
        ),
        "cluster.network.shape",
    )
    case("cluster_unknown_key", sc(cluster__racks=2), "cluster.racks")

    # ---- perturbations, compute, algorithms ------------------------------------------------
    case(
        "perturbation_device_out_of_range",
        sc(perturbations=[{"devices": [99], "compute_scale": 0.5}]),
        "perturbations[0].devices",
    )
    case("perturbation_no_scale", sc(perturbations=[{"devices": [1]}]), "perturbations[0].compute_scale")
    case("perturbation_empty", sc(perturbations=[{}]), "perturbations[0]")
    case(
        "perturbation_link_three_ends",
        sc(perturbations=[{"link": ["d0", "d1", "d2"], "failed": True}]),
        "perturbations",
    )
    case(
        "perturbation_link_missing",
        sc(perturbations=[{"link": ["node3", "leaf1"], "bw_scale": 0.5}]),
        ["perturbations[0].link", "'node3'", "'leaf1'", "d0"],
    )
    case(
        "perturbation_link_not_adjacent",
        sc(perturbations=[{"link": ["d0", "p0.leaf0.r5"], "bw_scale": 0.5}]),
        ["perturbations[0].link", "'d0' links to"],
    )
    case("compute_efficiency_over_1", sc(compute={"gemm_efficiency": 2}), "compute.gemm_efficiency")
    case("algorithm_unknown", sc(algorithms={"all-reduce": "magic"}), ["algorithms.all-reduce", "ring"])
    case("algorithm_unknown_op", sc(algorithms={"all-scatter": "ring"}), "algorithms")

    # ---- sweeps ----------------------------------------------------------------------------
    sweep_args = ["sweep", "{file}", "--out", "{out}"]
    base_sweep = {"base": "base.yaml"}
    case(
        "sweep_misspelled_axis",
        {**base_sweep, "grid": {"parallel.ppp": [1, 2]}},
        ["grid.parallel.ppp", "parallel.pp"],
        args=sweep_args,
    )
    case(
        "sweep_misspelled_section",
        {**base_sweep, "grid": {"paralel.pp": [1, 2]}},
        ["grid.paralel.pp", "parallel"],
        args=sweep_args,
    )
    case(
        "sweep_misspelled_network_axis",
        {**base_sweep, "grid": {"cluster.network.nic_bw": [1e9]}},
        ["grid.cluster.network.nic_bw", "nic_bw_bytes_per_s"],
        args=sweep_args,
    )
    case(
        "sweep_misspelled_case_axis",
        {**base_sweep, "cases": [{"training.global_batch": 8}]},
        ["cases[0].training.global_batch", "training.global_batch_size"],
        args=sweep_args,
    )
    case(
        "sweep_axis_inside_value",
        {**base_sweep, "grid": {"schedule.kind": ["x"]}},
        ["grid.schedule.kind", "schedule"],
        args=sweep_args,
    )
    case("sweep_unknown_key", {**base_sweep, "gird": {"parallel.pp": [1]}}, ["gird", "grid"], args=sweep_args)
    case(
        "sweep_alias_bomb",
        bomb.replace("a:", "zz_a:", 1).replace("*a", "*a") + "base: base.yaml\ngrid:\n  parallel.pp: *i\n",
        ["sweep_alias_bomb.yaml", "alias"],
        args=sweep_args,
        subprocess=True,
    )
    case(
        "sweep_too_many_cases",
        {**base_sweep, "grid": {f"parallel.{k}": list(range(1, 41)) for k in ("tp", "pp", "cp", "dp")}},
        ["grid", "limit"],
        args=sweep_args,
    )
    case(
        "sweep_duplicate_key",
        "base: base.yaml\ngrid: {parallel.pp: [1]}\ngrid: {parallel.tp: [1]}\n",
        ["sweep_duplicate_key.yaml", "duplicate key 'grid'"],
        args=sweep_args,
    )
    case("sweep_no_base", {"grid": {"parallel.pp": [1]}}, "base", args=sweep_args)
    case(
        "sweep_base_missing_file",
        {"base": "no-such-base.yaml", "grid": {"parallel.pp": [1]}},
        "no-such-base.yaml",
        args=sweep_args,
    )
    case("sweep_grid_not_list", {**base_sweep, "grid": {"parallel.pp": 2}}, "grid.parallel.pp", args=sweep_args)
    case(
        "sweep_where_call",
        {**base_sweep, "grid": {"parallel.pp": [1, 2]}, "where": "__import__('os').getcwd()"},
        "where[0]",
        args=sweep_args,
    )
    case(
        "sweep_where_unknown_key",
        {**base_sweep, "grid": {"parallel.pp": [1, 2]}, "where": "parallel.ppp > 1"},
        ["where[0]", "parallel.ppp"],
        args=sweep_args,
    )
    case("sweep_cases_not_list", {**base_sweep, "cases": {"parallel.pp": 2}}, "cases", args=sweep_args)
    case(
        "sweep_skip_invalid_word",
        {**base_sweep, "grid": {"parallel.pp": [1]}, "skip_invalid": "maybe"},
        "skip_invalid",
        args=sweep_args,
    )
    case("sweep_axis_bad_format", {**base_sweep, "grid": {"parallel..pp": [1]}}, "grid", args=sweep_args)
    case("sweep_dev_zero", None, ["/dev/zero", "regular file"], args=["sweep", "/dev/zero", "--out", "{out}"])
    case("sweep_binary", b"\x00" * 64, ["sweep_binary.yaml", "binary"], args=sweep_args)

    # ---- traces (run base.yaml --trace FILE) ----------------------------------------------
    trace_args = ["run", "{dir}/base.yaml", "--no-plots", "--trace", "{file}"]
    good = _tiny_trace(BASE)
    other = _tiny_trace({**BASE, "model": {**TINY_MODEL, "hidden": 512}})
    case("trace_other_model", json.dumps(other), ["trace.scenario", "rebuild"], args=trace_args, ext=".json")
    legacy = dict(other)
    legacy.pop("scenario")
    case("trace_other_model_legacy", json.dumps(legacy), ["trace.model_flops"], args=trace_args, ext=".json")
    bigger = _tiny_trace({**BASE, "cluster": {"preset": "dgx-h100", "devices": 16}})
    case("trace_other_world", json.dumps(bigger), ["trace.world", "16"], args=trace_args, ext=".json")
    case("trace_no_ops", json.dumps({**good, "ops": []}), "trace.ops", args=trace_args, ext=".json")
    case(
        "trace_no_format",
        json.dumps({k: v for k, v in good.items() if k != "format"}),
        "stepsim-trace",
        args=trace_args,
        ext=".json",
    )
    case("trace_bad_version", json.dumps({**good, "version": 99}), "trace.version", args=trace_args, ext=".json")
    bad_kind = copy.deepcopy(good)
    bad_kind["ops"][0]["kind"] = "teleport"
    case("trace_bad_op_kind", json.dumps(bad_kind), "ops[0].kind", args=trace_args, ext=".json")
    cyc = copy.deepcopy(good)
    cyc["ops"][0]["deps"] = [len(cyc["ops"]) - 1]
    case("trace_cycle", json.dumps(cyc), ["trace", "cycl"], args=trace_args, ext=".json")
    dangling = copy.deepcopy(good)
    dangling["ops"][1]["deps"] = [10**9]
    case("trace_dangling_dep", json.dumps(dangling), ["deps: ", "unknown op"], args=trace_args, ext=".json")
    negative = copy.deepcopy(good)  # benchmarks/fuzz_inputs.py --seed 2026120602: named no field
    negative["ops"][0]["deps"] = [-2]
    case("trace_negative_dep", json.dumps(negative), ["deps: ", "unknown op -2"], args=trace_args, ext=".json")
    for flag, word in (("host_sync", "no"), ("comm_overlap", "yes"), ("recompute", "false")):
        flagged = copy.deepcopy(good)  # a string is truthy: "no" made the op block the host
        flagged["ops"][0][flag] = word
        case(f"trace_{flag}_string", json.dumps(flagged), f"ops[0].{flag}", args=trace_args, ext=".json")
    bad_weight = copy.deepcopy(good)
    bad_weight["weight"] = {"0": "many"}
    case("trace_bad_weight", json.dumps(bad_weight), ["trace", "malformed"], args=trace_args, ext=".json")
    case("trace_not_json", "ops: []\n", ["trace_not_json.json:1:", "not valid JSON"], args=trace_args, ext=".json")
    case("trace_binary", bytes(range(256)), ["trace_binary.json", "binary"], args=trace_args, ext=".json")
    case(
        "trace_gz_garbage",
        b"this is not gzip",
        ["trace_gz_garbage.json.gz", "cannot read"],
        args=trace_args,
        ext=".json.gz",
        binary=True,
    )
    case(
        "trace_gz_not_json",
        "not json at all",
        ["trace_gz_not_json.json.gz", "not valid JSON"],
        args=trace_args,
        ext=".json.gz",
    )
    case("trace_dev_zero", None, ["/dev/zero", "regular file"], args=["run", "{dir}/base.yaml", "--trace", "/dev/zero"])

    # ---- topologies ------------------------------------------------------------------------
    topo_args = ["run", "{dir}/base.yaml", "--no-plots", "--topology", "{file}"]
    case("graphml_not_xml", "hello, not XML\n", ["graphml_not_xml.graphml", "GraphML"], args=topo_args, ext=".graphml")
    case(
        "graphml_truncated",
        '<?xml version="1.0"?><graphml><graph edgedefault="undirected"><node id="d0"',
        ["graphml_truncated.graphml", "GraphML"],
        args=topo_args,
        ext=".graphml",
    )
    case(
        "graphml_entity_bomb",
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10))
        + ']><graphml><graph edgedefault="undirected"><node id="&lol9;"/></graph></graphml>',
        ["graphml_entity_bomb.graphml", "DOCTYPE"],
        args=topo_args,
        ext=".graphml",
    )
    case("graphml_binary", bytes(range(256)) * 8, ["graphml_binary.graphml", "binary"], args=topo_args, ext=".graphml")
    case(
        "graphml_no_devices",
        '<?xml version="1.0"?><graphml><graph edgedefault="undirected"><node id="s"/></graph></graphml>',
        ["graphml_no_devices.graphml", "topology"],
        args=topo_args,
        ext=".graphml",
    )
    case(
        "topology_json_no_format",
        '{"nodes": [], "edges": []}',
        ["topology_json_no_format.json", "format"],
        args=topo_args,
        ext=".json",
    )
    case(
        "topology_json_unknown_node",
        json.dumps(
            {
                "format": "stepsim-topology",
                "version": 1,
                "nodes": [{"id": "d0", "kind": "device", "index": 0}],
                "edges": [{"source": "d0", "target": "ghost", "bw_bytes_per_s": 1e9, "latency_s": 1e-6, "kind": "nic"}],
            }
        ),
        ["topology_json_unknown_node.json", "ghost"],
        args=topo_args,
        ext=".json",
    )
    case(
        "topology_json_invalid",
        '{"format": ',
        ["topology_json_invalid.json:1:", "not valid JSON"],
        args=topo_args,
        ext=".json",
    )
    case("topology_bad_extension", "x", ["topology_bad_extension.txt", "extension"], args=topo_args, ext=".txt")
    case(
        "topology_command_not_xml",
        "hello",
        ["topology_command_not_xml.graphml", "GraphML"],
        args=["topology", "{file}"],
        ext=".graphml",
    )

    case(
        "topology_command_json_number",
        "42",
        ["topology_command_json_number.json", "mapping"],
        args=["topology", "{file}"],
        ext=".json",
    )

    # ---- cluster files (`stepsim collective --cluster FILE`) ----------------------------------
    coll_args = ["collective", "all-reduce", "--cluster", "{file}", "--max-bytes", "1M"]
    case(
        "cluster_file_dup_key",
        "cluster: {preset: dgx-h100}\ncluster: {preset: dgx-b200}\n",
        ["cluster_file_dup_key.yaml", "duplicate key 'cluster'"],
        args=coll_args,
    )
    case("cluster_file_binary", b"\xff\xfe\x00c\x00l", ["cluster_file_binary.yaml", "binary"], args=coll_args)
    case(
        "cluster_file_bad_devices",
        "cluster: {preset: gb200-nvl72, devices: 146}\n",
        ["cluster.devices", "devices_per_domain"],
        args=coll_args,
    )

    physical_ranges(good, trace_args, topo_args, sweep_args, base_sweep)
    newest_features()

    header = (
        "# Hostile and mistaken inputs, written by tests/hostile/make_corpus.py (read its docstring).\n"
        "# name: {file (in files/), args (default: [run, '{file}']), exit, msg: substrings, subprocess}\n"
    )
    (HERE / "cases.yaml").write_text(header + yaml.safe_dump(cases, sort_keys=False, width=120))
    print(f"wrote {len(cases)} cases and {sum(1 for _ in FILES.iterdir())} files")


def physical_ranges(good: dict, trace_args, topo_args, sweep_args, base_sweep) -> None:
    """Issue 41: numbers outside their physical range (docs/scenario.md, "Physical ranges"),
    strings given for flags, special files and the weak messages it listed."""
    inf, nan = float("inf"), float("nan")
    h100 = {"preset": "dgx-h100", "devices": 8}
    case("hbm_bytes_inf", sc(cluster={**h100, "chip": {"preset": "h100", "hbm_bytes": inf}}), "cluster.chip.hbm_bytes")
    case("hbm_bw_tiny", sc(cluster={**h100, "chip": {"preset": "h100", "hbm_bw_bytes_per_s": 1e-300}}), "hbm_bw")
    case(
        "peak_flops_huge", sc(cluster={**h100, "chip": {"preset": "h100", "peak_flops_per_s": {"bf16": 1e300}}}), "peak"
    )
    case("compute_scale_inf", sc(perturbations=[{"devices": [0], "compute_scale": inf}]), "compute_scale")
    case("compute_scale_tiny", sc(perturbations=[{"devices": [0], "compute_scale": 1e-300}]), "compute_scale")
    case("compute_scale_nan", sc(perturbations=[{"devices": [0], "compute_scale": nan}]), "compute_scale")
    case("bw_scale_tiny", sc(perturbations=[{"link": ["d0", "p0.nvsw0"], "bw_scale": 1e-300}]), "bw_scale")
    case("bw_scale_string", sc(perturbations=[{"link": ["d0", "p0.nvsw0"], "bw_scale": "0.5"}]), "bw_scale")
    case("failed_string", sc(perturbations=[{"link": ["d0", "p0.nvsw0"], "failed": "yes"}]), "failed")
    case("host_bw_tiny", sc(cluster={**h100, "host_bw_bytes_per_s": 1e-300}), "cluster.host_bw_bytes_per_s")
    case("nic_bw_huge", sc(cluster={**h100, "network": {"nic_bw_bytes_per_s": 1e300}}), "nic_bw_bytes_per_s")
    quoted = yaml.safe_dump(sc(cluster={**h100, "network": {"nic_bw_bytes_per_s": 5e10}}), sort_keys=False)
    assert "nic_bw_bytes_per_s: 50000000000.0" in quoted
    quoted = quoted.replace("nic_bw_bytes_per_s: 50000000000.0", "nic_bw_bytes_per_s: '50e9'")
    case("nic_bw_quoted", quoted, ["cluster.network.nic_bw_bytes_per_s", "'50e9'"])
    case("latency_huge", sc(cluster={**h100, "network": {"domain_latency_s": 1e300}}), "domain_latency_s")
    case("oversubscription_huge", sc(cluster={**h100, "network": {"oversubscription": 1e300}}), "oversubscription")
    case(
        "nvls_string_false",
        sc(cluster={**h100, "network": {"nvls": "false"}}),
        ["cluster.network.nvls", "true or false"],
    )
    case("nvls_string_no", sc(cluster={**h100, "network": {"nvls": "no"}}), "cluster.network.nvls")
    case("sharp_string", sc(cluster={**h100, "network": {"sharp": "true"}}), "cluster.network.sharp")
    case("rails_number", sc(cluster={**h100, "network": {"rails": 1}}), "cluster.network.rails")
    case("dcn_bw_tiny", sc(cluster={**h100, "pods": {"count": 2, "dcn_bw_bytes_per_s": 1e-300}}), "dcn_bw_bytes_per_s")
    case("tied_embeddings_string", sc(model__tied_embeddings="false"), "model.tied_embeddings")
    case("offload_string", sc(training__offload={"optimizer": "no"}), "training.offload.optimizer")
    case("flash_attention_number", sc(training__flash_attention=0), "training.flash_attention")
    case("gemm_efficiency_tiny", sc(compute={"gemm_efficiency": 1e-300}), "compute.gemm_efficiency")
    case("launch_overhead_huge", sc(compute={"launch_overhead_s": 1e300}), "compute.launch_overhead_s")
    case(
        "net_efficiency_tiny", sc(network_calibration={"efficiency": {"nic": 1e-300}}), "network_calibration.efficiency"
    )
    case("seq_len_huge", sc(training__seq_len=10**15), "training.seq_len")
    case("hidden_huge", sc(model__hidden=10**12), "model.hidden")
    case("vocab_huge", sc(model__vocab=10**12), "model.vocab")
    case(
        "ideal_compute_too_long",
        sc(
            model={**TINY_MODEL, "hidden": 65536, "heads": 64, "ffn_hidden": 262144},
            training__seq_len=2**20,
            training__global_batch_size=2**22,
            training__micro_batch_size=2**20,
        ),
        ["training.global_batch_size", "model FLOPs"],
    )
    case(
        "cp_seq_len",
        sc(parallel={"cp": 8, "tp": 1, "pp": 1}, training__seq_len=100),
        ["training.seq_len", "2 * parallel.cp"],
    )
    case("name_long", sc(name="x" * 10_000), ["name", "200 characters"])
    case("model_name_long", sc(model__name="m" * 10_000), ["model.name", "200 characters"])
    case("cluster_name_long", sc(cluster={**h100, "name": "c" * 10_000}), ["cluster.name", "200 characters"])
    # files: UTF-16 with and without a byte-order mark, a symbolic-link loop, a broken link
    case("utf16_bom", BASE_TEXT.encode("utf-16"), ["utf16_bom.yaml", "UTF-16", "UTF-8"])
    case("utf16_no_bom", BASE_TEXT.encode("utf-16-le"), ["utf16_no_bom.yaml", "UTF-16", "UTF-8"])
    for name, target in (
        ("symlink_loop_a.yaml", "symlink_loop_b.yaml"),
        ("symlink_loop_b.yaml", "symlink_loop_a.yaml"),
    ):
        (FILES / name).unlink(missing_ok=True)
        (FILES / name).symlink_to(target)
    case("symlink_loop", None, ["symlink_loop_a.yaml", "symbolic-link loop"], args=["run", "{dir}/symlink_loop_a.yaml"])
    (FILES / "symlink_broken.yaml").unlink(missing_ok=True)
    (FILES / "symlink_broken.yaml").symlink_to("no-such-target.yaml")
    case(
        "symlink_broken",
        None,
        ["symlink_broken.yaml", "broken symbolic link"],
        args=["run", "{dir}/symlink_broken.yaml"],
    )
    case(
        "trace_symlink_loop",
        None,
        ["symlink_loop_a.yaml", "loop"],
        args=["run", "{dir}/base.yaml", "--trace", "{dir}/symlink_loop_a.yaml"],
    )
    # sweeps
    case(
        "sweep_base_itself",
        {**base_sweep, "base": "sweep_base_itself.yaml", "grid": {"parallel.pp": [1]}},
        ["base", "itself"],
        args=sweep_args,
    )
    case(
        "sweep_name_long",
        {**base_sweep, "name": "s" * 1000, "grid": {"parallel.pp": [1]}},
        ["name", "200"],
        args=sweep_args,
    )
    # traces: amounts out of range
    big = copy.deepcopy(good)
    i = next(k for k, op in enumerate(big["ops"]) if op.get("size_bytes"))
    big["ops"][i]["size_bytes"] = 1e300
    case("trace_size_huge", json.dumps(big), f"ops[{i}].size_bytes", args=trace_args, ext=".json")
    nan_flops = copy.deepcopy(good)
    j = next(k for k, op in enumerate(nan_flops["ops"]) if op.get("kernels"))
    nan_flops["ops"][j]["kernels"][0]["flops"] = nan
    case("trace_flops_nan", json.dumps(nan_flops), f"ops[{j}].kernels[0].flops", args=trace_args, ext=".json")
    neg_mem = copy.deepcopy(good)
    neg_mem["model_flops"] = inf
    case("trace_model_flops_inf", json.dumps(neg_mem), "trace.model_flops", args=trace_args, ext=".json")
    # topologies: too few devices (names the file), a string flag, a bandwidth out of range
    from topologies.io import save_topology
    from topologies.presets import build_cluster, cluster_preset

    save_topology(build_cluster(cluster_preset("dgx-h100", 4)), FILES / "topology_four_devices.json")
    case(
        "topology_too_few_devices",
        None,
        ["topology_four_devices.json", "4 devices", "needs 8"],
        args=["run", "{dir}/base.yaml", "--no-plots", "--topology", "{dir}/topology_four_devices.json"],
    )
    doc = json.loads((FILES / "topology_four_devices.json").read_text())
    case(
        "topology_nvls_string",
        json.dumps({**doc, "graph": {**doc["graph"], "nvls": "false"}}),
        ["topology_nvls_string.json", "nvls"],
        args=topo_args,
        ext=".json",
    )
    edge_bw = copy.deepcopy(doc)
    edge_bw["edges"][0]["bw_bytes_per_s"] = 1e300
    case(
        "topology_edge_bw_huge",
        json.dumps(edge_bw),
        ["topology_edge_bw_huge.json", "bw_bytes_per_s"],
        args=topo_args,
        ext=".json",
    )
    # Kineto traces (stepsim calibrate --kineto): a bare JSON list, negative durations
    kineto_args = ["calibrate", "--kineto", "{file}"]
    case(
        "kineto_json_list", "[1, 2, 3]", ["kineto_json_list.json", "not a Chrome trace"], args=kineto_args, ext=".json"
    )
    neg = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": 10, "dur": -5, "pid": 0, "tid": 1}]}
    case(
        "kineto_negative_dur", json.dumps(neg), ["kineto_negative_dur.json", "negative"], args=kineto_args, ext=".json"
    )


def newest_features() -> None:
    """Inputs to the surfaces added since the corpus began (2026-12-06): PP map files,
    sweep ``where`` expressions, Megatron argument lists, placement and MoE settings."""
    # ---- PP map files (`stepsim ppmap MAP --out DIR`): each was an internal error (exit 1)
    ppmap_args = ["ppmap", "{file}", "--out", "{out}", "--jobs", "1", "--assemble-only"]
    tiny_map = {
        "name": "m",
        "devices": 16,
        "models": [{**TINY_MODEL, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 256}}],
        "training": {"seq_len": 128, "sequences_per_device": 1, "dtype": "bf16"},
        "grid": {"cluster": {"preset": "dgx-h100"}, "domain_sizes": [8], "nic_gbps": [50]},
    }

    def ppmap(case_name, msg, **changes):
        d = copy.deepcopy(tiny_map)
        for key, value in changes.items():
            parts = key.split("__")
            node = d
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        case(case_name, d, msg, args=ppmap_args)

    ppmap("ppmap_nic_gbps_string", ["grid.nic_gbps", "'fast'"], grid__nic_gbps=["fast"])
    ppmap("ppmap_nic_gbps_not_list", "grid.nic_gbps", grid__nic_gbps=50)
    ppmap("ppmap_nic_gbps_inf", "grid.nic_gbps", grid__nic_gbps=[float("inf")])
    ppmap("ppmap_grid_list", "grid", grid=[8, 50])
    ppmap("ppmap_grid_unknown_key", ["grid.domain_size", "domain_sizes"], grid__domain_size=[8])
    ppmap("ppmap_domain_sizes_not_list", "grid.domain_sizes", grid__domain_sizes=8)
    ppmap("ppmap_grid_cluster_string", "grid.cluster", grid__cluster="dgx-h100")
    ppmap("ppmap_model_number", "models", models=[5])
    ppmap("ppmap_training_list", "training", training=[1])
    ppmap("ppmap_sequences_per_device_string", "training.sequences_per_device", training__sequences_per_device="8")
    ppmap("ppmap_search_pp_int", "search.pp", search={"pp": 4})
    ppmap("ppmap_search_zero_int", "search.zero", search={"zero": 1})
    ppmap("ppmap_search_schedules_string", "search.schedules", search={"schedules": "1f1b"})
    ppmap("ppmap_search_unknown_key", ["search.max_ttp", "max_tp"], search={"max_ttp": 4})
    ppmap("ppmap_search_list", "search", search=[1])
    ppmap("ppmap_marks_string", "marks", marks={"a": ["x", 1]})
    ppmap("ppmap_marks_inf", "marks", marks={"a": [8, float("inf")]})
    ppmap("ppmap_search_pp_empty", "search.pp", search={"pp": []})
    ppmap("ppmap_system_cluster_string", "systems.A.cluster", systems={"A": {"cluster": "h800"}})
    ppmap("ppmap_system_training_list", "systems.A.training", systems={"A": {"cluster": {}, "training": [1]}})
    ppmap("ppmap_system_unknown_key", "systems.A.foo", systems={"A": {"cluster": {"preset": "h800"}, "foo": 1}})
    ppmap("ppmap_name_long", ["name", "200"], name="n" * 10_000)
    case("ppmap_recheck_no_store", tiny_map, ["--recheck", "screen.jsonl"], args=ppmap_args[:-1] + ["--recheck"])
    ppmap(
        "ppmap_too_many_points",
        ["grid", "1,000"],
        devices=1024,
        grid__domain_sizes=[1, 2, 4, 8, 16, 32, 64, 128],
        grid__nic_gbps=list(range(1, 201)),
    )

    # ---- Megatron argument lists (`stepsim import megatron`): an internal error, scenarios that
    # would not run written with exit 0, contradictory or unknown values taken, a 100 GB layout
    import_args = ["import", "megatron", "{file}", "--cluster", "dgx-h100", "--devices", "8"]
    argv = (
        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --micro-batch-size 1 "
        "--global-batch-size 16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--vocab-size 32000 --bf16"
    )

    def megatron(case_name, text, msg):
        case(case_name, text + "\n", msg, args=import_args, ext=".args")

    megatron("megatron_tp_zero", argv.replace("parallel-size 2 --pipeline", "parallel-size 0 --pipeline"), "--tensor")
    megatron("megatron_vocab_multiple_zero", argv + " --make-vocab-size-divisible-by 0", "--make-vocab-size")
    megatron("megatron_first_layers_negative", argv + " --decoder-first-pipeline-num-layers -3", "--decoder-first")
    megatron("megatron_first_layers_over", argv + " --decoder-first-pipeline-num-layers 10", ["--decoder-first", "4"])
    megatron("megatron_bf16_and_fp16", argv + " --fp16", ["--fp16", "--bf16"])
    megatron("megatron_fp8_format_unknown", argv + " --fp8-format e5m2x", ["--fp8-format", "hybrid"])
    megatron(
        "megatron_layout_repeat_huge",
        argv + " --pipeline-model-parallel-layout 't*99999999999|t'",
        "--pipeline-model-parallel-layout",
    )
    megatron(
        "megatron_layout_group_repeat_huge",
        argv + " --pipeline-model-parallel-layout '(t)*999999999|t'",
        "--pipeline-model-parallel-layout",
    )
    megatron("megatron_fp8_word", argv + " model.fp8=maybe", ["--fp8", "hybrid"])
    megatron("megatron_word_1mb", argv + " --data-path " + "x" * 1_000_000, ["args", "65,536"])
    case(
        "megatron_nnodes_zero",
        "torchrun --nnodes 0 --nproc-per-node 8 pretrain_gpt.py " + argv + "\n",
        "--nnodes",
        args=import_args[:-2],
        ext=".args",
    )
    case(
        "dask_address_without_port",
        None,
        ["--dask", "tcp://host:8786"],
        args=["sweep", "{dir}/where_power_tower.yaml", "--out", "{out}", "--dask", "notanaddress"],
    )

    # ---- scenario settings: MoE-only keys on a dense model and repeated perturbations were
    # taken silently; an all-to-all of 65,536 ranks and an exact ring of 4,096 blew the memory
    for key, value in (
        ("moe_router_dtype", "fp32"),
        ("moe_dispatch_dtype", "fp8"),
        ("moe_host_sync", False),
        ("moe_shared_expert_overlap", True),
    ):
        case(f"dense_{key}", sc(**{f"training__{key}": value}), [f"training.{key}", "dense"])
    case(
        "perturbation_device_twice",
        sc(perturbations=[{"devices": [0], "compute_scale": 0.5}, {"devices": [0], "compute_scale": 0.9}]),
        ["perturbations[1].devices", "perturbations[0]"],
    )
    case(
        "perturbation_device_repeated",
        sc(perturbations=[{"devices": [3, 3], "compute_scale": 0.5}]),
        ["perturbations[0].devices", "device 3"],
    )
    case("perturbation_devices_empty", sc(perturbations=[{"devices": [], "compute_scale": 0.5}]), "perturbations[0]")
    experts = {"experts": 65536, "top_k": 2, "expert_ffn_hidden": 64}
    case(
        "ep_65536",
        sc(
            model={**TINY_MODEL, "moe": experts},
            cluster={"preset": "dgx-h100", "devices": 65536},
            parallel={"ep": 65536},
            training={"seq_len": 128, "global_batch_size": 65536},
        ),
        ["parallel.ep", "4,096"],
        subprocess=True,
    )
    case(
        "exact_cp_4096",
        sc(
            cluster={"preset": "dgx-h100", "devices": 4096},
            parallel={"cp": 4096},
            training={"seq_len": 2**24, "global_batch_size": 1},
        ),
        ["parallel.cp", "1,024"],
        args=["run", "{file}", "--exact", "--no-plots"],
        subprocess=True,
    )
    tpu = {"preset": "tpu-v5p", "devices": 64}
    case(  # 262,144 chips on one torus: 11 GB and 5 minutes for a 2-layer model
        "torus_262144",
        sc(
            cluster={
                "devices": 262144,
                "chip": "tpu-v5p",
                "network": {"kind": "torus", "shape": [64, 64, 64], "link_bw_bytes_per_s": 9e10},
            },
            parallel={"tp": 1},
            training={"seq_len": 128, "global_batch_size": 262144},
        ),
        ["cluster.devices", "65,536"],
        subprocess=True,
    )
    case(  # `collective --cluster SCENARIO` dropped the scenario's placement (other domains, exit 0)
        "collective_scenario_placement_zero",
        sc(cluster={"preset": "gb200-nvl72", "devices": 128}, placement={"devices_per_domain": 0}),
        "placement.devices_per_domain",
        args=["collective", "all-reduce", "--cluster", "{file}", "--max-bytes", "1M"],
    )
    torus_64 = {"kind": "torus", "shape": [64, 64, 64]}
    case(  # past 60 s building the torus and its collective
        "collective_torus_262144",
        {"cluster": {"devices": 262144, "chip": "tpu-v5p", "network": {**torus_64, "link_bw_bytes_per_s": 9e10}}},
        ["cluster.devices", "65,536"],
        args=["collective", "all-reduce", "--cluster", "{file}", "--max-bytes", "1M"],
        subprocess=True,
    )
    case(  # a TypeError (exit 1) where placement.tile is copied into the network section
        "placement_network_not_mapping",
        sc(cluster={**tpu, "network": 5}, placement={"tile": [4, 4, 4]}),
        "cluster.network",
    )
    case("placement_tile_long", sc(cluster=tpu, placement={"tile": [1] * 100_000}), ["placement.tile", "64"])

    # ---- export and validate: a TPU's Megatron launch line (8 GPUs a node) was written with exit 0;
    # --suite naming no folder was reported as --cases
    tpu_run = sc(cluster=tpu, training__global_batch_size=32)
    case("export_megatron_tpu", tpu_run, ["cluster.chip", "TPU"], args=["export", "megatron", "{file}"])
    case(  # the message did not say which of the two scenarios it was about
        "explain_b_invalid",
        sc(placement={"devices_per_domain": 0}),
        ["scenario B", "placement.devices_per_domain"],
        args=["explain", "{dir}/base.yaml", "{file}"],
    )
    case("validate_suite_missing", None, ["--suite", "no such folder"], args=["validate", "--suite", "{dir}/none"])
    case("validate_suite_file", None, ["--suite", "not a folder"], args=["validate", "--suite", "{dir}/base.yaml"])

    case(
        "search_too_many_layouts",
        sc(
            model={**TINY_MODEL, "layers": 64, "moe": {"experts": 256, "top_k": 8, "expert_ffn_hidden": 512}},
            cluster={"preset": "dgx-h100", "devices": 65536},
            parallel={"tp": 1},
            training={"seq_len": 4096, "global_batch_size": 65536 * 128},
        ),
        ["search", "500,000"],
        args=[
            "search",
            "{file}",
            "--jobs",
            "1",
            "--micro-batch-sizes",
            "1,2,4,8,16,32,64,128",
            "--zero",
            "0,1,2,3",
            "--max-vpp",
            "8",
            "--max-cp",
            "16",
        ],
    )

    case(
        "cuda_graphs_on_tpu",
        sc(cluster=tpu, training__global_batch_size=32, training__cuda_graphs="full"),
        ["training.cuda_graphs", "TPU"],
    )

    chakra_cases()
    report_cases()

    # ---- sweep `where` expressions: a hang (a billion-digit power) and memory blow-ups
    sweep_args = ["sweep", "{file}", "--out", "{out}", "--jobs", "1"]
    sweep = {"base": "base.yaml", "grid": {"parallel.pp": [1, 2]}}
    case("where_power_tower", {**sweep, "where": "9**9**9**9 > 1"}, ["where[0]", "exponents"], args=sweep_args)
    case("where_string_repeat", {**sweep, "where": "'a' * 10**10 == 'b'"}, ["where[0]", "repeated"], args=sweep_args)
    case("where_list_repeat", {**sweep, "where": "[1] * 10**10 == [1]"}, ["where[0]", "repeated"], args=sweep_args)
    case(
        "where_string_format",
        {**sweep, "where": "'%0999999999d' % 1 == 'b'"},
        ["where[0]", "formatted"],
        args=sweep_args,
        subprocess=True,
    )


def report_cases() -> None:
    """`stepsim report DIR` on a run directory with one table broken: each was an internal error
    (KeyError 'rank' / 'axis', ArrowInvalid)."""
    from simulator import simulate

    for name, table, text, msg in (
        ("report_memory_columns", "memory.csv", "a,b\n1,2\n", ["report_memory_columns/memory.csv", "rank"]),
        ("report_links_columns", "links.csv", "garbage\n1\n", ["report_links_columns/links.csv", "axis"]),
        ("report_events_parquet", "events.parquet", "x\n", ["report_events_parquet/events.parquet", "table"]),
    ):
        folder = FILES / name
        simulate(BASE).write(folder, plots=False)
        for extra in ("trace.json", "events.csv" if table == "events.parquet" else "events.parquet"):
            (folder / extra).unlink()  # smaller files; the report reads the other events table
        (folder / table).write_text(text)
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps({**summary, "sim_wall_s": None}))  # the same bytes each time
        case(name, None, msg, args=["report", "{dir}/" + name, "--html"])
    (FILES / "sweep_plot_parquet").mkdir()
    (FILES / "sweep_plot_parquet" / "results.parquet").write_text("x\n")  # an ArrowInvalid, exit 1
    case(
        "sweep_plot_parquet",
        None,
        ["sweep_plot_parquet/results.parquet", "table"],
        args=["sweep-plot", "{dir}/sweep_plot_parquet"],
    )


def chakra_cases() -> None:
    """Chakra ET traces another tool wrote (`run SCENARIO --trace DIR/prefix`), four ranks each,
    written with MLCommons' protobuf classes as tests/data/chakra/make_handmade.py does: members
    calling one collective as different types, and a send nobody receives, ran with exit 0."""
    from chakra.schema.protobuf.et_def_pb2 import (
        ALL_GATHER,
        ALL_REDUCE,
        COMM_COLL_NODE,
        COMM_SEND_NODE,
        COMP_NODE,
        GlobalMetadata,
        Node,
    )
    from chakra.schema.protobuf.et_def_pb2 import AttributeProto as A
    from chakra.src.third_party.utils.protolib import encodeMessage

    def node(i, name, typ, deps=(), **attrs):
        n = Node(id=i, name=name, type=typ)
        n.data_deps.extend(deps)
        for k, v in {"is_cpu_op": {"bool_val": False}, **attrs}.items():
            n.attr.append(A(name=k, **v))
        return n

    def fwd():
        return node(1, "fwd", COMP_NODE, num_ops={"int64_val": 10**12}, tensor_size={"uint64_val": 10**9})

    def coll(kind):
        size, group = {"int64_val": 1 << 20}, {"string_val": "1"}
        return node(2, "grad_sync", COMM_COLL_NODE, [1], comm_type={"int64_val": kind}, comm_size=size, pg_name=group)

    send = node(
        2,
        "send_act",
        COMM_SEND_NODE,
        [1],
        comm_src={"int32_val": 0},
        comm_dst={"int32_val": 1},
        comm_tag={"int32_val": 7},
        comm_size={"int64_val": 1 << 20},
    )
    (FILES / "comm_group.json").write_text(json.dumps({"1": [0, 1, 2, 3]}) + "\n")
    scenario = {**BASE, "cluster": {"preset": "dgx-h100", "devices": 4}, "parallel": {"tp": 1}}
    (FILES / "chakra_world4.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    for prefix, ranks, msg in (
        (
            "chakra_group_rank_twice/t",
            [[fwd(), coll(ALL_REDUCE)] for r in range(4)],
            ["chakra_group_rank_twice/comm_group.json", "twice"],
        ),
        (
            "chakra_collective_types_differ",
            [[fwd(), coll(ALL_GATHER if r == 0 else ALL_REDUCE)] for r in range(4)],
            ["chakra_collective_types_differ.1.et", "process group 1", "all-gather"],
        ),
        (
            "chakra_cpu_flag_string",
            [[node(1, "gemm", COMP_NODE, is_cpu_op={"string_val": "false"}, num_ops={"int64_val": 10**12})]] * 4,
            ["chakra_cpu_flag_string.0.et", "is_cpu_op"],
        ),
        (
            "chakra_send_not_received",
            [[fwd(), send] if r == 0 else [fwd()] for r in range(4)],
            ["chakra_send_not_received.0.et", "COMM_RECV_NODE"],
        ),
    ):
        if "/" in prefix:  # a folder of its own, with its own process groups
            (FILES / prefix).parent.mkdir()
            (FILES / prefix).with_name("comm_group.json").write_text(json.dumps({"1": [0, 0, 1, 2, 3]}) + "\n")
        for r, nodes in enumerate(ranks):
            with open(FILES / f"{prefix}.{r}.et", "wb") as f:
                encodeMessage(f, GlobalMetadata(version="1.0.0"))
                for n in nodes:
                    encodeMessage(f, n)
        args = ["run", "{dir}/chakra_world4.yaml", "--no-plots", "--trace", "{dir}/" + prefix]
        case(prefix.split("/")[0], None, msg, args=args)


def _tiny_trace(scenario: dict) -> dict:
    from simulator.scenario.loading import load_scenario
    from workloads.trace.builder import build_trace
    from workloads.trace.io import scenario_record, trace_to_dict

    s = load_scenario(scenario)
    d = trace_to_dict(build_trace(s.workload()))
    d["scenario"] = scenario_record(s)
    return d


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))
    main()
