import os
import sys

# tests/util.py holds the CPU-vs-lazyxla comparison helpers shared with tests/test_views.py.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
