//! Static memory planner (placeholder; being written).
