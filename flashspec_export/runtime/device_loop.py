"""The speculative loop resident on one device: the GPU backend of the runtime.

The target and its drafter (MTP, EAGLE or a standalone draft model) run as PyTorch modules where
their weights are (bf16 on a GPU), the n-gram drafter as a lookup over each sequence's tokens kept
on the device (``models.ngram.lookup``), the FlashSpec ops on the Triton kernels there (the
reference on CPU), and every tensor of the loop stays on the device: the static KV caches are
written in place, each sequence has its own length, and a step's ragged acceptance advances each
sequence by its own ``num_emitted`` in device memory. Prompts of different lengths are right-padded
for the prefill, as ``loop.generate`` does. On CUDA the decoder layers run fused
(``models/fused.py``: nine launches a layer, attention over each sequence's live prefix) and a
whole step — the target over the last token and the drafts, verify, the bookkeeping, then the draft
chain for the next step — is one CUDA graph (the prompt's prefill too, one graph per padded prompt
length).

The host never waits inside a step: it replays a round of steps back to back — as many as cannot
finish the slowest unfinished sequence (its remaining tokens / (γ + 1)) — then reads the round's
record (each step's kept ``num_emitted`` and who was unfinished) and the tokens it wrote, once.
It hands them to the stream (``runtime/text.py``: EOS, stop strings) step by step, as
``loop.generate`` does, so the stream cuts each sequence where the host loop would: the tokens
past a stop are dropped and not counted, and the stopped sequence idles from the next round on.
A stop costs at most the rest of its round on the device, never a wait inside it; with a stream
a round is at most ``STREAM_ROUND`` steps, which bounds that waste and the text's lag.

The rule is ``loop.generate``'s, step for step: same modules and seeds, same tokens, text and
metrics (``tests/runtime/test_device_loop.py``). ``verify`` / ``argmax`` are pluggable so that
the decode benchmark runs the same loop with the materialised sampler and matmul + argmax
drafting, and ``draft_filter`` rewrites the drafts inside the draft graph (the benchmark's
drafter of known acceptance).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from flashspec_export.config import ConfigError
from flashspec_export.models.drafters import EagleDrafter, ModelDrafter
from flashspec_export.models.fused import FusedLayers
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.ngram import NgramDrafter, lookup
from flashspec_export.models.target import TargetStep, select_rows
from flashspec_export.ops import registry
from flashspec_export.runtime.loop import (
    Stream,
    allowed_inputs,
    as_prompts,
    check_allowed,
    check_request,
    sampling_values,
)
from flashspec_export.runtime.metrics import Metrics
from flashspec_export.runtime.selection import Arm, NgramHindsight

# With a stream, the most steps between two reads of the host: a stop (EOS, a stop string) is
# seen at most this many steps late, and the text streams in pieces of at most this many steps.
# A read costs one synchronisation (~0.1 ms with the host's bookkeeping) per round.
STREAM_ROUND = 16
# With online selection, the most steps between two reads: the policy chooses every step's arm
# of a round before it runs and learns each step's acceptance and device time after it (its
# choices run at most this many steps ahead of what they teach it).
SELECT_ROUND = 16

# verify(hidden [N, γ+1, H], lm_head, drafts [N, γ], temperature, seed, positions, vocab_size
#   [, top_k=[N], top_p=[N]]) -> (tokens [N, γ + 1], num_emitted [N]);
# argmax(hidden [N, H], lm_head, vocab) -> token [N]
Verify = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Argmax = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def fused_ops(device: torch.device) -> tuple[Verify, Argmax]:
    """The FlashSpec ops for ``device``: the Triton kernels on CUDA, the reference elsewhere."""
    backend = "triton" if device.type == "cuda" else "reference"
    verify_impl = registry.resolve("verify_resample", backend)
    argmax_impl = registry.resolve("tiled_argmax", backend)

    def verify(hidden, lm_head, drafts, temperature, seed, positions, vocab_size, **truncation):
        result = verify_impl(
            hidden, lm_head, drafts, temperature, seed, positions, vocab_size, **truncation
        )
        return result.tokens, result.num_emitted

    def argmax(hidden, lm_head, vocab_size):
        return argmax_impl(hidden, lm_head, vocab_size)[0]

    return verify, argmax


class _Round(NamedTuple):
    """A round of steps enqueued on the device: their indices, arms (and the policy's indices
    of them), the largest γ, the event after the copies to the host, the tokens' host copy."""

    steps: range
    arms: list[Arm]
    chosen: list[int] | None
    widest: int
    ready: torch.cuda.Event | None
    out: torch.Tensor


def drafter_name(drafter) -> str:
    """The name an export's manifest gives ``drafter`` (``selection.Arm.drafter``)."""
    if drafter is None:
        return "none"
    if isinstance(drafter, NgramDrafter):
        return "ngram"
    if isinstance(drafter, ModelDrafter):
        return "model"
    return "eagle" if isinstance(drafter, EagleDrafter) else "mtp"


class DeviceLoop:
    """Speculative decoding of ``batch`` sequences of up to ``max_len`` tokens on the device of
    ``causal_lm``'s weights.

    Parameters
    ----------
    causal_lm : a HF Llama / Qwen causal LM (``models.target.SUPPORTED_MODEL_TYPES``), already on
        its device and dtype
    drafter : an ``MtpDrafter`` (or ``EagleDrafter``) of it or a ``ModelDrafter`` (same device
        and dtype), an ``NgramDrafter`` (its ``max_ngram``; the lookup runs on the device), or
        None with ``gamma = 0``
    gamma : drafts per step (0: plain decoding); with ``arms``, the largest arm's
    arms : the (drafter, γ) configurations a step may run (``selection.Arm``; default: the one
        arm (``drafter``, ``gamma``)), each with its own graph; ``"ngram"`` arms look the
        sequences up on the device (``drafter``'s ``max_ngram``, or 3 beside a graph drafter),
        any other name is ``drafter``'s. A graph drafter catches up on every step's tokens
        whichever arm ran it, so its cache stays current while n-gram arms draft.
    verify, argmax : the ops (default ``fused_ops``)
    graphs : capture CUDA graphs (default: on CUDA)
    fused : the decoder layers on the Triton kernels of ``models/fused.py`` (default: on CUDA;
        the PyTorch layers otherwise); the modules' q / k / v and gate / up weights become views
        of packed ones
    split_timing : a graph per piece of the step — the draft chain, the decoder, verify (sampler
        and bookkeeping) and the drafter's catch-up — timed apart (``piece_seconds``; the draft
        is the chain and the catch-up) instead of one
    draft_filter : ``f(drafts [N, γ], positions [N]) -> [N, γ]``, applied to the drafts inside
        the draft chain; ``positions`` is each sequence's last accepted position
    """

    def __init__(
        self,
        causal_lm: torch.nn.Module,
        drafter: MtpDrafter | ModelDrafter | NgramDrafter | None,
        batch: int,
        max_len: int,
        gamma: int,
        *,
        arms: Sequence[Arm] | None = None,
        verify: Verify | None = None,
        argmax: Argmax | None = None,
        graphs: bool | None = None,
        fused: bool | None = None,
        split_timing: bool = False,
        draft_filter: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ):
        if gamma > 0 and drafter is None:
            raise ValueError("drafter: gamma > 0 needs a drafter")
        name = drafter_name(drafter)
        self.arms = list(arms) if arms is not None else [Arm(name, gamma)]
        for arm in self.arms:
            if not 0 <= arm.gamma <= gamma:
                raise ValueError(f"arms: {arm} drafts outside 0 .. gamma {gamma}")
            if arm.gamma and arm.drafter not in (name, "ngram"):
                raise ValueError(f"arms: {arm} names a drafter the loop lacks (it has {name!r})")
        self.target = TargetStep(causal_lm)
        self.drafter = drafter
        # the graph drafter, where an arm drafts with it: it catches up on every step
        graph_drafter = not isinstance(drafter, NgramDrafter | None) and any(
            a.gamma and a.drafter == name for a in self.arms
        )
        self.graph_drafter = drafter if graph_drafter else None
        self.ngram = any(a.gamma and a.drafter == "ngram" for a in self.arms)
        self.max_ngram = drafter.max_ngram if isinstance(drafter, NgramDrafter) else 3
        self.lm_head = causal_lm.lm_head.weight
        self.vocab_size = causal_lm.config.vocab_size
        self.batch, self.max_len, self.gamma = batch, max_len, gamma
        device, dtype = self.lm_head.device, self.lm_head.dtype
        self.device = device
        default_verify, default_argmax = fused_ops(device)
        self.verify = verify or default_verify
        self.argmax = argmax or default_argmax
        self.draft_filter = draft_filter
        self.use_graphs = device.type == "cuda" if graphs is None else graphs
        self.split_timing = split_timing
        # per arm, without and with truncation: a graph per piece of its step (with truncation
        # the verify piece runs eagerly: its graph is None)
        self._graphs: dict[tuple[Arm, bool], list[torch.cuda.CUDAGraph | None]] = {}
        # per padded prompt length: its tokens' and lengths' buffers and its graph
        self._prefills: dict[int, tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph]] = {}
        self.target_layers = self.draft_layers = None
        if device.type == "cuda" if fused is None else fused:
            decoder = self.target.decoder
            self.target_layers = FusedLayers(
                decoder.layers, decoder.rotary_emb, self.target.geometry
            )
            if isinstance(self.graph_drafter, ModelDrafter):
                step = drafter.step
                self.draft_layers = FusedLayers(
                    step.decoder.layers, step.decoder.rotary_emb, step.geometry
                )
            elif self.graph_drafter is not None:
                self.draft_layers = FusedLayers(
                    drafter.layers, drafter.rotary_emb, drafter.geometry
                )
        # seconds per piece of the step, summed over the last run (split_timing)
        self.piece_seconds = {"target": 0.0, "verify": 0.0, "draft": 0.0}

        def zeros(shape, kind=torch.int64):
            return torch.zeros(shape, dtype=kind, device=device)

        n, hidden = batch, causal_lm.config.hidden_size
        self.k = zeros(self.target.cache_shape(batch, max_len), dtype)
        self.v = torch.zeros_like(self.k)
        if self.graph_drafter is not None:
            self.dk = zeros(drafter.cache_shape(batch, max_len), dtype)
            self.dv = torch.zeros_like(self.dk)
        # per sequence: the cache length (= position of the last accepted token), that token,
        # tokens generated so far, the most it may generate (lowered to the count when the
        # stream stops it), unfinished; the generated tokens (last column: a dump slot)
        self.pos, self.last, self.count, self.limit = zeros(n), zeros(n), zeros(n), zeros(n)
        self.active = zeros(n, torch.bool)
        self.out = zeros((n, max_len + 1))
        self.temperature, self.seed = zeros(n, torch.float32), zeros(n)
        # per sequence: top-k (0: off) and top-p (1: off), read by the verify of a request
        # that truncates (``generate``'s top_k / top_p)
        self.top_k, self.top_p = zeros(n), zeros(n, torch.float32) + 1.0
        self._truncating = False
        # a request's allowed-token callables (loop.Allowed per sequence), asked every step
        self._allowed = None
        self._warming = False  # a capture's warm-up: its state is no request's
        if self.ngram:  # each sequence's tokens by position, what the lookup reads (a dump slot)
            self.history = zeros((n, max_len + 1))
        # per γ of an arm: the drafts, the target step's output (its hidden states) and the
        # emitted tokens (with the first emitted position and the last accepted row, the
        # graph drafter's catch-up input)
        widths = sorted({a.gamma for a in self.arms})
        self.drafts = {g: zeros((n, g)) for g in widths}
        self.hidden = {g: zeros((n, g + 1, hidden), dtype) for g in widths}
        self.emitted = {g: zeros((n, g + 1)) for g in widths}
        self.step_pos, self.first_pos, self.last_row = zeros(n), zeros(n) + 1, zeros(n)
        # the catch-up's output, where the next step's draft chain starts: the first draft,
        # the hidden a feature drafter feeds its next call (MTP / EAGLE), that call's position
        # (a capture's warm-up runs a chain before any catch-up: the position its catch-up
        # would give, 2, keeps its cache writes inside the cache)
        self.first_draft, self.chain_pos = zeros(n), zeros(n) + 2
        self.chain_x = None
        if self.graph_drafter is not None and not isinstance(drafter, ModelDrafter):
            self.chain_x = zeros((n, 1, drafter.eh_proj.out_features), dtype)
        # per step (a device-side record the host reads after each round): tokens kept
        # (num_emitted up to the limit), unfinished before the step and real drafts (not -1);
        # steps taken
        self.records = zeros((max_len + 1, 3, n))
        self.steps_taken = zeros(1)
        self._host = None  # the host's copies: the records, and the tokens twice (pinned)
        self._flip = 0
        self._rows = torch.arange(gamma + 1, device=device)

    @property
    def _eager_verify(self) -> bool:
        """The request's verify runs outside the step's graphs: it truncates (a read back of
        the settled rows) or asks allowed-token callables on the host."""
        return self._truncating or self._allowed is not None

    # ---- the pieces of a step

    def _draft_call(self, hidden, tokens, position, last_row):
        """One drafter call over ``tokens [N, T]`` at ``position [N]`` (of ``tokens[:, 0]``),
        drafting from row ``last_row [N]``: (draft [N], the hidden [N, 1, H] a feature drafter
        feeds its next call, or None). A feature drafter (MTP / EAGLE) pairs ``hidden [N, T, H]``
        (the target's or its own, one position earlier) with the tokens; a draft model reads
        the tokens alone, with its own LM head."""
        drafter = self.graph_drafter
        if isinstance(drafter, ModelDrafter):
            step = drafter.step
            out, _, _ = step(
                tokens, position, self.dk, self.dv, inplace=True, fused=self.draft_layers
            )
            row = select_rows(out, last_row)[:, 0]  # [N, H]
            return self.argmax(row, drafter.lm_head, self.vocab_size), None
        normed, x, _, _ = drafter.features(
            hidden, tokens, position - 1, last_row, self.dk, self.dv, True, self.draft_layers
        )
        return self.argmax(normed, self.lm_head, self.vocab_size), x

    def _catch_up(self, hidden, tokens, first_position, last_row) -> None:
        """The graph drafter's first call of a chain, over the last step's rows (``tokens`` at
        ``first_position`` ..), drafting from ``last_row``: its cache follows every step,
        whichever arm drafted; the draft and its hidden wait for the next step's chain."""
        if self.graph_drafter is None:
            return
        draft, x = self._draft_call(hidden, tokens, first_position, last_row)
        self.first_draft.copy_(draft)
        if x is not None:
            self.chain_x.copy_(x)
        self.chain_pos.copy_(first_position + last_row + 1)  # of the next call's token

    def _draft(self, arm: Arm) -> None:
        """``arm.gamma`` drafts into ``self.drafts``. A graph drafter drafts greedily: the
        catch-up's draft (``_catch_up``, at the end of the last step), then γ - 1 single calls.
        The n-gram drafter looks the sequences up in ``self.history`` (up to each one's
        position), -1 where it finds fewer than γ."""
        gamma = arm.gamma
        if gamma == 0:
            return
        drafts = self.drafts[gamma]
        if arm.drafter == "ngram":
            history = self.history[:, :-1]
            drafts.copy_(lookup(history, self.pos + 1, gamma, self.max_ngram))
        else:
            draft, x, position = self.first_draft, self.chain_x, self.chain_pos
            drafts[:, 0] = draft
            zeros = torch.zeros_like(position)
            for j in range(1, gamma):
                draft, x = self._draft_call(x, draft[:, None], position, zeros)
                drafts[:, j] = draft
                position = position + 1
        if self.draft_filter is not None:
            drafts.copy_(self.draft_filter(drafts, self.pos))

    def _decode(self, arm: Arm) -> None:
        """The target over [last, drafts] into ``self.hidden``."""
        tokens = torch.cat([self.last[:, None], self.drafts[arm.gamma]], dim=1)  # [N, γ + 1]
        # Finished sequences idle at position 0 (their cache is dead; writes stay inside it).
        self.step_pos.copy_(torch.where(self.active, self.pos, 0))
        hidden, _, _ = self.target(
            tokens, self.step_pos, self.k, self.v, inplace=True, fused=self.target_layers
        )
        self.hidden[arm.gamma].copy_(hidden)

    def _verify(self, arm: Arm) -> None:
        """Verify the drafts and advance every sequence by its own count."""
        gamma, active = arm.gamma, self.active
        drafts, rows = self.drafts[gamma], self._rows[: gamma + 1]
        truncation = dict(top_k=self.top_k, top_p=self.top_p) if self._truncating else {}
        if self._allowed is not None and not self._warming:  # one read a step: the host asks
            counts, active_now = self.count.tolist(), self.active.cpu()
            generated = [self.out[row, :c].tolist() for row, c in enumerate(counts)]
            starts = [0] * len(counts)
            (words,) = allowed_inputs(
                self.vocab_size, self._allowed, generated, starts, drafts.cpu(), active_now
            )
            truncation["allowed_tokens"] = words.to(self.device)
        emitted, num = self.verify(
            self.hidden[gamma],
            self.lm_head,
            drafts,
            self.temperature,
            self.seed,
            self.step_pos + 1,
            self.vocab_size,
            **truncation,
        )
        num = torch.where(active, num, 0)
        kept = torch.minimum(num, self.limit - self.count)  # the metrics count what is kept
        drafted = (drafts >= 0).sum(dim=1)  # the metrics count real drafts
        record = torch.stack([kept, active.long(), drafted])  # [3, N]
        self.records.index_copy_(0, self.steps_taken, record[None])
        self.steps_taken.add_(1)
        valid = rows[None, :] < num[:, None]
        columns = torch.where(valid, self.count[:, None] + rows, self.out.shape[1] - 1)
        self.out.scatter_(1, columns, torch.where(valid, emitted, 0))
        if self.ngram:  # the emitted tokens at their positions, after the last accepted one
            at = torch.where(valid, self.pos[:, None] + 1 + rows, self.max_len)
            self.history.scatter_(1, at, torch.where(valid, emitted, 0))
        last_emitted = emitted.gather(1, (num - 1).clamp(min=0)[:, None])[:, 0]
        self.last.copy_(torch.where(active, last_emitted, self.last))
        finished = self.count + num >= self.limit
        self.emitted[gamma].copy_(emitted.clamp(min=0))
        self.first_pos.copy_(torch.where(finished, 0, self.pos) + 1)
        self.last_row.copy_(num.clamp(min=1) - 1)
        self.count.add_(num)
        self.pos.add_(num)
        self.active.copy_(self.count < self.limit)

    def _catch_up_on_step(self, arm: Arm) -> None:
        g = arm.gamma
        self._catch_up(self.hidden[g], self.emitted[g], self.first_pos, self.last_row)

    def _pieces(self, arm: Arm) -> list[tuple[str, Callable[[], None]]]:
        """A step of ``arm``: its drafts, the target's verify of them, then the graph drafter's
        catch-up on the tokens it emitted (as one piece, or a piece each with
        ``split_timing`` or while truncating, named by what ``piece_seconds`` counts them
        as)."""
        pieces = [
            ("draft", functools.partial(self._draft, arm)),
            ("target", functools.partial(self._decode, arm)),
            ("verify", functools.partial(self._verify, arm)),
            ("draft", functools.partial(self._catch_up_on_step, arm)),
        ]
        if self.graph_drafter is None:
            pieces = pieces[:-1]
        if arm.gamma == 0:
            pieces = pieces[1:]
        if self.split_timing or self._eager_verify:
            return pieces

        def step():
            for _, piece in pieces:
                piece()

        return [("step", step)]

    # ---- graphs

    def _capture(self) -> None:
        """Warm up (compiles the kernels; the state is reset before use) and capture each piece
        of every arm's step, as the request needs them (``self._eager_verify``). A truncating
        verify is not captured: it reads back whether its hand-in settled every row
        (``kernels/verify_resample.py``), and recomputes the rows they did not, exactly; nor one
        whose masks the host computes."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        self._warming = True  # the allowed-token callables are not asked about this state
        with torch.cuda.stream(stream):
            for arm in self.arms:
                for _ in range(2):
                    for _, piece in self._pieces(arm):
                        piece()
        self._warming = False
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for arm in self.arms:
            graphs = []
            for name, piece in self._pieces(arm):
                if self._eager_verify and name == "verify":
                    graphs.append(None)
                    continue
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    piece()
                graphs.append(graph)
            self._graphs[arm, self._eager_verify] = graphs

    # ---- the loop

    @torch.no_grad()
    def generate(
        self,
        prompt,
        new_tokens: int,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        stream: Stream | None = None,
        stream_round: int = STREAM_ROUND,
        *,
        arm: Arm | None = None,
        policy=None,
        select_round: int = SELECT_ROUND,
        top_k: torch.Tensor | None = None,
        top_p: torch.Tensor | None = None,
        allowed=None,
    ) -> tuple[list[list[int]], Metrics]:
        """Up to ``new_tokens`` per sequence after ``prompt`` ([N, T0] or N lists of token ids
        of any lengths >= 2), as ``loop.generate``: ``stream`` (``runtime.text.TextStream``)
        sees each step's tokens and may stop a sequence early (EOS, stop strings), read at
        least every ``stream_round`` steps.

        temperature : [N] float32 (0: greedy); seed : [N] int64
        arm : the (drafter, γ) every step runs (one of ``self.arms``; default the first)
        policy : instead, a ``selection`` policy over (some of) ``self.arms``: it picks the arm
            of every step of a round of at most ``select_round`` steps before the round runs,
            and updated after it with each step's accepted drafts per sequence and that step's
            device time (CUDA events around its graphs, read with the round's record: no
            synchronisation inside a round)
        top_k : [N] int64 (0: off), top_p : [N] float32 in (0, 1] (1: off): the target samples
            from its top-k / nucleus (``ops.verify_resample``); the verify then runs outside
            the step's graphs with one read back per step (an exact recompute of any row its
            hand-in does not settle)
        allowed : per sequence, a ``loop.Allowed`` callable or None, as ``loop.generate`` takes:
            asked for every row of every step (the generated tokens and the drafts before the
            row, read back from the device: one read a step), its mask fed to the verify, which
            then runs outside the step's graphs
        Returns the generated tokens per sequence and the run's metrics (with a policy,
        ``metrics.arms``: steps per arm).
        """
        prompts = as_prompts(prompt)
        check_request(prompts, new_tokens, self.gamma, temperature, self.batch, self.max_len)
        arm = self.arms[0] if arm is None else arm
        for asked in [arm] if policy is None else policy.arms:
            if asked not in self.arms:
                raise ConfigError(f"arm: {asked} is none of the loop's arms {self.arms}")
        if select_round < 1:
            raise ConfigError(f"select_round: expected at least 1, got {select_round}")
        check_allowed(allowed, len(prompts))
        self._allowed = allowed
        self._truncating = top_k is not None or top_p is not None
        if self._truncating:
            top_k, top_p = sampling_values(len(prompts), top_k, top_p)
            self.top_k.copy_(top_k)
            self.top_p.copy_(top_p)
        if self.use_graphs and (self.arms[0], self._eager_verify) not in self._graphs:
            self._capture()
        timed = self.device.type == "cuda"
        metrics = Metrics(self.gamma, self.batch)
        sync = torch.cuda.synchronize if timed else (lambda: None)
        sync()
        start = time.perf_counter()
        n = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts])
        longest = int(lengths.max())
        # right-padded with each prompt's last token (loop.generate's padding)
        padded = torch.tensor([p + p[-1:] * (longest - len(p)) for p in prompts])
        self.temperature.copy_(temperature)
        self.seed.copy_(seed)
        self.limit.fill_(new_tokens)
        self.count.zero_()
        self.active.fill_(True)
        self.out.zero_()
        self.steps_taken.zero_()
        self.pos.copy_(lengths - 1)
        self.last.copy_(padded[:, -1])
        self._prefill(padded.to(self.device), lengths.to(self.device))
        marks = []  # per step: (piece name, a time mark before it) and a mark after the last
        tokens: list[list[int]] = [[] for _ in range(n)]
        done = [0] * n  # per sequence: tokens the device generated (before a stop's cut)
        live = [True] * n  # per sequence: neither finished nor stopped by the stream
        in_flight = None  # the round on the device whose record the host has not read
        self._hindsight = None  # n-gram drafts scored on the steps other arms ran (a policy's)
        if policy is not None and {"ngram"} < {a.drafter for a in policy.arms if a.gamma}:
            longest = max(a.gamma for a in policy.arms if a.drafter == "ngram")
            self._hindsight = NgramHindsight(longest, self.max_ngram)
            self._sequences = [list(p) for p in prompts]  # each sequence's tokens so far
        while True:
            # The next round is enqueued before the host reads the one in flight, so its
            # choices and the reading overlap the device's work. No sequence emits more than
            # γ + 1 tokens a step: the round takes only steps that cannot finish the slowest
            # unfinished sequence even if the round in flight emitted the most it can.
            slowest = max((new_tokens - done[row] for row in range(n) if live[row]), default=0)
            if in_flight is not None:
                slowest -= len(in_flight.steps) * (in_flight.widest + 1)
            widest = self.gamma if policy is not None else arm.gamma
            steps = max(-(-slowest // (widest + 1)), 0)
            if stream is not None:
                steps = min(steps, stream_round)
            if policy is not None:  # each step's arm, chosen before the round runs
                steps = min(steps, select_round)
                chosen = [policy.choose() for _ in range(steps)]
                round_arms = [policy.arms[i] for i in chosen]
            else:
                chosen, round_arms = None, [arm] * steps
            queued = self._enqueue(round_arms, chosen, widest, marks) if steps else None
            if in_flight is not None:
                self._finish(in_flight, new_tokens, tokens, done, live, stream, metrics, marks,
                             policy)  # fmt: skip
            in_flight = queued
            if in_flight is None and not any(live):
                break
        self._time(metrics, marks)
        metrics.total_seconds = time.perf_counter() - start
        metrics.generated = sum(map(len, tokens))
        return tokens, metrics

    def _enqueue(self, arms: list[Arm], chosen, widest: int, marks: list) -> _Round:
        """Replay a step of each of ``arms`` back to back (a time mark around each piece into
        ``marks``), then queue the copies of the round's record and of the generated tokens to
        the host (pinned buffers on CUDA, so that the host waits for this round alone)."""
        first = len(marks)
        for step_arm in arms:
            pieces = self._pieces(step_arm)
            run = [piece for _, piece in pieces]
            if self.use_graphs:
                graphs = self._graphs[step_arm, self._eager_verify]
                run = [p if g is None else g.replay for p, g in zip(run, graphs, strict=True)]
            step = []
            for (name, _), piece in zip(pieces, run, strict=True):
                step.append((name, self._mark()))
                piece()
            step.append(("", self._mark()))
            marks.append(step)
        steps = range(first, len(marks))
        if self._host is None:
            pin = self.device.type == "cuda"
            records = torch.empty(self.records.shape, dtype=torch.int64, pin_memory=pin)
            outs = [torch.empty(self.out.shape, dtype=torch.int64, pin_memory=pin) for _ in "ab"]
            self._host = records, outs
        records, outs = self._host
        self._flip ^= 1  # the round in flight reads the other buffer
        out = outs[self._flip]
        cuda = self.device.type == "cuda"
        records[first : steps.stop].copy_(self.records[first : steps.stop], non_blocking=cuda)
        out.copy_(self.out, non_blocking=cuda)
        ready = self._mark() if cuda else None
        return _Round(steps, arms, chosen, widest, ready, out)

    def _finish(self, round_, new_tokens, tokens, done, live, stream, metrics, marks, policy):
        """Read ``round_`` (waiting for it alone), hand its steps to the stream, the metrics
        and the policy, and idle the sequences the stream stopped."""
        if round_.ready is not None:
            round_.ready.synchronize()
        stopped, kept, scored = self._take_round(
            round_, new_tokens, tokens, done, live, stream, metrics
        )
        for accepted, drafted in scored:  # the n-gram lookup in hindsight (a policy's)
            policy.observe("ngram", accepted, drafted)
        if policy is not None:  # the round's events are done too
            steps = marks[round_.steps.start : round_.steps.stop]
            for index, step_arm, step, step_kept in zip(
                round_.chosen, round_.arms, steps, kept, strict=True
            ):
                if not step_kept:  # no unfinished sequence: the step counts for none
                    continue
                key = f"{step_arm.drafter}:{step_arm.gamma}"
                metrics.arms[key] = metrics.arms.get(key, 0) + 1
                accepted = [max(k - 1, 0) for k in step_kept]  # a stop may keep none
                policy.update(index, accepted, max(_seconds(step[0][1], step[-1][1]), 1e-9))
        if stopped:  # they idle from now on: their limit drops to what they generated
            rows = torch.tensor(stopped, device=self.device)
            self.limit.index_copy_(0, rows, self.count[rows])
            self.active.copy_(self.count < self.limit)

    def _take_round(self, round_, new_tokens, tokens, done, live, stream, metrics):
        """The host's one read of a round: its record and the tokens it wrote (host copies),
        handed to ``stream`` and ``metrics`` step by step as ``loop.generate`` does. Updates
        the per-sequence ``tokens`` (kept), ``done`` (generated on the device) and ``live``;
        returns the sequences the stream stopped and per step the tokens it kept per
        unfinished sequence (none for a step the metrics do not count), and the n-gram
        lookup's hindsight scores (``NgramHindsight.scored``) of the proposals it settled."""
        steps = round_.steps
        record = self._host[0][steps.start : steps.stop].tolist()  # [S, 3, N]
        low = min(done)
        high = min(max(done) + len(steps) * (round_.widest + 1), self.out.shape[1] - 1)
        written = round_.out[:, low:high].tolist()  # [N, high - low]
        stopped, kept = [], []
        hindsight, scored = self._hindsight, []
        # per step: [N] tokens kept, [N] unfinished, [N] real drafts
        for step_arm, (kept_now, unfinished, drafted_now) in zip(round_.arms, record, strict=True):
            counted = []  # tokens kept per sequence unfinished at this step (the host loop's)
            drafted = []  # and its real drafts
            for row, (count, was_active) in enumerate(zip(kept_now, unfinished, strict=True)):
                if not (live[row] and was_active):
                    continue
                drafted.append(drafted_now[row])
                new = written[row][done[row] - low : done[row] - low + count]
                done[row] += count
                keep = stream.push(row, new) if stream is not None and new else None
                if keep is not None:
                    new = new[:keep]
                    live[row] = False
                    stopped.append(row)
                tokens[row].extend(new)
                counted.append(len(new))
                live[row] = live[row] and done[row] < new_tokens
                if hindsight is not None:  # what the lookup would have drafted, scored later
                    sequence = self._sequences[row]
                    if step_arm.drafter != "ngram":
                        hindsight.before(row, sequence)
                    sequence.extend(new)
                    scored += hindsight.scored(row, sequence, finished=not live[row])
            if counted:
                metrics.add_step(counted, drafted)
            kept.append(counted)
        return stopped, kept, scored

    def _prefill(self, prompt: torch.Tensor, lengths: torch.Tensor) -> None:
        """The target over the right-padded ``prompt [N, T0]`` but its last column, then the
        graph drafter catching up on it (each sequence from its own last prompt token,
        ``lengths [N]``; the n-gram drafter's history: the prompts); on CUDA one graph per
        padded length, captured on its first use (``self._prefills``). The padded cache slots
        lie at or past each sequence's position: the first step overwrites them before any
        query can attend to them."""

        def prefill(prompt, lengths):
            zeros = torch.zeros_like(lengths)
            hidden, _, _ = self.target(
                prompt[:, :-1], zeros, self.k, self.v, inplace=True, fused=self.target_layers
            )
            if self.ngram:  # the prompts (each up to its length; ``self.pos`` is set)
                self.history[:, : prompt.shape[1]].copy_(prompt)
            if isinstance(self.graph_drafter, ModelDrafter):  # the prompt, from position 0
                self._catch_up(None, prompt, zeros, lengths - 1)
            elif self.graph_drafter is not None:  # hidden row i pairs with prompt token i + 1
                self._catch_up(hidden, prompt[:, 1:], zeros + 1, lengths - 2)

        if not self.use_graphs:
            return prefill(prompt, lengths)
        length = prompt.shape[1]
        if length not in self._prefills:
            buffers = prompt.clone(), lengths.clone()
            prefill(*buffers)  # compiles this length's kernels; the capture then replays them
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                prefill(*buffers)
            self._prefills[length] = (*buffers, graph)
        prompt_buffer, lengths_buffer, graph = self._prefills[length]
        prompt_buffer.copy_(prompt)
        lengths_buffer.copy_(lengths)
        graph.replay()

    def _mark(self):
        """A point in time on the device's queue: a CUDA event, or the host clock on CPU."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _time(self, metrics: Metrics, marks: list[list]) -> None:
        """The time of each piece of the steps into ``metrics``."""
        seconds: dict[str, float] = {}
        for step in marks:
            for (name, before), (_, after) in itertools.pairwise(step):
                seconds[name] = seconds.get(name, 0.0) + _seconds(before, after)
        if not self.split_timing:  # one piece, or a truncating step's four
            metrics.step_seconds = sum(seconds.values())
        else:
            self.piece_seconds = {k: seconds.get(k, 0.0) for k in ("target", "verify", "draft")}
            metrics.draft_seconds = self.piece_seconds["draft"]
            metrics.verify_seconds = self.piece_seconds["target"] + self.piece_seconds["verify"]


def _seconds(before, after) -> float:
    """Seconds between two ``DeviceLoop._mark``s."""
    if isinstance(before, float):
        return after - before
    return before.elapsed_time(after) * 1e-3
