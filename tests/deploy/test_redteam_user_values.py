"""Red team (what a demanding user sets): chart values that would start roles that misbehave are refused by
`helm template`/`helm install`, naming the value and what is allowed.

- `schedulerName` names the kube-scheduler profile our Deployment runs *and* its leader-election Lease. Set to
  `default-scheduler` it started a second scheduler for every ordinary pod of the cluster, racing the real one;
  set to `kube-scheduler` in kube-system it made our kube-scheduler (and the extender's leader hand-over, which
  writes that Lease over) contend for the Lease of the cluster's default scheduler, kube-system/kube-scheduler:
  while ours held it, no ordinary pod was scheduled. Both rendered without a word.
- resource names that coincide (`resourceCountName` = `resourceMemoryName`, `wholeCardResourceName` = the count)
  rendered, and every role then refused to start (CrashLoopBackOff) with the message helm could have given.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy._chart import Case, template


@pytest.mark.parametrize(("sets", "namespace", "message"), [
    (("schedulerName=default-scheduler",), "kube-system",
     'schedulerName "default-scheduler" is the profile of the cluster\'s default scheduler'),
    (("schedulerName=default-scheduler",), "hami-system",
     'schedulerName "default-scheduler" is the profile of the cluster\'s default scheduler'),
    (("schedulerName=kube-scheduler",), "kube-system",
     "kube-system/kube-scheduler is the leader-election Lease of the cluster's default scheduler"),
    (("schedulerName=default-scheduler", "devices.mthreads.enabled=false"), "hami-system",
     'schedulerName "default-scheduler"'),
    (("devices.mthreads.resourceMemoryName=mthreads.com/vgpu",), "kube-system",
     "devices.mthreads.resourceMemoryName mthreads.com/vgpu is already devices.mthreads.resourceCountName"),
    (("devices.mthreads.wholeCardResourceName=mthreads.com/sgpu-core",), "kube-system",
     "devices.mthreads.wholeCardResourceName mthreads.com/sgpu-core is already devices.mthreads.resourceCoreName"),
])
def test_values_that_would_misbehave_are_refused(helm: Path, sets: tuple[str, ...], namespace: str,
                                                 message: str) -> None:
    proc = template(helm, Case(sets=sets, namespace=namespace), check=False)
    assert proc.returncode != 0, f"{sets} rendered"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("sets", [
    ("schedulerName=kube-scheduler",),  # outside kube-system the name takes nobody's Lease
    ("schedulerName=gpu-scheduler",),
    ("devices.mthreads.resourceCountName=example.com/vgpu",),
])
def test_distinct_names_still_render(helm: Path, sets: tuple[str, ...]) -> None:
    template(helm, Case(sets=sets, namespace="hami-system"))


@pytest.mark.parametrize(("sets", "message"), [
    # the seeds give each card's memory in GiB beside its units (S5000: "80 GiB per card = 160 x 512 MiB units"):
    # [80] rendered, and every S5000 node then offered no card (80-unit model) and every slice pod stayed Pending
    (("devices.mthreads.memoryPerCard={80}",), "devices.mthreads.memoryPerCard entry 80 is MTT S5000's memory in GiB; "
                                               "the unit is 512 MiB: use 160"),
    (("devices.mthreads.memoryPerCard={96,48}",), "entry 48 is MTT S4000's memory in GiB; the unit is 512 MiB: use 96"),
    (("devices.mthreads.memoryPerCard=80",), "use 160"),  # the legacy scalar
])
def test_memory_per_card_in_gib_is_refused(helm: Path, sets: tuple[str, ...], message: str) -> None:
    proc = template(helm, Case(sets=sets), check=False)
    assert proc.returncode != 0, f"{sets} rendered"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("key", [
    "scheduler.filterTopK", "scheduler.forceOverwriteDefaultScheduler", "scheduler.percentageOfNodesToScore",
    "mtsched.defaultCores",
    "mtsched.maxSlicesPerCard", "mtsched.pendingTTLSeconds", "mtsched.reconcileSeconds", "mtsched.keyPrefix",
    "mtsched.eventsEnabled", "mtsched.successEvents", "mtsched.quotaCheck", "mtsched.logLevel", "mtsched.logFormat",
    "mtsched.metricsPort",
])
def test_a_value_set_to_null_is_refused_naming_it(helm: Path, key: str) -> None:
    """`--set key=null` (or `key: null` in a values file) deletes the chart's default: the templates then rendered
    `int nil`, 0 (filterTopK 0 is "every node", not the chart's 1; maxSlicesPerCard 0 a role refusing to start)."""
    proc = template(helm, Case(sets=(f"{key}=null",), namespace="hami-system"), check=False)
    section, name = key.split(".")
    assert proc.returncode != 0, f"{key}=null rendered"
    assert f"at '/{section}': missing property '{name}'" in proc.stderr, proc.stderr
