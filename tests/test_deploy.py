"""deploy/kubernetes: the manifests validate offline, and their pieces fit together.

Core kinds (Deployment, Service, ConfigMap, PVC, Namespace) are validated strictly (unknown fields
refused) with ``kubernetes-validate`` against the Kubernetes 1.28 and 1.37 schemas it ships. It has
no schemas for custom resources: KEDA's ``ScaledObject`` and the Prometheus operator's
``ServiceMonitor`` raise ``SchemaNotFoundError`` there, so they are checked here instead against the
part of their CRDs' OpenAPI schemas the manifests use (required fields and types; unknown fields
refused). Then the cross-references a typo would break: selectors and labels, named ports, the
volume claim, the gateway's configuration (deploy/haproxy's files verbatim, HAProxy's own check
of them, the Triton Service's DNS name and ports, every variable the policy reads), the scrape
annotations, the KEDA target and query
(SuperSONIC's, :func:`coffea_sonic.facility.autoscaling.supersonic_query`), and the workers'
endpoints file read by coffea-sonic's own settings code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# kubernetes-validate (which brings jsonschema) is declared by the test extra: a missing one fails
import jsonschema
import kubernetes_validate
import pytest
import yaml

from coffea_sonic.facility.autoscaling import DEFAULT_THRESHOLD_MS, supersonic_query

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")
NAMESPACE = "coffea-sonic"
CUSTOM_KINDS = {"ScaledObject", "ServiceMonitor"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    documents = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append((path.name, document))
    return documents


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for _, d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _strict_object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _strict_object({"name": {"type": "string"}, "namespace": {"type": "string"},
                            "labels": _LABELS}, ("name",))
# keda.sh/v1alpha1 ScaledObject (KEDA 2.x CRD): the fields the manifest uses
_HPA_POLICY = _strict_object({"type": {"enum": ["Pods", "Percent"]}, "value": {"type": "integer"},
                              "periodSeconds": {"type": "integer"}},
                             ("type", "value", "periodSeconds"))
_HPA_RULES = _strict_object({"stabilizationWindowSeconds": {"type": "integer"},
                             "policies": {"type": "array", "items": _HPA_POLICY}})
SCALED_OBJECT = _strict_object({
    "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"},
    "metadata": _METADATA,
    "spec": _strict_object({
        "scaleTargetRef": _strict_object({"apiVersion": {"type": "string"},
                                          "kind": {"type": "string"}, "name": {"type": "string"}},
                                         ("name",)),
        "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
        "minReplicaCount": {"type": "integer"}, "maxReplicaCount": {"type": "integer"},
        "advanced": _strict_object({"horizontalPodAutoscalerConfig": _strict_object({
            "behavior": _strict_object({"scaleUp": _HPA_RULES, "scaleDown": _HPA_RULES})})}),
        "triggers": {"type": "array", "minItems": 1, "items": _strict_object({
            "type": {"type": "string"}, "metricType": {"enum": ["AverageValue", "Value",
                                                               "Utilization"]},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}}},
            ("type", "metadata"))},
    }, ("scaleTargetRef", "triggers")),
}, ("apiVersion", "kind", "metadata", "spec"))
# monitoring.coreos.com/v1 ServiceMonitor (Prometheus operator CRD): the fields the manifest uses
SERVICE_MONITOR = _strict_object({
    "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
    "metadata": _METADATA,
    "spec": _strict_object({
        "selector": _strict_object({"matchLabels": _LABELS}),
        "endpoints": {"type": "array", "minItems": 1, "items": _strict_object({
            "port": {"type": "string"}, "path": {"type": "string"},
            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
            "relabelings": {"type": "array", "items": _strict_object({
                "sourceLabels": {"type": "array", "items": {"type": "string"}},
                "targetLabel": {"type": "string"}, "regex": {"type": "string"},
                "replacement": {"type": "string"}})}})},
    }, ("selector", "endpoints")),
}, ("apiVersion", "kind", "metadata", "spec"))
CUSTOM_SCHEMAS = {"ScaledObject": SCALED_OBJECT, "ServiceMonitor": SERVICE_MONITOR}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_manifests_validate_strictly(version):
    checked = 0
    for path, document in _documents():
        if document["kind"] in CUSTOM_KINDS:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(document, version, strict=True)
            continue
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{path}: {document['kind']}/{document['metadata']['name']} is "
                                 f"invalid for Kubernetes {version}: {error.message} at "
                                 f"{list(error.path)}") from None
        checked += 1
    assert checked == 7  # namespace, PVC, triton Deployment+Service, gateway ConfigMap+Deployment+Service


def test_custom_resources_match_their_crd_schemas():
    custom = [(path, d) for path, d in _documents() if d["kind"] in CUSTOM_KINDS]
    assert {d["kind"] for _, d in custom} == CUSTOM_KINDS
    for path, document in custom:
        jsonschema.validate(document, CUSTOM_SCHEMAS[document["kind"]])
    # the check refuses what the CRD would refuse
    broken = _one("ScaledObject", "triton")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**broken, "spec": {**broken["spec"], "triggerz": []}}, SCALED_OBJECT)


def test_everything_is_in_one_namespace_and_services_select_their_pods():
    documents = [d for _, d in _documents()]
    assert all(d["metadata"].get("namespace") == NAMESPACE for d in documents
               if d["kind"] != "Namespace")
    for name in ("triton", "gateway"):
        service, deployment = _one("Service", name), _one("Deployment", name)
        pod = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        port_names = {port["name"] for container in pod["spec"]["containers"]
                      for port in container["ports"]}
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= port_names
    # the gateway resolves every Triton pod through a headless Service
    assert _one("Service", "triton")["spec"]["clusterIP"] == "None"


def test_triton_pods_request_a_gpu_and_read_the_model_repository_volume():
    pod = _one("Deployment", "triton")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-repository=/models" in container["args"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/models")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert _one("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"


def _server_templates(servers_cfg: str) -> dict[str, list[str]]:
    """Each backend's one ``server-template`` line, split into words."""
    templates, backend = {}, ""
    for line in servers_cfg.splitlines():
        words = line.split()
        if words[:1] == ["backend"]:
            backend = words[1]
        elif words[:1] == ["server-template"]:
            assert backend not in templates, f"backend {backend} has two server templates"
            templates[backend] = words
    return templates


def test_the_gateway_runs_the_tested_policy_file_over_the_triton_service(tmp_path):
    data = _one("ConfigMap", "gateway-config")["data"]
    haproxy = DEPLOY.parent / "haproxy"
    # one policy: the file the tests run (tests/test_gateway.py, tests/test_multihost.py)
    assert data["gateway.cfg"] == (haproxy / "gateway.cfg").read_text()
    assert data["grpc_refuse.lua"] == (haproxy / "grpc_refuse.lua").read_text()
    triton = _one("Service", "triton")
    ports = {p["name"]: p["port"] for p in triton["spec"]["ports"]}
    templates = _server_templates(data["servers.cfg"])
    template = templates["tritons"]
    assert template[3] == f"triton.{NAMESPACE}.svc.cluster.local:{ports['grpc']}"
    assert template[template.index("port") + 1] == str(ports["http"])  # Triton's readiness
    assert "proto" in template and template[template.index("proto") + 1] == "h2"
    # every variable the policy reads is set, and the ports are the ones the Service names
    pod = _one("Deployment", "gateway")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert set(re.findall(r"\$\{(GATEWAY_\w+)\}", data["gateway.cfg"])) == set(env)
    service_ports = {p["name"]: p["port"] for p in _one("Service", "gateway")["spec"]["ports"]}
    assert env["GATEWAY_BIND"] == f":{service_ports['grpc']}"
    assert env["GATEWAY_STATS_BIND"] == f":{service_ports['stats']}"
    assert env["GATEWAY_HTTP_BIND"] == f":{service_ports['http']}"
    # HTTP/REST clients go to the pods' HTTP port
    assert templates["tritons_http"][3] == f"triton.{NAMESPACE}.svc.cluster.local:{ports['http']}"
    assert int(pod["metadata"]["annotations"]["prometheus.io/port"]) == service_ports["stats"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["GATEWAY_JWT_KEY"].startswith(mounts["issuer-key"] + "/")
    assert container["args"][-3:] == ["/etc/gateway/gateway.cfg", "-f", "/etc/gateway/servers.cfg"]
    assert mounts["config"] == "/etc/gateway"
    # and HAProxy itself accepts the mounted files (where it is installed)
    if shutil.which("haproxy") is None:
        return
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    key = tmp_path / "issuer.pem"
    subprocess.run(["openssl", "genrsa", "-out", str(tmp_path / "issuer.key"), "2048"], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(tmp_path / "issuer.key"), "-pubout", "-out",
                    str(key)], check=True, capture_output=True)
    check = subprocess.run(
        ["haproxy", "-c", "-f", str(tmp_path / "gateway.cfg"), "-f", str(tmp_path / "servers.cfg")],
        capture_output=True, text=True,
        env={**os.environ, **env, "GATEWAY_JWT_KEY": str(key)})  # -c binds nothing
    assert check.returncode == 0, check.stdout + check.stderr


def test_prometheus_scrapes_the_triton_metrics_port_with_the_release_label():
    template = _one("Deployment", "triton")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] == 8002
    assert template["metadata"]["labels"]["release"] == NAMESPACE
    monitor = _one("ServiceMonitor", "triton")["spec"]
    assert monitor["endpoints"][0]["port"] == "metrics"
    assert monitor["endpoints"][0]["relabelings"][0] == {"targetLabel": "release",
                                                          "replacement": NAMESPACE}


def test_keda_scales_the_triton_deployment_on_supersonics_queue_time_per_execution():
    spec = _one("ScaledObject", "triton")["spec"]
    target = spec["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "triton")
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert float(trigger["metadata"]["threshold"]) == DEFAULT_THRESHOLD_MS
    assert " ".join(trigger["metadata"]["query"].split()) == supersonic_query(NAMESPACE, "30s")
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]


def test_the_workers_endpoints_file_points_every_model_at_the_gateway(monkeypatch):
    from coffea_sonic.config import model_urls, setting
    from coffea_sonic.core.endpoint import parse_model_url

    for name in [n for n in __import__("os").environ if n.startswith("COFFEA_SONIC_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("COFFEA_SONIC_CONFIG", str(DEPLOY / "endpoints.toml"))
    gateway = _one("Service", "gateway")
    port = next(p["port"] for p in gateway["spec"]["ports"] if p["name"] == "grpc")
    for model in ("jet_tagger", "particlenet_lite", "emtrk_cnn"):
        (url,) = model_urls(model)
        assert parse_model_url(url).address == f"gateway.{NAMESPACE}.svc:{port}", url
    assert setting("token_env") == "SONIC_TOKEN"
    assert setting("transport") == "grpc"
