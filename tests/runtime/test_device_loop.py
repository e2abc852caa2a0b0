"""The device-resident loop (``runtime.device_loop``) against the host loop (``loop.generate``)
on the same modules and seeds: the same tokens, step for step. On CPU here (reference ops, no
graphs); on a GPU with the Triton kernels and CUDA graphs (``gpu`` marker).

The random-weight MTP head almost never drafts the target's token, so the ragged multi-token
path is exercised with a drafter that proposes the target's own continuation, corrupted at known
positions (``draft_filter``): at T = 0 the text is the target's greedy chain, at T > 0 (the
coupled rule) the γ = 0 text, whatever the drafts."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.config import ConfigError
from flashspec_export.models.build import ExportConfig, build_modules, resolve_trained
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import sessions, text
from flashspec_export.runtime.device_loop import SELECT_ROUND, DeviceLoop
from flashspec_export.runtime.loop import generate
from flashspec_export.runtime.run import RunConfig, run
from tests.runtime.tiny import BATCH, GAMMA, MAX_LEN, NEW_TOKENS, SEEDS, TEMPERATURES, config_of


def _modules(checkpoint, device="cpu", dtype=torch.float32, draft="mtp"):
    return _modules_of(config_of(draft, checkpoint), device, dtype)


def _modules_of(config, device, dtype=torch.float32):
    modules = build_modules(config)
    for module in (modules.model, modules.drafter):
        if module is not None:  # None: the n-gram drafter
            module.to(device=device, dtype=dtype)
    return modules


def _drafter(modules):
    """The device loop's drafter of ``modules``: its graph drafter, or the n-gram lookup."""
    return NgramDrafter() if modules.drafter is None else modules.drafter


def _oracle_filter(sequences: torch.Tensor, corrupt_every: int):
    """Drafts = the next tokens of ``sequences [N, L]`` (prompt + continuation) after each
    sequence's last accepted position, one in ``corrupt_every`` replaced by a wrong id."""

    def draft_filter(drafts, positions):
        gamma = drafts.shape[1]
        index = (positions[:, None] + 1 + torch.arange(gamma, device=drafts.device)).clamp(
            max=sequences.shape[1] - 1
        )
        truth = sequences.gather(1, index)
        corrupt = (index * 7 + torch.arange(len(drafts), device=drafts.device)[:, None]) % (
            corrupt_every
        ) == 0
        return torch.where(corrupt, (truth + 1) % 512, truth)

    return draft_filter


ON_A_GPU = "on a GPU the fused layers run in test_on_the_gpu_same_tokens_as_the_host_loop"
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason=ON_A_GPU)


@pytest.mark.parametrize(
    "draft, gamma, fused",
    [
        ("mtp", 0, False),
        ("mtp", 1, False),
        ("mtp", 3, False),
        ("eagle", 3, False),
        ("model", 3, False),
        ("ngram", 3, False),
        ("ngram", 7, False),
        pytest.param("mtp", 3, True, marks=INTERPRETED),
        pytest.param("eagle", 2, True, marks=INTERPRETED),
        pytest.param("model", 2, True, marks=INTERPRETED),
        pytest.param("ngram", 3, True, marks=INTERPRETED),
    ],
)
def test_same_tokens_as_the_host_loop(draft, gamma, fused, prompt, target_checkpoint):
    """Every drafter (MTP, EAGLE, a draft model, the n-gram lookup on the device). ``fused``:
    the decoder layers on the Triton kernels (``models/fused.py``, under the interpreter on
    CPU, so fewer tokens), as on a GPU. The metrics count the same real drafts: the n-gram
    drafter's -1 placeholders are none."""
    modules = _modules(target_checkpoint, draft=draft)
    runtime = sessions.from_modules(
        build_modules(config_of(draft, target_checkpoint)), draft, BATCH, MAX_LEN
    )
    new_tokens = {"mtp": NEW_TOKENS // 2}.get(draft, NEW_TOKENS // 4) if fused else NEW_TOKENS
    want = generate(*runtime, prompt, new_tokens, gamma, TEMPERATURES, SEEDS)
    loop = DeviceLoop(modules.model, _drafter(modules), BATCH, MAX_LEN, gamma, fused=fused)
    tokens, metrics = loop.generate(prompt, new_tokens, TEMPERATURES, SEEDS)
    assert tokens == want.tokens
    assert metrics.steps == want.steps and metrics.emitted == want.metrics.emitted
    assert metrics.accepted_at == want.metrics.accepted_at
    assert metrics.drafted_at == want.metrics.drafted_at
    if draft == "ngram" and not fused:  # copies accepted, placeholders left out of the count
        assert metrics.tokens_per_step > 1.0, metrics.summary()
        assert metrics.drafted_at[-1] < metrics.sequence_steps, metrics.drafted_at


def _check_ragged_acceptance(modules, prompt, device):
    """T = 0 and T > 0 with drafts that are mostly right: several tokens per step, sequences
    advancing by different counts, and the γ = 0 text."""
    temperatures = TEMPERATURES.to(device)
    plain = DeviceLoop(modules.model, None, BATCH, MAX_LEN, 0)
    want, _ = plain.generate(prompt, NEW_TOKENS, temperatures, SEEDS)
    continuation = torch.cat([prompt, torch.tensor(want)], dim=1).to(device)
    loop = DeviceLoop(
        modules.model,
        modules.drafter,
        BATCH,
        MAX_LEN,
        3,
        draft_filter=_oracle_filter(continuation, corrupt_every=5),
    )
    tokens, metrics = loop.generate(prompt, NEW_TOKENS, temperatures, SEEDS)
    assert tokens == want
    assert metrics.tokens_per_step > 2.0, metrics.summary()
    assert 0 < metrics.acceptance[-1] < metrics.acceptance[0] <= 1.0


def test_ragged_multi_token_acceptance_keeps_the_text(prompt, target_checkpoint):
    _check_ragged_acceptance(_modules(target_checkpoint), prompt, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("draft, gamma", [("mtp", 0), ("mtp", 3), ("ngram", 3)])
def test_on_the_gpu_same_tokens_as_the_host_loop(draft, gamma, prompt, target_checkpoint):
    """fp32 on CUDA, Triton kernels and CUDA graphs in the device loop (the n-gram lookup
    inside the step's graph), Triton kernels in the host loop's modules: identical tokens,
    steps and real drafts."""
    modules = _modules(target_checkpoint, "cuda", draft=draft)
    reference = build_modules(config_of(draft, target_checkpoint))
    runtime = sessions.from_modules(reference, draft, BATCH, MAX_LEN, device="cuda")
    want = generate(*runtime, prompt, NEW_TOKENS, gamma, TEMPERATURES, SEEDS)
    for split_timing in (False, True):  # one graph per step; three, timed apart
        loop = DeviceLoop(
            modules.model, _drafter(modules), BATCH, MAX_LEN, gamma, split_timing=split_timing
        )
        assert loop.use_graphs and loop.target_layers is not None
        for _ in range(2):  # the captured graphs serve a second request too
            tokens, metrics = loop.generate(prompt, NEW_TOKENS, TEMPERATURES, SEEDS)
            assert tokens == want.tokens and metrics.steps == want.steps
            assert metrics.drafted_at == want.metrics.drafted_at


@pytest.mark.gpu
def test_on_the_gpu_ragged_acceptance_keeps_the_text(prompt, target_checkpoint):
    _check_ragged_acceptance(_modules(target_checkpoint, "cuda"), prompt, "cuda")


# Per sequence: off; top-k 3; top-k 40 and a nucleus of 0.5 (at TEMPERATURES 0, 0.8, 1)
TOP_K, TOP_P = torch.tensor([0, 3, 40]), torch.tensor([1.0, 1.0, 0.5])


def _check_truncation(draft, device, prompt, target_checkpoint):
    """top-k / top-p per sequence: the host loop's tokens (its modules' step takes them as a
    ``--sampling-params`` export's does) over two requests; a plain request between them is
    the untruncated text, so the truncation changes what the sampled sequences emit."""
    modules = _modules(target_checkpoint, device, draft=draft)
    reference = build_modules(config_of(draft, target_checkpoint))
    runtime = sessions.from_modules(
        reference, draft, BATCH, MAX_LEN, device=device, sampling_params=True
    )
    want = generate(
        *runtime, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS, top_k=TOP_K, top_p=TOP_P
    )
    loop = DeviceLoop(modules.model, _drafter(modules), BATCH, MAX_LEN, GAMMA)
    temperatures = TEMPERATURES.to(device)
    for _ in range(2):
        tokens, metrics = loop.generate(
            prompt, NEW_TOKENS, temperatures, SEEDS, top_k=TOP_K, top_p=TOP_P
        )
        assert tokens == want.tokens and metrics.steps == want.steps
        plain, _ = loop.generate(prompt, NEW_TOKENS, temperatures, SEEDS)
        assert plain[0] == tokens[0] and plain[1:] != tokens[1:]


@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_top_k_top_p_as_the_host_loop(draft, prompt, target_checkpoint):
    _check_truncation(draft, "cpu", prompt, target_checkpoint)


@pytest.mark.gpu
@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_on_the_gpu_top_k_top_p_as_the_host_loop(draft, prompt, target_checkpoint):
    """With CUDA graphs: the truncating verify runs between the step's other graphs."""
    _check_truncation(draft, "cuda", prompt, target_checkpoint)


@pytest.mark.parametrize(
    "top_k, top_p, message",
    [
        (torch.tensor([0, -1, 3]), None, r"top_k: expected 3 integers >= 0 \(0: off\)"),
        (torch.tensor([1, 2]), None, r"top_k: expected 3 integers"),
        (None, torch.tensor([1.0, 0.0, 0.5]), r"top_p: expected 3 values in \(0, 1\]"),
        (None, torch.tensor([1.0, 1.5, 0.5]), r"top_p: expected 3 values in \(0, 1\]"),
    ],
)
def test_bad_top_k_top_p_are_refused(top_k, top_p, message, prompt, target_checkpoint):
    modules = _modules(target_checkpoint)
    loop = DeviceLoop(modules.model, modules.drafter, BATCH, MAX_LEN, GAMMA)
    with pytest.raises(ConfigError, match=message):
        loop.generate(prompt, NEW_TOKENS, TEMPERATURES, SEEDS, top_k=top_k, top_p=top_p)


# The trained stdlib-tiny pair, where drafts are accepted: sequences advance by different counts.
STDLIB_LEN, STDLIB_TOKENS, STOP = 160, 48, "XML"  # the stop ends one sequence of three early


@pytest.fixture(scope="module")
def stdlib_tiny():
    """(the stdlib-tiny tokenizer, three prompts of different lengths)."""
    from transformers import AutoTokenizer

    from tests.runtime.test_stdlib_tiny import SOURCES

    tokenizer = AutoTokenizer.from_pretrained(resolve_trained(ExportConfig()).target)
    return tokenizer, text.encode_prompts(tokenizer, list(SOURCES))


def _streamed(decode, tokenizer, rows: int):
    """(tokens, metrics, texts, echoed pieces) of ``decode(stream)`` with a stop string."""
    pieces = [[] for _ in range(rows)]
    stream = text.TextStream(tokenizer, rows, (STOP,), lambda row, s: pieces[row].append(s))
    tokens, metrics = decode(stream)
    stream.finish()
    return tokens, metrics, stream.texts, pieces


@pytest.mark.parametrize("draft", ["mtp", "ngram"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_prompts_of_different_lengths_and_a_stop_string_as_the_host_loop(
    device, draft, stdlib_tiny
):
    """fp32, T = 0.8, three prompts of different lengths, a stop string: the device loop's
    tokens, streamed text (piece by piece) and metrics are the host loop's, and its tokens the
    γ = 0 loop's (same seeds). The stream sees whole rounds of steps at once (up to 12 here,
    or one), yet cuts each sequence where the host loop does (the tokens past a stop are neither
    kept nor counted). With the n-gram drafter (its lookup on the device, the host's
    ``NgramDrafter`` in the host loop) the metrics count the same real drafts, fewer than γ a
    step: the placeholders are none."""
    tokenizer, prompts = stdlib_tiny
    config = ExportConfig(draft=draft, batch=3, max_len=STDLIB_LEN, dtype="float32")
    reference = sessions.from_modules(build_modules(config), draft, 3, STDLIB_LEN, device)
    modules = _modules_of(config, device)
    temps, seeds = torch.full((3,), 0.8), torch.tensor([3, 4, 5])
    args = (prompts, STDLIB_TOKENS)

    def host(stream):
        result = generate(*reference, *args, 3, temps, seeds, stream)
        return result.tokens, result.metrics

    want, want_metrics, *want_text = _streamed(host, tokenizer, 3)
    loop = DeviceLoop(modules.model, _drafter(modules), 3, STDLIB_LEN, 3)
    for stream_round in (STDLIB_TOKENS, 1):
        decode = functools.partial(loop.generate, *args, temps, seeds, stream_round=stream_round)
        got, metrics, *got_text = _streamed(decode, tokenizer, 3)
        assert got == want and got_text == want_text
        for name in ("steps", "sequence_steps", "emitted", "accepted_at", "drafted_at"):
            assert getattr(metrics, name) == getattr(want_metrics, name), name
        assert metrics.generated == want_metrics.generated
    lengths = [len(tokens) for tokens in got]
    assert min(lengths) < STDLIB_TOKENS == max(lengths)  # the stop string ended some, not all
    # copies accepted (the n-gram drafter's few here: 1.05 tokens per step), and a step that
    # drafted nothing counts no draft
    assert metrics.tokens_per_step > {"mtp": 1.2, "ngram": 1.0}[draft], metrics.summary()
    if draft == "ngram":
        assert metrics.drafted_at[0] < metrics.sequence_steps, metrics.drafted_at
    plain = DeviceLoop(modules.model, None, 3, STDLIB_LEN, 0)
    assert _streamed(lambda s: plain.generate(*args, temps, seeds, s), tokenizer, 3)[0] == got


@pytest.fixture(scope="module")
def stdlib_tiny_bf16_export(tmp_path_factory):
    """The stdlib-tiny preset with its MTP head exported in its own dtype (bf16), batch 3 (a GPU
    test's: a CPU run never builds it)."""
    from flashspec_export.export.pipeline import export

    out = tmp_path_factory.mktemp("stdlib-tiny-bf16")
    export(ExportConfig(draft="mtp", out=str(out), batch=3, max_len=STDLIB_LEN, force=True))
    return out


@pytest.mark.gpu
def test_on_the_gpu_bf16_agreement_rate(stdlib_tiny_bf16_export):
    """bf16 ``--device cuda`` (fused layers, Triton kernels) against ``--device cpu`` (PyTorch's
    CPU bf16) and against onnxruntime (bf16 widened): the share of tokens that differ, counted up
    to and including each sequence's first difference (``test_dtypes.py``'s measure), printed
    and bounded by that test's bf16 bound."""
    from tests.runtime.test_dtypes import FLIP_RATE_BOUND
    from tests.runtime.test_stdlib_tiny import SOURCES

    def first_differences(report, other):
        compared = flips = 0
        for ours, theirs in zip(report.onnx.tokens, other.onnx.tokens, strict=True):
            pairs = zip(ours, theirs, strict=False)  # a stop may cut them at different lengths
            first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
            compared += min(len(ours), len(theirs)) if first is None else first + 1
            flips += first is not None
        return compared, flips

    totals = {"cpu": [0, 0], "onnxruntime": [0, 0]}
    for seed in range(4):
        config = RunConfig(
            str(stdlib_tiny_bf16_export), STDLIB_TOKENS, temperature=0.8, seed=seed,
            prompts=SOURCES, stop=(STOP,),
        )  # fmt: skip
        cuda = run(dataclasses.replace(config, device="cuda"))
        assert cuda.dtype == "bfloat16"
        others = {"cpu": run(dataclasses.replace(config, device="cpu")), "onnxruntime": run(config)}
        for name, other in others.items():
            compared, flips = first_differences(cuda, other)
            totals[name][0] += compared
            totals[name][1] += flips
    for name, (compared, flips) in totals.items():
        print(f"bf16 --device cuda vs {name}: {flips} of {compared} tokens differ")
        assert flips / compared <= FLIP_RATE_BOUND["bfloat16"], (name, flips, compared)


class _Scripted:
    """A selection policy that plays ``schedule`` (arm indices, cycled) whatever it learns: the
    same choices in the host loop and the device loop; it records what each step taught it."""

    def __init__(self, arms, schedule):
        self.arms, self.schedule, self.turn = arms, schedule, 0
        self.updates, self.seconds, self.observed = [], [], []

    def choose(self) -> int:
        self.turn += 1
        return self.schedule[(self.turn - 1) % len(self.schedule)]

    def update(self, arm: int, accepted, seconds: float) -> None:
        self.updates.append((arm, list(accepted)))
        self.seconds.append(seconds)

    def observe(self, drafter: str, accepted: int, drafted: int) -> None:
        self.observed.append((drafter, accepted, drafted))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_arms_switched_every_step_as_the_host_loop(device, stdlib_tiny):
    """The device loop with every (drafter, γ) arm of an MTP export (``selection.arms_for``:
    MTP and n-gram, γ 1..3), the arm switched every step by a fixed schedule, against the host
    loop's ``SelectingDrafter`` on the same schedule (fp32, T = 0.8, three prompts of different
    lengths): the same tokens, steps and per-position acceptance, and the γ = 0 tokens. The MTP
    head is the trained one, so its drafts are accepted: a head whose cache missed the steps
    the n-gram arms ran (no catch-up there) drafts from stale keys and changes the acceptance,
    which this test then catches."""
    from flashspec_export.runtime.selection import SelectingDrafter, arms_for

    _, prompts = stdlib_tiny
    config = ExportConfig(draft="mtp", batch=3, max_len=STDLIB_LEN, dtype="float32")
    target, drafter = sessions.from_modules(build_modules(config), "mtp", 3, STDLIB_LEN, device)
    modules = _modules_of(config, device)
    temps, seeds = torch.full((3,), 0.8), torch.tensor([3, 4, 5])
    arms = arms_for("mtp", 3)  # mtp:1 mtp:2 mtp:3 ngram:1 ngram:2 ngram:3
    schedule = [3, 5, 2, 2, 4, 0, 5, 1, 2, 3]  # n-gram runs between MTP steps
    host_policy = _Scripted(arms, schedule)
    selecting = SelectingDrafter({"mtp": drafter, "ngram": NgramDrafter()}, host_policy)
    want = generate(target, selecting, prompts, STDLIB_TOKENS, 3, temps, seeds)
    loop = DeviceLoop(modules.model, modules.drafter, 3, STDLIB_LEN, 3, arms=arms)
    chosen = {f"{a.drafter}:{a.gamma}": n for a, n in selecting.chosen.items()}
    assert len(chosen) == len(arms)
    # a read after every step, or rounds of steps whose arms were all chosen before they ran
    for select_round in (1, SELECT_ROUND):
        policy = _Scripted(arms, schedule)
        tokens, metrics = loop.generate(
            prompts, STDLIB_TOKENS, temps, seeds, policy=policy, select_round=select_round
        )
        assert tokens == want.tokens
        for name in ("steps", "sequence_steps", "emitted", "accepted_at", "drafted_at"):
            assert getattr(metrics, name) == getattr(want.metrics, name), name
        assert metrics.arms == chosen
        # each step's accepted drafts per unfinished sequence, as the host loop reports them
        assert policy.updates == host_policy.updates and len(policy.updates) == metrics.steps
        assert min(policy.seconds) > 0
        # the n-gram lookup scored in hindsight on every sequence-step an MTP arm ran
        mtp_steps = sum(len(a) for i, a in policy.updates if arms[i].drafter == "mtp")
        assert len(policy.observed) == mtp_steps
        assert all(d == "ngram" and 0 <= a <= n <= 3 for d, a, n in policy.observed)
        assert any(a > 0 for _, a, _ in policy.observed)
    assert metrics.accepted_at[0] >= 10, metrics.summary()  # drafts accepted (15 here)
    plain = DeviceLoop(modules.model, None, 3, STDLIB_LEN, 0)
    assert plain.generate(prompts, STDLIB_TOKENS, temps, seeds)[0] == tokens
