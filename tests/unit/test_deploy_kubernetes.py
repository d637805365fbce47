"""deploy/kubernetes: the manifests are valid Kubernetes objects, consistent with each other, and
pass only settings and flags that metricvault has.

Kubernetes objects are validated offline by ``kubernetes-validate`` (strict: unknown fields are
errors) against the schemas of the newest Kubernetes version it ships; the ServiceMonitor, a
CRD it cannot know, against the part of the CRD's openAPIV3Schema vendored in
``tests/data/kubernetes/crd`` (its source is named there).
"""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # kubernetes-validate depends on it
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from click import Command
from typer.main import get_command
from typer.testing import CliRunner

from metricvault.cli.main import app
from metricvault.collect.cli import build_parser
from metricvault.config import ENV_PREFIX, Settings, setting_names
from metricvault.durations import parse_duration_ms
from metricvault.server.connections import uvicorn_options

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
CRD_SCHEMA = ROOT / "tests" / "data" / "kubernetes" / "crd" / "servicemonitor-v1.schema.yaml"
HELM_VALUES = "prometheus-remote-write.yaml"
NOT_RESOURCES = {HELM_VALUES, "kustomization.yaml"}
K8S_VERSION = kubernetes_validate.latest_version()
GATEWAY_URL = "http://metricvault-gateway.metricvault.svc:9201"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every Kubernetes object of deploy/kubernetes."""
    found = []
    for path in sorted((DEPLOY / "base").glob("*.yaml")):
        if path.name not in NOT_RESOURCES:
            found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in objects(kind) if doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_specs() -> list[dict[str, Any]]:
    return [
        doc["spec"]["template"]["spec"] for doc in [*objects("DaemonSet"), *objects("StatefulSet")]
    ]


def containers() -> list[dict[str, Any]]:
    return [c for spec in pod_specs() for c in spec["containers"]]


def validate_crd(doc: dict[str, Any]) -> None:
    schema = yaml.safe_load(CRD_SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


# -- valid objects ----------------------------------------------------------------------------


def test_the_deployment_has_every_part() -> None:
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for _, doc in manifests())
    assert kinds == [
        ("DaemonSet", "metricvault-agent"),
        ("Namespace", "metricvault"),
        ("NetworkPolicy", "metricvault-agent"),
        ("NetworkPolicy", "metricvault-gateway"),
        ("Secret", "metricvault-agent-token"),
        ("Secret", "metricvault-gateway-config"),
        ("Secret", "metricvault-prometheus-token"),
        ("Service", "metricvault-agent"),
        ("Service", "metricvault-gateway"),
        ("Service", "metricvault-gateway-headless"),
        ("ServiceMonitor", "metricvault-agent"),
        ("ServiceMonitor", "metricvault-gateway"),
        ("StatefulSet", "metricvault-gateway"),
    ]
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    assert listed == sorted({name for name, _ in manifests()}), "kustomize applies every file"
    top = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert top["resources"] == ["base"], "kubectl apply -k deploy/kubernetes applies the base"


@pytest.mark.parametrize(
    "name, doc",
    [(f"{n}:{d['kind']}/{d['metadata']['name']}", d) for n, d in manifests()],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_object_is_valid(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        validate_crd(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _misspelt_field(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["runtimeClasName"] = "nvidia"


def _wrong_type(doc: dict[str, Any]) -> None:
    doc["spec"]["replicas"] = "one"


def _named_service_port(doc: dict[str, Any]) -> None:
    doc["spec"]["ports"][0]["port"] = "http"  # port is a number; targetPort may be a name


@pytest.mark.parametrize(
    "kind, name, spoil, expected",
    [
        ("DaemonSet", "metricvault-agent", _misspelt_field, "runtimeClasName"),
        ("StatefulSet", "metricvault-gateway", _wrong_type, "one"),
        ("Service", "metricvault-gateway", _named_service_port, "http"),
    ],
)
def test_the_validator_refuses_a_spoilt_object(kind, name, spoil, expected) -> None:
    doc = copy.deepcopy(one(kind, name))
    spoil(doc)
    with pytest.raises(kubernetes_validate.ValidationError, match=expected):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_crd_schema_refuses_a_spoilt_servicemonitor() -> None:
    doc = copy.deepcopy(one("ServiceMonitor", "metricvault-agent"))
    doc["spec"]["endpoints"][0]["honourLabels"] = True  # misspelt
    with pytest.raises(jsonschema.ValidationError, match="honourLabels"):
        validate_crd(doc)
    doc = copy.deepcopy(one("ServiceMonitor", "metricvault-agent"))
    doc["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError, match="15 seconds"):
        validate_crd(doc)
    del doc["spec"]["selector"]
    with pytest.raises(jsonschema.ValidationError, match="selector"):
        validate_crd(doc)


# -- settings and flags exist -----------------------------------------------------------------


def _config_listing() -> set[str]:
    result = CliRunner().invoke(app, ["config"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return {line.split("\t", 1)[0] for line in result.output.splitlines()[1:] if line}


def test_every_environment_variable_is_a_setting_metricvault_reads() -> None:
    listed = _config_listing()
    assert listed == set(setting_names())
    env = {
        e["name"]: e["value"]
        for c in containers()
        for e in c.get("env", [])
        if e["name"].startswith(ENV_PREFIX)
    }
    assert env, "the manifests set settings through METRICVAULT_* variables"
    for name, value in env.items():
        setting = name.removeprefix(ENV_PREFIX).lower()
        assert setting in listed, f"{name} is no setting of `metricvault config`"
        loaded = getattr(Settings.load(env={name: value}), setting)  # refused if invalid
        assert str(loaded).lower() == value.lower(), f"{name}={value} read as {loaded!r}"


def _subcommands() -> dict[str, Command]:
    group = get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]  # a TyperGroup


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def test_every_flag_is_in_its_commands_help() -> None:
    assert check_flags(containers()) == {"agent", "serve", "maintain"}


def check_flags(checked_containers: list[dict[str, Any]]) -> set[str]:
    """Each container runs ``metricvault SUB`` with flags its ``--help`` names; the SUBs."""
    commands = _subcommands()
    checked = set()
    for container in checked_containers:
        assert container["command"] == ["metricvault"]
        sub, *args = container["args"]
        if sub == "agent":
            help_text = build_parser().format_help()
            build_parser().parse_args(args)  # and the agent's parser takes them as given
        else:
            result = CliRunner().invoke(
                app, [sub, "--help"], catch_exceptions=False, terminal_width=200
            )
            assert result.exit_code == 0
            help_text = result.output
            options = {o for p in commands[sub].params for o in p.opts}
            assert set(_flags(args)) <= options, f"metricvault {sub}: {set(_flags(args)) - options}"
        for flag in _flags(args):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), f"{sub} {flag}"
        checked.add(sub)
    return checked


# -- the parts fit together -------------------------------------------------------------------


def _secret(name: str) -> dict[str, str]:
    return one("Secret", name)["stringData"]


def test_each_token_digest_is_the_digest_of_its_token(tmp_path: Path) -> None:
    toml_text = _secret("metricvault-gateway-config")["metricvault.toml"]
    digests = {t["sha256"] for t in tomllib.loads(toml_text)["auth_bearer_tokens"]}
    tokens = [
        _secret(n)["token"] for n in ("metricvault-agent-token", "metricvault-prometheus-token")
    ]
    assert digests == {hashlib.sha256(t.encode()).hexdigest() for t in tokens}
    config = tmp_path / "metricvault.toml"
    config.write_text(toml_text)
    settings = Settings.load(config_file=config, env={})
    assert len(settings.auth_bearer_tokens) == 2, "metricvault reads the gateway's config"


def test_the_agent_daemonset_is_set_up_for_pod_attribution() -> None:
    spec = one("DaemonSet", "metricvault-agent")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia" and spec["hostPID"] is True
    agent = spec["containers"][0]
    args = build_parser().parse_args(agent["args"][1:])
    assert args.kubernetes == "auto"
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    socket_dir = str(args.pod_resources_socket.parent)
    [mount] = [m for m in mounts.values() if m["mountPath"] == socket_dir]
    assert mount.get("readOnly") is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    token_dir = str(args.push_bearer_token_file.parent)
    [token_mount] = [m for m in mounts.values() if m["mountPath"] == token_dir]
    secret = volumes[token_mount["name"]]["secret"]["secretName"]
    assert args.push_bearer_token_file.name in _secret(secret)
    assert args.push == GATEWAY_URL
    assert str(args.state_dir) in {m["mountPath"] for m in mounts.values()}
    limits, requests = agent["resources"]["limits"], agent["resources"]["requests"]
    assert requests["memory"] == "80Mi" and limits["memory"] == "160Mi"  # docs/kubernetes.md


def test_the_gateway_statefulset_keeps_its_vault_on_the_claim() -> None:
    sts = one("StatefulSet", "metricvault-gateway")["spec"]
    headless = one("Service", sts["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    [claim] = sts["volumeClaimTemplates"]
    pod = sts["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    for name in ("gateway", "maintain"):
        args = by_name[name]["args"]
        data = args[args.index("--data") + 1]
        mounts = [
            m for m in by_name[name]["volumeMounts"] if m["name"] == claim["metadata"]["name"]
        ]
        assert len(mounts) == 1 and data.startswith(mounts[0]["mountPath"] + "/")
        config = args[args.index("--config") + 1]
        assert any(config.startswith(m["mountPath"] + "/") for m in by_name[name]["volumeMounts"])
    assert by_name["maintain"]["args"][:2] == ["maintain", "--loop"]
    env = {e["name"]: e["value"] for e in by_name["gateway"]["env"]}
    assert env["METRICVAULT_GATEWAY_MAINTAIN"] == "false", "one maintainer: the maintain container"
    # a Service's selector selects its pods, and its target port is a named container port
    labels = sts["template"]["metadata"]["labels"]
    ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    for service in objects("Service"):
        selected = service["spec"]["selector"].items() <= labels.items()
        if service["metadata"]["name"].startswith("metricvault-gateway"):
            assert selected and {p["targetPort"] for p in service["spec"]["ports"]} <= ports


def test_servicemonitors_select_services_and_their_ports() -> None:
    for monitor in objects("ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"]
        services = [
            s for s in objects("Service") if wanted.items() <= s["metadata"]["labels"].items()
        ]
        assert services, monitor["metadata"]["name"]
        ports = {p["name"] for s in services for p in s["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    agent = one("ServiceMonitor", "metricvault-agent")["spec"]["endpoints"][0]
    assert agent["honorLabels"] is True, "the agent's pod labels must win over the target's"


def test_the_remote_write_snippet_points_at_the_gateway_with_its_token() -> None:
    values = yaml.safe_load((DEPLOY / HELM_VALUES).read_text())
    [remote] = values["prometheus"]["prometheusSpec"]["remoteWrite"]
    assert remote["url"] == GATEWAY_URL + "/api/v1/write"
    credentials = remote["authorization"]["credentials"]
    secret = one("Secret", credentials["name"])
    assert (
        secret["metadata"]["namespace"] == "monitoring"
        and credentials["key"] in secret["stringData"]
    )
    drop = remote["writeRelabelConfigs"][0]
    assert drop == {"sourceLabels": ["job"], "regex": "metricvault-agent", "action": "drop"}
    assert drop["regex"] == one("Service", "metricvault-agent")["metadata"]["name"], (
        "the agent job's name is its Service's (the ServiceMonitor's default job label)"
    )
    # each field is one of the Prometheus CRD's RemoteWriteSpec (a structural check)
    assert set(remote) <= {"url", "authorization", "writeRelabelConfigs", "queueConfig"}
    assert set(remote["queueConfig"]) <= {
        "maxSamplesPerSend",
        "batchSendDeadline",
        "capacity",
        "maxShards",
    }


def test_the_prometheus_pair_carries_the_labels_the_gateway_deduplicates_by() -> None:
    """kube-prometheus-stack runs ``replicas`` Prometheus pods; the operator sets each one's
    pod name as external label ``replicaExternalLabelName`` (default ``prometheus_replica``):
    it must be the gateway's ha_replica_label, and externalLabels must hold ha_cluster_label."""
    spec = yaml.safe_load((DEPLOY / HELM_VALUES).read_text())["prometheus"]["prometheusSpec"]
    defaults = Settings()
    assert spec["replicas"] >= 2
    assert spec["replicaExternalLabelName"] == defaults.ha_replica_label
    assert spec["externalLabels"][defaults.ha_cluster_label]
    assert defaults.ha_replica_label not in spec["externalLabels"]  # the operator sets it
    # each field is one of the Prometheus CRD's PrometheusSpec (a structural check)
    assert set(spec) <= {"replicas", "replicaExternalLabelName", "externalLabels", "remoteWrite"}
    gateway_env = {env["name"] for c in containers() for env in c.get("env", []) if "name" in env}
    for name in ("ha_replica_label", "ha_cluster_label"):  # the defaults are what is deployed
        assert f"METRICVAULT_{name.upper()}" not in gateway_env


def test_network_policies_let_the_agents_and_prometheus_in() -> None:
    gateway = one("NetworkPolicy", "metricvault-gateway")["spec"]
    agent_labels = one("DaemonSet", "metricvault-agent")["spec"]["template"]["metadata"]["labels"]
    sources = gateway["ingress"][0]["from"]
    assert any(
        s.get("podSelector", {}).get("matchLabels", {}).items() <= agent_labels.items()
        and "namespaceSelector" not in s
        for s in sources
    )
    assert gateway["ingress"][0]["ports"] == [{"port": 9201, "protocol": "TCP"}]
    assert one("NetworkPolicy", "metricvault-agent")["spec"]["ingress"][0]["ports"] == [
        {"port": 9400, "protocol": "TCP"}
    ]


# --------------------------------------------------------------------------- the Dockerfile
DOCKERFILE = ROOT / "Dockerfile"
DOCKER_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER",
}  # fmt: skip


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) of a Dockerfile: comments and blank lines dropped, a
    trailing backslash continues the instruction on the next line (Docker's own rules for
    the default escape character)."""
    out: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction is dropped
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        pending = ""
        out.append((start, word.upper(), " ".join(args.split())))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def stages(instructions: list[tuple[int, str, str]]) -> list[list[tuple[int, str, str]]]:
    found: list[list[tuple[int, str, str]]] = []
    for item in instructions:
        if item[1] == "FROM":
            found.append([])
        if found:
            found[-1].append(item)
    return found


def copy_sources(args: str) -> tuple[dict[str, str], list[str]]:
    """A COPY's --flags and its sources (every word but the last, the destination)."""
    words = args.split()
    flags = dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    assert len(paths) >= 2, f"COPY {args}: needs a source and a destination"
    return flags, paths[:-1]


def test_the_dockerfile_parses_into_known_instructions_of_several_stages() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    unknown = [(n, word) for n, word, _ in instructions if word not in DOCKER_INSTRUCTIONS]
    assert not unknown
    assert instructions[0][1] in ("ARG", "FROM")
    built = stages(instructions)
    assert len(built) >= 2, "multi-stage: build tools stay out of the image"
    names = [stage[0][2].split()[-1] for stage in built if " AS " in stage[0][2].upper()]
    assert len(names) == len(built) and len(set(names)) == len(names)


def test_every_path_the_dockerfile_copies_exists() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    earlier: list[str] = []
    for stage in stages(instructions):
        for line, word, args in stage:
            if word == "ADD":
                pytest.fail(f"Dockerfile:{line}: use COPY (ADD also fetches URLs and unpacks)")
            if word != "COPY":
                continue
            flags, sources = copy_sources(args)
            if "from" in flags:
                assert flags["from"] in earlier, f"Dockerfile:{line}: no earlier stage"
                continue
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile:{line}: {source} is missing"
                assert not source.startswith(("/", "..")), "outside the build context"
        earlier.append(stage[0][2].split()[-1])


def test_the_image_runs_as_the_manifests_user_and_serves_both_commands() -> None:
    final = stages(dockerfile_instructions(DOCKERFILE.read_text()))[-1]
    users = [args for _, word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the image must not be root"
    gateway = one("StatefulSet", "metricvault-gateway")["spec"]["template"]["spec"]
    assert (
        users[-1]
        == f"{gateway['securityContext']['runAsUser']}:{gateway['securityContext']['runAsGroup']}"
    )
    entry = [json_args for _, word, json_args in final if word == "ENTRYPOINT"]
    assert entry and yaml.safe_load(entry[-1]) == ["metricvault"]
    installs = " ".join(args for _, word, args in final if word == "RUN")
    assert "metricvault[kubernetes]" in installs  # the agent's pod-resources client
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for pod in pod_specs():
        for container in pod["containers"]:
            assert container["image"] == f"metricvault:{version}"
            assert container["command"] == ["metricvault"]


def test_the_dockerfile_reader_follows_continuations_and_comments() -> None:
    text = "# c\nARG X=1\n\nFROM a AS b\nRUN one \\\n    # dropped\n    two\ncopy --from=b /w /w\n"
    assert dockerfile_instructions(text) == [
        (2, "ARG", "X=1"),
        (4, "FROM", "a AS b"),
        (5, "RUN", "one two"),
        (8, "COPY", "--from=b /w /w"),
    ]
    assert copy_sources("--from=b --chown=1:1 /w /x /dst") == (
        {"from": "b", "chown": "1:1"},
        ["/w", "/x"],
    )


# ------------------------------------------------ deploy/kubernetes/scale-out (an overlay)
# Many gateways and maintainers on one s3:// vault. Kustomize is not a Python package, so
# ``kustomize_build`` does what the overlay asks of it (resources: files or directories with
# a kustomization.yaml; patches that delete an object) and refuses anything else, and
# ``kubectl kustomize``, where it is installed, must build the same objects.
SCALE_OUT = DEPLOY / "scale-out"
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "resources", "patches"}


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def kustomize_build(directory: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file relative to deploy/, object) for what ``kubectl kustomize directory`` emits."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_FIELDS
    assert not unknown, f"{directory.name}/kustomization.yaml: {unknown} (not emulated here)"
    found: list[tuple[str, dict[str, Any]]] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        assert path.exists(), f"{directory.name}/kustomization.yaml: {entry} does not exist"
        if path.is_dir():
            found += kustomize_build(path)
        else:
            name = str(path.relative_to(ROOT / "deploy"))
            found += [(name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        target = yaml.safe_load(patch["patch"])
        assert target.pop("$patch") == "delete", "only deleting patches are emulated"
        matches = [i for i, (_, doc) in enumerate(found) if _key(doc) == _key(target)]
        assert len(matches) == 1, f"the patch deleting {_key(target)} matches {len(matches)}"
        del found[matches[0]]
    keys = [_key(doc) for _, doc in found]
    assert len(set(keys)) == len(keys), "kustomize refuses two objects with one name"
    return found


def scale_out() -> list[dict[str, Any]]:
    return [doc for _, doc in kustomize_build(SCALE_OUT)]


def scale_out_one(kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in scale_out() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def scale_out_pods() -> dict[str, dict[str, Any]]:
    """Deployment name -> its pod template."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in scale_out()
        if d["kind"] == "Deployment"
    }


def _own_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(n, d) for n, d in kustomize_build(SCALE_OUT) if n.startswith("kubernetes/scale-out/")]


def test_the_scale_out_overlay_swaps_the_statefulset_for_deployments() -> None:
    built = sorted((d["kind"], d["metadata"]["name"]) for d in scale_out())
    base = sorted((d["kind"], d["metadata"]["name"]) for _, d in manifests())
    replaced = {("StatefulSet", "metricvault-gateway"), ("Service", "metricvault-gateway-headless")}
    added = {
        ("Deployment", "metricvault-gateway"),
        ("Deployment", "metricvault-maintainer"),
        ("PodDisruptionBudget", "metricvault-gateway"),
        ("PodDisruptionBudget", "metricvault-maintainer"),
        ("Secret", "metricvault-s3"),
    }
    assert built == sorted((set(base) - replaced) | added)
    assert replaced <= set(base), "the base keeps its StatefulSet for local disks"
    own = {p.name for p in SCALE_OUT.glob("*.yaml")} - {"kustomization.yaml"}
    listed = yaml.safe_load((SCALE_OUT / "kustomization.yaml").read_text())["resources"]
    assert sorted(own) == sorted(r for r in listed if not r.startswith("..")), "every file"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_builds_what_the_tests_check() -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(SCALE_OUT)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert sorted(map(_key, built)) == sorted(map(_key, scale_out()))
    by_key = {_key(d): d for d in scale_out()}
    for doc in built:
        assert doc == by_key[_key(doc)], f"{_key(doc)} differs from its file"


@pytest.mark.parametrize(
    "name, doc",
    [(f"{n}:{d['kind']}/{d['metadata']['name']}", d) for n, d in _own_objects()],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_scale_out_object_is_valid(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_scale_out_variable_is_a_setting_and_its_secret_has_the_key() -> None:
    listed = _config_listing()
    secrets = {d["metadata"]["name"]: d["stringData"] for d in scale_out() if d["kind"] == "Secret"}
    checked = 0
    for pod in scale_out_pods().values():
        for container in pod["spec"]["containers"]:
            for env in container.get("env", []):
                name = env["name"]
                setting = name.removeprefix(ENV_PREFIX).lower()
                assert name.startswith(ENV_PREFIX) and setting in listed, f"{name}: no setting"
                if "valueFrom" in env:
                    ref = env["valueFrom"]["secretKeyRef"]
                    value = secrets[ref["name"]][ref["key"]]  # the Secret holds the key
                else:
                    value = env["value"]
                loaded = getattr(Settings.load(env={name: value}), setting)  # refused if bad
                assert str(loaded).lower() == value.lower(), f"{name}={value} read as {loaded!r}"
                checked += 1
    assert checked >= 10


def test_every_scale_out_flag_is_in_its_commands_help() -> None:
    pods = scale_out_pods().values()
    assert check_flags([c for p in pods for c in p["spec"]["containers"]]) == {"serve", "maintain"}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _arg(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    return str(args[args.index(flag) + 1])


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * units.get(unit or "", 1)


def test_the_gateways_write_one_s3_vault_each_with_its_own_buffer() -> None:
    deployment = scale_out_one("Deployment", "metricvault-gateway")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    [gateway] = pod["containers"]
    assert gateway["args"][0] == "serve" and _arg(gateway, "--data").startswith("s3://")
    env = _env(gateway)
    assert env["METRICVAULT_GATEWAY_MAINTAIN"] == "false", "the maintainers maintain"
    volumes = {v["name"]: v for v in pod["volumes"]}
    [state] = [m for m in gateway["volumeMounts"] if m["mountPath"] == env["METRICVAULT_STATE_DIR"]]
    size_limit = _bytes(volumes[state["name"]]["emptyDir"]["sizeLimit"])
    # backpressure (503) long before the kubelet evicts the pod, without grace, over sizeLimit
    assert int(env["METRICVAULT_BUFFER_MAX_BYTES"]) * 2 <= size_limit
    assert _bytes(gateway["resources"]["requests"]["ephemeral-storage"]) >= size_limit
    # SIGTERM: the preStop pause, uvicorn's drain, then the flush must fit in the grace period
    drain_s = uvicorn_options(Settings())["timeout_graceful_shutdown"]
    pause_s = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pause_s + drain_s + 60
    for name in (
        "METRICVAULT_S3_ENDPOINT",
        "METRICVAULT_S3_ACCESS_KEY",
        "METRICVAULT_S3_SECRET_KEY",
    ):
        [ref] = [e["valueFrom"] for e in gateway["env"] if e["name"] == name]
        assert ref["secretKeyRef"]["name"] == "metricvault-s3"


def test_the_maintainers_run_the_loop_with_claims_on_the_gateways_vault() -> None:
    deployment = scale_out_one("Deployment", "metricvault-maintainer")
    assert deployment["spec"]["replicas"] == 2, "two, so that claims decide who does a day"
    [maintain] = deployment["spec"]["template"]["spec"]["containers"]
    [gateway] = scale_out_pods()["metricvault-gateway"]["spec"]["containers"]
    assert maintain["args"][:2] == ["maintain", "--loop"]
    assert _arg(maintain, "--data") == _arg(gateway, "--data")
    env = _env(maintain)
    ttl = Settings.load(
        env={"METRICVAULT_MAINTAIN_CLAIM_TTL": env["METRICVAULT_MAINTAIN_CLAIM_TTL"]}
    )
    interval = Settings.load(
        env={"METRICVAULT_MAINTAIN_INTERVAL": env["METRICVAULT_MAINTAIN_INTERVAL"]}
    )
    assert parse_duration_ms(ttl.maintain_claim_ttl) > parse_duration_ms(interval.maintain_interval)


def test_the_service_and_budgets_select_the_right_pods() -> None:
    pods = {name: t["metadata"]["labels"] for name, t in scale_out_pods().items()}
    service = scale_out_one("Service", "metricvault-gateway")["spec"]
    selects = {n for n, labels in pods.items() if service["selector"].items() <= labels.items()}
    assert selects == {"metricvault-gateway"}, "the Service sends writes to gateways only"
    [gateway] = scale_out_pods()["metricvault-gateway"]["spec"]["containers"]
    assert {p["targetPort"] for p in service["ports"]} <= {p["name"] for p in gateway["ports"]}
    listen_port = _arg(gateway, "--listen").rpartition(":")[2]
    assert [p["containerPort"] for p in gateway["ports"]] == [int(listen_port)]
    for name in ("metricvault-gateway", "metricvault-maintainer"):
        budget = scale_out_one("PodDisruptionBudget", name)["spec"]
        wanted = budget["selector"]["matchLabels"].items()
        assert {n for n, labels in pods.items() if wanted <= labels.items()} == {name}
        replicas = scale_out_one("Deployment", name)["spec"]["replicas"]
        assert 0 < budget["maxUnavailable"] < replicas
    policy = scale_out_one("NetworkPolicy", "metricvault-gateway")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pods["metricvault-gateway"].items()


def test_the_ha_pair_values_reach_the_scale_out_gateways_unchanged() -> None:
    """Prometheus's Helm values (the HA pair's labels) name the Service, which the overlay
    keeps; the election is shared through the vault, so each replica may reach any gateway."""
    values = yaml.safe_load((DEPLOY / HELM_VALUES).read_text())["prometheus"]["prometheusSpec"]
    [remote] = values["remoteWrite"]
    service = scale_out_one("Service", "metricvault-gateway")
    port = service["spec"]["ports"][0]["port"]
    namespace = service["metadata"]["namespace"]
    assert remote["url"] == f"http://metricvault-gateway.{namespace}.svc:{port}/api/v1/write"
    defaults = Settings()
    assert values["replicaExternalLabelName"] == defaults.ha_replica_label
    for template in scale_out_pods().values():
        for container in template["spec"]["containers"]:
            assert not {"METRICVAULT_HA_REPLICA_LABEL", "METRICVAULT_HA_CLUSTER_LABEL"} & set(
                _env(container)
            ), "the defaults the Helm values rely on"
    tokens = scale_out_one("Secret", remote["authorization"]["credentials"]["name"])
    assert tokens["metadata"]["namespace"] == "monitoring"


def test_the_scale_out_images_are_the_projects() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    base_user = one("StatefulSet", "metricvault-gateway")["spec"]["template"]["spec"]
    for template in scale_out_pods().values():
        spec = template["spec"]
        assert spec["securityContext"]["runAsUser"] == base_user["securityContext"]["runAsUser"]
        for container in spec["containers"]:
            assert container["image"] == f"metricvault:{version}"
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            written = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
            assert _env(container)["METRICVAULT_STATE_DIR"] in written, "state on a volume"
