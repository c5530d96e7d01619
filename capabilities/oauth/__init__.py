"""The authorization server for MCP clients: django-oauth-toolkit, set up as MCP needs.

Loaded by the web process only (Django views). The resource-server side, which
checks tokens on every door, is `capabilities.access.oauth_tokens`.
"""
