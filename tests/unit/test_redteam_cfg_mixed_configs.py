"""Red team, configuration changes: a roll of a configuration change that stays half-way (a new pod that never gets
ready, so `maxUnavailable: 0` keeps the old ones) leaves old- and new-configuration watchers on one Redis for as long
as it lasts, each rewriting the nodes they disagree about at every comparison (memoryPerCard: an S5000 node closed
and opened every reconcileSeconds; maxSlicesPerCard: every card's limit flipping; tests/redis/
test_redteam_cfg_models_roll.py). MtschedReleasesMixed, the alert for a roll stuck half-way, compared only the code
(`mtsched_build_info{version, scripts, code}`), which a configuration change leaves as it was: nothing said so.
`mtsched_build_info` carries a digest of the shared settings too, and the alert counts it."""

from __future__ import annotations

from pathlib import Path

import yaml

from controller.cli import config_digest
from shared.config import load_config
from shared.serving.metrics import BUILD

RULES = Path(__file__).resolve().parents[2] / "deploy/helm/hami/templates/monitoring/prometheusrule.yaml"


def test_redteam_cfg_build_info_tells_two_configurations_apart() -> None:
    assert "config" in BUILD._labelnames  # type: ignore[attr-defined]
    base = load_config(env={}, flags={})
    for change in ({"maxSlicesPerCard": "4"}, {"memoryPerCard": "96,160"}, {"keyPrefix": "mt2"},
                   {"schedulerName": "gpu"}, {"defaultCores": "2"}, {"pendingTTLSeconds": "60"}):
        assert config_digest(load_config(env={}, flags=change)) != config_digest(base), change


def test_redteam_cfg_what_differs_per_role_or_is_secret_is_not_in_it() -> None:
    base = load_config(env={}, flags={})
    for change in ({"listen": "0.0.0.0:9443"}, {"nodeName": "gpu-1"}, {"podName": "hami-scheduler-0"},
                   {"logLevel": "debug"}, {"redisPassword": "s3cret"}, {"leaderYieldSeconds": "60"}):
        assert config_digest(load_config(env={}, flags=change)) == config_digest(base), change
    digest = config_digest(load_config(env={}, flags={"redisUrl": "redis://:pw@r:6379/0"}))
    assert digest == config_digest(load_config(env={}, flags={"redisUrl": "redis://:other@r:6379/0"}))
    assert len(digest) == 12 and int(digest, 16) >= 0


def test_redteam_cfg_the_mixed_releases_alert_counts_configurations() -> None:
    text = RULES.read_text()
    start = text.index("alert: MtschedReleasesMixed")
    expr = yaml.safe_load(text[start:text.index("for:", start)].replace("alert: MtschedReleasesMixed", ""))
    assert "config" in str(expr), expr
