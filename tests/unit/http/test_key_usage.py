"""Key accounts on their own, on a hand-driven clock: which limit refuses, and the Retry-After
each computes (whole seconds until the window would admit the request)."""

from __future__ import annotations

import pytest

from hearth.chat.types import Done, Usage
from hearth.errors import TooManyRequests
from hearth.http.key_usage import KeyAccounts
from hearth.tenants import ApiKey


def test_the_token_window_waits_for_enough_tokens_to_expire() -> None:
    now = [0.0]
    accounts = KeyAccounts([ApiKey("k", "a", "a", tpm=100)], clock=lambda: now[0])
    spend = accounts.observer("a")
    for t, n in ((0, 60), (10, 30), (20, 40)):  # 130 tokens by t=20
        now[0] = t
        accounts.admit("a")
        spend(Done(Usage(prompt_tokens=n)))
        accounts.release("a")
    now[0] = 30
    with pytest.raises(TooManyRequests) as e:
        accounts.admit("a")
    assert e.value.retry_after == 30  # at t=60 the first 60 expire: 70 left, under 100
    now[0] = 60
    accounts.admit("a")
    row = accounts.usage()[0]
    assert (row["requests"], row["limited"], row["in_flight"], row["prompt_tokens"]) == (4, 1, 1, 130)


def test_unknown_names_and_the_admin_are_not_accounted() -> None:
    accounts = KeyAccounts([ApiKey("k", "a", "a", concurrent=1)])
    accounts.admit("admin")  # not a key of the file: nothing counted, nothing refused
    accounts.admit("a")
    with pytest.raises(TooManyRequests) as e:
        accounts.admit("a")
    assert e.value.retry_after == 1
    accounts.release("a")
    accounts.admit("a")
    accounts.observer(None)(Done(Usage(prompt_tokens=5)))  # a request without a key: ignored
