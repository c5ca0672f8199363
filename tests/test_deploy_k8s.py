"""deploy/k8s/ as a cluster and the gateway would read it, offline (no cluster runs here).

Every document validates against the Kubernetes API schemas bundled by `kubernetes-validate` (strict: an unknown
field is an error), for the oldest and the newest Kubernetes minor it carries that the manifests support. The
ConfigMap's gateway.toml is loaded by the gateway's own loader with the Deployment's environment (secrets filled
from the Secret), so a setting name the gateway does not know fails as it would at start-up; the backend's
variables must name backend settings. The cross-references a schema cannot see are checked too: selectors match
their pods, probes and Services name real ports, the config file is where the Deployment mounts it, the upstream
and Redis URLs name the Services, and the kill deadline is above the drain. Each planted error fails.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from backend.config import BackendConfig
from backend.engine.config import EngineConfig
from gateway.config.settings import ConfigError, GatewayConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
VERSIONS = (
    "1.29.0",
    kubernetes_validate.latest_version(),
)  # PodDisruptionBudget policy/v1, HPA autoscaling/v2
Docs = list[dict[str, Any]]


def load() -> Docs:
    """Every document of the resources kustomization.yaml lists, in order."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: Docs = []
    for name in kustomization["resources"]:
        docs += [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]
    return docs


def find(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(docs: Docs, name: str) -> dict[str, Any]:
    (only,) = find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"]
    return only


def schema_problems(docs: Docs) -> list[str]:
    return [problem for doc in docs for version in VERSIONS for problem in _schema(json.dumps(doc), version)]


@functools.cache
def _schema(doc_json: str, version: str) -> tuple[str, ...]:
    """One document against one version's schemas (cached: the planted-error tests change one document)."""
    doc = json.loads(doc_json)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.path))
        return (f"{doc['kind']}/{doc['metadata']['name']} ({version}) {where}: {exc.message}",)
    return ()


def environment(docs: Docs, name: str) -> dict[str, str]:
    """The container's variables, as the pod would see them (secret references read from the Secret)."""
    env = {}
    for var in container(docs, name).get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = find(docs, "Secret", ref["name"])["stringData"][ref["key"]]
    return env


def gateway_config(docs: Docs, tmp: Path) -> GatewayConfig:
    """The gateway's config as the pod would load it: the mounted file named by `--config`, then its environment."""
    gateway = container(docs, "tokenedge-gateway")
    config_path = Path(gateway["args"][gateway["args"].index("--config") + 1])
    (mount,) = [m for m in gateway["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    spec = find(docs, "Deployment", "tokenedge-gateway")["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    data = find(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    (tmp / config_path.name).write_text(data[config_path.name])
    return load_config(tmp / config_path.name, environment(docs, "tokenedge-gateway"))


def backend_problems(docs: Docs) -> list[str]:
    known = {f.name for f in dataclasses.fields(BackendConfig)} | {
        f.name for f in dataclasses.fields(EngineConfig)
    }
    env = environment(docs, "tokenedge-backend")
    unknown = [n for n in env if not n.startswith("TOKENEDGE_BACKEND_") or n[18:].lower() not in known]
    if unknown:
        return [f"backend variables that name no backend setting: {unknown}"]
    config = BackendConfig.from_sources([], env)
    port = container(docs, "tokenedge-backend")["ports"][0]["containerPort"]
    return [] if config.port == port else [f"backend listens on {config.port}, its container port is {port}"]


def image_problems(docs: Docs) -> list[str]:
    """The Deployments run the images `make image` tags (deploy/images/build.py: localhost/<name>:<version>)."""
    version = metadata.version("tokenedge")
    return [
        f"{name} runs {image}, `make image` tags localhost/{name}:{version}"
        for name in ("tokenedge-gateway", "tokenedge-backend")
        if (image := container(docs, name)["image"]) != f"localhost/{name}:{version}"
    ]


def port_problems(docs: Docs, name: str) -> list[str]:
    """Selectors match the pod's labels; probes and the Service name the container's ports."""
    deployment, service = find(docs, "Deployment", name), find(docs, "Service", name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    problems = [
        f"{kind} {name} selects {sel} not on its pods"
        for kind, sel in (
            ("Deployment", deployment["spec"]["selector"]["matchLabels"]),
            ("Service", service["spec"]["selector"]),
        )
        if not sel.items() <= labels.items()
    ]
    ports = {p["name"] for p in container(docs, name)["ports"]}
    probes = [v for k, v in container(docs, name).items() if k.endswith("Probe")]
    named = [(p.get("httpGet") or p.get("tcpSocket") or {}).get("port") for p in probes]
    named += [p["targetPort"] for p in service["spec"]["ports"]]
    return problems + [f"{name}: port {p!r} is not a container port" for p in named if p and p not in ports]


def gateway_problems(docs: Docs, config: GatewayConfig) -> list[str]:
    problems = []
    gateway = container(docs, "tokenedge-gateway")
    if config.server.port != gateway["ports"][0]["containerPort"] or config.server.host != "0.0.0.0":
        problems.append(f"the gateway listens on {config.server.host}:{config.server.port}")
    probes = {k: (v.get("httpGet") or {}).get("path") for k, v in gateway.items() if k.endswith("Probe")}
    if probes.get("readinessProbe") != "/ready" or probes.get("livenessProbe") != "/health":
        problems.append(f"probes: {probes}")
    grace = find(docs, "Deployment", "tokenedge-gateway")["spec"]["template"]["spec"]
    if grace["terminationGracePeriodSeconds"] < config.server.drain_timeout_s + 5:
        problems.append("terminationGracePeriodSeconds leaves the drain no time to clean up")
    for url, service in (
        (config.upstream.targets[0].url, "tokenedge-backend"),
        (config.cache.redis_url, "tokenedge-redis"),
    ):
        parts = urlsplit(url)
        ports = [p["port"] for p in find(docs, "Service", service)["spec"]["ports"]]
        if parts.hostname != service or parts.port not in ports:
            problems.append(f"{url} does not name the Service {service} ({ports})")
    return problems


def problems(docs: Docs, tmp: Path) -> list[str]:
    found = schema_problems(docs) + backend_problems(docs) + image_problems(docs)
    for name in ("tokenedge-gateway", "tokenedge-backend", "tokenedge-redis"):
        found += port_problems(docs, name)
    try:
        config = gateway_config(docs, tmp)
    except ConfigError as exc:
        return [*found, f"gateway config: {exc}"]
    return found + gateway_problems(docs, config)


def test_the_manifests_validate_and_render_with_the_gateway_config(tmp_path: Path) -> None:
    docs = load()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Secret",
        "Service",
    ]
    assert problems(docs, tmp_path) == []
    config = gateway_config(docs, tmp_path)
    assert config.server.admin_token == "replace-me-admin-token"  # from the Secret, through the environment
    assert config.server.drain_grace_s > 0  # the Service's endpoints update while /ready says 503


def test_every_manifest_file_is_a_listed_resource() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} == listed


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    doc[last] = value


PLANTED = {
    # a wrong field (a typo of readinessProbe), a wrong type: the schemas
    "field": (
        "Deployment",
        "tokenedge-gateway",
        "spec.template.spec.containers.0.readinesProbe",
        {},
        "readinesProbe",
    ),
    "type": ("Deployment", "tokenedge-gateway", "spec.replicas", "3", "spec/replicas"),
    "hpa": (
        "HorizontalPodAutoscaler",
        "tokenedge-gateway",
        "spec.metrics.0.resource.target.averageUtilisation",
        70,
        "averageUtilisation",
    ),
    # settings the gateway does not know: in the file, in the environment
    "setting": (
        "ConfigMap",
        "tokenedge-gateway",
        "data.gateway.toml",
        "[server]\ndrain_timeout = 30.0\n",
        "drain_timeout",
    ),
    "env": (
        "Deployment",
        "tokenedge-gateway",
        "spec.template.spec.containers.0.env.0.name",
        "TOKENEDGE_SERVER_ADMIN_TOKN",
        "ADMIN_TOKN",
    ),
    "backend": (
        "Deployment",
        "tokenedge-backend",
        "spec.template.spec.containers.0.env.2.name",
        "TOKENEDGE_BACKEND_THREAD",
        "THREAD",
    ),
    # what no schema sees
    "selector": (
        "Service",
        "tokenedge-gateway",
        "spec.selector",
        {"app.kubernetes.io/name": "gateway"},
        "selects",
    ),
    "probe": (
        "Deployment",
        "tokenedge-gateway",
        "spec.template.spec.containers.0.readinessProbe.httpGet.port",
        "web",
        "'web'",
    ),
    "image": (
        "Deployment",
        "tokenedge-backend",
        "spec.template.spec.containers.0.image",
        "tokenedge-backend:latest",
        "make image",
    ),
    "grace": (
        "Deployment",
        "tokenedge-gateway",
        "spec.template.spec.terminationGracePeriodSeconds",
        30,
        "terminationGrace",
    ),
}


@pytest.mark.parametrize("plant", sorted(PLANTED))
def test_a_planted_error_fails(plant: str, tmp_path: Path) -> None:
    kind, name, path, value, named = PLANTED[plant]
    docs = copy.deepcopy(load())
    target = find(docs, kind, name)
    if kind == "ConfigMap":  # the whole file, keyed by a name with a dot in it
        target["data"]["gateway.toml"] = value
    else:
        _set(target, path, value)
    found = problems(docs, tmp_path)
    assert any(named in p for p in found), found
