"""docs/install.md matches the chart: its values, --set flags, object names and commands."""

from __future__ import annotations

import contextlib
import re
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.deploy._chart import CHART, MANIFEST, ROOT, Case, Json, check_config, embedded, find, objects, template

DOC = ROOT / "docs" / "install.md"
Rendered = Callable[[str], list[Json]]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def _has_path(values: Json, dotted: str) -> bool:
    node: object = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_set_flag_names_a_chart_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    flags = re.findall(r"--set ([A-Za-z0-9_.]+)=", DOC.read_text())
    assert len(flags) >= 4
    for key in flags:
        if key == "device.mthreads.enabled":  # the old guide's typo, documented as ignored
            continue
        assert _has_path(values, key), key


def test_every_values_block_renders(helm: Path) -> None:
    blocks = [yaml.safe_load(b) for b in _blocks("yaml")]
    values_blocks = [b for b in blocks if isinstance(b, dict) and ("devices" in b or "redis" in b)]
    assert len(values_blocks) >= 3
    for block in values_blocks:
        if "redis" in block:  # needs the Secret it names, which the render does not check
            block = {"redis": {"external": {**block["redis"]["external"]}}}
        objs = objects(template(helm, Case(block)).stdout)
        cfg = embedded(objs, "hami-config", "config.yaml")
        want = block.get("devices", {}).get("mthreads", {}).get("memoryPerCard")
        if want is not None:
            assert cfg["memoryPerCard"] == want
            assert check_config(one_config(objs))["memoryPerCard"] == want


def one_config(objs: list[Json]) -> str:
    return str(next(o for o in find(objs, "ConfigMap") if o["metadata"]["name"] == "hami-config")["data"][
        "config.yaml"])


def test_kubectl_commands_name_rendered_objects(rendered: Rendered) -> None:
    objs = rendered("defaults")
    deploys = {d["metadata"]["name"]: d for d in find(objs, "Deployment")}
    text = DOC.read_text()
    for name in re.findall(r"deploy/(hami-[a-z-]+)", text):
        assert name in deploys, name
    for name, c in re.findall(r"exec deploy/(hami-[a-z-]+) -c ([a-z-]+)", text):
        assert c in [x["name"] for x in deploys[name]["spec"]["template"]["spec"]["containers"]]
    for kind, name in (("MutatingWebhookConfiguration", "hami-webhook"), ("Secret", "hami-scheduler-tls")):
        assert f"{name}" in text and find(objs, kind, name)
    assert "helm install hami deploy/helm/hami -n kube-system" in text
    assert "helm upgrade hami deploy/helm/hami -n kube-system -f values.yaml" in text
    assert "kubectl -n kube-system rollout restart deploy/hami-scheduler" in text
    assert "helm uninstall hami -n kube-system" in text


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_without_helm_certificate_steps() -> None:
    """Step 1 of "Without Helm" makes a certificate the extender and webhook clients accept; step 2's
    sed rewrites the images of the static manifest."""
    block = next(b for b in _blocks("bash") if "openssl req -x509" in b)
    openssl = [ln for ln in block.splitlines() if ln.startswith(("openssl ", "printf "))]
    with tempfile.TemporaryDirectory(prefix="docs-tls-") as tmp:
        for line in openssl:
            proc = subprocess.run(["bash", "-c", line], cwd=tmp, capture_output=True, text=True, check=False)
            assert proc.returncode == 0, (line, proc.stderr)
        work = Path(tmp)
        cert = x509.load_pem_x509_certificate((work / "tls.crt").read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "hami-webhook.kube-system.svc" in san.get_values_for_type(x509.DNSName)
        for host in ("hami-webhook.kube-system.svc", "127.0.0.1"):
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.load_cert_chain(work / "tls.crt", work / "tls.key")
            client = ssl.create_default_context(cafile=str(work / "ca.crt"))
            a, b = ssl.MemoryBIO(), ssl.MemoryBIO()
            c, d = ssl.MemoryBIO(), ssl.MemoryBIO()
            cli = client.wrap_bio(a, b, server_hostname=host)
            srv = server.wrap_bio(c, d, server_side=True)
            for _ in range(10):  # drive the handshake through memory BIOs
                for side in (cli, srv):
                    with contextlib.suppress(ssl.SSLWantReadError):
                        side.do_handshake()
                c.write(b.read())
                a.write(d.read())
            assert cli.getpeercert()["subject"], host  # verified chain and name
    sed = re.search(r"sed -e '([^']+)' \\\n\s+-e '([^']+)'", block)
    assert sed is not None
    proc = subprocess.run(["sed", "-e", sed.group(1), "-e", sed.group(2), str(MANIFEST)],
                          capture_output=True, text=True, check=True)
    images = set(re.findall(r"image: (\S+)", proc.stdout))
    assert "registry.k8s.io/kube-scheduler:v1.34.2" in images
    assert "registry.example.com/mtsched/mtsched:0.1.0" in images
