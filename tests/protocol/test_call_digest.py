"""A call's idempotency key."""

from __future__ import annotations

from capabilities.protocol.call_digest import call_digest


def test_any_text_an_agent_can_send_has_a_digest() -> None:
    lone = call_digest("convert.markdownToHtml", {"markdown": "\ud800"})
    assert len(lone) == 64
    assert lone != call_digest("convert.markdownToHtml", {"markdown": "\ud801"})


def test_the_digest_ignores_key_order_and_tells_calls_apart() -> None:
    one = call_digest("export.pdf", {"html": "<p>x</p>", "options": {"a": 1, "b": 2}})
    assert one == call_digest("export.pdf", {"options": {"b": 2, "a": 1}, "html": "<p>x</p>"})
    assert one != call_digest("process.image", {"html": "<p>x</p>", "options": {"a": 1, "b": 2}})
