"""MiniMax-M2, GLM-4.7-Flash, Kimi K2.5 (its text model) and ERNIE 4.5 MoE from tiny checkpoints saved by
transformers.

MiniMax-M2 (`minimax_m2`): q and k each RMS-normed across all their heads at once (weights of H * D and
H_kv * D), partial rotary positions, every layer MoE routed by sigmoid scores plus the fp32 score-correction
bias that lives on the MoE block (saved as `block_sparse_moe.e_score_correction_bias`, experts as Mixtral's
`w1/w3/w2`). GLM-4.7-Flash (`glm4_moe_lite`): DeepSeek-V3's latent attention and MoE, dense layers from
`mlp_layer_types`. Kimi K2.5 (`kimi_k25`): a DeepSeek-V3 text model inside a multimodal wrapper, its head
tied to the embedding, saved by transformers under `language_model.model.blocks.` (as published:
`language_model.model.layers.`). ERNIE 4.5 (`ernie4_5_moe`): GLM-style interleaved rotary pairs, softmax
routing with a (1, E) score correction saved as `mlp.moe_statics.` (held as `mlp.gate.moe_statics.`).

Each: the same fp32 logits as transformers (within 1e-5), the same generate() tokens over CASES x ENGINES
(paged, contiguous and chunked caches; ragged prompts batched continuously). MiniMax-M2 also: the norm's
weights at their full width, recorded as `qk_norm`, different logits from a per-head norm, the weights
saved back under transformers' names, and tensor parallelism refusing it by name. OLMo 2 / 3 (the same
norm across heads, post norms): logits and greedy tokens. The score-correction
buffers are moved by noise and the checkpoints saved again, so the bias takes part in the choice.
"""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, Recorder, SamplingParams, from_pretrained, to_hf_state_dict
from llmperf.engine.tensor_parallel import shard_spec

from checkpoints import CASES, ENGINES, PROMPTS, assert_generation_matches, assert_logits_match, saved_checkpoint

TOL = 1e-5  # fp32 (rtol and atol): measured at most 9.4e-6 absolute on logits up to 7.2
NOISE = 0.2  # as tests/engine/test_moe_families.py: tiny routers separate the experts

_MLA = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=32,
            qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, rms_norm_eps=1e-5, q_lora_rank=48, n_group=1, topk_group=1)
CONFIGS = {
    # 4 query heads of 16 over 2 KV heads: q normed over 64 features, k over 32; rotary on 8 of 16
    "minimax_m2": dict(model_type="minimax_m2", vocab_size=128, hidden_size=64, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, intermediate_size=32, num_hidden_layers=3,
                       num_local_experts=4, num_experts_per_tok=2, rotary_dim=8, max_position_embeddings=64,
                       bos_token_id=None, eos_token_id=None),
    "glm4_moe_lite": dict(_MLA, model_type="glm4_moe_lite", mlp_layer_types=["dense", "sparse", "sparse"]),
    # layer 0 dense, 1-2 MoE with a shared expert; softmax routing with the (1, E) correction in `moe_statics`
    "ernie4_5_moe": dict(model_type="ernie4_5_moe", vocab_size=128, hidden_size=64, intermediate_size=96,
                         moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, moe_num_experts=8, moe_k=2, moe_num_shared_experts=1,
                         moe_layer_start_index=1, moe_layer_interval=1, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None),
}
#: Kimi K2.5: the wrapper's text model (layer 0 dense) and a one-layer vision tower
KIMI_TEXT = dict(_MLA, model_type="deepseek_v3", first_k_dense_replace=1)
KIMI_VISION = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=32,
                   pos_emb_height=4, pos_emb_width=4, pos_emb_time=2)
NAMES = [*CONFIGS, "kimi_k25"]


def _move_score_bias(hf, path) -> None:
    """Move every score-correction buffer (zeros at init; ERNIE's is a parameter) by noise and save the
    checkpoint again."""
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        buffers = [b for n, b in (*hf.named_buffers(), *hf.named_parameters()) if n.endswith("e_score_correction_bias")]
        assert buffers
        for b in buffers:
            b.add_(torch.randn(b.shape, generator=g) * 0.1)
    hf.save_pretrained(path)


def _kimi_checkpoint(path):
    import transformers

    torch.manual_seed(3)
    cfg = transformers.Kimi_K25Config(text_config=KIMI_TEXT, vision_config=KIMI_VISION)
    hf = transformers.AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32).eval()
    assert hf.lm_head.weight is hf.get_input_embeddings().weight
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NOISE)
    hf.generation_config.eos_token_id = hf.generation_config.bos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name in NAMES:
        path = tmp_path_factory.mktemp(name)
        hf = _kimi_checkpoint(path) if name == "kimi_k25" else saved_checkpoint(CONFIGS[name], path, seed=3,
                                                                                   noise=NOISE)
        _move_score_bias(hf, path)
        out[name] = (path, hf)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_transformers(checkpoints, name):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf, tol=TOL)
    assert_logits_match(path, hf, tol=TOL, weight_layout="in_out", batch=1, tokens=9)


_MEMO: dict = {}


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NAMES)
def test_tokens_equal_transformers_generate(checkpoints, name, case, engine):
    path, hf = checkpoints[name]
    assert_generation_matches(path, hf, case, engine, memo=_MEMO)


def test_the_checkpoints_are_read_where_transformers_saves_them(checkpoints):
    """MiniMax-M2's experts and score bias as transformers saves them (Mixtral's names, the bias on the
    block), Kimi K2.5's text model under `language_model.model.blocks.`, its head tied (no tensor)."""
    from safetensors import safe_open

    with safe_open(str(checkpoints["minimax_m2"][0] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"model.layers.0.block_sparse_moe.e_score_correction_bias",
            "model.layers.0.block_sparse_moe.experts.0.w1.weight"} <= keys
    with safe_open(str(checkpoints["kimi_k25"][0] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "language_model.model.blocks.1.mlp.gate.e_score_correction_bias" in keys
    assert not any("lm_head" in k for k in keys)
    assert from_pretrained(checkpoints["kimi_k25"][0], dtype="fp32").spec.tied_embeddings
    with safe_open(str(checkpoints["ernie4_5_moe"][0] / "model.safetensors"), "pt") as f:
        assert f.get_slice("model.layers.1.mlp.moe_statics.e_score_correction_bias").get_shape() == [1, 8]


def test_ernie_weights_save_back_under_transformers_names(checkpoints):
    """ERNIE 4.5's correction goes back where transformers holds it (`mlp.gate.moe_statics.`, (1, E))."""
    path, hf = checkpoints["ernie4_5_moe"]
    theirs = hf.state_dict()
    saved = to_hf_state_dict(from_pretrained(path, dtype="fp32"))
    assert {k for k in theirs if "rotary" not in k} == set(saved)
    for k, v in saved.items():
        assert torch.equal(v, theirs[k]), k


def test_kimi_k25_as_published(checkpoints, tmp_path):
    """The published names (`language_model.model.layers.`) load to the same logits."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path, hf = checkpoints["kimi_k25"]
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        tensors = {k.replace("language_model.model.blocks.", "language_model.model.layers."): f.get_tensor(k)
                   for k in f.keys()}
    assert any(k.startswith("language_model.model.layers.") for k in tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    assert_logits_match(tmp_path, hf, tol=TOL)


def test_minimax_q_k_norm_across_heads(checkpoints):
    """The norms' weights are the checkpoint's full-width ones; the norm is recorded as `qk_norm`, once
    per layer and step; a per-head norm of the same weights would give other logits."""
    path, hf = checkpoints["minimax_m2"]
    model = from_pretrained(path, dtype="fp32")
    spec = model.spec
    assert spec.qk_norm == "rmsnorm_across_heads"
    theirs = hf.state_dict()
    for i, layer in enumerate(model.layers):
        assert layer.q_norm.weight.shape == (spec.num_heads * spec.head_dim,)
        assert layer.k_norm.weight.shape == (spec.num_kv_heads * spec.head_dim,)
        assert torch.equal(layer.q_norm.weight, theirs[f"model.layers.{i}.self_attn.q_norm.weight"])
        assert torch.equal(layer.moe_ffn.router_score_bias, theirs[f"model.layers.{i}.mlp.e_score_correction_bias"])
    rec = Recorder()
    Engine(model).generate([PROMPTS[0]], SamplingParams(max_new_tokens=2), recorder=rec)
    df = rec.trace.to_frame()
    steps = len(df[["phase", "step"]].drop_duplicates())  # a prefill and a decode step
    assert (df[df.op == "qk_norm"].groupby("layer").size() == steps).all()
    assert sorted(df[df.op == "qk_norm"].layer.unique()) == list(range(spec.num_layers))
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        across = model(ids, all_logits=True)
        for layer in model.layers:  # the same math per head: a norm of D features, each head its own
            layer.q_norm.shape = layer.k_norm.shape = (spec.head_dim,)
            layer.q_norm.weight.data = layer.q_norm.weight.data[:spec.head_dim].clone()
            layer.k_norm.weight.data = layer.k_norm.weight.data[:spec.head_dim].clone()
        per_head = model(ids, all_logits=True)
    assert (across - per_head).abs().max() > 1e-3


def test_the_score_bias_changes_the_choice(checkpoints):
    """Each checkpoint's score-correction bias is read and changes which experts are chosen: without it the
    logits differ."""
    for name in NAMES:
        model = from_pretrained(checkpoints[name][0], dtype="fp32")
        ids = torch.tensor([PROMPTS[0]])
        with torch.no_grad():
            biased = model(ids, all_logits=True)
            biases = [m.router_score_bias for m in model.modules() if getattr(m, "router_score_bias", None) is not None]
            assert biases and all(b.abs().max() > 0 for b in biases)
            for b in biases:
                b.zero_()
            assert (model(ids, all_logits=True) - biased).abs().max() > 1e-3, name


def test_minimax_weights_save_back_under_transformers_names(checkpoints):
    path, hf = checkpoints["minimax_m2"]
    theirs = hf.state_dict()
    for layout in ("out_in", "in_out"):
        saved = to_hf_state_dict(from_pretrained(path, dtype="fp32", weight_layout=layout))
        assert {k for k in theirs if "rotary" not in k} == set(saved)
        for k, v in saved.items():
            assert torch.equal(v, theirs[k]), k


#: OLMo 2 / OLMo 3 norm q and k across all heads too (with post norms; OLMo 3 slides 3 layers in 4): the
#: engine builds them with the same norm
OLMO = {mt: dict(model_type=mt, vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=None,
                 bos_token_id=None, eos_token_id=None, **extra)
        for mt, extra in (("olmo2", {}), ("olmo3", dict(sliding_window=6)))}


@pytest.mark.parametrize("name", list(OLMO))
def test_olmo_norm_across_heads_equals_transformers(name, tmp_path):
    hf = saved_checkpoint(OLMO[name], tmp_path, seed=3, noise=NOISE)
    assert from_pretrained(tmp_path, dtype="fp32").spec.qk_norm == "rmsnorm_across_heads"
    assert_logits_match(tmp_path, hf, tol=TOL)
    memo: dict = {}
    for engine in ENGINES:
        assert_generation_matches(tmp_path, hf, "greedy", engine, memo=memo)


def test_tensor_parallelism_refuses_the_norm_across_heads_by_name(checkpoints):
    spec = from_pretrained(checkpoints["minimax_m2"][0], dtype="fp32").spec
    for s in (spec, spec.scaled(num_experts=1, experts_per_token=1, moe_ffn_size=None, router_score_bias=False)):
        with pytest.raises(ValueError, match=r"^qk_norm: .* norms q and k across all heads") as info:
            shard_spec(s, 2)
        assert "\n" not in str(info.value)
