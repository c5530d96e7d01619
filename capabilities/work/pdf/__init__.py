"""export.pdf: WeasyPrint behind a bounded URL fetcher."""
