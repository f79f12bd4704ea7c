"""Redis 7.2 and later word an ACL refusal differently from 6.2 and 7.0 (tests/redis/test_acl_user.py runs those):
a command, key or channel a script sends is refused as "ERR ACL failure in script: ..." and a key or channel as
"No permissions to access a key" (capital N, no user named). Each is an ACL refusal all the same: transient, said
with what to grant, and a one-shot command's exit 2 (red team: "No permissions to" was not recognised, so a 7.2
user without `~mt:*` or `&mt:feed` made the mirror's read a plain LedgerError, and the role crash-looped)."""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser

from shared.serving.supervise import is_transient
from shared.store.ledger_core import AclRefusedError, failed
from shared.store.redis_conn import acl_refused, explain

# as Redis 7.2+ answers (src/script.c: "ACL failure in script: " + getAclErrorMessage(..., verbose=0))
REPLIES = [
    "ERR ACL failure in script: No permissions to access a key script: 1a2b3c, on @user_script:12.",
    "ERR ACL failure in script: No permissions to access a channel script: 1a2b3c, on @user_script:40.",
    "ERR ACL failure in script: User mtsched has no permissions to run the 'hincrby' command script: 1a2b3c, "
    "on @user_script:7.",
    "NOPERM No permissions to access a key",
    "NOPERM No permissions to access a channel",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_a_redis_7_2_refusal_is_an_acl_refusal(reply: str) -> None:
    error = BaseParser().parse_error(reply)
    assert acl_refused(error), reply
    assert "the Redis user may not do what the roles need" in explain(error)
    wrapped = failed("snapshot of node-1", error)  # as a script's call or a pipelined read raises it
    assert isinstance(wrapped, AclRefusedError) and is_transient(wrapped)
    assert acl_refused(wrapped), str(wrapped)  # mtsched cards / explain: exit 2 naming what to grant
