import os
import sys

# Test helper modules (scan_ir.py) live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

import tempfile

# Tests never touch the user's compile cache.
os.environ["SCANWEAVER_CACHE_DIR"] = tempfile.mkdtemp(prefix="scanweaver-test-cache-")

# Kernels compile in full on their first call (no background compile thread outliving
# a test); tests/test_cpu_tiers.py turns the tiers on where it tests them.
os.environ.setdefault("SCANWEAVER_TIERED", "0")
