"""The MLflow model registry, as the loop uses it: folders of weights as versions, aliases as state.

A checkpoint is a plain folder (safetensors plus a manifest), logged as run artifacts and registered
with ``create_model_version(source=<run artifact URI>/<path>)``; ``register_model("runs:/...")`` does
not work for folders that are not MLflow "logged models". Stages are deprecated: the aliases
``champion`` (what serving must serve) and ``candidate`` (newest, not yet evaluated) carry the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException, RestException

from infra.errors import InfraError

CHAMPION = "champion"
CANDIDATE = "candidate"


class RegistryError(InfraError):
    """The registry refused or failed an operation; the message names the model, version or alias."""


class AliasNotSet(RegistryError):
    """The model has no version under that alias yet (e.g. no champion before the base model exists)."""


class Registry:
    """A thin adapter over ``MlflowClient`` that converts its errors into ``RegistryError``."""

    def __init__(self, tracking_uri: str) -> None:
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def register_folder(self, name: str, run_id: str, artifact_path: str, tags: dict[str, str] | None = None) -> int:
        """Register the run's artifact folder ``artifact_path`` as a new version of ``name``; return it."""
        try:
            try:
                self.client.get_registered_model(name)
            except RestException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                self.client.create_registered_model(name)
            run = self.client.get_run(run_id)
            source = f"{run.info.artifact_uri.rstrip('/')}/{artifact_path.strip('/')}"
            version = self.client.create_model_version(name, source=source, run_id=run_id, tags=tags)
        except MlflowException as exc:
            raise RegistryError(f"registering {artifact_path} of run {run_id} as {name} failed: {exc}") from exc
        return int(version.version)

    def newest_version(self, name: str) -> int:
        """The highest version number of ``name`` the registry shows (0 if it has none or does not exist).

        A deleted version is not shown, yet MLflow's SQL store never hands its number out again (it
        assigns the highest number ever used plus one), so the next version may still be above this plus one.
        """
        try:
            found = self.client.search_model_versions(
                f"name = '{name}'", max_results=1, order_by=["version_number DESC"]
            )
        except RestException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return 0
            raise RegistryError(f"reading the versions of {name} failed: {exc}") from exc
        except MlflowException as exc:
            raise RegistryError(f"reading the versions of {name} failed: {exc}") from exc
        return int(found[0].version) if found else 0

    def require_version(self, name: str, version: int) -> None:
        """RegistryError unless ``name`` has a version ``version`` (one request)."""
        try:
            self._direct().get_model_version(name, str(version))
        except MlflowException as exc:
            raise RegistryError(f"{name} has no version {version} in the registry: {exc}") from exc

    def version_tags(self, name: str, version: int) -> dict[str, str]:
        """The tags of version ``version`` of ``name`` (one request)."""
        try:
            return dict(self._direct().get_model_version(name, str(version)).tags)
        except MlflowException as exc:
            raise RegistryError(f"reading the tags of {name} version {version} failed: {exc}") from exc

    def set_alias(self, name: str, alias: str, version: int) -> None:
        """Point ``alias`` of ``name`` at ``version`` (moving it if it pointed elsewhere)."""
        try:
            self._direct().set_registered_model_alias(name, alias, str(version))
        except MlflowException as exc:
            raise RegistryError(f"setting {name}@{alias} -> v{version} failed: {exc}") from exc

    def set_version_tags(self, name: str, version: int, tags: Mapping[str, str]) -> None:
        """Set ``tags`` on version ``version`` of ``name``, one request each (the REST API has no batch)."""
        try:
            direct = self._direct()
            for key, value in tags.items():
                direct.set_model_version_tag(name, str(version), key, value)
        except MlflowException as exc:
            raise RegistryError(f"tagging {name} v{version} failed: {exc}") from exc

    def _direct(self) -> Any:
        """The client ``MlflowClient`` itself calls, for alias moves, tags, and the reads of a promotion and a swap.

        ``MlflowClient.set_registered_model_alias``, ``set_model_version_tag`` and ``get_model_version``
        first fetch the registered model, to refuse a prompt of MLflow's prompt registry: one more
        request for each, and the server's CPU for it (about 13 ms a request; a promotion's ten tags
        made twenty requests, about 0.3 s of the server's CPU on 2 cores, in the middle of serving's
        swap). The models liveloop reads and writes are the ones it registered, never prompts.
        """
        return self.client._get_registry_client()  # type: ignore[no-untyped-call]

    def version_by_alias(self, name: str, alias: str) -> ModelVersion:
        """The model version the alias points at; AliasNotSet if there is none."""
        try:
            return self.client.get_model_version_by_alias(name, alias)
        except RestException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                raise AliasNotSet(f"{name} has no version with alias '{alias}'") from exc
            raise RegistryError(f"looking up {name}@{alias} failed: {exc}") from exc
        except MlflowException as exc:
            raise RegistryError(f"looking up {name}@{alias} failed: {exc}") from exc

    def alias_version(self, name: str, alias: str) -> int:
        """The version number the alias points at; AliasNotSet if there is none."""
        return int(self.version_by_alias(name, alias).version)

    def download(self, name: str, version: int, destination: Path) -> Path:
        """Download the files of a model version into ``destination``; return the folder."""
        import mlflow.artifacts

        try:
            source = self._direct().get_model_version_download_uri(name, str(version))
            path = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(destination), tracking_uri=self.client.tracking_uri
            )
        except MlflowException as exc:
            raise RegistryError(f"downloading {name} v{version} failed: {exc}") from exc
        return Path(path)
