"""redis_refusal: a Redis error reply unwrapped from Redis 6.2's script error, read by the supervisor (is_transient)
and by the Sentinel connection that leaves a replaced master (shared/store/redis_conn.py: on 6.2 its NOREPLICAS comes
inside the script's error). The wrapped form is 6.2's, as tests/redis/test_review_refusals_in_scripts_62.py sees it."""

from __future__ import annotations

import pytest
from redis import exceptions as rexc

from shared.serving.supervise import is_transient, redis_refusal

WRAP = "Error running script (call to f_0a1b2c): @user_script:404: @user_script: 404: -"


@pytest.mark.parametrize(("message", "refusal", "in_script", "transient"), [
    ("NOREPLICAS Not enough good replicas to write.", "NOREPLICAS Not enough good replicas to write.", False, True),
    (WRAP + "NOREPLICAS Not enough good replicas to write.", "NOREPLICAS Not enough good replicas to write.", True,
     True),
    (WRAP + "MISCONF Redis is configured to save RDB snapshots", "MISCONF Redis is configured to save RDB snapshots",
     True, True),
    (WRAP + "OOM command not allowed", "OOM command not allowed", True, True),
    (WRAP + "WRONGTYPE Operation against a key", "WRONGTYPE Operation against a key", True, False),
    ("WRONGTYPE Operation against a key", "WRONGTYPE Operation against a key", False, False),
    ("BUSYKEY Target key name already exists.", "BUSYKEY Target key name already exists.", False, False),
    ("Error running script (call to f_0a1b2c): @user_script:12: user_script:12: attempt to compare nil",
     "Error running script (call to f_0a1b2c): @user_script:12: user_script:12: attempt to compare nil", False, False),
])
def test_a_refusal_is_read_inside_a_62_script_error(message: str, refusal: str, in_script: bool,
                                                    transient: bool) -> None:
    assert redis_refusal(rexc.ResponseError(message)) == (refusal, in_script)
    assert is_transient(rexc.ResponseError(message)) is transient
