"""Large inputs spill to storage and come back unchanged for the runner."""

from __future__ import annotations

import uuid

from django.core.files.storage import default_storage

from capabilities import inputs


def test_large_contents_spill_and_come_back() -> None:
    big = "QUJD" * 20_000 + "\ud800é"  # over the threshold; odd characters survive
    params = {
        "image": {"content": big, "mimeType": "image/png", "encoding": "base64"},
        "small": {"content": "aGk=", "encoding": "base64"},
        "operations": [{"type": "grayscale"}],
    }
    job_id = str(uuid.uuid4())
    stored = inputs.spill(job_id, params)
    assert stored["image"]["content"] is None
    assert stored["image"]["length"] == len(big)
    assert stored["small"] == params["small"]
    assert stored["operations"] == params["operations"]
    name = stored["image"][inputs.SPILLED_KEY]
    assert name.startswith(f"inputs/{job_id}/")
    assert inputs.restore(stored) == params
    inputs.discard(stored)
    assert not default_storage.exists(name)


def test_small_params_are_untouched() -> None:
    params = {"html": "<p>x</p>" * 100, "options": {"pageSize": "a4"}}
    assert inputs.spill(str(uuid.uuid4()), params) == params
