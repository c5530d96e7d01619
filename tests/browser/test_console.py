"""The console (/abp/console/) in Chromium, as a signed-in person uses it: forms drawn
from the capabilities' schemas, runs with progress, Cancel, results and errors."""

from __future__ import annotations

import io
import json
import os
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from PIL import Image
from playwright.sync_api import FilePayload, Locator, Page

from capabilities.models import CancelSource, Job, JobStatus
from tests.browser.conftest import screenshot
from tests.browser.support import orm, orm_eventually
from tests.support.stack import Stack

PASSWORD = "pw-for-console-tests"


def person(*permissions: str) -> tuple[str, int]:
    """A user who may sign in (with these permissions): their username and id."""

    def make() -> tuple[str, int]:
        user = get_user_model().objects.create_user(
            username=f"console-{uuid.uuid4().hex[:8]}", password=PASSWORD
        )
        for name in permissions:
            label, codename = name.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=label, codename=codename)
            )
        return user.get_username(), user.pk

    return orm(make)


def open_console(page: Page, stack: Stack, username: str, capability: str = "") -> Locator:
    """Sign in on the way to the console; the form of `capability` (shown by its #name)."""
    page.goto(f"{stack.http_url}/abp/console/")
    assert page.url.startswith(f"{stack.http_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    connection = page.wait_for_selector("#connection:not([data-state=connecting])")
    assert connection is not None
    assert connection.get_attribute("data-state") == "ready", connection.inner_text()
    if capability:
        page.click(f"#capability-list li[data-capability='{capability}'] a")
    form = page.locator(f"form.abp-capability[data-capability='{capability}']")
    if capability:
        form.wait_for(state="visible")
    return form


def listed(page: Page) -> set[str]:
    names = page.eval_on_selector_all(
        "#capability-list li", "items => items.map(item => item.dataset.capability)"
    )
    return set(names)


def latest_run(page: Page, status: str) -> Locator:
    """The newest run, once it has this status."""
    page.wait_for_selector(f".abp-run:first-child[data-status={status}]")
    return page.locator(".abp-run").first


def test_the_markdown_form_is_drawn_from_its_schema_and_runs(page: Page, stack: Stack) -> None:
    username, _ = person()
    form = open_console(page, stack, username, "convert.markdownToHtml")
    # What the user may call, the host's own capabilities among them; not what needs a
    # permission they lack (test.guarded: auth.view_user; notes.export: notes.view_note).
    names = listed(page)
    assert {"convert.markdownToHtml", "export.pdf", "process.image"} <= names
    assert {"test.sleep", "test.whoami", "reports.squares"} <= names
    assert not {"test.guarded", "notes.export"} & names
    assert "Python-Markdown" in form.locator(".abp-description").inner_text()

    markdown = form.locator("[data-path=markdown]")
    assert markdown.locator("textarea[name=markdown]").count() == 1
    assert markdown.locator(".abp-required").count() == 1
    assert markdown.locator(".abp-help").inner_text() == "The Markdown text."
    options = form.locator("fieldset[data-path=options]")
    assert options.locator("legend").inner_text() == "options"
    sanitize = options.locator("input[type=checkbox][name='options.sanitize']")
    assert sanitize.is_checked()  # its default
    assert options.locator(".abp-required").count() == 0

    # Nothing is sent while a required field is empty.
    form.locator("button[type=submit]").click()
    assert form.locator(".abp-form-error").inner_text() == "Not sent: markdown: Required."
    assert markdown.locator("textarea").get_attribute("aria-invalid") == "true"
    assert page.locator(".abp-run").count() == 0

    markdown.locator("textarea").fill("# Hello\n\nSome *emphasis*.<script>alert(1)</script>")
    form.locator("button[type=submit]").click()
    run = latest_run(page, "succeeded")
    assert run.get_attribute("data-capability") == "convert.markdownToHtml"
    html = json.loads(run.locator(".abp-run-json").inner_text())["html"]
    assert html.startswith("<h1>Hello</h1>")
    assert "<em>emphasis</em>" in html
    assert "<script>" not in html
    # The result is shown as text, never parsed.
    assert run.locator(".abp-run-result h1").count() == 0
    screenshot(page, "console-markdown")


def test_a_slow_run_shows_its_progress_and_cancel_stops_it(page: Page, stack: Stack) -> None:
    username, user_id = person("auth.view_user")
    form = open_console(page, stack, username, "test.sleep")
    assert "test.guarded" in listed(page)
    form.locator("select[name=mode]").select_option(label="checkpoint")
    form.locator("input[name=steps]").fill("1000")
    form.locator("input[name=stepMs]").fill("20")
    form.locator("button[type=submit]").click()

    run = page.locator(".abp-run").first
    page.wait_for_function(
        "run => Number(run.dataset.percentage || 0) > 0", arg=run.element_handle()
    )
    assert run.get_attribute("data-status") == "running"
    assert run.locator(".abp-run-stage").inner_text().startswith("sleeping ")
    call_id = run.get_attribute("data-call-id")
    run.locator(".abp-run-cancel").click()
    page.wait_for_selector(f".abp-run[data-call-id='{call_id}'][data-status=cancelled]")
    assert run.locator(".abp-run-status").inner_text() == "cancelled"
    assert run.locator(".abp-run-error-code").inner_text() == "CANCELLED"
    assert run.locator(".abp-run-cancel").is_disabled()
    screenshot(page, "console-cancelled")

    job = orm_eventually(
        Job.objects.filter(call_id=call_id, stopped_at__isnull=False).first, timeout=15
    )
    assert job.status == JobStatus.CANCELLED
    assert job.cancel_source == CancelSource.AGENT
    assert job.cancel_reason == "Cancelled from the console."
    assert job.user_id == user_id
    assert (job.progress or 0) < 1000


def noise(width: int, height: int) -> bytes:
    """A PNG of random pixels: over the 64 KiB above which client.js uploads it."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buffer, "PNG")
    return buffer.getvalue()


def test_an_uploaded_image_is_processed_and_shown(page: Page, stack: Stack) -> None:
    form = open_console(page, stack, person()[0], "process.image")
    upload = FilePayload(name="noise.png", mimeType="image/png", buffer=noise(480, 320))
    form.locator("input[type=file][name=image]").set_input_files(files=[upload])
    # operations: an array of oneOf objects, drawn as rows of a choice.
    operations = form.locator("fieldset[data-path=operations]")
    operations.locator(".abp-add").click()
    operations.locator("select[name='operations.0']").select_option(label="rotate")
    operations.locator("input[name='operations.0.degrees']").fill("90")
    assert operations.locator("input[name='operations.0.expand']").is_checked()
    form.locator("select[name=format]").select_option(label="png")
    form.locator("button[type=submit]").click()

    run = latest_run(page, "succeeded")
    picture = run.locator("img.abp-run-image")
    page.wait_for_function(
        "img => img.complete && img.naturalWidth === 320 && img.naturalHeight === 480",
        arg=picture.element_handle(),
    )
    # Over the stack's inline limit (256 KiB): a download URL, the picture shown from it.
    link = run.locator("a.abp-run-download")
    assert (link.get_attribute("href") or "").startswith(f"{stack.http_url}/abp/files/")
    assert picture.get_attribute("src") == link.get_attribute("href")
    assert (link.get_attribute("download") or "").endswith(".png")
    # The file went to /abp/uploads; the job's row holds the reference only.
    call_id = run.get_attribute("data-call-id")
    image: dict[str, Any] = orm(lambda: Job.objects.get(call_id=call_id).params["image"])
    assert "uploadId" in image
    assert "content" not in image
    screenshot(page, "console-image")


def test_a_json_field_is_parsed_before_the_call_and_errors_show_their_code(
    page: Page, stack: Stack
) -> None:
    form = open_console(page, stack, person()[0], "test.sleep")
    submit = form.locator("button[type=submit]")
    problem = form.locator(".abp-form-error")
    # `echo` has an empty schema: anything, as JSON.
    echo = form.locator("textarea.abp-json[name=echo]")
    steps = form.locator("input[name=steps]")

    steps.fill("-1")
    submit.click()
    assert problem.inner_text() == "Not sent: steps: At least 0."
    steps.fill("1")
    echo.fill("{not json")
    submit.click()
    assert problem.inner_text().startswith("Not sent: echo: Not valid JSON")
    assert echo.get_attribute("aria-invalid") == "true"
    assert page.locator(".abp-run").count() == 0

    echo.fill('{"tags": ["a", "b"], "n": 3}')
    form.locator("input[name=fileBytes]").fill("2048")
    submit.click()
    run = latest_run(page, "succeeded")
    assert problem.is_hidden()
    data = json.loads(run.locator(".abp-run-json").inner_text())
    assert data["echo"] == {"tags": ["a", "b"], "n": 3}
    assert "characters of base64" in data["file"]["content"]
    # Inline: a blob: URL made from its base64.
    link = run.locator("a.abp-run-download")
    assert (link.get_attribute("href") or "").startswith("blob:")
    assert link.get_attribute("download") == "blob.bin"
    assert "2048 bytes" in link.inner_text()
    assert run.locator("img").count() == 0

    form.locator("select[name=mode]").select_option(label="fail")
    submit.click()
    failed = latest_run(page, "failed")
    assert failed.locator(".abp-run-error-code").inner_text() == "INVALID_PARAMS"
    assert "Asked to fail." in failed.locator(".abp-run-error").inner_text()


RENDER = """async (schema) => {
  const { formFor } = await import("/static/abp/console_form.js");
  const form = formFor(schema);
  document.body.replaceChildren(form.element);
  window.consoleForm = form;
  const fields = [...document.querySelectorAll("[data-path]")];
  return fields.map((field) => [field.dataset.path, field.dataset.kind]);
}"""

READ = """() => {
  try {
    return { value: window.consoleForm.read() };
  } catch (error) {
    return { error: error.message, name: error.name };
  }
}"""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 2}},
            "required": ["x"],
        }
    },
    "properties": {
        "name": {"type": "string", "maxLength": 20, "default": "ada"},
        "level": {"enum": [1, 2, 3], "default": 2},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "default": ["a"]},
        "point": {"$ref": "#/$defs/Point"},
        "maybe": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
        "when": {"type": "string", "format": "date"},
        "anything": {},
        "mixed": {"type": ["string", "integer"]},
    },
    "required": ["point"],
}


def test_the_renderer_draws_each_kind_and_json_for_the_rest(page: Page, stack: Stack) -> None:
    page.goto(f"{stack.http_url}/")
    kinds = dict(page.evaluate(RENDER, SCHEMA))
    assert kinds == {
        "": "object",
        "name": "string",
        "level": "enum",
        "ratio": "number",
        "tags": "array",
        "tags.0": "string",
        "point": "object",
        "point.x": "number",
        "point.y": "number",
        "maybe": "string",
        "when": "string",
        "anything": "json",
        "mixed": "json",
    }
    assert page.get_attribute("input[name=when]", "type") == "date"
    assert page.locator("[data-path=point] > legend .abp-required").count() == 1

    # A required field of a required object drawn from a $ref.
    assert page.evaluate(READ) == {"error": "point.x: Required.", "name": "FieldError"}
    page.fill("input[name='point.x']", "5")
    page.fill("input[name=ratio]", "0.5")
    page.locator("[data-path=tags] .abp-add").click()
    page.fill("input[name='tags.1']", "b")
    page.select_option("select[name=level]", label="3")
    assert page.evaluate(READ) == {
        "value": {
            "name": "ada",
            "level": 3,
            "ratio": 0.5,
            "tags": ["a", "b"],
            "point": {"x": 5, "y": 2},
        }
    }
    page.fill("textarea[name=anything]", "[1, {")
    assert page.evaluate(READ)["error"].startswith("anything: Not valid JSON")
    page.fill("textarea[name=anything]", "[1, null]")
    page.fill("input[name=ratio]", "2")
    assert page.evaluate(READ)["error"] == "ratio: At most 1."
    page.fill("input[name=ratio]", "")
    page.locator("[data-path=tags] .abp-remove").first.click()
    page.fill("input[name=maybe]", "hi")
    page.fill("input[name=when]", "2026-12-07")
    value = page.evaluate(READ)["value"]
    assert value["anything"] == [1, None]
    assert value["tags"] == ["b"]
    assert (value["maybe"], value["when"]) == ("hi", "2026-12-07")
    assert "ratio" not in value


RECURSIVE: dict[str, Any] = {
    "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
    "$ref": "#/$defs/Node",
}


def test_a_recursive_schema_is_drawn_to_a_bounded_depth_then_as_json(
    page: Page, stack: Stack
) -> None:
    page.goto(f"{stack.http_url}/")
    kinds = dict(page.evaluate(RENDER, RECURSIVE))
    depth = page.evaluate("async () => (await import('/static/abp/console_schema.js')).MAX_DEPTH")
    nested = ".".join(["next"] * depth)
    assert kinds[nested] == "object"
    assert kinds[f"{nested}.next"] == "json"
    assert len(kinds) == depth + 2  # the root, `depth` objects, the JSON at the end
    page.fill(f"textarea[name='{nested}.next']", '{"next": null}')
    value = page.evaluate(READ)["value"]
    for _ in range(depth + 1):
        value = value["next"]
    assert value == {"next": None}
