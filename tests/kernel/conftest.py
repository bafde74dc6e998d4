import sys
from pathlib import Path

# makes the shared helpers (attn_testing.py) importable under any pytest import mode
sys.path.insert(0, str(Path(__file__).parent))
