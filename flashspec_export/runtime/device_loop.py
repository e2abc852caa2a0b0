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

import itertools
import time
from collections.abc import Callable

import torch

from flashspec_export.models.drafters import ModelDrafter
from flashspec_export.models.fused import FusedLayers
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.ngram import NgramDrafter, lookup
from flashspec_export.models.target import TargetStep, select_rows
from flashspec_export.ops import registry
from flashspec_export.runtime.loop import Stream, as_prompts, check_request
from flashspec_export.runtime.metrics import Metrics

# With a stream, the most steps between two reads of the host: a stop (EOS, a stop string) is
# seen at most this many steps late, and the text streams in pieces of at most this many steps.
# A read costs one synchronisation (~0.1 ms with the host's bookkeeping) per round.
STREAM_ROUND = 16

# verify(hidden [N, γ+1, H], lm_head, drafts [N, γ], temperature, seed, positions, vocab_size)
#   -> (tokens [N, γ + 1], num_emitted [N]); argmax(hidden [N, H], lm_head, vocab) -> token [N]
Verify = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Argmax = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def fused_ops(device: torch.device) -> tuple[Verify, Argmax]:
    """The FlashSpec ops for ``device``: the Triton kernels on CUDA, the reference elsewhere."""
    backend = "triton" if device.type == "cuda" else "reference"
    verify_impl = registry.resolve("verify_resample", backend)
    argmax_impl = registry.resolve("tiled_argmax", backend)

    def verify(hidden, lm_head, drafts, temperature, seed, positions, vocab_size):
        result = verify_impl(hidden, lm_head, drafts, temperature, seed, positions, vocab_size)
        return result.tokens, result.num_emitted

    def argmax(hidden, lm_head, vocab_size):
        return argmax_impl(hidden, lm_head, vocab_size)[0]

    return verify, argmax


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
    gamma : drafts per step (0: plain decoding)
    verify, argmax : the ops (default ``fused_ops``)
    graphs : capture CUDA graphs (default: on CUDA)
    fused : the decoder layers on the Triton kernels of ``models/fused.py`` (default: on CUDA;
        the PyTorch layers otherwise); the modules' q / k / v and gate / up weights become views
        of packed ones
    split_timing : three graphs per step — decoder, verify (sampler and bookkeeping), draft
        chain — timed apart (``piece_seconds``) instead of one
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
        verify: Verify | None = None,
        argmax: Argmax | None = None,
        graphs: bool | None = None,
        fused: bool | None = None,
        split_timing: bool = False,
        draft_filter: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ):
        if gamma > 0 and drafter is None:
            raise ValueError("drafter: gamma > 0 needs a drafter")
        self.target = TargetStep(causal_lm)
        self.drafter = drafter
        self.ngram = isinstance(drafter, NgramDrafter)
        graph_drafter = drafter is not None and not self.ngram
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
        self._graphs: list[torch.cuda.CUDAGraph] | None = None
        # per padded prompt length: its tokens' and lengths' buffers and its graph
        self._prefills: dict[int, tuple[torch.Tensor, torch.Tensor, torch.cuda.CUDAGraph]] = {}
        self.target_layers = self.draft_layers = None
        if device.type == "cuda" if fused is None else fused:
            decoder = self.target.decoder
            self.target_layers = FusedLayers(
                decoder.layers, decoder.rotary_emb, self.target.geometry
            )
            if isinstance(drafter, ModelDrafter):
                step = drafter.step
                self.draft_layers = FusedLayers(
                    step.decoder.layers, step.decoder.rotary_emb, step.geometry
                )
            elif graph_drafter:
                self.draft_layers = FusedLayers(
                    drafter.layers, drafter.rotary_emb, drafter.geometry
                )
        # seconds per piece of the step, summed over the last run (split_timing)
        self.piece_seconds = {"target": 0.0, "verify": 0.0, "draft": 0.0}

        def zeros(shape, kind=torch.int64):
            return torch.zeros(shape, dtype=kind, device=device)

        n, width, hidden = batch, gamma + 1, causal_lm.config.hidden_size
        self.k = zeros(self.target.cache_shape(batch, max_len), dtype)
        self.v = torch.zeros_like(self.k)
        if graph_drafter:
            self.dk = zeros(drafter.cache_shape(batch, max_len), dtype)
            self.dv = torch.zeros_like(self.dk)
        # per sequence: the cache length (= position of the last accepted token), that token,
        # tokens generated so far, the most it may generate (lowered to the count when the
        # stream stops it), unfinished; the generated tokens (last column: a dump slot)
        self.pos, self.last, self.count, self.limit = zeros(n), zeros(n), zeros(n), zeros(n)
        self.active = zeros(n, torch.bool)
        self.out = zeros((n, max_len + 1))
        self.temperature, self.seed = zeros(n, torch.float32), zeros(n)
        self.drafts = zeros((n, gamma))
        if self.ngram:  # each sequence's tokens by position, what the lookup reads (a dump slot)
            self.history = zeros((n, max_len + 1))
        # the target step's positions and output (its hidden states: the drafter's catch-up
        # input, with the emitted tokens, the first emitted position and the last accepted row)
        self.step_pos = zeros(n)
        self.hidden = zeros((n, width, hidden), dtype)
        self.pending = (self.hidden, zeros((n, width)), zeros(n) + 1, zeros(n))
        # per step (a device-side record the host reads after each round): tokens kept
        # (num_emitted up to the limit), unfinished before the step and real drafts (not -1);
        # steps taken
        self.records = zeros((max_len + 1, 3, n))
        self.steps_taken = zeros(1)
        self._rows = torch.arange(width, device=device)

    # ---- the pieces of a step

    def _draft_call(self, hidden, tokens, position, last_row):
        """One drafter call over ``tokens [N, T]`` at ``position [N]`` (of ``tokens[:, 0]``),
        drafting from row ``last_row [N]``: (draft [N], the hidden [N, 1, H] a feature drafter
        feeds its next call, or None). A feature drafter (MTP / EAGLE) pairs ``hidden [N, T, H]``
        (the target's or its own, one position earlier) with the tokens; a draft model reads
        the tokens alone, with its own LM head."""
        if isinstance(self.drafter, ModelDrafter):
            step = self.drafter.step
            out, _, _ = step(
                tokens, position, self.dk, self.dv, inplace=True, fused=self.draft_layers
            )
            row = select_rows(out, last_row)[:, 0]  # [N, H]
            return self.argmax(row, self.drafter.lm_head, self.vocab_size), None
        normed, x, _, _ = self.drafter.features(
            hidden, tokens, position - 1, last_row, self.dk, self.dv, True, self.draft_layers
        )
        return self.argmax(normed, self.lm_head, self.vocab_size), x

    def _draft(self, hidden, tokens, first_position, last_row) -> None:
        """γ drafts into ``self.drafts``. A graph drafter drafts greedily: one catch-up call over
        the last step's rows (tokens at ``first_position`` ..), drafting from ``last_row``, then
        γ - 1 single calls. The n-gram drafter looks the sequences up in ``self.history``
        (up to each one's position), -1 where it finds fewer than γ."""
        if self.gamma == 0:
            return
        if self.ngram:
            drafts = lookup(self.history[:, :-1], self.pos + 1, self.gamma, self.drafter.max_ngram)
            self.drafts.copy_(drafts)
        else:
            zeros = torch.zeros_like(last_row)
            draft, x = self._draft_call(hidden, tokens, first_position, last_row)
            self.drafts[:, 0] = draft
            position = first_position + last_row + 1  # of the draft just made
            for j in range(1, self.gamma):
                draft, x = self._draft_call(x, draft[:, None], position, zeros)
                self.drafts[:, j] = draft
                position = position + 1
        if self.draft_filter is not None:
            self.drafts.copy_(self.draft_filter(self.drafts, self.pos))

    def _draft_from_pending(self) -> None:
        self._draft(*self.pending)

    def _decode(self) -> None:
        """The target over [last, drafts] into ``self.hidden``."""
        tokens = torch.cat([self.last[:, None], self.drafts], dim=1)  # [N, γ + 1]
        # Finished sequences idle at position 0 (their cache is dead; writes stay inside it).
        self.step_pos.copy_(torch.where(self.active, self.pos, 0))
        hidden, _, _ = self.target(
            tokens, self.step_pos, self.k, self.v, inplace=True, fused=self.target_layers
        )
        self.hidden.copy_(hidden)

    def _verify(self) -> None:
        """Verify the drafts and advance every sequence by its own count."""
        active = self.active
        emitted, num = self.verify(
            self.hidden,
            self.lm_head,
            self.drafts,
            self.temperature,
            self.seed,
            self.step_pos + 1,
            self.vocab_size,
        )
        num = torch.where(active, num, 0)
        kept = torch.minimum(num, self.limit - self.count)  # the metrics count what is kept
        drafted = (self.drafts >= 0).sum(dim=1)  # the metrics count real drafts
        record = torch.stack([kept, active.long(), drafted])  # [3, N]
        self.records.index_copy_(0, self.steps_taken, record[None])
        self.steps_taken.add_(1)
        valid = self._rows[None, :] < num[:, None]
        columns = torch.where(valid, self.count[:, None] + self._rows, self.out.shape[1] - 1)
        self.out.scatter_(1, columns, torch.where(valid, emitted, 0))
        if self.ngram:  # the emitted tokens at their positions, after the last accepted one
            at = torch.where(valid, self.pos[:, None] + 1 + self._rows, self.max_len)
            self.history.scatter_(1, at, torch.where(valid, emitted, 0))
        last_emitted = emitted.gather(1, (num - 1).clamp(min=0)[:, None])[:, 0]
        self.last.copy_(torch.where(active, last_emitted, self.last))
        finished = self.count + num >= self.limit
        _, tokens_in, position_in, row_in = self.pending
        tokens_in.copy_(emitted.clamp(min=0))
        position_in.copy_(torch.where(finished, 0, self.pos) + 1)
        row_in.copy_(num.clamp(min=1) - 1)
        self.count.add_(num)
        self.pos.add_(num)
        self.active.copy_(self.count < self.limit)

    def _pieces(self) -> list[Callable[[], None]]:
        """A step: the target's verify of the current drafts, then the next step's drafts (as
        one piece, or three with ``split_timing``; no draft piece at γ = 0)."""
        if not self.split_timing:
            return [self._step]
        return [self._decode, self._verify, self._draft_from_pending][: 3 if self.gamma else 2]

    def _step(self) -> None:
        self._decode()
        self._verify()
        self._draft_from_pending()

    # ---- graphs

    def _capture(self) -> None:
        """Warm up (compiles the kernels; the state is reset before use) and capture each piece
        of the step."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                for piece in self._pieces():
                    piece()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._graphs = []
        for piece in self._pieces():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                piece()
            self._graphs.append(graph)

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
    ) -> tuple[list[list[int]], Metrics]:
        """Up to ``new_tokens`` per sequence after ``prompt`` ([N, T0] or N lists of token ids
        of any lengths >= 2), as ``loop.generate``: ``stream`` (``runtime.text.TextStream``)
        sees each step's tokens and may stop a sequence early (EOS, stop strings), read at
        least every ``stream_round`` steps.

        temperature : [N] float32 (0: greedy); seed : [N] int64
        Returns the generated tokens per sequence and the run's metrics.
        """
        prompts = as_prompts(prompt)
        check_request(prompts, new_tokens, self.gamma, temperature, self.batch, self.max_len)
        if self.use_graphs and self._graphs is None:
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
        run = [graph.replay for graph in self._graphs] if self._graphs else self._pieces()
        marks = []  # per step: a time mark before each piece and one after the last
        tokens: list[list[int]] = [[] for _ in range(n)]
        done = [0] * n  # per sequence: tokens the device generated (before a stop's cut)
        live = [True] * n  # per sequence: neither finished nor stopped by the stream
        while any(live):
            slowest = max(new_tokens - done[row] for row in range(n) if live[row])
            # No sequence emits more than γ + 1 tokens a step: this many steps cannot finish the
            # slowest one, so they run back to back before the host looks again.
            steps = -(-slowest // (self.gamma + 1))
            if stream is not None:
                steps = min(steps, stream_round)
            first = len(marks)
            for _ in range(steps):
                marks.append([])
                for piece in run:
                    marks[-1].append(self._mark())
                    piece()
                marks[-1].append(self._mark())
            steps = range(first, len(marks))
            stopped = self._take_round(steps, new_tokens, tokens, done, live, stream, metrics)
            if stopped:  # they idle from now on: their limit drops to what they generated
                rows = torch.tensor(stopped, device=self.device)
                self.limit.index_copy_(0, rows, self.count[rows])
                self.active.copy_(self.count < self.limit)
        self._time(metrics, marks)
        metrics.total_seconds = time.perf_counter() - start
        metrics.generated = sum(map(len, tokens))
        return tokens, metrics

    def _take_round(self, steps, new_tokens, tokens, done, live, stream, metrics) -> list[int]:
        """The host's one read of a round (the step indices ``steps``): its record and the
        tokens it wrote, handed to ``stream`` and ``metrics`` step by step as ``loop.generate``
        does. Updates the per-sequence ``tokens`` (kept), ``done`` (generated on the device)
        and ``live``; returns the sequences the stream stopped."""
        record = self.records[steps.start : steps.stop].cpu().tolist()  # [S, 3, N]
        low = min(done)
        high = min(max(done) + len(steps) * (self.gamma + 1), self.out.shape[1] - 1)
        written = self.out[:, low:high].cpu().tolist()  # [N, high - low]
        stopped = []
        # per step: [N] tokens kept, [N] unfinished, [N] real drafts
        for kept_now, unfinished, drafted_now in record:
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
            if counted:
                metrics.add_step(counted, drafted)
        return stopped

    def _prefill(self, prompt: torch.Tensor, lengths: torch.Tensor) -> None:
        """The target over the right-padded ``prompt [N, T0]`` but its last column, then the
        first draft chain catching up on it (each sequence from its own last prompt token,
        ``lengths [N]``; the n-gram drafter's lookup over the prompts); on CUDA one graph per
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
                self._draft(None, None, None, None)
            elif isinstance(self.drafter, ModelDrafter):  # the prompt, from position 0
                self._draft(None, prompt, zeros, lengths - 1)
            else:  # hidden row i (position i) pairs with prompt token i + 1
                self._draft(hidden, prompt[:, 1:], zeros + 1, lengths - 2)

        if not self._graphs:
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
        seconds = [0.0] * (len(marks[0]) - 1)
        for step in marks:
            for i, (before, after) in enumerate(itertools.pairwise(step)):
                if isinstance(before, float):
                    seconds[i] += after - before
                else:
                    seconds[i] += before.elapsed_time(after) * 1e-3
        if len(seconds) == 1:
            metrics.step_seconds = seconds[0]
        else:
            self.piece_seconds = dict(zip(self.piece_seconds, [*seconds, 0.0][:3], strict=True))
            metrics.draft_seconds = self.piece_seconds["draft"]
            metrics.verify_seconds = self.piece_seconds["target"] + self.piece_seconds["verify"]
