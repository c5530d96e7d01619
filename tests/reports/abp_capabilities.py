# reports/abp_capabilities.py
from dataclasses import dataclass

from capabilities import File, JobContext, capability


@dataclass
class ReportParams:
    rows: int = 1000
    title: str = "Squares"


@dataclass
class Report:
    rows: int
    csv: File


@capability("reports.squares", description="A CSV of n and n squared, one row at a time.")
def squares(params: ReportParams, ctx: JobContext) -> Report:
    lines = [f"# {params.title}", "n,square"]
    for n in range(params.rows):
        ctx.checkpoint()  # a cancel stops the work here
        lines.append(f"{n},{n * n}")
        if n % 100 == 0:
            ctx.report(progress=n, total=params.rows, stage="rows")
        ctx.wait(0.005)  # the slow part of a real report: a cancel ends the wait at once
    data = "\n".join(lines).encode()
    csv = ctx.save_file(data, mime_type="text/csv", filename="squares.csv")
    return Report(rows=params.rows, csv=csv)
