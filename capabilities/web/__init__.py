"""The HTTP side: pages, the manifest, page tokens, downloads."""
