"""deploy/kubernetes, checked offline: every manifest against the Kubernetes schemas
(`kubernetes-validate` ships them; strict: an unknown field is an error), and what the schemas
cannot see: the kustomization lists every file, selectors select the pods they mean, every
Secret key a pod reads exists, the flags and variables the containers pass are the CLI's own,
and the nodes drain through the gateway in their preStop within their grace period."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from hearth.cli.main import app

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S = "1.31"  # the oldest Kubernetes the manifests are checked against (policy/v1, apps/v1 throughout)
# Variables the containers set that are no option's envvar: the pod's own name (for $(POD_NAME)),
# the keys `required_keys` reads, and the gateway's PostgreSQL URL (the state layer reads it).
OTHER_ENV = {"POD_NAME", "HEARTH_API_KEYS", "HEARTH_DATABASE_URL"}


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(ROOT.glob("*.yaml"))
            if p.name != "kustomization.yaml"}


def resources() -> list[dict[str, Any]]:
    return [d for docs in manifests().values() for d in docs]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in resources() if d["kind"] == kind]


def workloads() -> list[dict[str, Any]]:
    return of_kind("Deployment") + of_kind("StatefulSet")


def containers() -> list[dict[str, Any]]:
    return [c for w in workloads() for c in w["spec"]["template"]["spec"]["containers"]]


@pytest.mark.parametrize("doc", resources(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_is_valid_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("breakage", ["a string for a number", "an unknown field", "a missing selector"])
def test_an_invalid_manifest_fails_the_check(breakage: str) -> None:
    doc = copy.deepcopy(of_kind("Deployment")[0])
    if breakage == "a string for a number":
        doc["spec"]["replicas"] = "two"
    elif breakage == "an unknown field":
        doc["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    else:
        del doc["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S, strict=True)


def test_the_kustomization_lists_every_file() -> None:
    kustomization = yaml.safe_load((ROOT / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(manifests())
    kubernetes_validate.validate(of_kind("Namespace")[0], K8S, strict=True)
    assert kustomization["namespace"] == of_kind("Namespace")[0]["metadata"]["name"]


def test_selectors_select_their_pods() -> None:
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads()]
    for w in workloads():
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
    for s in of_kind("Service") + of_kind("PodDisruptionBudget"):
        selector = s["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert any(selector.items() <= labels.items() for labels in pods), s["metadata"]["name"]
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    for st in of_kind("StatefulSet"):
        assert services[st["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"  # headless: per-pod DNS


def test_every_secret_a_pod_reads_exists() -> None:
    secrets = {s["metadata"]["name"]: s["stringData"] for s in of_kind("Secret")}
    refs = [e["valueFrom"]["secretKeyRef"] for c in containers() for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs
    for ref in refs:
        assert ref["key"] in secrets[ref["name"]], ref


def _command(name: str) -> Any:
    """The click command behind `hearth NAME` (typer's own click: compared by shape, not class)."""
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def _options(cmd: Any) -> tuple[set[str], set[str]]:
    flags = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    env = {e for p in cmd.params for e in ([p.envvar] if isinstance(p.envvar, str) else p.envvar or [])}
    return flags, env


def test_the_containers_use_the_clis_own_flags_and_variables() -> None:
    seen = set()
    for c in containers():
        if c.get("command") != ["hearth"]:
            continue
        cmd = _command(c["args"][0])
        flags, env = _options(cmd)
        used = {a for a in c["args"][1:] if a.startswith("--")}
        assert used <= flags, f"{c['name']}: unknown flags {used - flags}"
        names = {e["name"] for e in c["env"]}
        assert names <= env | OTHER_ENV, f"{c['name']}: unknown variables {names - env - OTHER_ENV}"
        for ref in re.findall(r"\$\((\w+)\)", " ".join(c["args"])):
            assert ref in names  # Kubernetes expands $(VAR) only from the container's env
        seen.add(c["args"][0])
    assert seen == {"serve", "gateway"}


def test_nodes_join_the_gateway_and_drain_through_it_before_they_stop() -> None:
    nodes = next(s for s in of_kind("StatefulSet") if s["spec"]["template"]["spec"]["containers"][0]["args"][0]
                 == "serve")
    spec = nodes["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    join = c["args"][c["args"].index("--join") + 1]
    fleet_service = re.fullmatch(r"http://([a-z0-9-]+):8080", join)
    assert fleet_service is not None and services[fleet_service.group(1)]["spec"]["publishNotReadyAddresses"]
    drain = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert "hearth gateway drain" in drain and join in drain and "$HEARTH_JOIN_KEY" in drain
    assert "drain" in _command("gateway").commands
    assert spec["terminationGracePeriodSeconds"] >= 300
    assert nodes["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {m["name"] for m in c["volumeMounts"]}
    assert {"name": "HEARTH_HOME", "value": "/data"} in c["env"]


def test_two_gateways_with_probes_and_a_disruption_budget() -> None:
    (gw,) = of_kind("Deployment")
    assert gw["spec"]["replicas"] == 2
    (c,) = gw["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and "livenessProbe" in c
    (pdb,) = [p for p in of_kind("PodDisruptionBudget") if p["metadata"]["name"] == gw["metadata"]["name"]]
    assert pdb["spec"]["minAvailable"] == 1
