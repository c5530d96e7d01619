"""Template tags for a host's pages: `{% load abp %}`."""
