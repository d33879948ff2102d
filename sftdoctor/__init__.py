"""sftdoctor: preflight checks, a trainer and a knowledge base for LLM supervised fine-tuning.

Importing this package must stay cheap: nothing here imports torch or the training stack.
"""

__version__ = "0.1.0"
