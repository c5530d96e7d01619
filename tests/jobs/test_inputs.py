"""Large inputs spill to storage and come back unchanged for the runner."""

from __future__ import annotations

import uuid

import pytest
from django.core.files.storage import default_storage

from capabilities.jobs import inputs


def test_large_contents_spill_and_come_back() -> None:
    big = "QUJD" * 20_000 + "é"  # over the threshold; odd characters survive
    params = {
        "image": {"content": big, "mimeType": "image/png", "encoding": "base64"},
        "small": {"content": "aGk=", "encoding": "base64"},
        "operations": [{"type": "grayscale"}],
    }
    job_id = str(uuid.uuid4())
    stored, spilled = inputs.spill(job_id, params)
    assert stored["image"] == {"content": None, "mimeType": "image/png", "encoding": "base64"}
    assert stored["small"] == params["small"]
    assert stored["operations"] == params["operations"]
    assert spilled["image"]["length"] == len(big)
    name = spilled["image"]["name"]
    assert name.startswith(f"inputs/{job_id}/")
    assert inputs.restore(job_id, stored, spilled) == params
    inputs.discard(job_id, spilled)
    assert not default_storage.exists(name)


def test_small_params_are_untouched() -> None:
    params = {"html": "<p>x</p>" * 100, "options": {"pageSize": "a4"}}
    assert inputs.spill(str(uuid.uuid4()), params) == (params, {})


def test_agent_data_cannot_name_a_file() -> None:
    # The marker of old sat in the params: an agent-shaped object could name a file.
    params = {"image": {"content": None, "$spilled": "../../settings.py", "length": 3}}
    assert inputs.restore(str(uuid.uuid4()), params, {}) == params


@pytest.mark.parametrize("name", ["inputs/other-job/image.txt", "inputs/{job}/../../x.txt"])
def test_a_spilled_name_outside_the_job_s_folder_is_refused(name: str) -> None:
    job_id = str(uuid.uuid4())
    spilled = {"image": {"name": name.format(job=job_id), "length": 3}}
    with pytest.raises(ValueError, match="not in job"):
        inputs.restore(job_id, {"image": {"content": None}}, spilled)
    with pytest.raises(ValueError, match="not in job"):
        inputs.discard(job_id, spilled)
