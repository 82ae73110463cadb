"""The KubeRay manifests in infra/kuberay/: rendered (base, dev, prod) and validated.

- Core kinds against the Kubernetes schemas bundled with kubernetes-validate (strict:
  unknown fields are errors), offline.
- KubeRay kinds against KubeRay v1.7's CRD schemas, read from $KUBERAY_CRD_DIR (default:
  <repo>/../shared/schemas/kuberay). Unknown fields are errors here too (the API server
  would silently prune them); CEL rules cannot be evaluated here, so a manifest that sets
  a field carrying one (other than immutability) fails rather than passing unchecked.
- What the schemas cannot say: one image, one config source, the two cluster specs
  kept identical, autoscaling bounds, a Serve config Ray accepts, no secret values.

Overlays are rendered by a small renderer below that supports exactly the kustomize
features these kustomizations use; where `kubectl` is installed, its `kubectl kustomize`
output must be identical.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from gravityocr.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
KUBERAY = REPO / "infra" / "kuberay"
TARGETS = ["base", "overlays/dev", "overlays/prod"]
KUBERNETES_VERSION = "1.31"
RAY_KINDS = {"RayCluster": "ray.io_rayclusters.yaml", "RayCronJob": "ray.io_raycronjobs.yaml",
             "RayService": "ray.io_rayservices.yaml", "RayJob": "ray.io_rayjobs.yaml"}


# ------------------------------------------------------------------ a small kustomize

def _load_docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _set_images(node, images: list[dict]) -> None:
    """kustomize's image transformer: every `image` of a container, anywhere."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    name = re.split(r"[:@]", container["image"], maxsplit=1)[0]
                    for image in images:
                        if image["name"] == name:
                            new = image.get("newName", name)
                            container["image"] = new + (f"@{image['digest']}" if "digest" in image
                                                        else f":{image['newTag']}" if "newTag" in image else "")
            else:
                _set_images(value, images)
    elif isinstance(node, list):
        for item in node:
            _set_images(item, images)


def _json_patch(doc: dict, ops: list[dict]) -> None:
    """RFC 6902 add / replace / remove, the operations our overlays use."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "add":
                node.insert(index, op["value"])
            elif op["op"] == "replace":
                node[index] = op["value"]
            elif op["op"] == "remove":
                del node[index]
            else:
                raise ValueError(f"unsupported op {op}")
        else:
            if op["op"] in ("replace", "remove") and last not in node:
                raise KeyError(f"{op['path']}: nothing to {op['op']}")
            if op["op"] in ("add", "replace"):
                node[last] = op["value"]
            elif op["op"] == "remove":
                del node[last]
            else:
                raise ValueError(f"unsupported op {op}")


def _matches(doc: dict, target: dict) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    return all([target.get("kind", doc["kind"]) == doc["kind"],
                target.get("name", doc["metadata"]["name"]) == doc["metadata"]["name"],
                target.get("group", group) == group, target.get("version", version) == version])


def _config_map(directory: Path, spec: dict) -> dict:
    data = {}
    for entry in spec.get("files", []):
        key, _, file = entry.rpartition("=") if "=" in entry else (Path(entry).name, "", entry)
        data[key] = (directory / file).read_text()
    for env_file in spec.get("envs", []):
        for line in (directory / env_file).read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                data[key.strip()] = value
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": spec["name"]}, "data": data}


SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "configMapGenerator",
             "generatorOptions", "patches"}


def render(directory: Path) -> list[dict]:
    """The documents `kubectl kustomize directory` prints, for the features used here."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED
    assert not unsupported, f"{directory}: the test's renderer does not support {unsupported}"
    assert kustomization.get("generatorOptions", {}).get("disableNameSuffixHash", True), \
        "hashed ConfigMap names are not rewritten inside custom resources' pod templates"
    docs: list[dict] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        docs.extend(render(path) if path.is_dir() else _load_docs(path))
    for spec in kustomization.get("configMapGenerator", []):
        generated = _config_map(directory, spec)
        assert spec.get("behavior", "create") == "create", "the test's renderer only creates ConfigMaps"
        docs.append(generated)
    for patch in kustomization.get("patches", []):
        ops = yaml.safe_load((directory / patch["path"]).read_text() if "path" in patch else patch["patch"])
        assert isinstance(ops, list), "only JSON 6902 patches (a list of operations) are supported here"
        hits = [d for d in docs if _matches(d, patch["target"])]
        assert hits, f"{directory}: patch {patch} matches nothing"
        for doc in hits:
            _json_patch(doc, ops)
    for label_set in kustomization.get("labels", []):
        assert not label_set.get("includeSelectors") and not label_set.get("includeTemplates")
        for doc in docs:
            doc["metadata"].setdefault("labels", {}).update(label_set["pairs"])
    if "images" in kustomization:
        _set_images(docs, kustomization["images"])
    if "namespace" in kustomization:
        for doc in docs:
            doc["metadata"]["namespace"] = kustomization["namespace"]
    return docs


@pytest.fixture(scope="module", params=TARGETS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(KUBERAY / request.param)


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


# ------------------------------------------------------------------ schemas

def crd_dir() -> Path:
    path = Path(os.environ.get("KUBERAY_CRD_DIR", REPO.parent / "shared" / "schemas" / "kuberay"))
    missing = [name for name in RAY_KINDS.values() if not (path / name).is_file()]
    if missing:
        pytest.fail(f"KubeRay CRD schemas not found: {', '.join(missing)} in {path}. Copies of KubeRay v1.7's "
                    "CRDs (ray-operator/config/crd/bases) belong there; set KUBERAY_CRD_DIR to their folder.")
    return path


def _strict(schema):
    """An OpenAPI v3 structural schema as JSON Schema: int-or-string made explicit, and
    unknown fields rejected (the API server would silently prune them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable"):
        out.pop("nullable")
        if "type" in out:
            out["type"] = [out["type"], "null"]
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _cel_rules(validator, rules, instance, schema):
    """CEL rules cannot be evaluated here: a manifest may only rely on immutability ones."""
    for rule in rules:
        if rule["rule"] != "self == oldSelf":
            yield jsonschema.ValidationError(f"sets a field with a CEL rule this test cannot check: {rule['rule']}")


CrdValidator = jsonschema.validators.extend(jsonschema.Draft7Validator, {"x-kubernetes-validations": _cel_rules})


@functools.lru_cache(maxsize=None)
def _crd_validator(kind: str, api_version: str):
    crd = yaml.load((crd_dir() / RAY_KINDS[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert version in versions and versions[version]["served"], f"{kind} {api_version} is not served by KubeRay"
    schema = _strict(versions[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is checked with the core schemas
    schema["properties"].pop("status", None)
    return CrdValidator(schema)


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_crd_dir_is_present():
    crd_dir()


def test_every_document_validates_against_its_schema(rendered):
    import kubernetes_validate

    target, docs = rendered
    assert docs
    for doc in docs:
        name = f"{target}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in RAY_KINDS:
            errors = _errors(_crd_validator(doc["kind"], doc["apiVersion"]), doc)
            assert not errors, f"{name} against KubeRay's CRD:\n" + "\n".join(errors)
            # ObjectMeta, through a core kind that has nothing else
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
                                         KUBERNETES_VERSION, strict=True)
        else:
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{name}: {'/'.join(map(str, error.path))}: {error.message}")


def test_pod_templates_validate_as_core_pod_templates(rendered):
    """The CRDs embed PodTemplateSpec; check each against Kubernetes' own schema too."""
    import kubernetes_validate

    target, docs = rendered
    for spec, where in _cluster_specs(docs):
        for group, template in _templates(spec):
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                          "metadata": {"name": f"{where}-{group}"}, "template": template},
                                         KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught():
    """The validation above is not vacuous: a typo'd field and a wrong type both fail."""
    cluster = copy.deepcopy(_by_kind(render(KUBERAY / "base"), "RayCluster")[0])
    validator = _crd_validator("RayCluster", cluster["apiVersion"])
    assert not _errors(validator, cluster)
    cluster["spec"]["workerGroupSpecs"][0]["maxReplica"] = 3
    cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    errors = "\n".join(_errors(validator, cluster))
    assert "maxReplica" in errors and "num-cpus" in errors


# ------------------------------------------------------------------ what schemas cannot say

def _cluster_specs(docs: list[dict]) -> list[tuple[dict, str]]:
    specs = []
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] == "RayCluster":
            specs.append((doc["spec"], name))
        elif doc["kind"] == "RayService":
            specs.append((doc["spec"]["rayClusterConfig"], name))
    return specs


def _templates(spec: dict):
    yield "head", spec["headGroupSpec"]["template"]
    for group in spec.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]


def _containers(spec: dict):
    for _, template in _templates(spec):
        yield from template["spec"]["containers"]


def test_two_clusters_and_the_nightly_job_share_one_image_and_one_config(rendered):
    target, docs = rendered
    assert sorted(d["kind"] for d in docs if d["kind"] in RAY_KINDS) == ["RayCluster", "RayService"]
    specs = _cluster_specs(docs)
    (cron,) = _by_kind(docs, "CronJob")
    submitters = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    images = {c["image"] for spec, _ in specs for c in _containers(spec)} | {c["image"] for c in submitters}
    assert len(images) == 1, f"{target}: more than one image: {images}"
    assert not next(iter(images)).startswith("gravityocr"), "the images transformer did not apply"
    assert {d["metadata"]["name"] for d in _by_kind(docs, "ConfigMap")} == {"gravityocr-env"}
    for spec, where in specs:
        for container in _containers(spec):
            refs = {e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e}
            assert refs == {"gravityocr-env"}, where


def test_the_two_clusters_are_one_cluster_spec(rendered):
    """Written out twice (kustomize cannot share a subtree), kept identical but for what is
    tuned per use: maximum sizes, idle timeouts, GPU workers kept up (the service's), the
    service's API token and the Secret of its Ray token (which the nightly submitter needs)."""
    target, docs = rendered
    specs = {name: spec for spec, name in _cluster_specs(docs)}
    cluster, service = specs["gravityocr"], specs["gravityocr-serve"]

    def shape(spec: dict, ignore_replicas: bool = False) -> dict:
        spec = copy.deepcopy(spec)
        for container in _containers(spec):
            container["envFrom"] = [e for e in container["envFrom"] if e != {"secretRef": {"name": "gravityocr-api"}}]
        spec["autoscalerOptions"].pop("idleTimeoutSeconds")
        spec["authOptions"].pop("secretName", None)
        for group in spec["workerGroupSpecs"]:
            group.pop("maxReplicas"), group.pop("idleTimeoutSeconds")  # tuned per use (overlays)
            if ignore_replicas and group["groupName"] == "gpu-workers":
                group.pop("replicas"), group.pop("minReplicas")
        return spec

    assert shape(service, ignore_replicas=True) == shape(cluster, ignore_replicas=True), \
        f"{target}: the service's cluster differs"


def test_autoscaling_is_on_with_sensible_bounds(rendered):
    import ray

    target, docs = rendered
    for spec, where in _cluster_specs(docs):
        assert spec["rayVersion"] == ray.__version__, f"{where}: rayVersion is not the installed Ray"
        assert spec["enableInTreeAutoscaling"] is True
        assert spec["autoscalerOptions"]["version"] == "v2"  # per-group idle timeouts need v2
        assert spec["authOptions"]["mode"] == "token"
        assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "no work on the head"
        groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
        assert set(groups) == {"cpu-workers", "gpu-workers"}
        for name, group in groups.items():
            assert 0 <= group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]
            assert group["maxReplicas"] >= 1 and 30 <= group["idleTimeoutSeconds"] <= 3600, f"{where}/{name}"
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert ("nvidia.com/gpu" in limits) == (name == "gpu-workers"), f"{where}/{name}"
            resources = json.loads(json.loads(group["rayStartParams"]["resources"]))
            assert set(resources) == {"cpu_worker" if name == "cpu-workers" else "engine_worker"}
        assert groups["cpu-workers"]["minReplicas"] == 0, f"{where}: CPU workers scale to zero"
        if where == "gravityocr":
            assert groups["gpu-workers"]["minReplicas"] == 0, "the always-on cluster holds no idle GPU"
        else:  # the service has a warm engine
            assert groups["gpu-workers"]["minReplicas"] >= 1, where


def test_nightly_job(rendered):
    """The nightly job is `gravityocr batch --serve-app` submitted to the RayService's cluster
    (its head Service), presenting that cluster's Ray token: the service's replicas read it."""
    target, docs = rendered
    (cron,) = _by_kind(docs, "CronJob")
    (service,) = _by_kind(docs, "RayService")
    fields = cron["spec"]["schedule"].split()
    assert len(fields) == 5, "a standard 5-field cron schedule"
    job = cron["spec"]["jobTemplate"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    words = container["command"]
    assert words[:3] == ["ray", "job", "submit"]
    assert f"--address=http://{service['metadata']['name']}-head-svc:8265" in words
    batch = words[words.index("--") + 1:]
    assert batch[:2] == ["gravityocr", "batch"]
    args = build_parser("batch").parse_args(batch[1:])  # the flags `gravityocr batch` has
    assert args.input.startswith("s3://") and args.output.startswith("s3://") and args.input != args.output
    assert args.resume, "nightly runs over a growing prefix skip what is done"
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert args.serve_app == app["name"], "read by the service's replicas"
    token = {e["name"]: e for e in container["env"]}["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
    assert token == service["spec"]["rayClusterConfig"]["authOptions"]["secretName"]
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and job["activeDeadlineSeconds"] > 0
    assert (cron["spec"].get("suspend") is True) == (target == "overlays/dev")


def test_serve_config_is_one_ray_and_the_app_accept(rendered):
    from ray.serve.schema import ServeDeploySchema

    from gravityocr.serve.app import OcrService
    from gravityocr.serve.settings import ServeSettings

    target, docs = rendered
    (service,) = _by_kind(docs, "RayService")
    config = ServeDeploySchema.model_validate(yaml.safe_load(service["spec"]["serveConfigV2"]))
    (app,) = config.applications
    assert app.import_path == "gravityocr.serve.app:app_builder"
    ServeSettings.from_args(app.args)  # raises on a setting the app does not have
    assert [d.name for d in app.deployments] == [OcrService.name]
    (gpu_group,) = [g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "gpu-workers"]
    for deployment in app.deployments:
        autoscaling = deployment.autoscaling_config
        assert autoscaling and 1 <= autoscaling["min_replicas"] <= autoscaling["max_replicas"], deployment.name
        assert autoscaling["min_replicas"] <= gpu_group["minReplicas"] and \
            autoscaling["max_replicas"] <= gpu_group["maxReplicas"], "one replica per GPU worker"
        assert deployment.ray_actor_options.num_gpus == 1
        assert set(deployment.ray_actor_options.resources or {}) == {"engine_worker"}
        assert_room_for_both_lanes(ServeSettings.from_args(app.args), deployment.max_ongoing_requests,
                                   autoscaling)


def assert_room_for_both_lanes(settings, max_ongoing_requests: int, autoscaling: dict) -> None:
    """A replica's Serve slots hold a full online load beside every page a batch job keeps in
    flight (serve/app.py `batch_pages_in_flight`), and the job's pages alone scale the deployment out."""
    job_pages = settings.batch_pages_per_replica * autoscaling["max_replicas"]
    assert max_ongoing_requests >= settings.max_concurrent_requests + job_pages
    assert autoscaling["target_ongoing_requests"] <= settings.batch_pages_per_replica


def test_the_local_serve_config_has_room_for_both_lanes():
    from gravityocr.serve.cli import DEFAULT_CONFIG, load_serve_config

    _, settings, options = load_serve_config(DEFAULT_CONFIG)
    assert_room_for_both_lanes(settings, options["max_ongoing_requests"], options["autoscaling_config"])


def test_no_secret_values(rendered):
    target, docs = rendered
    assert not _by_kind(docs, "Secret"), "Secrets are created out of band, never committed"
    text = yaml.safe_dump_all(docs)
    for spec, where in _cluster_specs(docs):
        for container in _containers(spec):
            for env in container.get("env", []):
                assert "value" not in env or not re.search(r"KEY|SECRET|TOKEN|PASSWORD", env["name"]), where
            secrets = {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
            assert secrets == ({"gravityocr-s3", "gravityocr-api"} if where == "gravityocr-serve"
                               else {"gravityocr-s3"}), where
    for config_map in _by_kind(docs, "ConfigMap"):
        assert not any(re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", key) for key in config_map["data"])
    assert "aws_secret_access_key" not in text.lower()
    readme = (REPO / "infra" / "README.md").read_text()
    assert "gravityocr-s3" in readme and "gravityocr-api" in readme, "the README says how to create the Secrets"


# ------------------------------------------------------------------ the renderer is kustomize

@pytest.mark.parametrize("target", TARGETS)
def test_renderer_matches_kubectl_kustomize(target):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the overlays were rendered by this test's own renderer only")
    out = subprocess.run([kubectl, "kustomize", str(KUBERAY / target)], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=lambda d: (d["kind"], d["metadata"]["name"]))
    ours = sorted(render(KUBERAY / target), key=lambda d: (d["kind"], d["metadata"]["name"]))
    assert ours == theirs


# ------------------------------------------------------------------ Prometheus scrape configs

def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package (apt-get install prometheus)")
    return promtool


def _check_config(path: Path) -> None:
    result = subprocess.run([_promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-local.yml"])
def test_prometheus_configs_are_valid(name):
    _check_config(REPO / "infra" / "prometheus" / name)


def test_kubernetes_scrape_config(tmp_path):
    """Debian's Prometheus is built without Kubernetes service discovery, so promtool checks
    the rest of the config with static targets in its place; the container port names it
    keeps must be the ones the manifests declare."""
    config = yaml.safe_load((REPO / "infra" / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (job,) = config["scrape_configs"]
    assert [sd["role"] for sd in job.pop("kubernetes_sd_configs")] == ["pod"]
    job["static_configs"] = [{"targets": ["127.0.0.1:8080"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    _check_config(tmp_path / "prometheus.yml")

    (keep_ports,) = [r for r in job["relabel_configs"]
                     if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]]
    kept = set(keep_ports["regex"].split("|"))
    declared = set()
    for spec, _ in _cluster_specs(render(KUBERAY / "base")):
        for container in _containers(spec):
            declared |= {p["name"] for p in container["ports"]}
    assert kept <= declared and {"metrics", "as-metrics", "dash-metrics"} <= kept
