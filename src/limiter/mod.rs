//! limiter (being written).
