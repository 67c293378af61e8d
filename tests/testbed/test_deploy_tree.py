"""The deploy folder as a whole: the kustomization lists every manifest, all of them parse,
and every image reference agrees with the project version."""

from pathlib import Path

import yaml

import tessera

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NOT_APPLIED = {
    "scheduler/tls-secrets.example.yaml",
    "scheduler/record-signing-secret.example.yaml",
    "nri-hook/record-verify-secret.example.yaml",
    "scheduler/kube-scheduler-config.yaml",
}


def test_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    manifests = {
        str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml"
    }
    assert listed == manifests - NOT_APPLIED
    assert all((DEPLOY / name).is_file() for name in listed)


def test_manifests_parse_and_use_this_version() -> None:
    images = set()
    for path in DEPLOY.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc is None or isinstance(doc, dict), path
            text = yaml.safe_dump(doc)
            images |= {
                line.split("image:")[1].strip() for line in text.splitlines() if "image:" in line
            }
    assert images == {f"ghcr.io/tessera-dev/tessera:{tessera.__version__}"}
