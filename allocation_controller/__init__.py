"""The allocation controller: owns the kamiwaza.ai/AllocationVerified Pod condition."""
