"""`mtsched explain` inside a role's container (`kubectl exec ... -- mtsched explain`) reads the API with the pod's
own ServiceAccount: the image has no kubeconfig and its HOME is /nonexistent (ops review, 2026-12-05: it
failed with "Invalid kube-config file")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.cli import explain_kubeconfig


def test_the_kubeconfig_explain_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert explain_kubeconfig("", pod) == ""  # in a pod: its ServiceAccount (Kube.create's in-cluster config)
    assert explain_kubeconfig("/k/given", pod) == "/k/given"
    assert explain_kubeconfig("", {**pod, "KUBECONFIG": f"/a{os.pathsep}/b"}) == "/a"
    assert explain_kubeconfig("", {**pod, "KUBECONFIG": f"{os.pathsep}/b"}) == "/b"  # its first entry, not ''
    home = tmp_path / ".kube" / "config"
    assert explain_kubeconfig("", {}) == str(home)  # outside a pod: the usual default, which says if it is missing
    home.parent.mkdir()
    home.write_text("")
    assert explain_kubeconfig("", pod) == str(home)  # a pod that has one: it
