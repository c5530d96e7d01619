"""work/params_size.json_fits against json.dumps itself."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from capabilities.work.params_size import json_fits

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(value=JSON, limit=st.integers(min_value=0, max_value=400))
def test_it_answers_as_the_length_of_json_dumps_would(value: Any, limit: int) -> None:
    assert json_fits(value, limit) == (len(json.dumps(value, ensure_ascii=False)) <= limit)


def test_a_big_string_is_over_without_being_encoded() -> None:
    assert not json_fits({"markdown": "\x00" * 5_000_000}, 64 * 1024)
    assert json_fits({"markdown": "# Hi"}, len('{"markdown": "# Hi"}'))
