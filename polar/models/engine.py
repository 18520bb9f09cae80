"""An in-process generation engine over a transformers causal LM, with SGLang's behaviour.

All model work (prefill, decode steps, weight reloads) runs on one worker thread, one step at a time, so
concurrent generations interleave token by token and a weight update always lands between two steps, as
on a real server. Each generation records the weight version of every token it samples (version spans).

Pause modes follow SGLang's ``/pause_generation``: ``abort`` ends running generations at once with an
abort finish reason (their partial output is returned); ``in_place`` freezes them with their KV cache;
``retract`` freezes them and drops the cache, so after ``resume`` they recompute their prefix under the
weights then live.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from pathlib import Path

import torch

from polar.errors import ContextLengthExceeded, InvalidRequest
from polar.inference import (
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LogprobSemantics,
    spans_from_events,
)
from polar.models.engine_job import Job
from polar.models.moe import tap_for
from polar.models.prefix_cache import PrefixCache
from polar.models.sampling import sample_next
from polar.tokens.tokenizer import ChatTokenizer


class PauseMode(StrEnum):
    ABORT = "abort"
    IN_PLACE = "in_place"
    RETRACT = "retract"


class LocalEngine:
    """Generates from token ids with a local model. Thread-safe; use from one or more event loops."""

    def __init__(
        self,
        model_dir: Path,
        tokenizer: ChatTokenizer,
        *,
        semantics: LogprobSemantics = LogprobSemantics.TEMPERATURE_SCALED,
        threads: int = 1,
        weight_version: str = "default",
    ):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        torch.set_num_threads(threads)
        self.model_dir = model_dir
        self.tokenizer = tokenizer
        self.semantics = semantics
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.context_length: int = self.model.config.max_position_embeddings
        self.weight_version = weight_version
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-engine")
        self._jobs: set[Job] = set()
        self._running = threading.Event()
        self._running.set()
        self._pause_mode: PauseMode | None = None
        self._seeds = itertools.count(random.SystemRandom().randrange(2**31))
        self.prefix_cache = PrefixCache()
        self.requests_served = 0
        self.router_tap = tap_for(self.model)  # None for a dense model (no routed experts to report)

    # ---- generation -------------------------------------------------------------------------------

    def validate(self, request: GenerateRequest) -> None:
        ids = request.input_ids
        if not ids:
            raise InvalidRequest("input_ids must not be empty", field="input_ids")
        vocab = self.model.config.vocab_size
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise InvalidRequest(f"input_ids contains {bad}, outside the vocabulary [0, {vocab})", field="input_ids")
        if len(ids) >= self.context_length:
            raise ContextLengthExceeded(len(ids), self.context_length)
        extras = request.extras
        if extras is None:
            return
        if not 0 <= extras.top_logprobs <= vocab:
            raise InvalidRequest(f"top_logprobs_num must be in [0, {vocab}]", field="top_logprobs_num")
        if any(not 0 <= i < vocab for i in extras.token_ids):
            raise InvalidRequest(f"token_ids_logprob holds an id outside [0, {vocab})", field="token_ids_logprob")
        if extras.routed_experts and self.router_tap is None:
            raise InvalidRequest(
                "return_routed_experts needs a mixture-of-experts model; this one is dense",
                field="return_routed_experts",
            )
        if not 0 <= extras.routed_experts_start <= len(ids):
            raise InvalidRequest(
                f"routed_experts_start_len must be in [0, {len(ids)}] (the prompt's length)",
                field="routed_experts_start_len",
            )

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield one chunk per sampled token, then a chunk carrying the final result."""
        self.validate(request)
        seed = request.sampling.seed if request.sampling.seed is not None else next(self._seeds)
        job = Job(request, torch.Generator().manual_seed(seed), pending=list(request.input_ids))
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        ttft = None
        self._jobs.add(job)
        try:
            while True:
                while not self._running.is_set() and job.aborted is None:
                    await asyncio.sleep(0.005)
                produced = len(job.output)
                finish = await loop.run_in_executor(self._executor, self._step, job)
                if len(job.output) > produced:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    yield GenerateChunk((job.output[-1],), (job.logprobs[-1],), extras=job.token_extras())
                if finish is not None:
                    await loop.run_in_executor(self._executor, self._keep_prefix, job)
                    self.requests_served += 1
                    yield GenerateChunk((), (), final=self._result(job, *finish, ttft, started))
                    return
        finally:
            self._jobs.discard(job)

    def _keep_prefix(self, job: Job) -> None:
        """Leave a finished job's cache for later requests that extend it (worker thread)."""
        if job.cache is not None and job.aborted is None and job.pending:
            covered = [*job.request.input_ids, *job.output][: job.cache.get_seq_length()]
            self.prefix_cache.store(covered, job.cache)
        job.cache = None

    def _result(
        self, job: Job, reason: FinishReason, matched: int | str | None, ttft: float | None, started: float
    ) -> GenerateResult:
        return GenerateResult(
            output_ids=tuple(job.output),
            output_logprobs=tuple(job.logprobs),
            finish_reason=reason,
            matched_stop=matched,
            version_spans=spans_from_events(job.version_events, self.weight_version, len(job.output)),
            prompt_tokens=len(job.request.input_ids),
            logprob_semantics=self.semantics,
            ttft_s=ttft,
            e2e_s=time.perf_counter() - started,
            extras=job.final_extras(self.router_tap),
        )

    def _step(self, job: Job) -> tuple[FinishReason, int | str | None] | None:
        """Sample one token (worker thread). Returns (reason, matched) when the job is finished."""
        params = job.request.sampling
        if job.aborted is not None:
            return FinishReason.ABORT, None
        budget = min(params.max_new_tokens, self.context_length - len(job.request.input_ids))
        if len(job.output) >= budget:
            return FinishReason.LENGTH, None
        logits = self._forward(job)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.tokenizer.eos_ids))
        if len(job.output) < params.min_new_tokens and stop_ids:
            logits = logits.clone()
            logits[list(stop_ids)] = float("-inf")
        token, logprob = sample_next(logits, params, job.generator, self.semantics)
        job.output.append(token)
        job.logprobs.append(logprob)
        if job.extras.top_logprobs or job.extras.token_ids:
            job.keep_top(logits, self.semantics)
        job.pending = [token]
        return self._finished(job, token, stop_ids, budget)

    def _forward(self, job: Job) -> torch.Tensor:
        """Run the model over the job's pending ids (reusing a shared prefix on a first step or a recompute) and
        return the next token's logits; keeps routed experts when the job asked for them."""
        if job.recompute:
            job.recompute = False
            job.cache, job.pending = None, [*job.request.input_ids, *job.output]
        routing = job.extras.routed_experts and self.router_tap is not None
        if job.cache is None:  # first step, or recomputation after a retract: reuse a shared prefix if any
            # Routed experts are reported from routed_experts_start on: a reused prefix must not cover them.
            wanted = job.pending[: job.extras.routed_experts_start + 1] if routing else job.pending
            job.cache, reused = self.prefix_cache.lookup(wanted)
            job.pending = job.pending[reused:]
        position = len(job.request.input_ids) + len(job.output) - len(job.pending)  # of job.pending[0]
        if routing:
            assert self.router_tap is not None
            self.router_tap.start()
        try:
            with torch.no_grad():
                out = self.model(
                    input_ids=torch.tensor([job.pending]), cache=job.cache, use_cache=True, logits_to_keep=1
                )
            if routing:
                job.keep_routing(self.router_tap, position)
        finally:
            if routing:
                assert self.router_tap is not None
                self.router_tap.stop()
        job.cache = out.cache
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def _finished(
        self, job: Job, token: int, stop_ids: set[int], budget: int
    ) -> tuple[FinishReason, int | str | None] | None:
        """Why the job ends after sampling ``token``, in SGLang's check order: stop strings, then stop tokens /
        EOS, then length; None while it goes on."""
        params = job.request.sampling
        if params.stop:
            tail = self.tokenizer.decode(job.output[-(max(len(s.encode()) for s in params.stop) + 2) :])
            matched = next((s for s in params.stop if s in tail), None)
            if matched is not None:
                return FinishReason.STOP, matched
        if token in stop_ids:
            return FinishReason.STOP, token
        if len(job.output) >= budget:
            return FinishReason.LENGTH, None
        return None

    async def score(self, prompt_ids: list[int], output_ids: list[int], temperature: float) -> list[float]:
        """Teacher-forced logprobs of ``output_ids`` after ``prompt_ids`` under the live weights."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, self._score, prompt_ids, output_ids, temperature
        )

    def _score(self, prompt_ids: list[int], output_ids: list[int], temperature: float) -> list[float]:
        ids = [*prompt_ids, *output_ids]
        cache, reused = self.prefix_cache.lookup(prompt_ids)
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([ids[reused:]]), cache=cache, use_cache=True, logits_to_keep=len(output_ids) + 1
            )
        logits = out.logits[0, :-1].float()
        if self.semantics is LogprobSemantics.TEMPERATURE_SCALED and temperature >= 1e-6:
            logits = logits / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(output_ids)[:, None])[:, 0].tolist()
        self.prefix_cache.store(ids, out.cache)
        return logprobs

    # ---- control ----------------------------------------------------------------------------------

    async def load_weights(self, source: Path | dict[str, torch.Tensor], version: str) -> None:
        """Swap weights between two decode steps and label them ``version``.

        ``source`` is a checkpoint folder (safetensors) or an in-memory state dict. Running generations
        record the switch in their version spans; under a retract pause they recompute their prefix.
        """
        await asyncio.get_running_loop().run_in_executor(self._executor, self._swap_weights, source, version)

    def _swap_weights(self, source: Path | dict[str, torch.Tensor], version: str) -> None:
        if isinstance(source, Path | str):
            from safetensors.torch import load_file

            files = sorted(Path(source).glob("*.safetensors"))
            if not files:
                raise InvalidRequest(f"no *.safetensors files in {source}", field="model_path")
            state: dict[str, torch.Tensor] = {}
            for f in files:
                state.update(load_file(f))
        else:
            state = source
        # Check everything before touching the model: load_state_dict copies tensors one by one, so a bad
        # checkpoint would otherwise leave mixed weights under the old version label.
        live = self.model.state_dict()
        missing, unexpected = sorted(live.keys() - state.keys()), sorted(state.keys() - live.keys())
        wrong = sorted(k for k in live.keys() & state.keys() if tuple(state[k].shape) != tuple(live[k].shape))
        if missing or unexpected or wrong:
            raise InvalidRequest(
                f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                f"wrong shape {wrong[:5]}",
                field="model_path",
            )
        self.model.load_state_dict(state, strict=True)
        self._set_version(version)

    async def relabel(self, version: str) -> None:
        """Give the live weights a new version label (SGLang's update_weight_version), between steps."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._set_version, version)

    def _set_version(self, version: str) -> None:
        """Running generations record the change at their current length (worker thread)."""
        self.prefix_cache.clear()
        for job in list(self._jobs):
            job.version_events.append((self.weight_version, len(job.output)))
            if self._pause_mode is PauseMode.RETRACT:
                job.needs_recompute()
        self.weight_version = version

    def pause(self, mode: PauseMode = PauseMode.ABORT) -> None:
        self._pause_mode = mode
        self._running.clear()
        if mode is PauseMode.ABORT:
            for job in list(self._jobs):
                job.aborted = "paused with mode=abort"
        elif mode is PauseMode.RETRACT:
            for job in list(self._jobs):
                job.needs_recompute()

    def resume(self) -> None:
        self._pause_mode = None
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def abort_all(self, message: str = "aborted") -> int:
        for job in list(self._jobs):
            job.aborted = message
        return len(self._jobs)

    def close(self) -> None:
        self.abort_all("engine closed")
        self._executor.shutdown(wait=False, cancel_futures=True)
