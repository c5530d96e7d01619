"""The JSON-RPC 2.0 wire format of /abp/rpc: frames in, the session's messages out, and back.

Standard library and capabilities.protocol only: no Django, no I/O. See docs/jsonrpc.md.
"""
