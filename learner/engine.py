"""The DeepSpeed training engine: the policy model, ZeRO-1/2 data parallelism, one optimizer step per batch.

What the rest of the learner sees is :class:`LearnerEngine`: ``train_step`` on a packed batch (the same
:class:`StepBatch` on every rank, each rank computing its share), ``save_state``/``load_state`` (the private
DeepSpeed checkpoint, a collective call) and ``save_pretrained`` (the Hugging Face folder, rank 0).

Decisions a reader must know:

- Gloo on CPU with fp32 everywhere; NCCL on GPUs with bf16 weights and fp32 master weights kept by ZeRO.
- Ranks split a batch by sample (``index % world_size == rank``) and scale their loss by
  ``world_size * local_tokens / batch_tokens``: DeepSpeed averages gradients over ranks, so the step
  equals the token-level mean over the whole batch, as one process would compute it.
- Every step seeds torch from ``(seed, step)``, so that a replayed step draws the numbers the first
  attempt drew (the tiny Llama has no dropout, but a base model may).
- ZeRO-1/2 keep full weights on every rank, so rank 0's module is the consolidated model on CPU (fp32).
  With bf16 the module holds bf16 copies, so the fp32 master weights are consolidated from the saved
  ZeRO state instead (``get_fp32_state_dict_from_zero_checkpoint``).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from learner.errors import LearnerError
from learner.logprobs import completion_logprobs
from learner.loss import LossConfig, policy_gradient_loss
from learner.manifest import config_hash
from learner.settings import LearnerSettings
from learner.tiny_model import TinyModelSpec, build_tiny_model

DS_TAG = "ds"
"""The DeepSpeed checkpoint tag inside a state folder."""


class TrainingEngineError(LearnerError):
    """The engine could not be built or its state loaded; the message names the setting or folder to fix."""


@dataclass(frozen=True)
class StepBatch:
    """One optimizer step's samples, as plain lists (cheap to broadcast to other ranks)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]
    loss_mask: list[list[int]]
    advantages: list[float]
    """Already normalised over this batch."""
    token_credit: list[list[float]] | None = None
    """Per sample, credit added to each completion token's advantage (on the advantages' scale: a turn's credited
    spans, :mod:`learner.token_spans`); an empty list for a sample without any, None for a batch without any."""

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def tokens(self) -> int:
        """Prompt plus completion tokens of the batch."""
        return sum(len(p) + len(c) for p, c in zip(self.prompt_ids, self.completion_ids, strict=True))

    def shard(self, rank: int, world_size: int) -> StepBatch:
        """The samples rank ``rank`` computes."""
        pick = range(rank, len(self), world_size)
        return StepBatch(
            prompt_ids=[self.prompt_ids[i] for i in pick],
            completion_ids=[self.completion_ids[i] for i in pick],
            behaviour_logprobs=[self.behaviour_logprobs[i] for i in pick],
            loss_mask=[self.loss_mask[i] for i in pick],
            advantages=[self.advantages[i] for i in pick],
            token_credit=None if self.token_credit is None else [self.token_credit[i] for i in pick],
        )


@dataclass(frozen=True)
class StepMetrics:
    """What one step reports (over the whole batch, all ranks)."""

    loss: float
    pg_loss: float
    kl: float
    mean_weight: float
    truncated_fraction: float
    clipped_fraction: float
    policy_tokens: int


def step_seed(seed: int, step: int) -> int:
    """The torch seed of optimizer step ``step``: a hash, so that neighbouring steps are unrelated."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def on_gpu() -> bool:
    """Whether training runs on CUDA (bf16, NCCL) rather than the CPU (fp32, gloo)."""
    return os.environ.get("DS_ACCELERATOR", "") != "cpu" and torch.cuda.is_available()


def init_distributed(world_size: int) -> tuple[int, int]:
    """Join the process group (rank, world size from the environment); return ``(rank, world_size)``.

    A single process needs no launcher: the rendezvous variables get local defaults when unset.
    """
    import deepspeed

    options: dict[str, Any] = {}
    if world_size == 1 and "MASTER_PORT" not in os.environ:
        # A rendezvous over TCP makes torch's store listen on every interface; a lone process needs no
        # network at all, so it meets itself in a file (the MASTER_* defaults below only quiet DeepSpeed's
        # launcher discovery).
        rendezvous = Path(tempfile.mkdtemp(prefix="liveloop-rendezvous-")) / "store"
        options = {"init_method": f"file://{rendezvous}", "rank": 0, "world_size": 1}
    if world_size == 1:
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    found = int(os.environ.get("WORLD_SIZE", "0"))
    if found != world_size:
        raise TrainingEngineError(
            f"world_size is {world_size} but WORLD_SIZE in the environment is {found}; start one process per rank "
            "with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK set"
        )
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if world_size == 1 and not on_gpu():
        _skip_shared_memory_collectives()
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo", verbose=False, **options)
    return int(os.environ["RANK"]), world_size


def _skip_shared_memory_collectives() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce op on ``init_distributed``.

    The op only speeds up collectives between ranks on one host; a lone CPU rank has none, and compiling it
    costs 30 s to over 3 minutes of a 2-core machine on a fresh cache (every first start of the learner).
    DeepSpeed reads op compatibility from ``deepspeed.ops.__compatible_ops__`` and offers no other switch;
    marking the op incompatible makes it fall back to plain torch.distributed, as on a machine without a compiler.
    """
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def base_model_label(base_model: str) -> str:
    """How manifests name the base model (version 1): ``tiny-llama:<spec hash>`` or the folder's absolute path."""
    if base_model == "tiny":
        return f"tiny-llama:{config_hash(TinyModelSpec().model_dump())[:16]}"
    return str(Path(base_model).resolve())


def load_base_model(base_model: str) -> Any:
    """The base model, fp32: the default tiny Llama for ``"tiny"``, else the Hugging Face folder."""
    if base_model == "tiny":
        return build_tiny_model(TinyModelSpec())
    folder = Path(base_model)
    if not (folder / "config.json").is_file():
        raise TrainingEngineError(
            f"base_model {base_model!r} is not a Hugging Face model folder (no config.json); "
            "give a local folder or 'tiny'"
        )
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def deepspeed_config(settings: LearnerSettings) -> dict[str, Any]:
    """The DeepSpeed config: AdamW in torch (no FusedAdam build), ZeRO stage from settings, bf16 on GPUs."""
    return {
        "train_micro_batch_size_per_gpu": 1,  # batches are packed by tokens here, not counted by DeepSpeed
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": settings.lr,
                "betas": [0.9, 0.999],
                "eps": 1e-8,
                "weight_decay": settings.weight_decay,
                "torch_adam": True,
            },
        },
        "zero_optimization": {"stage": settings.zero_stage, "overlap_comm": False},
        "bf16": {"enabled": on_gpu()},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


class LearnerEngine:
    """The policy under DeepSpeed, plus (when ``kl_coef > 0``) a frozen reference copy for the KL term."""

    def __init__(self, settings: LearnerSettings, rank: int, world_size: int) -> None:
        self.settings = settings
        self.rank = rank
        self.world_size = world_size
        self.loss_config = LossConfig(is_cap=settings.is_cap, clip_eps=settings.clip_eps, kl_coef=settings.kl_coef)
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars at every checkpoint
        self.engine: Any = None
        self.reference: Any = None
        self._build(settings.base_model)
        self.refresh_reference()

    def _build(self, weights: str) -> None:
        """(Re)create the DeepSpeed engine around the model in ``weights`` (a folder, or 'tiny'), with a fresh
        optimizer: Adam's moments start at zero and its step count at 0."""
        import deepspeed

        settings = self.settings
        model = load_base_model(weights)
        if settings.lora:
            from peft import LoraConfig, get_peft_model

            # LoRA's A matrices are random: seed them so every rank and every fresh start agree.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(settings.seed)
                model = get_peft_model(
                    model,
                    LoraConfig(
                        r=settings.lora_r,
                        lora_alpha=settings.lora_alpha,
                        target_modules=list(settings.lora_target_modules),
                        lora_dropout=0.0,
                        task_type="CAUSAL_LM",
                    ),
                )
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.engine = None  # drop the old engine (and its optimizer state) before building the next
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=trainable, config=deepspeed_config(settings)
        )

    def rebase(self, folder: Path) -> None:
        """Start again from the full-weights checkpoint in ``folder`` (the champion): its weights, a fresh
        optimizer (the moments of another line mean nothing here) and it as the KL reference. Every rank calls it."""
        if self.settings.lora:
            raise TrainingEngineError(
                "rebasing onto the champion needs full-weight checkpoints; with lora=true the learner cannot "
                "load an adapter checkpoint as its starting point yet"
            )
        self._build(str(folder))
        self.refresh_reference()

    @property
    def module(self) -> Any:
        """The trained model (a Hugging Face causal LM, or a peft model around one)."""
        return self.engine.module

    def refresh_reference(self, folder: Path | None = None) -> None:
        """Freeze the KL reference: the checkpoint in ``folder`` (the champion, full weights), or the current
        policy when None (the champion is the policy: at a rebase, or a learner without a registry). Nothing
        when kl_coef is 0."""
        if self.loss_config.kl_coef <= 0:
            return
        if folder is None or self.settings.lora:
            reference = copy.deepcopy(self.engine.module)
        else:
            dtype = next(self.engine.module.parameters()).dtype  # bf16 on GPUs, like the policy it is compared with
            reference = load_base_model(str(folder)).to(device=self.engine.device, dtype=dtype)
        self.reference = reference.eval()
        for parameter in self.reference.parameters():
            parameter.requires_grad_(False)

    def train_step(self, batch: StepBatch, step: int) -> StepMetrics:
        """One optimizer step on ``batch`` (every rank calls it with the same batch); ``step`` seeds it."""
        torch.manual_seed(step_seed(self.settings.seed, step))
        local = batch.shard(self.rank, self.world_size)
        batch_tokens = sum(sum(m) for m in batch.loss_mask)
        if len(local):
            loss, sums = self._local_loss(local, batch_tokens)
        else:
            # An idle rank still joins the gradient reduction, with zeros.
            loss = sum(p.sum() for p in self.engine.module.parameters() if p.requires_grad) * 0.0
            sums = torch.zeros(7, dtype=torch.float64)
        self.engine.backward(loss)
        self.engine.step()
        if self.world_size > 1:
            import torch.distributed as dist

            # NCCL reduces device tensors only; gloo takes the CPU tensor as it is.
            sums = sums.to(self.engine.device)
            dist.all_reduce(sums)
            sums = sums.cpu()
        tokens = max(float(sums[6]), 1.0)
        return StepMetrics(
            loss=float(sums[0]) / tokens,
            pg_loss=float(sums[1]) / tokens,
            kl=float(sums[2]) / tokens,
            mean_weight=float(sums[3]) / tokens,
            truncated_fraction=float(sums[4]) / tokens,
            clipped_fraction=float(sums[5]) / tokens,
            policy_tokens=int(sums[6]),
        )

    def _local_loss(self, local: StepBatch, batch_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        logp, valid = completion_logprobs(self.engine.module, local.prompt_ids, local.completion_ids)
        shape = logp.shape
        mask = _padded(local.loss_mask, shape, logp.device) * valid
        behaviour = _padded(local.behaviour_logprobs, shape, logp.device)
        advantages = torch.tensor(local.advantages, dtype=torch.float32, device=logp.device)
        if local.token_credit is not None:
            advantages = advantages.unsqueeze(-1) + _padded(local.token_credit, shape, logp.device)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logp, _ = completion_logprobs(self.reference, local.prompt_ids, local.completion_ids)
        terms = policy_gradient_loss(logp, behaviour, advantages, mask, self.loss_config, ref_logp)
        local_tokens = float(mask.sum().item())
        scale = self.world_size * local_tokens / batch_tokens if batch_tokens else 1.0
        sums = torch.tensor(
            [
                float(terms.loss.item()) * local_tokens,
                float(terms.pg_loss.item()) * local_tokens,
                float(terms.kl.item()) * local_tokens,
                terms.mean_weight * local_tokens,
                terms.truncated_fraction * local_tokens,
                terms.clipped_fraction * local_tokens,
                local_tokens,
            ],
            dtype=torch.float64,
        )
        return terms.loss * scale, sums

    # -- state --------------------------------------------------------------------------------

    def save_state(self, folder: Path) -> None:
        """Write the DeepSpeed checkpoint (weights, optimizer, step) into ``folder``; every rank calls it."""
        self.engine.save_checkpoint(
            str(folder), tag=DS_TAG, client_state={}, save_latest=False, exclude_frozen_parameters=self.settings.lora
        )

    def load_state(self, folder: Path) -> None:
        """Load what :meth:`save_state` wrote; every rank calls it."""
        if not (folder / DS_TAG).is_dir():
            raise TrainingEngineError(f"{folder} holds no DeepSpeed state ({DS_TAG}/ is missing); delete the folder")
        path, _ = self.engine.load_checkpoint(
            str(folder),
            tag=DS_TAG,
            load_module_strict=not self.settings.lora,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
        if path is None:
            raise TrainingEngineError(
                f"DeepSpeed could not load the state in {folder}; delete the folder to start over"
            )

    def save_pretrained(self, folder: Path, state_folder: Path | None = None) -> None:
        """Save the consolidated weights (or the LoRA adapter) as safetensors into ``folder``; rank 0 only.

        With bf16 the fp32 master weights come from ``state_folder`` (the saved ZeRO state) so the
        checkpoint does not lose precision; on fp32 the module's weights are the master weights.
        """
        module = self.engine.module
        if self.engine.bfloat16_enabled():
            if state_folder is None:
                raise TrainingEngineError("bf16 weights are consolidated from the saved state: pass state_folder")
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            state = get_fp32_state_dict_from_zero_checkpoint(str(state_folder), tag=DS_TAG)
            module.save_pretrained(folder, state_dict=state, safe_serialization=True)
        else:
            module.save_pretrained(folder, safe_serialization=True)


def _padded(rows: Sequence[Sequence[float]], shape: torch.Size, device: torch.device) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float32)
    for index, row in enumerate(rows):
        if row:
            out[index, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)
