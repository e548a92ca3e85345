"""Version of the stand-in SGLang tree (standin_tree.py rewrites it with the release it runs)."""

__version__ = "0.5.23"
