"""Mode ``oel``: online experiential learning with on-policy context distillation (upstream PR #96)."""
