"""Take docs/demo.png: the console after a cancelled export, a Markdown call and an image.

    .venv/bin/python docs/demo_screenshot.py

Starts its own stack (as the tests do) and Debian's Chromium, and signs a user in.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import environment  # noqa: E402 - needs the path above

OUTPUT = ROOT / "docs" / "demo.png"


def fractal() -> bytes:
    """A colourful PNG to upload."""
    from PIL import Image, ImageOps

    gray = Image.effect_mandelbrot((640, 420), (-2.3, -1.1, 0.9, 1.1), 120)
    colored = ImageOps.colorize(gray, black="#0b1d51", white="#ffd166", mid="#ef476f")
    buffer = io.BytesIO()
    colored.save(buffer, "PNG")
    return buffer.getvalue()


MARKDOWN = """# Quarterly report

Revenue grew **12%** over the quarter; costs stayed flat.

| Region | Revenue | Change |
|--------|---------|--------|
| North  | 4.2 M   | +9%    |
| South  | 3.1 M   | +17%   |
"""


def long_document(pages: int) -> str:
    """HTML of `pages` pages, for an export that runs long enough to cancel."""
    page = "<section style='page-break-after: always'><h1>Page {}</h1><p>{}</p></section>"
    body = "".join(page.format(n, "Lorem ipsum dolor sit amet. " * 40) for n in range(pages))
    return f"<!doctype html><html><body>{body}</body></html>"


def main() -> None:
    """Run the three jobs in the console and take the picture."""
    stack = environment.prepare("abp-screenshot-")
    from django.contrib.auth import get_user_model
    from playwright.sync_api import FilePayload, sync_playwright

    from tests.browser.support import CHROMIUM, CHROMIUM_ARGS

    get_user_model().objects.create_user(username="ada", password="screenshot-only")
    try:
        stack.start()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            page.goto(f"{stack.http_url}/abp/console/")
            page.fill("#id_username", "ada")
            page.fill("#id_password", "screenshot-only")
            page.click("button[type=submit]")
            page.wait_for_selector("#connection[data-state=ready]")
            page.click("#capability-list li[data-capability='export.pdf'] a")
            form = "form[data-capability='export.pdf']"
            page.fill(f"{form} textarea[name=html]", long_document(300))
            page.click(f"{form} button[type=submit]")
            page.wait_for_function(
                "() => /layout [0-9]{2}/.test(document.querySelector('.abp-run-stage').textContent)"
            )
            page.locator(".abp-run").first.locator(".abp-run-cancel").click()
            page.wait_for_selector(".abp-run:first-child[data-status=cancelled]")

            page.click("#capability-list li[data-capability='convert.markdownToHtml'] a")
            form = "form[data-capability='convert.markdownToHtml']"
            page.fill(f"{form} textarea[name=markdown]", MARKDOWN)
            page.click(f"{form} button[type=submit]")
            page.wait_for_selector(".abp-run:first-child[data-status=succeeded]")

            page.click("#capability-list li[data-capability='process.image'] a")
            form = "form[data-capability='process.image']"
            upload = FilePayload(name="fractal.png", mimeType="image/png", buffer=fractal())
            page.set_input_files(f"{form} input[name=image]", files=[upload])
            page.click(f"{form} [data-path=operations] .abp-add")
            page.select_option(f"{form} select[name='operations.0']", label="sharpen")
            page.click(f"{form} button[type=submit]")
            page.wait_for_function(
                "() => document.querySelector('.abp-run:first-child img')?.complete === true"
            )
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=str(OUTPUT))
            browser.close()
    finally:
        stack.stop()
        stack.remove_files()
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
