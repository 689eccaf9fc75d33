import os
import sys

# Test helper modules (scan_ir.py) live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))

import tempfile

# Tests never touch the user's compile cache.
os.environ["SCANWEAVER_CACHE_DIR"] = tempfile.mkdtemp(prefix="scanweaver-test-cache-")
