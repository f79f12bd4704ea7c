"""Red team, today's changes: mtsched_build_info{config} is a digest of the shared settings, the Redis URL among them
without its password. The URL's userinfo password was taken out, its query's (`?password=`, `?sentinel_password=`,
which redis-py reads and mtsched accepts outside the chart) was not: the digest of a process whose password sits
there changed with the password (a rotation raised MtschedReleasesMixed during its roll as a configuration change),
and a /metrics label read by anyone who can scrape was a 48-bit hash over the password and settings an attacker can
guess, a check for a dictionary of passwords offline."""

from __future__ import annotations

from controller.cli import config_digest
from shared.config import load_config


def digest(url: str) -> str:
    return config_digest(load_config(env={}, flags={"redisUrl": url}))


def test_redteam_today2_a_password_in_the_query_is_not_in_the_config_digest() -> None:
    assert digest("redis://r:6379/0?password=s3cret") == digest("redis://r:6379/0?password=other")
    assert (digest("redis+sentinel://s:26379/mymaster?sentinel_password=a")
            == digest("redis+sentinel://s:26379/mymaster?sentinel_password=b"))
    # the Redis itself still counts
    assert digest("redis://r:6379/0?password=s3cret") != digest("redis://other:6379/0?password=s3cret")
