"""Checks a checkpoint folder must pass before anything serves it: manifest hashes and finite weights.

Both the hot-swap controller and the evaluation gate run them. The weight check reads one tensor at a
time from the safetensors files, so it needs no more memory than the largest single tensor.
"""

from __future__ import annotations

from pathlib import Path

from learner.manifest import CheckpointManifest, ManifestError, verify_checkpoint
from serving.errors import ServingError


class CheckpointRefused(ServingError):
    """A checkpoint failed a sanity check (hashes, NaN/Inf weights); it must not be served. Do not retry it."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage

    def __reduce__(self) -> tuple[type[CheckpointRefused], tuple[str, str]]:
        # Raised in the registry helper process (serving.registry_worker) and re-raised in the gateway.
        return (type(self), (str(self), self.stage))


def non_finite_tensors(folder: Path) -> list[str]:
    """Names (``file:tensor``) of the tensors in the folder's safetensors files holding a NaN or an Inf."""
    import torch
    from safetensors import safe_open

    bad: list[str] = []
    for path in sorted(folder.rglob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    bad.append(f"{path.relative_to(folder).as_posix()}:{name}")
    return bad


def check_checkpoint(folder: Path) -> CheckpointManifest:
    """Verify every sha256 of the manifest, then that every weight is finite; CheckpointRefused if not."""
    try:
        manifest = verify_checkpoint(folder)
    except ManifestError as exc:
        raise CheckpointRefused(str(exc), stage="verify") from exc
    if not any(folder.rglob("*.safetensors")):
        raise CheckpointRefused(f"{folder} has no .safetensors weights; save with safe_serialization=True", "verify")
    bad = non_finite_tensors(folder)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CheckpointRefused(
            f"checkpoint {manifest.checkpoint_id} in {folder} has NaN/Inf weights in {shown}; retrain or restore it",
            stage="verify",
        )
    return manifest
