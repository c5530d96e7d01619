"""What the app's package ships to every host: its bridge, browser modules and base, no demo."""

from __future__ import annotations

from pathlib import Path

import capabilities

PACKAGE = Path(capabilities.__file__).parent


def test_the_app_ships_no_demo_page() -> None:
    templates = {path.name for path in (PACKAGE / "templates" / "abp").iterdir()}
    assert templates == {
        "base.html",
        "console.html",
        "embed.html",
        "oauth_consent.html",
        "runtime.html",
        "your_jobs.html",
        "your_keys.html",
    }


def test_the_app_ships_only_the_browser_modules() -> None:
    assets = {path.name for path in (PACKAGE / "static" / "abp").iterdir()}
    assert assets - {".gitkeep"} == {
        "bridge.js",
        "client.js",
        "console.css",
        "console.js",
        "console_form.js",
        "console_schema.js",
        "page_token.js",
        "runtime.js",
        "uploads.js",
        "wire.js",
        "your_jobs.js",
    }
