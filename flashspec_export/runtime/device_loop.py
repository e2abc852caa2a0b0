"""The speculative loop resident on one device: the GPU backend of the runtime.

The target and an MTP drafter run as PyTorch modules where their weights are (bf16 on a GPU),
the FlashSpec ops on the Triton kernels there (the reference on CPU), and every tensor of the
loop stays on the device: the static KV caches are written in place, each sequence has its own
length, and a step's ragged acceptance advances each sequence by its own ``num_emitted`` in
device memory. On CUDA the decoder layers run fused (``models/fused.py``: nine launches a
layer, attention over each sequence's live prefix) and a whole step — the target over the last
token and the drafts, verify, the bookkeeping, then the draft chain for the next step — is one
CUDA graph (the prompt's prefill too, one graph per prompt length). The host never waits inside
a step: it replays as many steps as cannot finish every
sequence (the slowest one's remaining tokens / (γ + 1)) back to back, then reads the counts once;
each step's ``num_emitted`` goes to a device-side record that is read at the end (the metrics).

The rule is ``loop.generate``'s, step for step: same modules and seeds, same tokens
(``tests/runtime/test_device_loop.py``). ``verify`` / ``argmax`` are pluggable so that the decode
benchmark runs the same loop with the materialised sampler and matmul + argmax drafting, and
``draft_filter`` rewrites the drafts inside the draft graph (the benchmark's drafter of known
acceptance).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import torch

from flashspec_export.models.fused import FusedLayers
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import TargetStep
from flashspec_export.ops import registry
from flashspec_export.runtime.loop import as_prompts, check_request
from flashspec_export.runtime.metrics import Metrics

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
    drafter : an ``MtpDrafter`` of it (same device and dtype), or None with ``gamma = 0``
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
        drafter: MtpDrafter | None,
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
        self._prefills: dict[int, tuple[torch.Tensor, torch.cuda.CUDAGraph]] = {}
        self.target_layers = self.draft_layers = None
        if device.type == "cuda" if fused is None else fused:
            decoder = self.target.decoder
            self.target_layers = FusedLayers(
                decoder.layers, decoder.rotary_emb, self.target.geometry
            )
            if drafter is not None:
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
        if drafter is not None:
            self.dk = zeros(drafter.cache_shape(batch, max_len), dtype)
            self.dv = torch.zeros_like(self.dk)
        # per sequence: the cache length (= position of the last accepted token), that token,
        # tokens generated so far, unfinished; the generated tokens (last column: a dump slot)
        self.pos, self.last, self.count = zeros(n), zeros(n), zeros(n)
        self.active = zeros(n, torch.bool)
        self.out = zeros((n, max_len + 1))
        self.new_tokens = zeros(())
        self.temperature, self.seed = zeros(n, torch.float32), zeros(n)
        self.drafts = zeros((n, gamma))
        # the target step's positions and output (its hidden states: the drafter's catch-up
        # input, with the emitted tokens, the first emitted position and the last accepted row)
        self.step_pos = zeros(n)
        self.hidden = zeros((n, width, hidden), dtype)
        self.pending = (self.hidden, zeros((n, width)), zeros(n) + 1, zeros(n))
        # per step (a device-side record the host reads at the end): tokens kept (num_emitted up
        # to new_tokens) and unfinished before the step; steps taken
        self.records = zeros((max_len + 1, 2, n))
        self.steps_taken = zeros(1)
        self._rows = torch.arange(width, device=device)

    # ---- the pieces of a step

    def _draft(self, hidden, tokens, first_position, last_row) -> None:
        """γ greedy drafts into ``self.drafts``: one catch-up call over the last step's rows
        (tokens at ``first_position`` ..), drafting from ``last_row``, then γ - 1 single calls."""
        if self.gamma == 0:
            return
        mtp, zeros, fused = self.drafter, torch.zeros_like(last_row), self.draft_layers
        normed, x, _, _ = mtp.features(
            hidden, tokens, first_position - 1, last_row, self.dk, self.dv, True, fused
        )
        draft = self.argmax(normed, self.lm_head, self.vocab_size)
        self.drafts[:, 0] = draft
        position = first_position + last_row + 1  # of the draft just made
        for j in range(1, self.gamma):
            normed, x, _, _ = mtp.features(
                x, draft[:, None], position - 1, zeros, self.dk, self.dv, True, fused
            )
            draft = self.argmax(normed, self.lm_head, self.vocab_size)
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
        kept = torch.minimum(num, self.new_tokens - self.count)  # the metrics count what is kept
        self.records.index_copy_(0, self.steps_taken, torch.stack([kept, active.long()])[None])
        self.steps_taken.add_(1)
        valid = self._rows[None, :] < num[:, None]
        columns = torch.where(valid, self.count[:, None] + self._rows, self.out.shape[1] - 1)
        self.out.scatter_(1, columns, torch.where(valid, emitted, 0))
        last_emitted = emitted.gather(1, (num - 1).clamp(min=0)[:, None])[:, 0]
        self.last.copy_(torch.where(active, last_emitted, self.last))
        finished = self.count + num >= self.new_tokens
        _, tokens_in, position_in, row_in = self.pending
        tokens_in.copy_(emitted.clamp(min=0))
        position_in.copy_(torch.where(finished, 0, self.pos) + 1)
        row_in.copy_(num.clamp(min=1) - 1)
        self.count.add_(num)
        self.pos.add_(num)
        self.active.copy_(self.count < self.new_tokens)

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
        prompt: torch.Tensor,
        new_tokens: int,
        temperature: torch.Tensor,
        seed: torch.Tensor,
    ) -> tuple[list[list[int]], Metrics]:
        """``new_tokens`` per sequence after ``prompt [N, T0]`` (T0 >= 2), as ``loop.generate``.

        Returns the generated tokens and the run's metrics.
        """
        check_request(
            as_prompts(prompt), new_tokens, self.gamma, temperature, self.batch, self.max_len
        )
        if self.use_graphs and self._graphs is None:
            self._capture()
        timed = self.device.type == "cuda"
        metrics = Metrics(self.gamma, self.batch)
        sync = torch.cuda.synchronize if timed else (lambda: None)
        sync()
        start = time.perf_counter()
        prompt = prompt.to(self.device)
        n, prompt_len = prompt.shape
        self.temperature.copy_(temperature)
        self.seed.copy_(seed)
        self.new_tokens.fill_(new_tokens)
        self.count.zero_()
        self.active.fill_(True)
        self.out.zero_()
        self.steps_taken.zero_()
        self.pos.fill_(prompt_len - 1)
        self.last.copy_(prompt[:, -1])
        self._prefill(prompt)
        run = [graph.replay for graph in self._graphs] if self._graphs else self._pieces()
        marks = []  # per step: a time mark before each piece and one after the last
        least_done = 0
        while least_done < new_tokens:
            # No sequence emits more than γ + 1 tokens a step: this many steps cannot finish the
            # slowest one, so they run back to back before the host looks again.
            for _ in range(-(-(new_tokens - least_done) // (self.gamma + 1))):
                marks.append([])
                for piece in run:
                    marks[-1].append(self._mark())
                    piece()
                marks[-1].append(self._mark())
            least_done = int(self.count.min())  # the host's one wait per round
        self._account(metrics, marks)
        tokens = self.out[:, :new_tokens].cpu().tolist()
        metrics.total_seconds = time.perf_counter() - start
        metrics.generated = n * new_tokens
        return tokens, metrics

    def _prefill(self, prompt: torch.Tensor) -> None:
        """The target over the prompt, then the first draft chain catching up on it; on CUDA
        one graph per prompt length, captured on its first use (``self._prefills``)."""

        def prefill(prompt):
            n, prompt_len = prompt.shape
            zeros = torch.zeros(n, dtype=torch.int64, device=self.device)
            hidden, _, _ = self.target(
                prompt[:, :-1], zeros, self.k, self.v, inplace=True, fused=self.target_layers
            )
            self._draft(hidden, prompt[:, 1:], zeros + 1, zeros + prompt_len - 2)

        if not self._graphs:
            return prefill(prompt)
        length = prompt.shape[1]
        if length not in self._prefills:
            buffer = prompt.clone()
            prefill(buffer)  # compiles this length's kernels; the capture then replays them
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                prefill(buffer)
            self._prefills[length] = (buffer, graph)
        buffer, graph = self._prefills[length]
        buffer.copy_(prompt)
        graph.replay()

    def _mark(self):
        """A point in time on the device's queue: a CUDA event, or the host clock on CPU."""
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _account(self, metrics: Metrics, marks: list[list]) -> None:
        """The device record of each step into ``metrics``, and the time of each piece."""
        for num, was_active in self.records[: len(marks)].cpu():
            metrics.add_step(num[was_active.bool()].tolist())
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
