"""Mode ``opd``: on-policy distillation from a hinted teacher (token-level advantages or top-K loss)."""
