"""The export.pdf capability as agents see it (WeasyPrint itself loads only in workers)."""

from capabilities import pdf
from capabilities.registry import CapabilitySpec

SPEC = CapabilitySpec(
    name="export.pdf",
    description=pdf.DESCRIPTION,
    input_schema=pdf.INPUT_SCHEMA,
    output_schema=pdf.OUTPUT_SCHEMA,
    runner="capabilities.pdf.run",
)
