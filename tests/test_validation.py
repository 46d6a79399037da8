"""Stream-name and topic rules."""

import pytest

from logjam.errors import InvalidAppEnv, InvalidTopic
from logjam.validation import check_app_env, check_topic, is_valid_app_env, is_valid_topic


@pytest.mark.parametrize("name", ["app-production", "my_app-prod", "shop2-staging", "a-b", b"logjam-dev"])
def test_good_app_envs(name):
    check_app_env(name)
    assert is_valid_app_env(name)


@pytest.mark.parametrize(
    "name, reason",
    [("", "empty"), ("noenv", "no '-'"), ("app-\tprod", "byte 0x09"), ("app-prod\x00", "byte 0x00"),
     ("app-prød", "byte 0xC3"), ("a-" + "x" * 300, "limit")],
)
def test_bad_app_envs_say_why(name, reason):
    with pytest.raises(InvalidAppEnv, match=reason):
        check_app_env(name)
    assert not is_valid_app_env(name)


@pytest.mark.parametrize("topic", ["logs", "logs.rails", "javascript", "events.x", "frontend.page", "frontend.ajax", "mobile"])
def test_good_topics(topic):
    check_topic(topic)
    assert is_valid_topic(topic)


@pytest.mark.parametrize("topic", ["", "log", "frontend", "frontend.other", "metrics", "LOGS"])
def test_bad_topics(topic):
    with pytest.raises(InvalidTopic, match="must start with"):
        check_topic(topic)
    assert not is_valid_topic(topic)


def test_the_topic_limit_counts_bytes_in_every_check():
    # 5 + 125 two-byte characters: 130 characters, 255 bytes (at the limit); one more is 257 bytes.
    at_limit = "logs." + "é" * 125
    over = at_limit + "é"
    assert len(at_limit.encode()) == 255 and len(over) < 255 < len(over.encode())
    check_topic(at_limit)
    assert is_valid_topic(at_limit) and is_valid_topic(at_limit.encode())
    with pytest.raises(InvalidTopic, match="bytes"):
        check_topic(over)
    assert not is_valid_topic(over) and not is_valid_topic(over.encode())
