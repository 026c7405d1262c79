"""bench/gpu.py, the prepared GPU benchmark, end to end on tiny shapes on the CPU: every stage
runs, nothing fails, and the JSON holds every figure the GPU run is for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_gpu_bench_runs_end_to_end_on_tiny_shapes(tmp_path):
    out = tmp_path / "gpu.json"
    result = bench("--device", "cpu", "--tiny", "--out", str(out), "--prompts", "2",
                   "--new-tokens", "10", "--reps", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == [] and report["skipped"] == []
    pairs = report["pairs"]
    assert set(pairs) == {"qwen-1.5b", "llama-8b", "llama-70b"}
    bnb = report["machine"]["bitsandbytes"] is not None
    for name, pair in pairs.items():
        rows = pair["contestants"]
        expected = {"generate", "plain", "k4", "adaptive", "chain", "head-k4", "head-adaptive"}
        if name == "llama-70b":
            expected |= {"1b-k4", "1b-adaptive"}  # the second draft
        else:
            expected |= {"assisted", "int4-generate", "int4-plain", "int4-k4", "int4-adaptive"}
        assert expected <= set(rows)
        for label, row in rows.items():
            eager = 1 if name == "llama-70b" and label == "generate" else 2
            assert row["tokens_per_second"] > 0 and len(row["runs"]) == eager
            # Every contestant against specgen plain and transformers' eager generate on the
            # same target and scheme (the prompts generate ran); on the CPU the verify pass is
            # exact.
            assert row["equal_to_plain"] == f"{eager}/{eager}"
            assert row["equal_to_generate"] == ("1/1" if name == "llama-70b" else "2/2")
            if label.endswith(("plain", "k4", "adaptive", "chain")) and not label.startswith("head"):
                # specgen's: whether its decoders replay graphs (a CPU has none)
                assert row["graphs"] == {"target": "eager", "draft": "eager"}
                assert row["syncs_per_step"] is None  # counted on a GPU only
        assert rows["k4"]["tokens_per_target_pass"] > 1  # the draft agrees part of the time
        assert "tree_steps" not in rows["chain"]  # adaptive without token trees
        assert "ideal_vs_plain" in rows["k4"]
        # The head at its set agreement: tau, its cost against a target pass; its target's
        # graph status is any other's (eager here, on a CPU; on a GPU its graphs keep the
        # states the head reads).
        head = rows["head-k4"]
        assert head["tokens_per_target_pass"] > 1 and head["draft_pass_share_of_target_pass"] > 0
        assert head["graphs"] == {"target": "eager", "head": "eager"}
        assert 0.5 < pair["head_agreement"] < 0.9
        curves = pair["verify_cost"]
        schemes = {pair["target_scheme"]} | ({"int4-gpu"} | ({"nf4"} if bnb else set())
                                              if pair["target_scheme"] == "bf16" else set())
        assert schemes <= set(curves)
        for c in curves.values():
            assert set(c["ms"]) == {str(w) for w in range(1, 10)}
        for w, profile in curves[pair["target_scheme"]]["profile"].items():
            # No device kernels on a CPU: null, and the CPU profiler's count beside it.
            assert profile["kernels_per_pass"] is None and profile["cpu_profiler_ops_per_pass"] > 0
        assert pair["target_one_token_ms_without_graphs"] > 0 and pair["draft_one_token_ms"] > 0
        assert 0.6 < pair["agreement"] <= 1.0  # calibrated towards 0.8, the 70B's too
    assert 0 < pairs["llama-70b"]["second_draft_agreement"] <= 1.0
    assert "generate-static" in pairs["qwen-1.5b"]["contestants"]
    assert pairs["qwen-1.5b"]["fp32_equal_to_generate"] == {"plain": "2/2", "k4": "2/2",
                                                             "adaptive": "2/2"}
    assert "| qwen-1.5b | k4 |" in result.stdout  # the summary table, printed last


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_asking_for_cuda_without_it_is_one_clear_line(tmp_path):
    result = bench("--out", str(tmp_path / "x.json"))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error:") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
