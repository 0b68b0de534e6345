"""Shared fixtures: small model and device specs that need no built-in data."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Triton's `@triton.jit` reads TRITON_INTERPRET when a kernel module is imported, so it must be set
# before any test module (or a library it imports) pulls in `kernels`: without a GPU the kernels run
# in Triton's CPU interpreter.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings

from llmperf.specs import HardwareSpec, ModelSpec

# No test depends on how fast or busy the machine is: hypothesis's per-example deadline (200 ms) and
# its "too slow" health check are timings, so they are off for every property test, including one
# that forgets its own `deadline=None`.
settings.register_profile("llmperf", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("llmperf")


# ---- markers: `-m "not slow"` is the quick loop; `gpu` and `avx512` name what a test needs -------------

#: Tests that take seconds each on a 2-core CPU (`--durations` of the whole suite), so `pytest -m "not slow"`
#: leaves them out: a test file, or a test (all its parameters). They still run in the full suite and CI.
SLOW = (
    "tests/notebooks/",
    "tests/measure/test_calibrate.py",
    "tests/measure/test_commands.py",
    "tests/measure/test_profile.py",
    "tests/engine/test_engine_bench.py",
    "tests/kernels/test_compile.py",
    "tests/docs/test_site.py",
    "tests/docs/test_examples.py",
    "tests/report/test_report_todays.py",
    "tests/analysis/test_flop_counter.py",
    "tests/analysis/test_flop_counter.py::test_llama_gqa_matches_flop_counter",
    "tests/analysis/test_layers.py::test_decode_closed_form_for_any_layer_pattern",
    "tests/analysis/test_precision_deployed.py::test_outputs_say_which",
    "tests/analysis/test_rollup.py::test_single_estimate_equals_its_sweep_row",
    "tests/cli/test_cli.py::test_a_sweep_too_wide_for_80_columns_splits_by_model_device_precision",
    "tests/cli/test_file_safety.py::test_a_user_without_permission_is_refused_before_any_work",
    "tests/cli/test_file_safety.py::test_markup_in_names_is_text",
    "tests/cli/test_file_safety.py::test_report_symlink_mode_and_a_second_run",
    "tests/cli/test_plan_todays.py::test_deepseek_v3_on_8_h200_is_planned_in_every_layout",
    "tests/cli/test_plan_todays.py::test_simulate_takes_the_layout_and_says_how_it_priced",
    "tests/engine/test_batching.py::test_block_shortage_preempts_and_recomputes_without_corruption",
    "tests/engine/test_batching.py::test_every_request_gets_the_tokens_it_gets_alone",
    "tests/engine/test_batching.py::test_sampled_and_beam_requests_survive_preemption",
    "tests/engine/test_beam.py::test_equals_hf_generate",
    "tests/engine/test_block_pool.py::TestBlockManagerMachine::runTest",
    "tests/engine/test_chunked_prefix.py::test_chunked_prefill_gives_the_solo_tokens",
    "tests/engine/test_chunked_prefix.py::test_prefix_sharing_with_chunks_and_preemption",
    "tests/engine/test_cpu_kernels.py::test_a_build_is_cached_by_source_and_flags",
    "tests/engine/test_cpu_kernels.py::test_decode_attention_is_as_close_to_float64_as_sdpa",
    "tests/engine/test_cpu_kernels.py::test_the_bf16_rms_norm_rounds_where_hugging_face_rounds",
    "tests/engine/test_cpu_kernels.py::test_the_engine_runs_each_gemm_on_the_kernel_its_rows_call_for_and_the_rest_packed",
    "tests/engine/test_cpu_kernels.py::test_the_engine_runs_its_rms_norms_and_swiglu_on_the_kernels_in_fp32_and_bf16",
    "tests/engine/test_cpu_kernels.py::test_the_kernels_build_and_link_on_any_x86_host",
    "tests/engine/test_decode_layers.py::test_one_call_gives_the_logits_of_the_operators_one_by_one",
    "tests/engine/test_failures.py::test_engine_is_reusable_after_a_bad_request",
    "tests/engine/test_failures.py::test_engine_is_reusable_after_a_step_fails",
    "tests/engine/test_failures.py::test_from_pretrained_stops_at_the_checkpoint_eos",
    "tests/engine/test_failures.py::test_position_limit_matches_hf_at_the_edge",
    "tests/engine/test_failures.py::test_preempted_multi_sequence_request_comes_back_forked",
    "tests/engine/test_failures.py::test_random_workloads_with_failures_leave_the_pool_empty",
    "tests/engine/test_generate.py::test_a_seed_reproduces_a_sampled_run_and_another_seed_differs",
    "tests/engine/test_generate.py::test_sliding_window_equals_transformers_across_chunks_and_recompute",
    "tests/engine/test_generate.py::test_tokens_equal_transformers_generate",
    "tests/engine/test_math_fields.py::test_checkpoint_variants_load_equal_to_transformers_or_are_refused",
    "tests/engine/test_mixed_forward.py::test_grouped_forward_equals_one_forward_per_group",
    "tests/engine/test_model.py::test_triton_backend_equals_sdpa",
    "tests/engine/test_model.py::test_triton_ragged_multi_token_step_equals_sdpa",
    "tests/engine/test_ops.py::test_torch_ops_and_cpu_ops_give_the_same_logits",
    "tests/engine/test_shape.py::test_nothing_outside_the_cache_reaches_into_its_manager",
    "tests/engine/test_weights.py::test_saved_checkpoint_reproduces_transformers_logits",
    "tests/kernels/test_flash_attention.py::test_ragged_lengths",
    "tests/measure/test_kernel_bench.py::test_bench_case_end_to_end_with_fake_timer",
    "tests/report/test_html.py::test_user_strings_are_escaped",
    "tests/report/test_report_cli.py::test_estimate_sweep",
    "tests/report/test_report_cli.py::test_report_never_imports_torch",
    "tests/report/test_report_cli.py::test_runs_only",
    "tests/report/test_sample.py::test_sample_runs_still_load_and_draw",
    "tests/serving/test_cli_serving.py::test_plan_never_offers_a_replica_its_simulated_service_rate",
    "tests/serving/test_cli_serving.py::test_plan_never_serves_more_than_the_service_rate_per_replica",
    "tests/serving/test_cli_serving.py::test_plan_ranks_and_explains",
    "tests/serving/test_cli_serving.py::test_simulate_json_csv_and_find_max_rate",
    "tests/serving/test_engine_schedule.py::test_engine_and_simulator_schedules_match",
    "tests/serving/test_simulator.py::test_find_max_rate_brackets_the_slo",
    "tests/serving/test_simulator.py::test_find_max_rate_never_passes_the_service_rate",
    "tests/serving/test_simulator.py::test_littles_law_on_a_steady_run",
    "tests/serving/test_simulator.py::test_slos_at_the_observed_latencies_are_met",
    "tests/serving/test_windowed_blocks.py::test_random_runs_keep_the_invariants_and_the_bound",
    "tests/specs/test_hf_today.py::test_random_configs_cache_widths",
    "tests/specs/test_hf_today.py::test_tiny_kv_width_matches_the_cache",
    "tests/specs/test_spec_invariants.py::test_kv_bytes_scale_with_kv_heads_not_query_heads",
)
#: what the skip condition of a test that needs one says (`skipif` reasons): the hardware it needs
NEEDS = {"gpu": ("needs a CUDA device",), "avx512": ("cpu_kernels:", "AMX GEMM:")}


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ARG001
    """Mark `slow` the tests in SLOW, and `gpu` / `avx512` those whose skip condition is that hardware
    (`llmperf.engine.cpu`'s kernels need AVX-512; AMX tests are a subset), so `-m "not avx512"` runs what
    an AVX2-only CPU runs and `-m gpu` what only a CUDA device runs."""
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        if any(test == s or test.startswith(s + "::") or (s.endswith("/") and test.startswith(s)) for s in SLOW):
            item.add_marker(pytest.mark.slow)
        reasons = [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")]
        for marker, needles in NEEDS.items():
            if any(n in r for r in reasons for n in needles):
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):  # noqa: ANN001, ANN201
    """Run the test under umask 022, then 077 (the modes of what llmperf writes follow it)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """An empty llmperf cache folder for one test (`LLMPERF_CACHE_DIR`: no calibration in it), created
    only when llmperf writes to it. The CPU kernels the suite's cache already compiled are linked in,
    so an engine run here does not compile them again (seconds); nothing else is shared."""
    from llmperf.outputs import cache_dir

    suite = cache_dir()
    fresh = tmp_path / "llmperf-cache"
    compiled = sorted(suite.glob("cpu_kernels-*.so")) if suite.is_dir() else []
    if compiled:
        fresh.mkdir()
        for lib in compiled:
            (fresh / lib.name).symlink_to(lib)
    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(fresh))
    return fresh


@pytest.fixture
def tiny_llama() -> ModelSpec:
    return ModelSpec(name="tiny-llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, ffn_size=128, max_positions=256)


@pytest.fixture
def llama2_7b() -> ModelSpec:
    """Llama-2-7B built in code (the public config), independent of the YAML data."""
    return ModelSpec(name="llama-2-7b-code", vocab_size=32000, hidden_size=4096, num_layers=32,
                     num_heads=32, num_kv_heads=32, ffn_size=11008, max_positions=4096)


@pytest.fixture(scope="session")
def a100() -> HardwareSpec:
    return HardwareSpec(name="a100-test", peak_tflops={"fp32": 19.5, "fp16": 312, "bf16": 312, "int8": 624},
                        memory_bandwidth_gbps=2039, memory_gib=80, interconnect_gbps=300, num_sms=108,
                        sram_per_sm_kib=192, l2_cache_mib=40)
