"""roofcal: physics-informed, calibrated step-time models for LLM inference."""
