"""Suite-wide settings: the tests build every model, tokenizer and dataset they use locally, so the
Hugging Face hubs are switched off; a test that reached for the network would fail loudly here
instead of passing only where the network happens to be reachable."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
