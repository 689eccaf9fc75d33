import os
import sys

# Test helper modules (scan_ir.py) live beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
