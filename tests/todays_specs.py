"""Today's models as specs built by hand from their public configs (`data/hf-configs/`), independent of
the YAML catalog: the golden KV and memory tests build from these (one copy)."""

from __future__ import annotations

#: deepseek-ai/DeepSeek-V3 config.json: 61 layers, MLA (kv_lora_rank 512, qk_rope 64), 3 dense layers
DEEPSEEK_V3 = dict(name="deepseek-v3-code", vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128,
                   num_kv_heads=128, ffn_size=18432, moe_ffn_size=2048, num_experts=256, experts_per_token=8,
                   shared_experts=1, dense_layers=(0, 1, 2), kv_lora_rank=512, q_lora_rank=1536,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, router_score_bias=True,
                   max_positions=163840, dtype="bf16")
#: openai/gpt-oss-20b config.json: 24 layers alternating sliding (128) / full, 8 KV heads x 64
GPT_OSS_20B = dict(name="gpt-oss-20b-code", vocab_size=201088, hidden_size=2880, num_layers=24, num_heads=64,
                   num_kv_heads=8, head_dim=64, ffn_size=2880, num_experts=32, experts_per_token=4,
                   max_positions=131072, sliding_window=128,
                   layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(24)),
                   qkv_bias=True, out_bias=True, mlp_bias=True, router_bias=True, attn_sinks=True, dtype="bf16")
#: meta-llama/Llama-4-Scout-17B-16E text config: 48 layers, every 4th global (NoPE), the others chunked (8192)
SCOUT = dict(name="llama-4-scout-code", vocab_size=202048, hidden_size=5120, num_layers=48, num_heads=40,
             num_kv_heads=8, head_dim=128, ffn_size=16384, moe_ffn_size=8192, num_experts=16, experts_per_token=1,
             shared_experts=1, max_positions=10485760, attention_chunk_size=8192,
             layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)),
             nope_layers=tuple(i for i in range(48) if (i + 1) % 4 == 0), qk_norm="l2", dtype="bf16")
