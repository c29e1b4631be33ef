"""The studies split into subpackages (issue 16: ``fp8lab/capacity/``, ``fp8lab/serving/``,
``fp8lab/calibration/``, ``fp8lab/quality/``, ``fp8lab/longctx/``, ``fp8lab/audit/``, ``fp8lab/decode/``,
``fp8lab/prefix/``): every name the former single modules offered is still on the package, the functions whose
names match a submodule (``px.summary``, ``px.verdict``, ``lc.tables``, ``quality.verdict``) stay the functions,
the modules import downwards only (``spec`` never imports ``run`` or a table; Study 02 builds on Study 03, never
the reverse), each stays under about 600 lines, and importing a study does not load matplotlib."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

from fp8lab.paths import REPO_ROOT

#: The public names notebooks, tests, scripts, fp8lab/prefix/worker.py and the audit use, or that the former modules
#: defined (fp8lab/capacity.py, fp8lab/longctx.py and fp8lab/prefix.py before the split).
PUBLIC = {
    "capacity": """COLUMNS NOT_RUN RECORD_COLUMNS capacity_check check_record_roots records_check records_markdown
        summarize summarize_records verdict_markdown CapacitySpec CapacityRun run_capacity summary summary_rows
        tables verdicts""",
    "longctx": """BASELINE EMULATED_ROLE GROWTH_METRICS LongCtxPlan LongCtxResult NULL_BLOCKS STUDY Tables blocks_for
        blocksize_table boundary_table capacity_frontier claims crossover_table divergence_by_position
        divergence_table divergence_trend fit_growth fit_phases fitted fitted_crossover frontier_at_budgets
        growth_table longest_context max_concurrency_at measured_crossover parse_estimated_max_len passkey_accuracy
        passkey_table phase_meta plan_table position_divergence predicted_num_blocks quality_documents
        quality_phases ramp_max_model_len ramp_phases ramp_prompt ramp_table random_token_table run_study
        speed_table stored_divergence summary_values sweep_phases tables verdict_markdown overlap_peak
        length_grid document_ids passkey_items passkey_correct insert_at_depth assemble_document json_object
        PASSKEY_NEEDLE PASSKEY_QUESTION PASSKEY_TASK PASSKEY_OUTPUT_TOKENS PasskeyItem resolve_model""",
    "prefix": """CLAIM BlockPool PrefixRun PrefixSpec Shape STUDY PROTOCOL CPU_DEFAULT_BLOCK WorkloadKind PromptSource
        cell_table claim_evidence claim_verdict compare_outputs conversation_blocks conversation_pool
        correctness_table knee_formula knee_simulated knee_table load measured_knee parse_workloads plan
        run_prefix sim_hit_rate simulate summary sweep_table verdict""",
    "serving": """Arrival DEFAULT_BLOCK_SIZE DELTA_COLUMNS ENGINE_COLUMNS Metric ROW_METRICS STUDY ServingPlan ServingResult
        ServingSpec attribute_shared_memory bench_args build_phases capacity_ladder capacity_search capacity_table
        concurrency_limit default_block_size delta_line delta_row delta_table engine_table estimate_seconds
        fidelity_check fidelity_line fidelity_summary headline_metrics itl_frame kv_usage_timeline latency_summary
        main mean_context method_table min_requests noise_floor_table open_loop_schedule open_loop_table
        paired_schedule phase_meta phase_payload phase_records plan_from_params predicted_blocks preemption_line
        profile_estimate require_ok resolve_concurrency roofline_measured roofline_tables run_device
        run_fp8lab_offline run_study run_vllm_bench schedule_table summary_rows summary_values throughput_table
        trial_order verdict per_trial tput_point""",
    "decode": """ANCHORS PROTOCOL STUDY DecodeRun DecodeSpec capacity_table crossover_table find_run fit_table load margin
        plan point_table roofline_table run_decode store_bandwidth summary summary_rows verdict""",
    # the claims audit (fp8lab/audit.py before the split): what notebooks, tests and scripts use, and its __all__
    "audit": """ARITHMETIC AuditSpec CLAIM15_OPTIONS CLAIM5 CLAIMS CLAIMS_BY_ID COMPUTATION CONFIRMED CPU_EVIDENCE
        DYNAMIC_CHANGES_KEY Evidence Finding GPU_EVIDENCE INCONCLUSIVE Missing NOT_TESTABLE PHYSICS PREFIX_VERDICTS
        REFUTED RULES Report Rule SERVING_DELTAS Setting VERDICTS audit block_size_finding calibration_scale_diffs
        claimed_kv_bytes_per_token combine decide decode_detectable decode_grid default_configs details_markdown
        evidence_frame format_facts headline judge links load_evidence load_options load_report option_exists
        options_table parts_verdict quality_top3 ramp_noise rows_note rule_128k_throughput rule_32_token_calibration
        rule_block_size rule_gain_at_batch_1 rule_long_speed rule_long_tpot rule_loss_grows_with_batch rule_mix
        rule_top3_band rule_top3_threshold rule_total_memory rule_ttft_spread safe study_setting styled
        summary_values verdict_frame verdict_markdown""",
    "calibration": """AmaxCapture CALIB_ATTN CALIB_PROMPT CLAIM_THRESHOLD Calibration CalibrationPool CalibrationSpec
        DYNAMIC_LABEL EMULATED_SUFFIX FORMAT_DTYPES MANIFEST REFERENCE SCALES_FILE STRATEGIES STUDY ScaleSet Strategy
        Tensor VLLM_DYNAMIC_DIVISORS attention_prefixes build_scale_sets calibrate calibration_pool capture_amax
        capture_heldout capture_path claim_verdict convergence_table default_scale_set draw_samples export_scale_set
        export_sets find_set head_reduction_check headline kv_cache_scheme_for logprob_vectors prompt_ids prompt_points
        quality_label quality_phases quality_reserved_tokens quality_scale_sets quant_error_summary quant_error_table
        rel_diff run_dynamic scale_diff_summary scale_diff_table scale_set_dir scale_set_from_capture scale_tensors
        scales_from_amax snr_db stored_capture summary_rows tokens_to_threshold batches CalibrationStudySpec""",
    "quality": """BASELINE CopyItem DEFAULT_PROMPTS KVConfig PHASES QualityRuns QualitySpec REPORT_FINE_BAND
        REPORT_N_TOKENS REPORT_THRESHOLD VerdictRules agreement_rate attention_error_table by_position capture_prompts
        copy_task_items delta_ppl_pct engine_roundtrip first_divergence greedy_phase greedy_table headline
        identical_prefix_len kl_topk kv_configs load_prompt_set perplexity ppl_by_label ppl_phase ppl_table ppl_windows
        roundtrip_points roundtrip_summary roundtrip_table run_quality study_phases summary_rows summary_table
        task_phase task_table task_tf_phase teacher_phase teacher_table token_match_fraction top3_by_category
        topk_curve topk_overlap verdict verdict_markdown causal_attention QualityStudySpec""",
}
#: The audit's rule modules, by topic.
RULE_TOPICS = ("memory", "serving", "longctx", "quality", "facts")
#: Submodules of each study that the spec must never import (the spec sits at the bottom of its study).
ABOVE_SPEC = {
    "capacity": {"check", "records", "run", "tables", "verdict", "summary", "plots"},
    "longctx": {"run", "ramp", "growth", "divergence", "tables", "verdict", "summary", "plots"},
    "prefix": {"run", "tables", "verdict", "summary", "plots", "prompts"},
    "serving": {"schedule", "estimate", "paired", "run", "tables", "deltas", "verdict", "summary", "fidelity", "plots"},
    "decode": {"run", "tables", "verdict", "summary", "plots"},
    "audit": {"run", "tables", "verdict", "summary", "readers", "study", *(f"rules_{t}" for t in RULE_TOPICS)},
    "calibration": {"run", "capture", "scales", "tables", "export", "endtoend", "verdict", "summary", "plots", "study"},
    "quality": {"run", "metrics", "inputs", "tables", "roundtrip", "verdict", "summary", "plots", "study"},
}
MAX_LINES = 600


@pytest.mark.parametrize("study", sorted(PUBLIC))
def test_the_package_offers_every_former_public_name(study):
    pkg = importlib.import_module(f"fp8lab.{study}")
    missing = [n for n in PUBLIC[study].split() if not hasattr(pkg, n)]
    assert not missing, missing


def test_functions_named_like_a_submodule_stay_functions():
    from fp8lab import capacity as cap
    from fp8lab import decode, quality, serving
    from fp8lab import longctx as lc
    from fp8lab import prefix as px

    for name in (
        "fp8lab.longctx.tables",
        "fp8lab.prefix.summary",
        "fp8lab.prefix.verdict",
        "fp8lab.capacity.tables",
        "fp8lab.capacity.summary",
        "fp8lab.capacity.study",
        "fp8lab.serving.verdict",
        "fp8lab.decode.summary",
        "fp8lab.decode.verdict",
        "fp8lab.quality.verdict",
    ):
        mod = importlib.import_module(name)  # importing the submodule again must not rebind the package's name
        assert mod.__name__ == name and mod.__file__.endswith(name.rsplit(".", 1)[1] + ".py")
    assert callable(lc.tables) and lc.tables.__name__ == "tables" and isinstance(lc.Tables, type)
    assert callable(px.summary) and px.summary.__name__ == "summary"
    assert callable(px.verdict) and px.verdict.__name__ == "verdict"
    assert callable(cap.tables) and cap.tables.__name__ == "tables"
    assert callable(cap.summary) and cap.summary.__name__ == "summary"
    assert callable(serving.verdict) and serving.verdict.__name__ == "verdict"
    assert callable(decode.summary) and decode.summary.__name__ == "summary"
    assert callable(decode.verdict) and decode.verdict.__name__ == "verdict"
    assert callable(quality.verdict) and quality.verdict.__module__ == "fp8lab.quality.verdict"
    for pkg in (px, lc, cap, serving, decode):
        assert set(pkg.__all__) <= set(dir(pkg))


def _imports(path) -> set[str]:
    """Every fp8lab module a file imports, at its top or inside a function (not under ``if TYPE_CHECKING:``,
    which is never executed)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fp8lab"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("fp8lab"))
    return out


@pytest.mark.parametrize("study", sorted(PUBLIC))
def test_modules_import_downwards_only_and_stay_small(study):
    root = REPO_ROOT / "fp8lab" / study
    files = {p.stem: p for p in root.glob("*.py") if p.stem != "__init__"}
    assert "spec" in files and "run" in files and len(files) >= 6, sorted(files)
    graph = {
        name: {m.split(".")[2] for m in _imports(p) if m.startswith(f"fp8lab.{study}.") and m.count(".") >= 2} - {name}
        for name, p in files.items()
    }
    assert not graph["spec"] & ABOVE_SPEC[study], graph["spec"]
    # no cycle among the submodules (a cycle would make the package's import order matter)
    seen: dict[str, int] = {}

    def visit(n: str, stack: tuple[str, ...]) -> None:
        assert n not in stack, f"import cycle: {' -> '.join((*stack, n))}"
        if seen.get(n):
            return
        for m in graph.get(n, ()):
            visit(m, (*stack, n))
        seen[n] = 1

    for n in graph:
        visit(n, ())
    sizes = {p.name: len(p.read_text().splitlines()) for p in root.glob("*.py")}
    assert all(n <= MAX_LINES for n in sizes.values()), sizes


def test_importing_a_study_loads_neither_matplotlib_nor_vllm():
    code = (
        "import sys, fp8lab.capacity, fp8lab.longctx, fp8lab.prefix, fp8lab.serving.study, fp8lab.decode.study, "
        "fp8lab.audit.study, fp8lab.calibration, fp8lab.quality; "
        "print(sorted(m for m in ('matplotlib', 'vllm', 'torch') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout


def test_study_02_builds_on_study_03_never_the_reverse():
    """Study 02 (``fp8lab.calibration``) runs Study 03's measures; nothing in ``fp8lab/quality/`` imports it back."""
    qdir = REPO_ROOT / "fp8lab" / "quality"
    back = {p.name: _imports(p) for p in qdir.glob("*.py")}
    assert len(back) >= 8
    assert not {n: m for n, m in back.items() if any(x.startswith("fp8lab.calibration") for x in m)}
    assert any(x.startswith("fp8lab.quality") for x in _imports(REPO_ROOT / "fp8lab" / "calibration" / "study.py"))
