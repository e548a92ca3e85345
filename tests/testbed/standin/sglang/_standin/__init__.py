"""Implementation of the stand-in SGLang server (orch test bed only)."""
