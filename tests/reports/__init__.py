"""The tutorial's app (docs/your-capabilities.md): its `abp_capabilities.py` verbatim.

tests/docs/test_your_capabilities.py checks the file is still the tutorial's code block.
"""
