"""The app's settings as types: each namespace a frozen model, with its defaults.

Pure (pydantic only): `schema` says what every key is and may be; `environment`
reads a deployment's `ABP_*` variables into it. `capabilities.conf` builds the
models from Django's settings and hands them to the code.
"""
