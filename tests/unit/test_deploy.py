"""Deployment files are valid and start the same entry points as the README's commands."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from services.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


def test_compose_services_run_triad_entry_points():
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    assert set(services) == {f"{s}{suffix}" for s in COMMANDS if s != "up" for suffix in ("", "-cuda")}
    for name, service in services.items():
        command = service["command"]
        assert name.removesuffix("-cuda") == command[0] and command[0] in COMMANDS
        assert "runs:/runs" in service["volumes"], name  # the one shared volume
        assert service["profiles"] == (["cuda"] if name.endswith("-cuda") else ["cpu"])
        if command[0] == "trainer":
            assert service["entrypoint"][:3] == ["python", "-m", "torch.distributed.run"]
            assert service["entrypoint"][-2:] == ["-m", "services.cli"]
    for name in ("inference", "orchestrator"):
        env = services[name]["environment"]
        assert env["TRIAD_INFERENCE__ADMIN_TOKEN_FILE"] == "/run/secrets/admin_token"
    cuda_gpus = [
        services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for n in ("inference-cuda", "trainer-cuda")
    ]
    assert cuda_gpus == [["0"], ["1"]]  # inference and trainer never share a GPU


def test_compose_file_validates_with_docker_compose():
    cmd = compose_command()
    if cmd is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    r = subprocess.run(
        [*cmd, "-f", str(REPO / "compose.yaml"), "config", "-q"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy").glob("Dockerfile*")), ids=lambda p: p.name)
def test_dockerfiles_copy_every_package(dockerfile):
    text = dockerfile.read_text()
    for package in ("shared", "inference", "orchestrator", "trainer", "services"):
        assert f"COPY {package} ./{package}" in text
    assert 'ENTRYPOINT ["triad"]' in text


KINDS = {
    "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    "ConfigMap": "V1ConfigMap",
    "Secret": "V1Secret",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "Job": "V1Job",
}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object, "datetime": str}


def check_against_schema(data, type_name: str, where: str) -> None:
    """Walk a manifest against the Kubernetes API models: unknown fields and wrong types fail."""
    import kubernetes.client.models as models

    if type_name.startswith("List["):
        assert isinstance(data, list), where
        for i, item in enumerate(data):
            check_against_schema(item, type_name[5:-1], f"{where}[{i}]")
        return
    if type_name.startswith("Dict["):
        assert isinstance(data, dict), where
        return
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]), f"{where}: expected {type_name}, got {data!r}"
        return
    model = getattr(models, type_name)
    assert isinstance(data, dict), f"{where}: expected an object"
    fields = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, value in data.items():
        assert key in fields, f"{where}: unknown field {key!r} for {type_name}"
        check_against_schema(value, model.openapi_types[fields[key]], f"{where}.{key}")


def k8s_docs() -> list[dict]:
    return list(yaml.safe_load_all((REPO / "deploy" / "k8s" / "triad.yaml").read_text()))


def test_kubernetes_manifests_match_the_api_schema():
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient

    client = ApiClient()
    for doc in k8s_docs():
        type_name = KINDS[doc["kind"]]
        check_against_schema(doc, type_name, f"{doc['kind']}/{doc['metadata']['name']}")
        client._ApiClient__deserialize(doc, type_name)  # the client's own required-field checks


def test_kubernetes_layout_uses_triad_entry_points_and_one_shared_volume():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_docs()}
    assert docs[("PersistentVolumeClaim", "triad-runs")]["spec"]["accessModes"] == ["ReadWriteMany"]
    for kind, name, service in [
        ("Deployment", "triad-inference", "inference"),
        ("Deployment", "triad-orchestrator", "orchestrator"),
        ("Job", "triad-trainer", "trainer"),
    ]:
        pod = docs[(kind, name)]["spec"]["template"]["spec"]
        command = pod["containers"][0]["command"]
        assert command[:2] == ["triad", service] or command[-4:-2] == ["services.cli", service]
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims == ["triad-runs"]
    job = docs[("Job", "triad-trainer")]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"]
    command = job["template"]["spec"]["containers"][0]["command"]
    assert f"--nnodes={job['completions']}" in command
    assert "--rdzv-endpoint=triad-trainer-0.triad-trainer:29500" in command


def test_slurm_template_runs_the_trainer_entry_point():
    text = (REPO / "deploy" / "slurm" / "trainer.sbatch").read_text()
    assert "-m services.cli trainer" in text and "--rdzv-backend=c10d" in text
    r = subprocess.run(["bash", "-n", str(REPO / "deploy" / "slurm" / "trainer.sbatch")])
    assert r.returncode == 0


def test_s3_compose_shares_no_volume_and_points_every_service_at_the_bucket():
    services = yaml.safe_load((REPO / "deploy" / "compose" / "compose.s3.yaml").read_text())["services"]
    for name in ("inference", "orchestrator", "trainer"):
        service = services[name]
        assert "volumes" not in service, name
        env = service["environment"]
        assert env["TRIAD_RUN_DIR"].startswith("s3://") and env["AWS_ENDPOINT_URL"] == "http://s3:9000", name
        command = service["command"]
        assert command[0] == name and name in COMMANDS
    assert services["orchestrator"]["depends_on"]["inference"] == {"condition": "service_healthy"}
    assert services["trainer"]["depends_on"]["bucket"] == {"condition": "service_completed_successfully"}
    assert services["bucket"]["depends_on"] == {"s3": {"condition": "service_healthy"}}
    assert services["s3"]["healthcheck"]["test"][0] == "CMD-SHELL"  # podman 4.3 splits CMD at spaces


def test_s3_server_image_defaults_to_the_pinned_moto_and_builds_from_the_triad_image():
    from tests.containers import MOTO_DOCKERFILE, moto_version

    version = moto_version()
    s3 = yaml.safe_load((REPO / "deploy" / "compose" / "compose.s3.yaml").read_text())["services"]["s3"]
    assert s3["image"] == f"${{TRIAD_S3_IMAGE:-motoserver/moto:{version}}}"  # what a user pulls
    lines = MOTO_DOCKERFILE.read_text().splitlines()
    assert lines.index("ARG BASE=triad:cpu") < lines.index("FROM ${BASE}")
    assert f"ARG MOTO_VERSION={version}" in lines
    for pip_var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        assert f"ARG {pip_var}" in lines, pip_var
    assert 'ENTRYPOINT ["moto_server", "-H", "0.0.0.0"]' in lines  # as motoserver/moto's image


def test_s3_kubernetes_manifests_have_no_shared_volume():
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient

    from shared.config import TriadConfig

    docs = list(yaml.safe_load_all((REPO / "deploy" / "k8s" / "triad-s3.yaml").read_text()))
    for doc in docs:
        check_against_schema(doc, KINDS[doc["kind"]], f"{doc['kind']}/{doc['metadata']['name']}")
        ApiClient()._ApiClient__deserialize(doc, KINDS[doc["kind"]])
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.toml"]
    cfg = TriadConfig.model_validate(tomllib.loads(config))
    assert cfg.run_dir.startswith("s3://") and str(cfg.store.cache_dir) == "/cache"
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert len(pods) == 3
    for pod in pods:
        assert all("persistentVolumeClaim" not in v for v in pod["volumes"])
        container = pod["containers"][0]
        assert {"secretRef": {"name": "triad-s3"}} in container["envFrom"]
        assert {"name": "cache", "mountPath": "/cache"} in container["volumeMounts"]


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy").glob("Dockerfile*")), ids=lambda p: p.name)
def test_dockerfiles_take_the_base_image_and_pip_sources_as_build_args(dockerfile):
    lines = dockerfile.read_text().splitlines()
    base = next(line for line in lines if line.startswith("ARG BASE="))
    assert lines.index(base) < lines.index("FROM ${BASE}")  # a default a user can pull
    for pip_var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        assert any(line.split("=")[0] == f"ARG {pip_var}" for line in lines), pip_var
    dependencies = next(i for i, line in enumerate(lines) if 'pip install ".[' in line)
    copied_before = [line for line in lines[:dependencies] if line.startswith("COPY")]
    assert copied_before == ["COPY pyproject.toml ./"]  # a code or docs change keeps the cached layer


def test_local_pip_sources_become_build_args_and_read_only_mounts():
    from tests.containers import PIP_CERT_IN_BUILD, build_args_for_local_pip

    flags = build_args_for_local_pip(
        {
            "find-links": "/opt/wheels",
            "extra-index-url": "file:///opt/pypi/simple https://mirror.example/simple",
            "cert": "/etc/ssl/ca.pem",
        }
    )
    assert flags == [
        "--build-arg=PIP_FIND_LINKS=/opt/wheels",
        "--build-arg=PIP_EXTRA_INDEX_URL=file:///opt/pypi/simple https://mirror.example/simple",
        f"--build-arg=PIP_CERT={PIP_CERT_IN_BUILD}",
        f"--volume=/etc/ssl/ca.pem:{PIP_CERT_IN_BUILD}:ro",
        "--volume=/opt/pypi:/opt/pypi:ro",  # the index's root, which its file:// links point into
        "--volume=/opt/wheels:/opt/wheels:ro",
    ]
    assert build_args_for_local_pip({}) == []  # out there: the Dockerfile's defaults


def test_container_ulimits_stay_within_this_process_hard_limits(tmp_path):
    import resource
    import tomllib

    from tests.containers import write_containers_conf

    conf = tomllib.loads(write_containers_conf(tmp_path / "containers.conf").read_text())
    limits = dict(item.split("=") for item in conf["containers"]["default_ulimits"])
    for name, kind in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = (int(x) for x in limits[name].split(":"))
        host = resource.getrlimit(kind)[1]
        assert soft == hard > 0 and (host == resource.RLIM_INFINITY or hard <= host), (name, hard, host)
