//! Chat templates (being written).
