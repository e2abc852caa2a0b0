"""Bad input at the scripts: one line naming the argument, what it got and what it expects, exit
status 2, before any expensive work. Each case runs the real script in process (runpy) and
reads its stderr; the export cases stop at validation, so no model is built."""

from __future__ import annotations

import importlib.util
import pathlib
import runpy
import sys

import pytest
import torch

from flashspec_export.export.manifest import FORMAT

pytest.importorskip("transformers")

SCRIPTS = pathlib.Path(__file__).parents[1] / "scripts"


def run_script(name: str, *args: str, capsys) -> tuple[int, str]:
    """Run ``scripts/<name>`` with ``args`` as ``python scripts/<name>`` would (its directory
    first on ``sys.path``); returns (exit status, stderr)."""
    argv, path = sys.argv, sys.path[:]
    sys.argv = [name, *args]
    sys.path.insert(0, str(SCRIPTS))
    try:
        runpy.run_path(str(SCRIPTS / name), run_name="__main__")
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv, sys.path[:] = argv, path
    return code, capsys.readouterr().err


def _checkpoint_dir(tmp_path, config_text: str | None, weights: bool = False):
    path = tmp_path / "ckpt"
    path.mkdir()
    if config_text is not None:
        (path / "config.json").write_text(config_text)
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return str(path)


EXPORT_CASES = {
    "gamma below 0": (["--gamma", "-1"], "gamma: expected 0 <= gamma <= 64, got -1"),
    "absurd batch": (["--batch", "100000"], "batch: expected 1 <= batch <= 4096, got 100000"),
    "absurd max-len": (["--max-len", "10000000"], "max_len: expected 2 <= max_len <= 1048576"),
    "seed beyond int64": (["--seed", str(2**63)], "seed: expected 0 <= seed <= 922337203685477"),
    "max-len below gamma + 2": (["--max-len", "4"], "max_len: 4 cannot hold a token and gamma"),
    "draft-weights for ngram": (
        ["--draft", "ngram", "--draft-weights", "w.pt"],
        "draft-weights: only --draft mtp or eagle takes them (got --draft ngram)",
    ),
    "draft-model for mtp": (
        ["--draft-model", "tiny-draft-llama"],
        "draft-model: only --draft model takes it (got --draft mtp)",
    ),
    "model without draft-model": (
        ["--target", "tiny-llama", "--draft", "model"],
        "draft-model: --draft model needs",
    ),
}


@pytest.mark.parametrize("case", EXPORT_CASES)
def test_export_refuses(case, tmp_path, capsys):
    args, message = EXPORT_CASES[case]
    code, err = run_script("export.py", *args, "--out", str(tmp_path / "x"), capsys=capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "x").exists()  # refused before anything was written


CHECKPOINT_CASES = {
    "corrupt config.json": ('{"model_type": "llama",', False, "config.json is not valid JSON"),
    "config without model_type": ('{"hidden_size": 64}', True, "config.json has no model_type"),
    "no weights": ('{"model_type": "llama"}', False, "has no weights (*.safetensors or *.bin)"),
    "no config.json": (None, True, "has no config.json"),
}


@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_export_refuses_a_damaged_checkpoint(case, tmp_path, capsys):
    config_text, weights, message = CHECKPOINT_CASES[case]
    target = _checkpoint_dir(tmp_path, config_text, weights)
    code, err = run_script(
        "export.py", "--target", target, "--out", str(tmp_path / "x"), capsys=capsys
    )
    assert code == 2 and message in err, err


def test_export_refuses_draft_weights_that_are_no_state_dict(tmp_path, capsys):
    out = ["--out", str(tmp_path / "x")]
    code, err = run_script("export.py", "--draft-weights", "nowhere.pt", *out, capsys=capsys)
    assert (
        code == 2
        and "nowhere.pt is not a file (expected a .safetensors or torch state dict)" in err
    ), err
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a pickle")
    code, err = run_script("export.py", "--draft-weights", str(garbage), *out, capsys=capsys)
    assert code == 2 and "is not a state dict (.safetensors or torch.save)" in err, err


def test_export_refuses_a_cache_longer_than_the_positions(tmp_path, capsys):
    out = str(tmp_path / "x")
    args = ["--target", "tiny-llama", "--max-len", "300", "--out", out]
    code, err = run_script("export.py", *args, capsys=capsys)
    assert code == 2 and "max_len: 300 exceeds the target's 256 positions" in err, err


def test_export_refuses_a_cache_larger_than_the_machine_before_building_the_model(tmp_path, capsys):
    """llama3-8b-shape, batch 4096 x 8192 positions: petabytes of cache. Refused from the
    preset's geometry alone (building the 8B model first would take minutes)."""
    args = ["--target", "llama3-8b-shape", "--batch", "4096", "--max-len", "8192"]
    code, err = run_script("export.py", *args, "--out", str(tmp_path / "x"), capsys=capsys)
    assert code == 2 and "batch / max_len: the KV cache of batch 4096" in err, err


@pytest.fixture(scope="module")
def ngram_export(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from flashspec_export.export.pipeline import export
    from flashspec_export.models.build import ExportConfig

    out = tmp_path_factory.mktemp("ngram-export")
    export(ExportConfig(target="tiny-llama", draft="ngram", out=str(out), batch=2, max_len=32))
    return str(out)


GENERATE_CASES = {
    "nan temperature": (["--temperature", "nan"], "temperature: expected a finite value >= 0"),
    "negative temperature": (["--temperature", "-1"], "got -1.0"),
    "infinite temperature": (["--temperature", "inf"], "got inf"),
    "zero new tokens": (["--new-tokens", "0"], "new_tokens: expected at least 1, got 0"),
    "seed beyond int64": (["--seed", str(2**63)], "seed: expected 0 <= seed <="),
    "seed + batch beyond int64": (["--seed", str(2**63 - 1)], "exceeds 9223372036854775807"),
    "prompt too short": (["--prompt-len", "1"], "prompt_len: expected at least 2, got 1"),
    "unknown stop escape": (["--stop", "\\q"], "unknown escape \\q in '\\\\q'"),
    "negative top-k": (["--top-k", "-1"], "--top-k: expected an integer >= 0 (0: off), got -1"),
    "top-p 0": (["--top-p", "0"], "--top-p: expected a value in (0, 1] (1: off), got 0.0"),
    "top-p above 1": (["--top-p", "1.5"], "--top-p: expected a value in (0, 1] (1: off), got 1.5"),
    "top-p nan": (["--top-p", "nan"], "--top-p: expected a value in (0, 1] (1: off), got nan"),
    "top-k without sampling params": (
        ["--top-k", "5"],
        "--top-k: this export's target step takes no top_k / top_p; re-export with "
        "scripts/export.py --sampling-params",
    ),
    "allowed-chars without allowed tokens": (
        ["--allowed-chars", "0123456789"],
        "--allowed-chars: this export's target step takes no allowed-token mask; re-export with "
        "scripts/export.py --allowed-tokens",
    ),
    "allowed-chars empty": (["--allowed-chars", ""], "--allowed-chars: expected at least one"),
    "unknown device": (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    "device and engines": (
        ["--device", "cpu", "--engines"],
        "device: --device runs the PyTorch modules, --engines the TensorRT engines; give one",
    ),
}


@pytest.mark.parametrize("case", GENERATE_CASES)
def test_generate_refuses(case, ngram_export, capsys):
    args, message = GENERATE_CASES[case]
    code, err = run_script("generate.py", ngram_export, *args, capsys=capsys)
    assert code == 2 and message in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
def test_generate_device_cuda_says_it_needs_a_gpu(ngram_export, capsys):
    code, err = run_script("generate.py", ngram_export, "--device", "cuda", capsys=capsys)
    assert code == 2 and "device: --device cuda needs a CUDA GPU" in err, err
    assert "--device cpu runs the same loop on the CPU" in err


SIZE_CASES = {
    "bench rows 0": ("bench_kernels.py", ["--rows", "0"], "--rows: expected an integer >= 1"),
    "bench rep-ms x": ("bench_kernels.py", ["--rep-ms", "x"], "expected an integer, got 'x'"),
    "tune rows -4": ("tune_kernels.py", ["--rows", "-4"], "--rows: expected an integer >= 1"),
    "tune epilogue": ("tune_kernels.py", ["--epilogues", "8x2x64"], "in 24..256; or none"),
    "decode alpha 1": ("bench_decode.py", ["--alpha", "1"], "--alpha: expected 0 < alpha < 1"),
    "decode temperature -1": (
        "bench_decode.py",
        ["--temperature", "-1"],
        "--temperature: expected a finite value >= 0",
    ),
    "decode batch 0": ("bench_decode.py", ["--batches", "0"], "an integer in 1..256, got 0"),
    "tune_cuda gamma 99": ("tune_cuda.py", ["--gamma", "99"], "an integer in 0..64, got 99"),
    "invariance gamma 0": ("check_invariance.py", ["--gammas", "0"], "in 1..64, got 0"),
}


@pytest.mark.parametrize("case", SIZE_CASES)
def test_benchmark_scripts_refuse_bad_sizes_before_looking_for_a_gpu(case, capsys):
    script, args, message = SIZE_CASES[case]
    code, err = run_script(script, *args, capsys=capsys)
    assert code == 2 and message in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without GPU")
@pytest.mark.parametrize(
    "script", ["bench_kernels.py", "tune_kernels.py", "tune_cuda.py", "bench_decode.py"]
)
def test_gpu_scripts_say_they_need_a_gpu(script, capsys):
    code, err = run_script(script, capsys=capsys)
    assert code == 2 and "needs a CUDA GPU" in err, err


def _damaged(export_dir, tmp_path, damage):
    import shutil

    copy = tmp_path / "damaged"
    shutil.copytree(export_dir, copy)
    damage(copy)
    return str(copy)


DAMAGE = {
    "truncated graph": (
        lambda d: (d / "target_step.onnx").write_bytes((d / "target_step.onnx").read_bytes()[:999]),
        "target_step.onnx does not match its manifest",
    ),
    "missing graph": (
        lambda d: (d / "target_prefill.onnx").unlink(),
        "target_prefill.onnx is missing (the manifest lists it)",
    ),
    "empty manifest": (
        lambda d: (d / "manifest.json").write_text(""),
        "manifest.json is not valid JSON",
    ),
    "truncated manifest": (
        lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:200]),
        "manifest.json is not valid JSON",
    ),
    "manifest without graphs": (
        lambda d: (d / "manifest.json").write_text(f'{{"format": {FORMAT}, "config": {{}}}}'),
        "manifest.json lacks source, architecture, vocab_size, padded_vocab, hidden_size, gamma, "
        "drafter, opset, ops, graphs, weights_sha256",
    ),
    "manifest with a mistyped field": (
        lambda d: (d / "manifest.json").write_text(
            (d / "manifest.json").read_text().replace('"gamma": 3', '"gamma": "3"')
        ),
        "manifest.json: gamma: expected int, got str",
    ),
    "missing manifest": (
        lambda d: (d / "manifest.json").unlink(),
        "manifest.json not found (run scripts/export.py first)",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_generate_and_build_engines_refuse_a_damaged_export(case, ngram_export, tmp_path, capsys):
    damage, message = DAMAGE[case]
    damaged = _damaged(ngram_export, tmp_path, damage)
    code, err = run_script("generate.py", damaged, "--new-tokens", "2", capsys=capsys)
    assert code == 2 and message in err, err
    if importlib.util.find_spec("tensorrt_rtx") is not None:  # the engine build refuses too
        code, err = run_script("build_engines.py", damaged, capsys=capsys)
        assert code == 2 and message in err, err
        assert not (pathlib.Path(damaged) / "engines").exists()


def test_stop_strings_are_taken_as_typed():
    """Backslash escapes only: non-ASCII text is kept (``unicode_escape`` once turned "→" into
    "â\\x86\\x92", so such a stop string never matched; issue 33)."""
    from flashspec_export.cli import unescaped

    assert unescaped("→ done\\n\\n") == "→ done\n\n"
    assert unescaped("naïve\\t\\\\n\\x41\\u00e9") == "naïve\t\\nAé"
    assert unescaped("plain") == "plain"


def test_select_on_an_export_without_drafts_is_refused_by_name(tiny_ngram_export):
    import dataclasses

    from flashspec_export.config import ConfigError
    from flashspec_export.export import manifest
    from flashspec_export.runtime.run import RunConfig, _check_select

    no_drafts = dataclasses.replace(manifest.read(tiny_ngram_export), gamma=0)
    config = RunConfig(str(tiny_ngram_export), select="ucb1")
    with pytest.raises(ConfigError, match=r"select: the export drafts nothing \(gamma 0\)"):
        _check_select(no_drafts, config)
