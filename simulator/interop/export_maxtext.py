"""A scenario as the MaxText configuration that would run it (``stepsim export maxtext``): the
overrides of MaxText's ``src/maxtext/configs/base.yml`` (AI-Hypercomputer/maxtext e591f30)
for the model, the device mesh and the batch.

The mesh: MaxText multiplies its axes to the device count, inside a slice (``ici_*``) and
across slices over the data-centre network (``dcn_*``). stepsim's expert parallelism is carved
out of data parallelism, as MaxText's expert axis is out of the data and FSDP axes: ZeRO-3 /
FSDP layouts put ``dp / ep`` on ``fsdp``, the others on ``data``; the groups that span slices
go on the ``dcn_`` axes (data first). What MaxText has no setting for is refused, naming the
key (a pipeline schedule other than its 1F1B-style circular pipeline; no recompute, which has no
``remat_policy`` of its own: the closest, ``minimal``, is written with a comment).
"""

from __future__ import annotations

from simulator.scenario.errors import ScenarioError
from workloads.pipeline import get_schedule

REMAT = {"full": "full", "selective": "minimal_with_context", "none": "minimal"}


def _mesh(sc) -> dict:
    L, c = sc.layout, sc.cluster
    pods = max(1, c.n_pods)
    fsdp_axis = "fsdp" if L.zero >= 3 else "data"
    dp_rest = L.dp // L.ep if L.ep > 1 and L.dp % L.ep == 0 else L.dp
    ep = L.ep if dp_rest != L.dp else 1
    if dp_rest % pods:
        raise ScenarioError(
            f"the data-parallel degree left beside expert parallelism ({dp_rest}) must split over the {pods} slices",
            field="parallel.dp",
        )
    ici = {"data": 1, "fsdp": 1, "tensor": L.tp, "context": L.cp, "pipeline": L.pp, "expert": ep}
    ici[fsdp_axis] = dp_rest // pods
    dcn = {"data": pods} if pods > 1 else {}
    out = {f"ici_{k}_parallelism": v for k, v in ici.items()}
    out.update({f"dcn_{k}_parallelism": v for k, v in dcn.items()})
    if pods > 1:
        out["dcn_fsdp_parallelism"] = 1
    return out


def export_maxtext(sc) -> str:
    """The MaxText configuration (YAML overrides of ``base.yml``) of resolved scenario ``sc``."""
    if sc.layout.pp > 1 and not get_schedule(sc.schedule).megatron_lm:
        raise ScenarioError(f"MaxText's pipeline runs 1F1B-style schedules only, got {sc.schedule}", field="schedule")
    m, t, L = sc.model, sc.training, sc.layout
    micro = t.micro_batches(L.dp)
    cfg: dict = {
        "base_emb_dim": m.hidden,
        "base_num_query_heads": m.heads,
        "base_num_kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "base_mlp_dim": m.ffn_hidden,
        "base_num_decoder_layers": m.layers,
        "vocab_size": m.vocab,
        "mlp_activations": ["silu", "linear"] if m.ffn == "swiglu" else ["gelu"],
        "logits_via_embedding": bool(m.tied_embeddings),
    }
    if m.attention is not None:
        a = m.attention
        cfg.update(
            attention_type="mla",
            q_lora_rank=a.q_lora_rank,
            kv_lora_rank=a.kv_lora_rank,
            qk_nope_head_dim=a.qk_nope_head_dim,
            qk_rope_head_dim=a.qk_rope_head_dim,
            v_head_dim=a.v_head_dim,
        )
    if m.moe is not None:
        e = m.moe
        cfg.update(
            num_experts=e.experts,
            num_experts_per_tok=e.top_k,
            base_moe_mlp_dim=e.expert_ffn_hidden,
            first_num_dense_layers=e.dense_layers,
            shared_experts=e.shared_experts,
        )
    if m.mtp_depth:
        cfg["mtp_num_layers"] = m.mtp_depth
    cfg.update(_mesh(sc))
    if L.pp > 1:
        cfg["num_layers_per_pipeline_stage"] = m.layers // (L.pp * L.vpp) or 1
        cfg["num_pipeline_microbatches"] = micro
    cfg.update(
        max_target_length=t.seq_len,
        # MaxText's global batch: per_device_batch_size x devices x gradient_accumulation_steps
        # (a fraction where tensor, context or pipeline axes share a sequence)
        per_device_batch_size=t.global_batch_size / (L.world * (1 if L.pp > 1 else micro)),
        gradient_accumulation_steps=1 if L.pp > 1 else micro,
        dtype="bfloat16",
        quantization="fp8" if t.dtype == "fp8" else "",
        remat_policy=REMAT[t.recompute],
        opt_type={"adam": "adamw"}.get(t.optimizer, t.optimizer),
    )
    lines = [f"# {sc.name}: written by stepsim export maxtext (overrides of base.yml, maxtext e591f30)"]
    if t.recompute == "none":
        lines.append("# recompute none: MaxText has no remat policy that saves everything; 'minimal' saves the most")
    for k, v in cfg.items():
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, str):
            v = f'"{v}"'
        elif isinstance(v, list):
            v = "[" + ", ".join(f'"{x}"' for x in v) + "]"
        elif isinstance(v, float):
            v = f"{v:g}"
        lines.append(f"{k}: {v}")
    return "\n".join(lines) + "\n"
