"""Red team: a config error names a setting that does not exist.

README (Configuration) promises invalid configuration is refused with every problem listed, and the brief of
every role's message is "the setting, the value and what is allowed". For the settings whose key keeps an
acronym in capitals (`SPELLED` in shared/config.py: pendingTTLSeconds, redisCA, redisCAFile,
extenderClientCAFile, webhookClientCAFile), a value of the wrong type is reported under `camel(name)`, a
spelling that is no setting at all: `pendingTtlSeconds: 'abc' is not a whole number`. An operator who then
"fixes" the key the message names gets `unknown setting 'pendingTtlSeconds'`.

Expected: the message names the key as written (`pendingTTLSeconds`). Fix: shared/config.py `_coerce` (use
`key_of(name)` instead of `camel(name)` in its three messages; `_validate`'s messages use the right spelling
by hand already).
"""

from __future__ import annotations

import pytest

from shared.config import ConfigError, load_config


@pytest.mark.parametrize(("key", "value"), [
    ("pendingTTLSeconds", "two minutes"),
    ("redisCA", ["not", "pem"]),
    ("redisCAFile", {"a": 1}),
    ("extenderClientCAFile", ["a"]),
    ("webhookClientCAFile", ["a"]),
])
def test_redteam_op_type_error_names_the_setting_as_spelled(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(env={}, flags={key: value})
    text = str(e.value)
    assert f"{key}:" in text, f"the message names no setting {key!r}: {text!r}"
    # and the name it gives instead is no setting: following it makes things worse
    wrong = text.split("- ", 1)[1].split(":", 1)[0]
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(env={}, flags={wrong: "1"} if wrong != key else {"x": 1})
