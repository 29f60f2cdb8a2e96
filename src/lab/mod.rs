//! lab (being written).
