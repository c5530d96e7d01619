"""Take docs/demo.png: the demo page after a PDF export, an image and a cancelled export.

    .venv/bin/python docs/demo_screenshot.py

Starts its own stack (as the tests do) and Debian's Chromium.
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


def main() -> None:
    """Run the three jobs in the demo and take the picture."""
    stack = environment.prepare("abp-screenshot-")
    from playwright.sync_api import FilePayload, sync_playwright

    from tests.browser.support import CHROMIUM, CHROMIUM_ARGS

    try:
        stack.start()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1200, "height": 1820})
            page.goto(f"{stack.http_url}/abp/demo/")
            page.wait_for_selector("#connection[data-state=ready]")
            page.fill("input[name=pages]", "3")
            page.click("#pdf-form button[type=submit]")
            page.wait_for_selector(".job[data-status=succeeded] iframe.pdf")
            upload = FilePayload(name="fractal.png", mimeType="image/png", buffer=fractal())
            page.set_input_files("#image-file", files=[upload])
            page.select_option("select[name=operation]", "sharpen")
            page.click("#image-form button[type=submit]")
            page.wait_for_selector(".job[data-status=succeeded] img.picture")
            page.fill("input[name=pages]", "300")
            page.click("#pdf-form button[type=submit]")
            page.wait_for_function(
                "() => Number(document.querySelector('.job').dataset.percentage || 0) > 12"
            )
            page.locator(".job").first.locator(".job-cancel").click()
            page.wait_for_selector(".job[data-status=cancelled]")
            # Chromium's PDF viewer paints on its own time; this is a picture, not a test.
            page.wait_for_timeout(2500)
            # A viewport shot: a full-page one resizes the view and loses the PDF's paint.
            page.screenshot(path=str(OUTPUT))
            browser.close()
    finally:
        stack.stop()
        stack.remove_files()
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
