//! edge (being written).
