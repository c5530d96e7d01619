"""deploy/k8s/ against Kubernetes' own schemas (kubernetes-validate), and against the app.

The KEDA ScaledObjects have no schema in kubernetes-validate: what they name is checked
against the rest of the base (their Deployments, the queues those consume, the metrics
the app exports).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from capabilities.asgi import DRAIN_SECONDS
from capabilities.config.schema import Queues
from capabilities.web import health
from tests.support.paths import ROOT

BASE = ROOT / "deploy" / "k8s"
# The oldest Kubernetes the base is for (sidecar-free, policy/v1, batch/v1 TTLs).
KUBERNETES = "1.31.0"
SERVE_ROLES = set(re.findall(r"^  (\w+)\)", (ROOT / "scripts" / "serve").read_text(), re.M))
QUEUE_OF_ROLE = {"worker": Queues().heavy, "small": Queues().small}


def manifests() -> list[Path]:
    return sorted(path for path in BASE.glob("*.yaml") if path.name != "kustomization.yaml")


def resources() -> list[dict[str, Any]]:
    return [doc for path in manifests() for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in resources() if doc["kind"] == kind}


@pytest.mark.parametrize(
    "resource",
    [doc for doc in resources() if doc["kind"] != "ScaledObject"],
    ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}",
)
def test_each_resource_is_valid_for_kubernetes(resource: dict[str, Any]) -> None:
    kubernetes_validate.validate(resource, KUBERNETES, strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [path.name for path in manifests()]


def containers() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for kind in ("Deployment", "Job"):
        for name, doc in of_kind(kind).items():
            found += [(name, c) for c in doc["spec"]["template"]["spec"]["containers"]]
    return found


def test_every_process_is_started_as_scripts_serve_starts_it_with_the_same_environment() -> None:
    roles = {name: container["command"] for name, container in containers()}
    assert {tuple(command[:1]) for command in roles.values()} == {("scripts/serve",)}
    assert {command[1] for command in roles.values()} == SERVE_ROLES
    for name, container in containers():
        sources = [next(iter(source.values()))["name"] for source in container["envFrom"]]
        assert sources == ["abp-jobs-config", "abp-jobs"], name


def test_the_web_probes_are_the_apps_and_its_drain_fits_in_its_grace() -> None:
    web = of_kind("Deployment")["abp-jobs-web"]["spec"]["template"]["spec"]
    container = web["containers"][0]
    ready = container["readinessProbe"]["httpGet"]["path"]
    # Only the replica's own state takes it out: what all share would take all out.
    assert ready == "/readyz?exclude=workers,database,redis"
    assert set(health.CHECKS) - {"workers", "database", "redis"} == {"warm", "serving"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pause + DRAIN_SECONDS + 5 <= web["terminationGracePeriodSeconds"]


def test_each_worker_scales_on_its_own_queues_depth() -> None:
    deployments = of_kind("Deployment")
    scaled = of_kind("ScaledObject")
    assert set(scaled) == {"abp-jobs-worker-heavy", "abp-jobs-worker-small"}
    for name, scaler in scaled.items():
        target = deployments[scaler["spec"]["scaleTargetRef"]["name"]]
        role = target["spec"]["template"]["spec"]["containers"][0]["command"][1]
        (trigger,) = scaler["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        assert set(re.findall(r'queue="([^"]+)"', query)) == {QUEUE_OF_ROLE[role]}, name
        assert {"abp_queue_depth", "abp_queue_running"} <= set(re.findall(r"abp_\w+", query))
        assert float(trigger["metadata"]["threshold"]) > 0
        assert 1 <= scaler["spec"]["minReplicaCount"] <= scaler["spec"]["maxReplicaCount"]


def test_the_metrics_the_autoscaler_reads_are_exported() -> None:
    exported = (ROOT / "capabilities" / "web" / "metrics_collector.py").read_text()
    for metric in ("abp_queue_depth", "abp_queue_running"):
        assert f'"{metric}"' in exported
