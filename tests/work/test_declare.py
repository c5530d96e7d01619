"""`@capability`: schemas from type hints or given, params and results converted, async.

In-process, through `capabilities.testing`: each test registers its own capability and
takes it out again.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, field_validator
from typing_extensions import TypedDict

from capabilities import CapabilityError, File, JobAborted, JobContext, capability
from capabilities.testing import RecordingContext, run_capability
from capabilities.work import registry
from capabilities.work.schemas import binary_result

NAME = "test.declared"


@pytest.fixture(autouse=True)
def forget_declared() -> Iterator[None]:
    yield
    registry.unregister(NAME)


@dataclass
class Order:
    count: int
    label: str = "x"


@dataclass
class Receipt:
    total: int
    file: File


class OrderDict(TypedDict):
    count: int
    label: str


class OrderModel(BaseModel):
    count: int
    label: str = "x"

    @field_validator("count")
    @classmethod
    def even(cls, value: int) -> int:
        if value % 2:
            raise ValueError("must be even")
        return value


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    count: int


class Total(BaseModel):
    total: int


def test_a_dataclass_gives_both_schemas_and_typed_values() -> None:
    seen: list[Order] = []

    @capability(NAME, description="Counts.")
    def count(params: Order, ctx: JobContext) -> Receipt:
        seen.append(params)
        return Receipt(
            total=params.count * 2,
            file=ctx.save_file(b"abc", mime_type="text/plain", filename="a.txt"),
        )

    spec = registry.require(NAME)
    described = spec.describe()
    assert described["description"] == "Counts."
    schema = described["inputSchema"]
    assert schema["type"] == "object"
    assert schema["required"] == ["count"]
    assert schema["properties"]["count"]["type"] == "integer"
    assert schema["properties"]["label"]["default"] == "x"
    assert schema["additionalProperties"] is False
    output = described["outputSchema"]
    assert output["properties"]["file"] == {
        **binary_result({"type": "string"}, "a file"),
        "title": "File",
    }
    Draft202012Validator.check_schema(schema)
    Draft202012Validator.check_schema(output)

    run = run_capability(NAME, {"count": 3})
    assert seen == [Order(count=3, label="x")]
    assert run.result == {
        "total": 6,
        "file": {"$file": "a.txt", "mimeType": "text/plain", "size": 3, "filename": "a.txt"},
    }
    assert type(run.result["file"]) is dict  # plain JSON, no File left in it
    assert run.files == {"a.txt": b"abc"}


def test_params_are_validated_by_the_registry_with_the_wire_codes() -> None:
    @capability(NAME, description="Counts.")
    def count(params: Order, ctx: JobContext) -> Total:
        return Total(total=params.count)

    with pytest.raises(CapabilityError) as wrong_type:
        run_capability(NAME, {"count": "many"})
    assert wrong_type.value.code == "INVALID_TYPE"
    assert wrong_type.value.details == {"path": "params.count", "rule": "type"}
    with pytest.raises(CapabilityError) as missing:
        run_capability(NAME, {})
    assert missing.value.code == "MISSING_PARAM"
    with pytest.raises(CapabilityError) as unknown:
        run_capability(NAME, {"count": 1, "cuont": 2})
    assert unknown.value.code == "INVALID_PARAMS"


def test_a_typeddict_gives_its_schema_and_a_dict() -> None:
    @capability(NAME, description="Counts.")
    def count(params: OrderDict, ctx: JobContext) -> OrderDict:
        return {"count": params["count"] + 1, "label": params["label"]}

    schema = registry.require(NAME).describe()["inputSchema"]
    assert schema["required"] == ["count", "label"]
    run = run_capability(NAME, {"count": 1, "label": "a"})
    assert run.result == {"count": 2, "label": "a"}


def test_a_pydantic_model_and_its_own_validators() -> None:
    @capability(NAME, description="Counts.")
    def count(params: OrderModel, ctx: JobContext) -> Total:
        return Total(total=params.count)

    assert run_capability(NAME, {"count": 4}).result == {"total": 4}
    # The schema cannot say "even": the model's validator refuses it where it runs.
    with pytest.raises(CapabilityError) as odd:
        run_capability(NAME, {"count": 3})
    assert odd.value.code == "INVALID_PARAMS"
    assert odd.value.details == {"path": "params.count"}


def test_a_model_that_allows_extra_keys_keeps_them() -> None:
    @capability(NAME, description="Counts.")
    def count(params: Loose, ctx: JobContext) -> Total:
        return Total(total=params.count + len(params.model_extra or {}))

    assert registry.require(NAME).describe()["inputSchema"]["additionalProperties"] is True
    assert run_capability(NAME, {"count": 1, "more": 1}).result == {"total": 2}


def test_explicit_schemas_leave_params_and_result_plain_dicts() -> None:
    seen: list[Any] = []
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    @capability(NAME, description="Echoes.", input_schema=schema, output_schema={"type": "object"})
    def echo(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        seen.append(params)
        return {"n": params["n"]}

    spec = registry.require(NAME)
    assert spec.input_schema == schema
    assert spec.output_schema == {"type": "object"}
    assert run_capability(NAME, {"n": 1}).result == {"n": 1}
    assert seen == [{"n": 1}]
    assert echo({"n": 2}, RecordingContext()) == {"n": 2}  # the function is left as it was


def test_options_reach_the_spec() -> None:
    @capability(
        NAME,
        description="Queued.",
        cost="reports",
        timeout_ms=1000,
        max_timeout_ms=2000,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
    )
    def queued(params: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        return {}

    spec = registry.require(NAME)
    assert spec.cost == "reports"
    assert spec.describe()["timeout"] == {"defaultMs": 1000, "maxMs": 2000}


def test_without_hints_the_schemas_are_required() -> None:
    with pytest.raises(TypeError, match="input_schema"):

        @capability(NAME, description="Untyped.")
        def untyped(params, ctx):  # type: ignore[no-untyped-def]
            return {}

    with pytest.raises(TypeError, match="output_schema"):

        @capability(NAME, description="Half typed.")
        def half(params: Order, ctx: JobContext) -> dict[str, Any]:
            return {}

    assert registry.get(NAME) is None


def test_a_name_registered_twice_is_refused_clearly() -> None:
    @capability(NAME, description="First.")
    def first(params: Order, ctx: JobContext) -> Total:
        return Total(total=1)

    with pytest.raises(registry.DuplicateCapability, match=rf"'{NAME}' is registered twice"):

        @capability(NAME, description="Second.")
        def second(params: Order, ctx: JobContext) -> Total:
            return Total(total=2)

    assert registry.require(NAME).description == "First."
    with pytest.raises(registry.DuplicateCapability, match=re.escape("export.pdf")):

        @capability("export.pdf", description="Mine.")
        def mine(params: Order, ctx: JobContext) -> Total:
            return Total(total=0)


def test_a_result_of_the_wrong_type_fails_the_run() -> None:
    @capability(NAME, description="Wrong.")
    def wrong(params: Order, ctx: JobContext) -> Total:
        return {"total": "not a model"}  # type: ignore[return-value]

    with pytest.raises(Exception, match="Total"):
        run_capability(NAME, {"count": 1})


def test_an_async_capability_runs_and_converts() -> None:
    @capability(NAME, description="Async.")
    async def count(params: Order, ctx: JobContext) -> Total:
        ctx.checkpoint()
        return Total(total=params.count)

    assert run_capability(NAME, {"count": 5}).result == {"total": 5}
    assert run_capability(NAME, {"count": 5}, cancel_at_checkpoint=1).cancelled


def test_a_cancel_cancels_an_async_capability_s_task() -> None:
    import asyncio

    started = threading.Event()
    saw: list[str] = []

    @capability(NAME, description="Waits forever.")
    async def forever(params: Order, ctx: JobContext) -> Total:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise
        return Total(total=0)

    ctx = RecordingContext()
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            registry.require(NAME).load_runner()({"count": 1}, ctx)
        except BaseException as raised:
            outcome.append(raised)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert started.wait(10)
    ctx.cancel()
    thread.join(10)
    assert not thread.is_alive()
    assert saw == ["cancelled"]
    assert len(outcome) == 1
    assert isinstance(outcome[0], JobAborted)
