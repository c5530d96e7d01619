"""Test-only capabilities (`test.sleep`, `test.allocate`), declared as any app's are.

Installed only by tests/settings.py: the product's manifest never has them.
"""
