"""convert.markdownToHtml: Markdown rendered and sanitised."""
