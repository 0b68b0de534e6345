"""Property-based invariants of the specs (hypothesis): KV bytes, parameter counts, precisions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.specs import STORAGE_DTYPES, ModelSpec, Precision, dtype_bytes, normalize_dtype

# Bytes per element, written out by hand (not read from llmperf.specs.DTYPE_BYTES, so a wrong entry
# in that table fails here): IEEE fp32 4, fp16 / bf16 2, fp8 (e4m3 / e5m2) 1, int8 1, int4 and fp4 (e2m1)
# two per byte.
BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}


@st.composite
def models(draw) -> ModelSpec:
    """Any valid decoder: MHA/GQA/MQA, any block family, optional MoE, biases, tying."""
    kv_heads = draw(st.integers(1, 8))
    heads = kv_heads * draw(st.integers(1, 8))
    head_dim = draw(st.sampled_from([8, 16, 64, 128]))
    family = draw(st.sampled_from(["llama", "gpt2", "opt", "gpt_neox"]))
    experts = draw(st.integers(1, 8))
    llama = family == "llama"
    return ModelSpec(
        name="m", family=family, vocab_size=draw(st.integers(1, 200_000)), hidden_size=heads * head_dim,
        num_layers=draw(st.integers(1, 128)), num_heads=heads, num_kv_heads=kv_heads,
        ffn_size=draw(st.integers(1, 60_000)), ffn_kind="swiglu" if llama else draw(st.sampled_from(["gelu", "relu"])),
        num_experts=experts, experts_per_token=draw(st.integers(1, experts)),
        norm_kind="rmsnorm" if llama else "layernorm", pos_encoding=draw(st.sampled_from(["rope", "learned"])),
        max_positions=draw(st.integers(1, 1 << 17)), tied_embeddings=draw(st.booleans()),
        qkv_bias=draw(st.booleans()), out_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()))


storage_dtypes = st.sampled_from(STORAGE_DTYPES)


@settings(max_examples=200, deadline=None)
@given(models(), st.integers(1, 16), storage_dtypes)
def test_kv_bytes_linear_in_layers(m, k, dtype):
    deeper = m.scaled(num_layers=k * m.num_layers)
    assert deeper.kv_bytes_per_token(dtype) == k * m.kv_bytes_per_token(dtype)
    one_layer = m.scaled(num_layers=1)
    assert m.kv_bytes_per_token(dtype) == m.num_layers * one_layer.kv_bytes_per_token(dtype)


@settings(max_examples=200, deadline=None)
@given(models(), storage_dtypes)
def test_kv_bytes_linear_in_dtype_bytes(m, dtype):
    per_byte = m.kv_bytes_per_token("int8")  # 1 byte per element
    assert per_byte == 2 * m.num_layers * m.num_kv_heads * m.head_dim
    assert m.kv_bytes_per_token(dtype) == per_byte * dtype_bytes(dtype)
    assert m.kv_bytes_per_token(dtype) == m.kv_bytes_per_token("fp16") * dtype_bytes(dtype) / 2


@settings(max_examples=200, deadline=None)
@given(models(), st.integers(1, 8))
def test_kv_bytes_scale_with_kv_heads_not_query_heads(m, g):
    """GQA: more query heads per KV head leave the cache unchanged."""
    wider = m.scaled(num_heads=m.num_heads * g, head_dim=m.head_dim, hidden_size=m.hidden_size)
    assert wider.kv_bytes_per_token() == m.kv_bytes_per_token()


@settings(max_examples=200, deadline=None)
@given(models(), st.integers(1, 64))
def test_param_count_monotone_and_affine_in_layers(m, extra):
    deeper = m.scaled(num_layers=m.num_layers + extra)
    assert deeper.param_count > m.param_count
    assert deeper.param_count - m.param_count == extra * m.params_per_layer
    assert m.params_per_layer > 0
    # active <= total, equal for a dense FFN
    assert m.active_param_count <= m.param_count
    assert (m.active_param_count == m.param_count) == (m.num_experts == m.experts_per_token)


@settings(max_examples=200, deadline=None)
@given(models())
def test_tying_saves_exactly_one_vocab_matrix(m):
    untied, tied = m.scaled(tied_embeddings=False), m.scaled(tied_embeddings=True)
    assert untied.param_count - tied.param_count == m.vocab_size * m.hidden_size


@settings(max_examples=100, deadline=None)
@given(models(), storage_dtypes)
def test_weight_bytes(m, dtype):
    assert m.weight_bytes(dtype) == m.param_count * BYTES[dtype]


@given(storage_dtypes, storage_dtypes, storage_dtypes)
def test_precision_accepts_every_storage_dtype(w, a, kv):
    p = Precision(weights=w, activations=a, kv=kv)
    assert (p.weight_bytes, p.act_bytes, p.kv_bytes) == (BYTES[w], BYTES[a], BYTES[kv])
    assert Precision.uniform(w) == Precision(weights=w, activations=w, kv=w)
    assert str(Precision.uniform(w)) == w


def test_storage_dtypes_are_the_hand_written_ones():
    assert sorted(STORAGE_DTYPES) == sorted(BYTES)


def test_weight_bytes_by_hand():
    """Llama-2-7B: 6,738,415,616 parameters -> 13.48 GB at fp16, 3.37 GB at int4 (no group scales)."""
    from llmperf.specs import load_model
    m = load_model("llama-2-7b")
    assert m.weight_bytes("fp16") == 13_476_831_232
    assert m.weight_bytes("bf16") == 13_476_831_232
    assert m.weight_bytes("fp32") == 26_953_662_464
    assert m.weight_bytes("int8") == m.weight_bytes("fp8") == 6_738_415_616
    assert m.weight_bytes("int4") == 3_369_207_808
    assert m.kv_bytes_per_token("fp8") == 262_144 and m.kv_bytes_per_token("int4") == 131_072


def test_dtype_bytes():
    assert dtype_bytes("int4") == 0.5 and Precision.uniform("int4").kv_bytes == 0.5
    assert [dtype_bytes(d) for d in STORAGE_DTYPES] == [4, 2, 2, 1, 1, 0.5, 0.5]
    assert str(Precision(weights="int4", kv="fp8")) == "w:int4/a:fp16/kv:fp8"


@pytest.mark.parametrize("alias,canonical", [("float16", "fp16"), ("half", "fp16"), ("bfloat16", "bf16"),
                                             ("float32", "fp32"), ("float", "fp32"), ("float8_e4m3fn", "fp8"),
                                             ("e4m3", "fp8"), (" BF16 ", "bf16"), ("INT4", "int4")])
def test_dtype_aliases(alias, canonical):
    assert normalize_dtype(alias) == canonical
    assert Precision(kv=alias).kv == canonical


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["int4", "int8"]), st.integers(1, 20_000), st.integers(1, 20_000),
       st.sampled_from([None, -1, 32, 64, 100, 128, 256]), st.booleans())
def test_every_input_of_a_row_has_its_group_scale(w, d_in, d_out, group, zero):
    """Group quantisation (GPTQ/AWQ): each output row has one scale (and zero) per group of `group`
    inputs, a last partial group included: ceil(d_in / group) groups (one per row when per channel)."""
    p = Precision(weights=w, group_size=group, zero_point=zero)
    per_group = 2.0 + (BYTES[w] if zero else 0.0)
    groups_per_row = (p.matrix_bytes(d_in, d_out) - d_in * d_out * BYTES[w]) / (d_out * per_group)
    assert groups_per_row == int(groups_per_row)
    g = p.effective_group_size or d_in
    assert (groups_per_row - 1) * g < d_in <= groups_per_row * g


def test_int4_scales_of_widths_the_group_does_not_divide():
    """A 4100-wide input in groups of 128: 32 full groups and one of 4, so 33 scales and zeros a row
    (2 B + 0.5 B each); GPT-2 XL's 1600-wide rows are 12.5 groups of 128: 13."""
    int4 = Precision(weights="int4")
    assert int4.matrix_bytes(4100, 4096) == 4100 * 4096 * 0.5 + 4096 * 33 * 2.5
    assert int4.matrix_bytes(1600, 4800) == 1600 * 4800 * 0.5 + 4800 * 13 * 2.5
    assert Precision(weights="int8", group_size=128).matrix_bytes(4100, 10) == 4100 * 10 + 10 * 33 * 2
    assert Precision(weights="int4", embeddings="int4").embedding_matrix_bytes(1600, 50257) == \
        1600 * 50257 * 0.5 + 50257 * 13 * 2.5
