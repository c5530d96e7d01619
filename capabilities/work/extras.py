"""Which built-in capabilities have their extra installed (docs/installing.md#extras).

A built-in is registered only where the libraries its extra brings can be found: a
host that installs `abp-jobs[images]` serves `process.image` alone, and
`manage.py check` says which built-ins are off and the line that turns each on. The
libraries are looked up, not imported: the web process never loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec


@dataclass(frozen=True)
class BuiltIn:
    """A built-in capability and the extra that brings its libraries."""

    name: str
    extra: str
    modules: tuple[str, ...]

    def missing_modules(self) -> list[str]:
        """The modules of its extra that cannot be found here."""
        return [module for module in self.modules if find_spec(module) is None]

    @property
    def install_line(self) -> str:
        return f'pip install "abp-jobs[{self.extra}]"'


BUILT_INS = {
    built_in.name: built_in
    for built_in in (
        BuiltIn("export.pdf", "pdf", ("weasyprint", "brotli", "PIL")),
        BuiltIn("process.image", "images", ("PIL",)),
        BuiltIn("convert.markdownToHtml", "markdown", ("markdown", "nh3")),
    )
}


def installed(name: str) -> bool:
    """Whether the built-in `name` has every library of its extra."""
    return not BUILT_INS[name].missing_modules()


def switched_off() -> list[BuiltIn]:
    """The built-ins whose extra is missing, in declaration order."""
    return [built_in for built_in in BUILT_INS.values() if built_in.missing_modules()]
