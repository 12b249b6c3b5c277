"""unbroken: keep large-scale LLM pretraining running through failures."""

__version__ = "0.1.0"
