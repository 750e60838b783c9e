"""Shared test fixtures: the real inputs under ../shared/data, skipped when absent."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
FIXTURES = REPO / "fixtures"


def simai_workloads() -> list[str]:
    """Every SimAI / AICB workload under ../shared/data/workloads (paths relative to it), for
    parametrising; ``["<missing>"]`` without the data, so that shared_path skips the test."""
    root = SHARED_DATA / "workloads"
    if not root.exists():
        return ["<missing>"]
    out = []
    for p in sorted(root.rglob("*.txt")):
        lines = p.read_text().splitlines()
        if len(lines) > 1 and lines[1].strip().isdigit():
            out.append(str(p.relative_to(SHARED_DATA)))
    return out


def shared_path(rel: str) -> Path:
    """A file under ../shared/data; skips the test with a clear reason when it is absent."""
    p = SHARED_DATA / rel
    if not p.exists():
        pytest.skip(f"needs ../shared/data/{rel} (real inputs, present in CI; absent in a fresh clone)")
    return p


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as a module (the benchmarks are scripts, not a
    package; their own imports of sibling benchmarks resolve through ``sys.path``)."""
    import importlib.util
    import sys

    path = REPO / "benchmarks" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack a .tar.gz/.tgz from shared data into ``dest`` (a tmp dir); returns ``dest``."""
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    return dest


def _recording_world(size: int):
    """Rank 0 of a ``size``-rank process group on the recording backend (collectives are
    recorded, not run, so the other ranks need not exist); torch is imported here, not at
    collection, so that torch-free test files stay collectable without it."""
    import torch.distributed as dist

    from echo_et.trace.recording import BACKEND_NAME, register_backend

    register_backend()
    dist.init_process_group(BACKEND_NAME, rank=0, world_size=size, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def world_of_one():
    """A one-rank group, for a workload's modules that need one (tensor-parallel layers at
    tp 1, gradient sync)."""
    yield from _recording_world(1)


@pytest.fixture
def world_of_two():
    """Rank 0 of a two-rank group: a tensor-parallel layer's share at tp 2."""
    yield from _recording_world(2)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip("needs ../shared/data (real inputs, present in CI; absent in a fresh clone)")
    return SHARED_DATA


# The tests left out of the fast subset (`python -m pytest -m "not slow"`, README): whole
# files, or single tests as "file.py::name", that take seconds each (a model traced, HTA, a
# sweep, a real trace's whole pipeline). CI runs everything.
SLOW = {
    # whole files
    "test_astra_sim_binary.py",
    "test_astra_sim_real.py",
    "test_kineto_real.py",
    "test_passes_real.py",
    "test_sim_real.py",
    "test_hta_timeline.py",
    "test_sweep_resume.py",
    "test_config_sweep.py",
    "test_trace_cli.py",
    "test_trace_gpt.py",
    "test_trace_insitu.py",
    "test_trace_layout.py",
    "test_trace_meta.py",
    "test_trace_steps.py",
    "test_restage_megatron.py::test_restaging_a_cpu_traced_megatron_job_matches_tracing",
    "test_bigscience.py::test_one_run_predicts_end_to_end",
    "test_simai_export.py::test_a_meta_device_trace_is_exported_from_its_prediction",
    "test_trace_user.py",
    "test_determinism.py",
    "test_fuzz_promise.py",
    # single tests (each several seconds: `pytest --durations`)
    "test_moe.py::test_real_run_reduces_the_gradients_of_unsplit_experts",
    "test_moe.py::test_meta_trace_equals_a_cpu_trace_on_every_rank",
    "test_moe.py::test_a_models_layouts_are_tried_with_expert_parallelism",
    "test_moe.py::test_a_moe_job_runs_in_astra_sim",
    "test_layout_grid.py::test_sweep_predicts_a_models_layouts",
    "test_architecture.py::test_library_errors_name_no_flag",
    "test_architecture.py::test_no_private_attribute_read_across_objects",
    "test_astra_sim_fit.py::test_dlrm_export_replays_to_the_measured_step",
    "test_chakra_read.py::test_feeder_counts_match_the_file",
    "test_chakra_write.py::test_round_trip_keeps_the_graph",
    "test_chrome_export.py::test_dlrm_measured_timeline_and_round_trip",
    "test_cli_basic.py::test_convert_check_inspect_export_on_every_real_input",
    "test_comm_calibrate.py::test_auto_picks_the_release_that_explains_the_multi_node_logs",
    "test_comm_calibrate.py::test_extrapolates_from_16_to_32_gpus",
    "test_comm_calibrate.py::test_profile_records_its_sources",
    "test_comm_calibrate.py::test_refitting_gives_identical_profiles",
    "test_comm_evaluate.py::test_cross_validation_reports_in_sample_and_held_out_errors",
    "test_comm_evaluate.py::test_plots_are_deterministic",
    "test_comm_launch.py::test_calibrate_choices_writes_the_matching_release_and_cap",
    "test_comm_tuning.py::test_the_32_gpu_step_comes_from_nccls_choice",
    "test_compute_retime.py::test_calibrate_compute_reproduces_the_shipped_a100_preset",
    "test_compute_retime.py::test_cli_errors_are_one_line_exit_2",
    "test_compute_retime.py::test_simulate_gpu_option_retimes_and_unknown_gpu_lists_the_presets",
    "test_compute_retime.py::test_simulate_retimes_an_untimed_job_for_its_gpu_and_with_a_profile",
    "test_first_run.py::test_pytest_q_prints_its_summary",
    "test_first_run.py::test_trace_keeps_profiler_noise_off_the_terminal",
    "test_first_run.py::test_validate_says_why_an_ex_situ_job_differs",
    "test_hostile_input.py::test_file_write_on_a_read_only_or_full_file_system",
    "test_hostile_input.py::test_real_chakra_feeder_trace_checks_and_simulates",
    "test_iteration_fit.py::test_calibrate_compute_fits_measured_iterations",
    "test_recompute_granularity.py::test_cli_flag_implies_recompute_and_refuses_unknown_levels",
    "test_recompute_granularity.py::test_sweep_configs_passes_the_granularity_to_every_row",
    "test_iteration_fit.py::test_calibrate_compute_iterations_with_a_collective_profile",
    "test_kineto_units.py::test_converted_times_are_the_file_microseconds_in_exact_ns",
    "test_passes_cli.py::test_scale_output_is_byte_identical_across_processes",
    "test_passes_gpt.py::test_restage_pp2_to_pp4_issues_what_tracing_at_pp4_issues",
    "test_passes_gpt.py::test_restaged_blocks_run_the_host_work_traced_at_pp4",
    "test_passes_gpt.py::test_scaled_64_rank_job_exports_to_astra_sim",
    "test_passes_gpt.py::test_scaling_dp2_to_dp8_equals_tracing_at_dp8",
    "test_passes_gpt.py::test_scaling_zero1_dp2_to_dp8_equals_tracing_at_dp8",
    "test_passes_gpt.py::test_traced_gpt_to_1024_ranks_checks_and_simulates",
    "test_pytorch_et.py::test_dlrm_eight_ranks_collectives_from_the_files",
    "test_pytorch_et.py::test_mutated_real_trace_never_crashes",
    "test_pytorch_et.py::test_resnet_110_groups_steps_and_sizes",
    "test_pytorch_et.py::test_stream_agrees_with_json_loads",
    "test_pytorch_et_fastpath.py::test_fast_path_same_job_as_reference_on_real_traces",
    "test_pytorch_et_fastpath.py::test_parse_struct_equals_parse_node",
    "test_repeats.py::test_an_expansion_past_the_limit_is_refused_not_attempted",
    "test_repeats.py::test_compact_trace_expands_to_the_flat_trace_byte_for_byte",
    "test_repeats.py::test_exports_of_the_compact_job_equal_those_of_the_flat_one",
    "test_repeats.py::test_simulate_command_on_a_compact_job_with_and_without_a_timeline",
    "test_repeats.py::test_too_many_instances_are_refused",
    "test_sim_cli.py::test_predict_with_a_calibrated_profile_and_a_bad_one",
    "test_sim_golden.py::test_real_dlrm_trace_simulates_as_before",
    "test_sweep.py::test_sweep_on_a_local_dask_cluster",
    # added 2026-12-05 (each 4-14 s: full collective fits, whole-job timelines and exports)
    "test_comm_calibrate.py::test_cross_validation_never_starts_from_a_measured_network",
    "test_comm_calibrate.py::test_a_fit_across_nodes_measures_the_network_from_the_spec_sheet",
    "test_chrome_export.py::test_streamed_export_equals_the_whole_writer_on_fixture_jobs",
    "test_chrome_export.py::test_streamed_export_equals_the_whole_writer_on_arbitrary_blocks",
    "test_sim_timeline_placed.py::test_fixture_jobs_timeline_unchanged",
    "test_export_streaming.py::test_chrome_export_streams_and_equals_the_expanded_export",
    # four meta-device traces twice each (with and without the kernel memo), 9 s in all
    "test_trace_memo.py::test_memo_gives_the_same_job_bytes",
    # two real gloo runs (1 and 3 processes) of the GPT, 9 s
    "test_interleaved_pipeline.py::test_real_run_gives_the_gradients_of_one_stage",
    # three real gloo runs of DeepSpeed's schedule against one stage (3-4 processes), 20 s
    "test_deepspeed_pipeline.py::test_real_run_gives_the_gradients_of_one_stage",
    # two real gloo runs of the Megatron GPT with sequence parallelism and one without, 25 s
    "test_sequence_parallel.py::test_real_run_gives_the_gradients_of_the_run_without_it",
    "test_timeline_stream.py::test_fixture_timelines_are_the_whole_writer_s",
    "test_timeline_stream.py::test_traced_gpt_timeline_is_the_whole_writer_s",
    # the DLRM Kineto job read and exported once, then 15 edits each checked by both checks
    # (1-3 s each, 25 s in all)
    "test_astra_sim_check_stream.py::test_dlrm_kineto_export_same_findings",
    # three CPU traces of a TP2 x PP2 gpt Job (6 s)
    "test_inject_replicas.py::test_injected_job_reduces_what_the_job_traced_at_that_dp_reduces",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        file = item.path.name
        name = item.originalname if hasattr(item, "originalname") else item.name
        if file in SLOW or f"{file}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)


def dead_pid() -> int:
    """The pid of a process that has exited (a killed run's, for its leftovers' names)."""
    import multiprocessing
    import os

    p = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    p.start()
    p.join()
    return p.pid


def saved_activation_bytes(fn, *args, exclude) -> int:
    """Bytes of the distinct storages autograd saves for the backward while ``fn`` runs,
    those of ``exclude`` (the parameters) left out."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values())
