"""Version of the stand-in SGLang package (mirrors ``sglang.version`` of SGLang 0.5.23)."""

__version__ = "0.5.23"
