"""The browser modules' error codes and retryable set are the server's.

The JavaScript is read as text, not run: each list is a literal written one entry a
line, and a line the parser does not expect fails the test rather than being skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capabilities.protocol.errors import RETRYABLE_CODES, ErrorCode
from tests.support.paths import ROOT

STATIC = ROOT / "capabilities" / "static" / "abp"
WIRE = STATIC / "wire.js"
RUNTIME = STATIC / "runtime.js"

# Where the JS lists codes (runtime.js, a classic script, names the two it needs itself).
DECLARATIONS = {WIRE: "export const ErrorCode", RUNTIME: "const ErrorCode"}

SERVER_CODES = {code.name: code.value for code in ErrorCode}
SERVER_RETRYABLE = {code.name for code in RETRYABLE_CODES}


def _block(source: str, opening: str, closing: str) -> tuple[str, list[str]]:
    """The one block from a line `opening` to a line `closing`, and its inner lines."""
    pattern = rf"^[ \t]*{re.escape(opening)}\n(.*?)\n[ \t]*{re.escape(closing)}$"
    found = list(re.finditer(pattern, source, re.MULTILINE | re.DOTALL))
    assert len(found) == 1, f"expected one `{opening}` ... `{closing}` block, found {len(found)}"
    lines = [line.strip() for line in found[0][1].splitlines()]
    return found[0][0], [line for line in lines if line and not line.startswith("//")]


def _entries(lines: list[str], entry: str) -> list[re.Match[str]]:
    matches = [re.fullmatch(entry, line) for line in lines]
    unexpected = [line for line, match in zip(lines, matches, strict=True) if match is None]
    assert unexpected == [], f"lines not of the form {entry!r}"
    return [match for match in matches if match is not None]


def frozen_codes(source: str, declaration: str) -> dict[str, str]:
    """`<declaration> = Object.freeze({` with one `NAME: "VALUE",` a line, then `});`."""
    _, lines = _block(source, f"{declaration} = Object.freeze({{", "});")
    matches = _entries(lines, r'([A-Z][A-Z_]*): "([A-Z][A-Z_]*)",')
    codes = {match[1]: match[2] for match in matches}
    assert len(codes) == len(matches), "a code is listed twice"
    return codes


def retryable_codes(source: str) -> set[str]:
    """`const RETRYABLE_CODES = new Set([` with one `ErrorCode.NAME,` a line, then `]);`."""
    _, lines = _block(source, "const RETRYABLE_CODES = new Set([", "]);")
    matches = _entries(lines, r"ErrorCode\.([A-Z][A-Z_]*),")
    names = [match[1] for match in matches]
    assert len(set(names)) == len(names), "a code is listed twice"
    return set(names)


def test_the_js_error_codes_are_the_servers() -> None:
    assert frozen_codes(WIRE.read_text(encoding="utf-8"), DECLARATIONS[WIRE]) == SERVER_CODES


def test_the_js_retryable_codes_are_the_servers() -> None:
    source = WIRE.read_text(encoding="utf-8")
    assert retryable_codes(source) == SERVER_RETRYABLE
    # ...and they are what decides `retryable` on the errors the JS builds.
    assert "retryable: RETRYABLE_CODES.has(code)" in source


def test_the_runtimes_own_codes_are_the_servers_and_not_retryable() -> None:
    # runtime.js is a classic script, with no static import of wire.js: it names the two
    # codes it answers with before it has loaded client.js, and marks them not retryable.
    source = RUNTIME.read_text(encoding="utf-8")
    codes = frozen_codes(source, DECLARATIONS[RUNTIME])
    assert codes
    assert codes.items() <= SERVER_CODES.items()
    assert set(codes).isdisjoint(SERVER_RETRYABLE)
    assert re.search(
        r"function error\(code, message\) \{\s*return \{ code, message, retryable: false \};\s*\}",
        source,
    )


@pytest.mark.parametrize("path", sorted(STATIC.glob("*.js")), ids=lambda path: path.name)
def test_no_other_js_spells_an_error_code(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    if path in DECLARATIONS:
        whole, _ = _block(source, f"{DECLARATIONS[path]} = Object.freeze({{", "});")
        source = source.replace(whole, "")
    spelled = sorted(
        code for code in SERVER_CODES.values() if re.search(rf"""["'`]{code}["'`]""", source)
    )
    assert spelled == [], f"{path.name} spells codes itself: use ErrorCode"
