"""Configuration: memoryPerCard in every form the seeds and the chart use, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import Config, ConfigError, load_config


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def models(c: Config) -> tuple[int, ...]:
    return tuple(m.memory for m in c.models)


def test_defaults_match_hami_and_the_seeds() -> None:
    c = load_config(env={})
    assert models(c) == (96,)  # chart default: MTT S4000
    assert c.slice_resources == ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")
    assert c.whole_card_resource_name == "mthreads.com/gpu"
    assert c.scheduler_name == "hami-scheduler"  # "The webhook rewrites the pod to use hami-scheduler"
    assert c.node_scheduler_policy == "binpack"  # HAMi --node-scheduler-policy default
    assert c.gpu_scheduler_policy == "spread"  # HAMi --gpu-scheduler-policy default
    assert c.force_overwrite_default_scheduler is True
    assert c.max_slices_per_card == 16  # vendor max_inst
    assert 1 <= c.default_cores <= 16


def test_s5000_guide_values_file(tmp_path: Path) -> None:
    # The values.yaml of the S5000 guide, verbatim.
    text = "devices:\n  mthreads:\n    enabled: true\n    memoryPerCard:\n      - 160\n"
    assert models(load_config(_file(tmp_path, text), env={})) == (160,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("devices:\n  mthreads:\n    memoryPerCard: [96, 160]\n", (96, 160)),  # mixed fleet
        ("devices:\n  mthreads:\n    memoryPerCard: 160\n", (160,)),  # legacy scalar
        ("memoryPerCard: [160]\n", (160,)),  # flat form
        ("memoryPerCard: '96,160'\n", (96, 160)),
        ("devices:\n  mthreads:\n    enabled: true\n", (96,)),  # unset: chart default
        ("", (96,)),  # empty file = defaults
        # the chart's spellings (tests/deploy/test_memory_per_card_agreement.py holds the chart and the roles to one
        # table): null is the default, a whole float a number (a Helm values file's 96 is 96.0), blank pieces of a
        # comma string are skipped, quotes as --set keeps them are no part of the number, models come sorted, once
        ("memoryPerCard: null\n", (96,)),
        ("memoryPerCard: [96.0, 160.0]\n", (96, 160)),
        ("memoryPerCard: '96,,160,'\n", (96, 160)),
        ("memoryPerCard: [96, '\"160\"']\n", (96, 160)),
        ("memoryPerCard: '[\"96\", \"160\"]'\n", (96, 160)),
        ("memoryPerCard: [160, 96, 160]\n", (96, 160)),
    ],
)
def test_memory_per_card_in_files(tmp_path: Path, text: str, expected: tuple[int, ...]) -> None:
    assert models(load_config(_file(tmp_path, text), env={})) == expected


def test_helm_form_keeps_other_mthreads_keys(tmp_path: Path) -> None:
    text = (
        "devices:\n  nvidia:\n    enabled: false\n  mthreads:\n    enabled: true\n"
        "    customresources: [mthreads.com/vgpu]\n    resourceCountName: example.com/vgpu\n"
    )
    c = load_config(_file(tmp_path, text), env={})
    assert c.resource_count_name == "example.com/vgpu"


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = _file(tmp_path, "memoryPerCard: [96]\ndefaultCores: 2\ngpuSchedulerPolicy: binpack\n")
    c = load_config(
        path,
        env={"MTSCHED_MEMORY_PER_CARD": "96,160", "MTSCHED_DEFAULT_CORES": "3"},
        flags={"default_cores": 4, "gpu_scheduler_policy": None},
    )
    assert models(c) == (96, 160)  # env beats file
    assert c.default_cores == 4  # flags beat env
    assert c.gpu_scheduler_policy == "binpack"  # a flag left at None does not override


def test_env_and_flag_spellings() -> None:
    c = load_config(
        env={
            "MTSCHED_PENDING_TTL_SECONDS": "60",
            "MTSCHED_CONFIG": "/ignored",
            "MTSCHED_FORCE_OVERWRITE_DEFAULT_SCHEDULER": "false",
        },
        flags={"maxSlicesPerCard": "8", "memoryPerCard": [160]},
    )
    assert c.pending_ttl_seconds == 60
    assert c.force_overwrite_default_scheduler is False
    assert c.max_slices_per_card == 8
    assert models(c) == (160,)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"memoryPerCard": []}, "memoryPerCard is empty"),
        ({"memoryPerCard": [0]}, "memoryPerCard entry 0 is out of range"),
        ({"memoryPerCard": ["big"]}, "memoryPerCard entry 'big' is not a whole number"),
        ({"memoryPerCard": [96.5]}, "memoryPerCard entry 96.5 is not a whole number"),
        ({"defaultCores": 0}, "defaultCores: 0 is outside 1..16"),
        ({"defaultCores": 17}, "defaultCores: 17 is outside 1..16"),
        ({"watchersLostAfterSeconds": 29}, "watchersLostAfterSeconds: 29 is outside 30..3600"),
        ({"watchersLostAfterSeconds": 3601}, "watchersLostAfterSeconds: 3601 is outside 30..3600"),
        ({"defaultCores": "1.5"}, "defaultCores: '1.5' is not a whole number"),
        ({"maxSlicesPerCard": 17}, "maxSlicesPerCard: 17 is outside 1..16"),
        ({"gpuSchedulerPolicy": "mutex"}, "gpuSchedulerPolicy: 'mutex' is not one of binpack, spread"),
        ({"nodeSchedulerPolicy": "random"}, "nodeSchedulerPolicy"),
        ({"resourceMemoryName": "sgpu memory"}, "resourceMemoryName"),
        ({"resourceCoreName": "mthreads.com/vgpu"},
         "resourceCoreName: 'mthreads.com/vgpu' is already resourceCountName; resource names must be distinct"),
        ({"keyPrefix": True}, "keyPrefix: True is not a string (quote it in YAML)"),
        ({"schedulerName": False}, "schedulerName: False is not a string"),
        ({"schedulerName": ""}, "schedulerName"),
        ({"eventsEnabled": "maybe"}, "eventsEnabled: 'maybe' is not a boolean"),
        ({"tlsCertFile": "/tls/tls.crt"}, "tlsCertFile and tlsKeyFile must be given together"),
        ({"listen": "8443"}, "listen: '8443' is not host:port"),
        ({"redisUrl": "http://x"}, "redisUrl"),
        ({"nosuchSetting": 1}, "unknown setting 'nosuchSetting'"),
        ({"leaderYieldSeconds": 59}, "leaderYieldSeconds: 59 is outside 60..3600 (0: never"),
        ({"leaderLease": "hami-scheduler"}, "leaderLease: 'hami-scheduler' is not <namespace>/<name>"),
        ({"podName": "Pod_1"}, "podName: 'Pod_1' is not a valid pod name"),
        ({"leaderYieldSeconds": 60, "leaderLease": "kube-system/hami-scheduler"}, "leaderPeers: empty"),
    ],
)
def test_invalid_settings_are_clear_errors(flags: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env={}, flags=flags)
    assert needle in str(e.value)
    assert str(e.value).startswith("invalid configuration:")


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = _file(tmp_path, "memoryPerCard: []\ndefaultCores: 99\nbogus: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env={"MTSCHED_MAX_SLICES_PER_CARD": "0"})
    text = str(e.value)
    for needle in (
        "memoryPerCard is empty",
        "defaultCores: 99",
        "unknown setting 'bogus'",
        "maxSlicesPerCard: 0",
    ):
        assert needle in text
    assert f"config file {path}" in text  # says where the bad key came from


@pytest.mark.parametrize(
    ("text", "needle"),
    [("- 96\n- 160\n", "top level must be a mapping"), ("memoryPerCard: [96\n", "config file")],
)
def test_unreadable_files(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(_file(tmp_path, text), env={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file"):
        load_config(tmp_path / "absent.yaml", env={})


def test_unrelated_mtsched_environment_variables_are_ignored() -> None:
    # Service links inject MTSCHED_REDIS_PORT-like variables; the CLI reads MTSCHED_LOG_FORMAT.
    env = {"MTSCHED_LOG_FORMAT": "text", "MTSCHED_REDIS_PORT": "tcp://10.0.0.1:6379", "MTSCHED_DEFAULT_CORES": "4"}
    assert load_config(env=env).default_cores == 4


def test_unknown_keys_in_file_and_flags_stay_errors(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("memoryPerCard: [160]\nmemoryPerCards: [96]\n")
    with pytest.raises(ConfigError, match="unknown setting 'memoryPerCards'"):
        load_config(f, env={})
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        load_config(env={}, flags={"bogus": 1})


def test_extender_client_auth_keys_in_every_spelling() -> None:
    base = {"tlsCertFile": "/tls/tls.crt", "tlsKeyFile": "/tls/tls.key"}
    for flags, env in (({"extenderClientCAFile": "/ca.crt"}, {}),
                       ({"extender_client_ca_file": "/ca.crt"}, {}),
                       ({}, {"MTSCHED_EXTENDER_CLIENT_CA_FILE": "/ca.crt"})):
        cfg = load_config(env=env, flags={**base, **flags})
        assert cfg.extender_client_ca_file == "/ca.crt"
    assert load_config(env={"MTSCHED_EXTENDER_ALLOW_UNAUTHENTICATED": "true"}).extender_allow_unauthenticated
    assert load_config(env={}).listen == ""  # the role's default: shared/serving/listen.py


@pytest.mark.parametrize(("text", "expected"), [
    # a HAMi values block pasted into a file that had the flat key: which one wins would be a guess
    ("memoryPerCard: [96]\ndevices:\n  mthreads:\n    memoryPerCard: [160]\n",
     "memoryPerCard is [96] and devices.mthreads.memoryPerCard is [160]: give it one way"),
    ("devices:\n  mthreads:\n    memoryPerCrad: [160]\n", "unknown setting 'devices.mthreads.memoryPerCrad'"),
    ("memoryPerCard: [96, 48]\n", "memoryPerCard entry 48 is MTT S4000's memory in GiB; the unit is 512 MiB: use 96"),
    ("devices:\n  mthreads:\n    memoryPerCard: 80\n",
     "memoryPerCard entry 80 is MTT S5000's memory in GiB; the unit is 512 MiB: use 160"),
    ("memoryPerCard: abc\n", "'abc' is not a whole number of 512 MiB units (2..4096; 96 = MTT S4000, 160 = MTT S5000"),
    # a number is written in ASCII digits, as the chart reads it (int() would make 96 of each of these)
    ("memoryPerCard: '9 6'\n", "memoryPerCard entry '9 6' is not a whole number"),
    ("memoryPerCard: '9_6'\n", "memoryPerCard entry '9_6' is not a whole number"),
    ("memoryPerCard: '+96'\n", "memoryPerCard entry '+96' is not a whole number"),
    ("memoryPerCard: '[[96]]'\n", "memoryPerCard entry '[96]' is not a whole number"),
    ("memoryPerCard: 96.5\n", "memoryPerCard entry 96.5 is not a whole number"),
    ("memoryPerCard: '-1'\n", "memoryPerCard entry -1 is out of range"),
])
def test_a_file_that_says_two_things_or_a_wrong_one_is_refused_by_name(tmp_path: Path, text: str,
                                                                       expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_file(tmp_path, text), env={})
    assert expected in str(e.value), str(e.value)


@pytest.mark.parametrize(("flat", "helm", "expected"), [
    ("[96, 160]", "[96, 160]", (96, 160)),
    ("160", "[160]", (160,)),  # spelled apart, read alike (review: the raw values were compared)
    ('"96,160"', "[160, 96]", (96, 160)),
])
def test_both_forms_saying_the_same_are_one(tmp_path: Path, flat: str, helm: str, expected: tuple[int, ...]) -> None:
    text = f"memoryPerCard: {flat}\ndevices:\n  mthreads:\n    enabled: true\n    memoryPerCard: {helm}\n"
    assert models(load_config(_file(tmp_path, text), env={})) == expected


def test_the_roles_refuse_gib_where_the_chart_does() -> None:
    """The same words as the chart's (deploy/helm/hami/templates/_helpers.tpl; tests/deploy/test_redteam_user_values.py
    holds the chart's side): a config written by hand, or the rendered manifest edited, is checked alike."""
    for gib, units, name in ((48, 96, "MTT S4000"), (80, 160, "MTT S5000")):
        with pytest.raises(ConfigError) as e:
            load_config(env={}, flags={"memoryPerCard": str(gib)})
        assert (f"memoryPerCard entry {gib} is {name}'s memory in GiB; the unit is 512 MiB: use {units} "
                f"(no Moore Threads card with sGPU has {gib} units)") in str(e.value)


@pytest.mark.parametrize("text", [
    "redisPassword: hunter2\ndevices:\n  mthreads:\n    redisPassword: hunter3\n",
    "redisUrl: redis://:hunter2@h:6379/0\ndevices:\n  mthreads:\n    redisUrl: redis://:hunter3@h:6379/0\n",
    "redisPassword: [hunter2]\n",  # not a string
    "redisUrl: [redis://:hunter2@h:6379/0]\n",
])
def test_a_refused_file_never_says_the_password(tmp_path: Path, text: str) -> None:
    """Red team: a password given both flat and as devices.mthreads.* (or not as a string) was quoted in the error,
    which the CLI prints and a role's log keeps."""
    with pytest.raises(ConfigError) as e:
        load_config(_file(tmp_path, text), env={})
    said = str(e.value)
    assert "hunter" not in said and "***" in said, said


def test_the_same_wrong_value_both_ways_is_said_once_as_wrong(tmp_path: Path) -> None:
    """Red team: a value refused given both ways alike was also called two values ("48 and 48: give it one way")."""
    with pytest.raises(ConfigError) as e:
        load_config(_file(tmp_path, "filterTopK: abc\ndevices:\n  mthreads:\n    filterTopK: abc\n"), env={})
    said = str(e.value)
    assert "give it one way" not in said and said.count("'abc' is not a whole number") == 1, said
