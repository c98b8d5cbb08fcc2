"""The Kubernetes deployment (``deploy/kubernetes/``) validated offline, and wired to the real settings.

Every manifest is validated against the Kubernetes API's JSON schemas (strict: an unknown or misspelt
field fails) from the ``kubernetes-validate`` package, which bundles them, so nothing is downloaded. Then
the wiring: every ``LIVELOOP_*`` variable a container sets names a field of a settings class, and the
values a container is given (with the Secrets' values replaced by well-formed stand-ins) build that class
without an error, as the component would at start-up; secrets come only from Secrets; every component
listens on 0.0.0.0 on the port its probes and Services use; the learner's rendezvous and world size agree.
No cluster and no service is needed.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from infra.settings import LiveloopSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests support (the pod-index label the learner's ranks read is 1.28+),
# and the newest whose schemas the package bundles.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
PACKAGES = ("infra", "ingest", "distill", "learner", "serving", "liveloop")
# Settings classes that live outside a module named ``settings``.
EXTRA_SETTINGS_MODULES = ("distill.samples",)
# Stand-ins for the Secrets' values: the shapes README.md tells operators to store.
SECRET_STAND_INS = {
    ("liveloop-external", "kafka-bootstrap"): "kafka-0.kafka:9092,kafka-1.kafka:9092,kafka-2.kafka:9092",
    ("liveloop-external", "postgres-dsn"): "postgresql://liveloop:secret@postgres:5432/liveloop",
    ("liveloop-external", "mlflow-backend-store-uri"): "postgresql+psycopg://mlflow:secret@postgres:5432/mlflow",
    ("liveloop-credentials", "credentials.json"): "{}",
}
# Components built beside this deployment: their variables are checked once their settings class is in the tree.
PENDING = {"LIVELOOP_DASHBOARD_": "the ops dashboard (issue 40)"}
SECRET_NAME = re.compile(r"(DSN|KEY|PASSWORD|TOKEN|SECRET|BOOTSTRAP|STORE_URI)$")
# Inside a pod the components must listen beyond loopback for probes, Services and scrapes to reach them.
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104
CREDENTIALS_IN_URI = re.compile(r"://[^/@\s]*:[^/@\s]*@")

Container = tuple[str, dict[str, Any], dict[str, Any]]  # manifest id, workload, container


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


DOCUMENTS = _documents()
WORKLOADS = [(name, doc) for name, doc in DOCUMENTS if doc["kind"] in ("Deployment", "StatefulSet", "Job")]
CONFIG = next(
    doc["data"] for _, doc in DOCUMENTS if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "liveloop-config"
)


def _containers(include_init: bool = False) -> list[Container]:
    out = []
    for name, doc in WORKLOADS:
        spec = doc["spec"]["template"]["spec"]
        for container in spec["containers"] + (spec.get("initContainers", []) if include_init else []):
            out.append((f"{name}/{container['name']}", doc, container))
    return out


CONTAINERS = _containers()


def _settings_classes() -> list[type[LiveloopSettings]]:
    """Every settings class of the packages: modules named ``settings`` (and the extra ones), imported."""
    names = list(EXTRA_SETTINGS_MODULES)
    for package in PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
            if info.name.rsplit(".", 1)[-1] == "settings":
                names.append(info.name)
    for name in names:
        importlib.import_module(name)
    found: list[type[LiveloopSettings]] = []
    todo = list(LiveloopSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


SETTINGS = _settings_classes()


def _field_exists(fields: dict[str, FieldInfo], path: list[str]) -> bool:
    """Whether ``a__b`` (env_nested_delimiter) names a field, descending into nested models."""
    head, *rest = path
    field = fields.get(head)
    if field is None:
        return False
    if not rest:
        return True
    model = field.annotation
    return isinstance(model, type) and issubclass(model, BaseModel) and _field_exists(model.model_fields, rest)


def settings_class_of(name: str) -> type[LiveloopSettings] | None:
    """The settings class whose env prefix and fields make up the variable ``name``, if any."""
    for cls in SETTINGS:
        prefix = str(cls.model_config.get("env_prefix", ""))
        if name.startswith(prefix) and _field_exists(cls.model_fields, name[len(prefix) :].lower().split("__")):
            return cls
    return None


def _pending(name: str) -> str | None:
    for prefix, what in PENDING.items():
        if name.startswith(prefix) and not any(cls.model_config.get("env_prefix") == prefix for cls in SETTINGS):
            return what
    return None


def _resolved(entry: dict[str, Any]) -> str | None:
    """An env entry's value as the pod would see it (Secrets by stand-in); None for the downward API."""
    if "value" in entry:
        return str(entry["value"])
    source = entry["valueFrom"]
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return SECRET_STAND_INS[(ref["name"], ref["key"])]
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        assert ref["name"] == "liveloop-config", f"{entry['name']}: unknown ConfigMap {ref['name']}"
        return str(CONFIG[ref["key"]])
    return None


def _ids(items: list[Any]) -> list[str]:
    return [item[0] for item in items]


# -- the manifests themselves ---------------------------------------------------------------------------


def test_the_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    manifests = {path.name for path in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(manifests)
    assert {image["name"] for image in kustomization["images"]} >= {
        c["image"] for _, _, c in _containers(include_init=True)
    }


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("document", DOCUMENTS, ids=_ids(DOCUMENTS))
def test_every_manifest_validates_against_the_kubernetes_schema(document: tuple[str, Any], version: str) -> None:
    _, doc = document
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{document[0]} is not a valid {doc['kind']} for Kubernetes {version}: {exc}")


def test_the_validator_refuses_a_misspelt_field() -> None:
    """The check above can fail: strict validation refuses a field Kubernetes does not know."""
    _, doc = next(d for d in DOCUMENTS if d[1]["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = broken["spec"]["template"]["spec"]["containers"][
        0
    ].pop("resources")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_no_manifest_holds_a_secret() -> None:
    assert not [name for name, doc in DOCUMENTS if doc["kind"] == "Secret"], "Secrets are created apart (README.md)"
    for name, _, container in CONTAINERS:
        for entry in container.get("env", []):
            if SECRET_NAME.search(entry["name"]):
                assert "secretKeyRef" in entry.get("valueFrom", {}), f"{name}: {entry['name']} must come from a Secret"
            assert not CREDENTIALS_IN_URI.search(str(entry.get("value", ""))), (
                f"{name}: {entry['name']} holds a password"
            )


def test_the_secrets_keys_are_documented() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    used = {
        (ref["name"], ref["key"])
        for _, _, container in CONTAINERS
        for entry in container.get("env", [])
        if (ref := entry.get("valueFrom", {}).get("secretKeyRef"))
    }
    used |= {
        (volume["secret"]["secretName"], "credentials.json")
        for _, doc in WORKLOADS
        for volume in doc["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in volume
    }
    for secret, key in sorted(used):
        assert secret in readme, f"README.md must say how to create the Secret {secret}"
        assert key in readme, f"README.md must say how to create {secret}'s key {key}"


# -- wired to the settings ------------------------------------------------------------------------------


def _liveloop_env(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (entry for entry in container.get("env", []) if entry["name"].startswith("LIVELOOP_"))


@pytest.mark.parametrize("container", CONTAINERS, ids=_ids(CONTAINERS))
def test_every_liveloop_variable_is_a_setting_and_its_value_is_accepted(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _, spec = container
    entries = list(_liveloop_env(spec))
    pending = {what for entry in entries if (what := _pending(entry["name"]))}
    if pending:
        pytest.skip(f"{name}: the settings of {', '.join(sorted(pending))} are not in this tree yet")
    classes: dict[type[LiveloopSettings], None] = {}
    for entry in entries:
        cls = settings_class_of(entry["name"])
        assert cls is not None, f"{name}: {entry['name']} is no field of any settings class (a typo is ignored)"
        classes[cls] = None
    for variable in [key for key in os.environ if key.startswith("LIVELOOP_")]:
        monkeypatch.delenv(variable)
    for entry in entries:
        value = _resolved(entry)
        if value is not None:
            monkeypatch.setenv(entry["name"], value)
    for cls in classes:
        cls()  # raises with every problem, as the component would at start-up


def test_a_misspelt_variable_is_caught() -> None:
    assert settings_class_of("LIVELOOP_DISTILL_WEB_PORT") is not None
    assert settings_class_of("LIVELOOP_TOPICS_EVENTS__PARTITIONS") is not None
    assert settings_class_of("LIVELOOP_DISTILL_WEBPORT") is None
    assert settings_class_of("LIVELOOP_TOPICS_EVENTS__PARTITION") is None


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {entry["name"]: _resolved(entry) for entry in container.get("env", [])}


@pytest.mark.parametrize("container", CONTAINERS, ids=_ids(CONTAINERS))
def test_a_listening_component_binds_every_interface_on_its_declared_port(container: Container) -> None:
    name, _, spec = container
    ports = {port["containerPort"] for port in spec.get("ports", [])}
    if spec["command"][0] == "mlflow":  # configured by its command line, not by liveloop settings
        assert f"--host={EVERY_INTERFACE}" in spec["command"]
        assert {f"--port={port}" for port in ports} <= set(spec["command"])
        return
    env = _env(spec)
    hosts = {key: value for key, value in env.items() if key.startswith("LIVELOOP_") and key.endswith("HOST")}
    assert all(value == EVERY_INTERFACE for value in hosts.values()), f"{name}: {hosts}"
    if ports:
        assert hosts, f"{name} declares ports {ports} but leaves its host setting at loopback"
    settings_ports = {int(str(v)) for k, v in env.items() if k.startswith("LIVELOOP_") and k.endswith("_PORT")}
    # Rank 0 of the learner also listens on the rendezvous port (torch's store), which MASTER_PORT names.
    rendezvous = {p["containerPort"] for p in spec.get("ports", []) if p["name"] == "rendezvous"}
    if rendezvous:
        assert rendezvous == {int(str(env["MASTER_PORT"]))}, f"{name}: rendezvous {rendezvous}"
    assert settings_ports == ports - rendezvous, f"{name}: ports in settings {settings_ports}, declared {ports}"


@pytest.mark.parametrize("container", CONTAINERS, ids=_ids(CONTAINERS))
def test_probes_use_the_health_endpoint_and_every_container_requests_resources(container: Container) -> None:
    name, _, spec = container
    requests = spec["resources"]["requests"]
    assert {"cpu", "memory"} <= set(requests), f"{name}: requests {requests}"
    assert "memory" in spec["resources"].get("limits", {}), f"{name}: no memory limit"
    paths = {spec[probe]["httpGet"]["path"] for probe in ("livenessProbe", "startupProbe") if probe in spec}
    served = {port["name"] for port in spec.get("ports", [])} & {"http", "web", "status"}
    if served and spec["command"][0] != "mlflow":
        assert "/healthz" in paths, f"{name}: serves HTTP but its liveness is not /healthz ({paths})"


def test_services_reach_their_pods_by_label_and_port_name() -> None:
    for name, doc in DOCUMENTS:
        if doc["kind"] != "Service":
            continue
        selector = doc["spec"]["selector"]
        targets = [
            w
            for _, w in WORKLOADS
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items() and w["kind"] != "Job"
        ]
        assert targets, f"{name} selects no pod"
        for port in doc["spec"]["ports"]:
            for workload in targets:
                declared = {
                    p["name"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
                }
                assert port["targetPort"] in declared, f"{name}: {workload['metadata']['name']} has no port {port}"


def _workload(kind: str, name: str) -> dict[str, Any]:
    return next(doc for _, doc in WORKLOADS if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_distiller_workers_do_not_outnumber_the_events_partitions() -> None:
    distiller = _workload("StatefulSet", "distiller")
    assert distiller["spec"]["replicas"] <= int(CONFIG["events-partitions"])
    env = _env(distiller["spec"]["template"]["spec"]["containers"][0])
    assert env["LIVELOOP_DISTILL_PARTITIONS"] == CONFIG["events-partitions"]


def test_the_learner_ranks_meet_at_rank_zero_and_agree_on_the_world_size() -> None:
    leader, workers = _workload("StatefulSet", "learner"), _workload("StatefulSet", "learner-worker")
    world = int(CONFIG["learner-world-size"])
    assert leader["spec"]["replicas"] == 1
    assert workers["spec"]["replicas"] == world - 1
    rendezvous = next(
        doc for _, doc in DOCUMENTS if doc["kind"] == "Service" and doc["metadata"]["name"] == "learner-rendezvous"
    )
    assert rendezvous["spec"]["clusterIP"] == "None"
    assert rendezvous["spec"]["publishNotReadyAddresses"] is True
    for workload in (leader, workers):
        assert workload["spec"]["serviceName"] == "learner-rendezvous"
        container = workload["spec"]["template"]["spec"]["containers"][0]
        env = _env(container)
        assert env["MASTER_ADDR"] == f"{leader['metadata']['name']}-0.learner-rendezvous"
        assert env["WORLD_SIZE"] == env["LIVELOOP_LEARNER_WORLD_SIZE"] == str(world)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert _env(leader["spec"]["template"]["spec"]["containers"][0])["RANK"] == "0"


def test_the_gateway_serves_with_vllm_on_a_gpu() -> None:
    container = _workload("Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]
    assert _env(container)["LIVELOOP_SERVING_ENGINE"] == "vllm"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_ingest_api_scales_on_load() -> None:
    hpa = next(doc for _, doc in DOCUMENTS if doc["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ingest-api"}
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"] >= 2
