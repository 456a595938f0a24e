"""The pure decisions: no database writes, no HTTP. Placement and its plan,
the LoRA pool planner, kept copies and the swap plan, canary gates, the
transition tables, quotas, the verification probe, base-model shapes."""
